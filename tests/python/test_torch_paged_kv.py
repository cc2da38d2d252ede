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


if __name__ == "__main__":
    unittest.main()
