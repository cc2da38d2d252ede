"""A PyTorch paged KV cache saved and loaded through the kvstash module in all four read modes
(direct, grouped, staged, grouped staged). Needs torch with a CUDA device; skipped otherwise."""
import os
import sys
import unittest

try:
    import torch
    HAVE_GPU = torch.cuda.is_available()
except ImportError:  # CI: no torch
    HAVE_GPU = False

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))


@unittest.skipUnless(HAVE_GPU, "needs torch and a CUDA device")
class PagedKVTest(unittest.TestCase):
    def test_four_modes(self):
        import paged_kv_cache as ex
        proc, master = ex.start_server(os.environ.get("KVS_SERVER_PATH", "kvstash-server"),
                                       "1GiB")
        try:
            res = ex.run(master, reps=3)
        finally:
            proc.terminate()
            proc.wait(10)
        modes = res["modes"]
        print(f"\npython {sys.version.split()[0]}, torch {torch.__version__}")
        for mode, r in modes.items():
            print(f"  {mode:15s} {r['ms']:8.2f} ms {r['GB/s']:6.2f} GB/s staged_reads "
                  f"{r['staged_reads']} fills {r['fills']} launches {r['scatter_launches']} "
                  f"fallbacks {r['fallbacks']}")
        # Bytes were checked page by page inside run(); here: which path ran.
        for mode in ("direct", "grouped"):
            self.assertEqual(modes[mode]["staged_reads"], 0)
        for mode in ("staged", "grouped staged"):
            self.assertEqual(modes[mode]["staged_reads"], 4)  # warm-up + 3 timed calls
            self.assertEqual(modes[mode]["fallbacks"], 0)
            self.assertEqual(modes[mode]["fills"], modes[mode]["scatter_launches"])
            self.assertGreaterEqual(modes[mode]["fills"], 4)

    def test_page_table_into_cuda_pages(self):
        """Per-layer CUDA pools named once, page ids per key: direct and staged reads into
        freshly permuted pages, every page compared with torch.equal."""
        import kvstash
        import paged_kv_cache as ex
        proc, master = ex.start_server(os.environ.get("KVS_SERVER_PATH", "kvstash-server"),
                                       "1GiB")
        layers, pages, page_shape, keys_n, per_key = 4, 256, (16, 8, 64), 8, 16
        try:
            gen = torch.Generator(device="cuda").manual_seed(7)
            src = [torch.randn((pages, *page_shape), device="cuda", dtype=torch.bfloat16,
                               generator=gen) for _ in range(layers)]
            keys = [f"pt-{i}" for i in range(keys_n)]
            src_ids = torch.randperm(pages)[:keys_n * per_key].view(keys_n, per_key)
            for staged in (False, True):
                was = os.environ.get("MC_STORE_GPU_STAGING")
                os.environ["MC_STORE_GPU_STAGING"] = "1" if staged else "0"  # read at setup
                store = kvstash.MooncakeDistributedStore()
                self.assertEqual(store.setup("localhost", "", 0, 0, "tcp", "", master), 0)
                if was is None:
                    del os.environ["MC_STORE_GPU_STAGING"]
                else:
                    os.environ["MC_STORE_GPU_STAGING"] = was
                dst = [torch.zeros_like(t) for t in src]
                for t in src + dst:
                    self.assertEqual(store.register_buffer(t.data_ptr(),
                                                           t.numel() * t.element_size()), 0)
                if not staged:
                    res = store.batch_put_from_pages(keys, [kvstash.page_region(t) for t in src],
                                                     src_ids, "page")
                    self.assertEqual(res, [0] * keys_n)
                dst_ids = torch.randperm(pages)[:keys_n * per_key].view(keys_n, per_key)
                before = store.get_stats()
                res = store.batch_get_into_pages(keys, [kvstash.page_region(t) for t in dst],
                                                 dst_ids, "page")
                torch.cuda.synchronize()
                size = per_key * layers * src[0][0].numel() * 2
                self.assertEqual(res, [size] * keys_n)
                for k in range(keys_n):
                    for j in range(per_key):
                        for layer in range(layers):
                            self.assertTrue(torch.equal(dst[layer][dst_ids[k, j]],
                                                        src[layer][src_ids[k, j]]))
                after = store.get_stats()
                staged_calls = after["get_staged_calls"] - before["get_staged_calls"]
                self.assertEqual(staged_calls, 1 if staged else 0)
                print(f"\n  page-table {'staged' if staged else 'direct'}: {keys_n} keys x "
                      f"{per_key} pages x {layers} layers into permuted CUDA pages, all equal; "
                      f"fills {after['fills'] - before['fills']}")
                for t in src + dst:
                    store.unregister_buffer(t.data_ptr())
                store.close()
        finally:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    unittest.main()
