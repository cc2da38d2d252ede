"""The tensor API with CUDA tensors: batch_get_tensor_into_cuda into registered device tensors,
direct and staged, every byte checked (bench/tensor_cuda.py at a small size), and put_tensor of a
CUDA tensor. Needs torch with a CUDA device; skipped otherwise (scripts/device.sh torch runs it)."""
import os
import sys
import unittest

try:
    import torch
    HAVE_GPU = torch.cuda.is_available()
except ImportError:
    HAVE_GPU = False

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))


@unittest.skipUnless(HAVE_GPU, "needs torch and a CUDA device")
class TensorCudaTest(unittest.TestCase):
    def test_into_cuda_direct_and_staged(self):
        import tensor_cuda as tc
        proc, master = tc.start_server(os.environ.get("KVS_SERVER_PATH", "kvstash-server"),
                                       "256MiB")
        try:
            res = tc.run(master, total=32 << 20, tensor_bytes=1 << 20, reps=2)
            for protocol in ("tcp",):
                res_tcp = tc.run(master, total=8 << 20, tensor_bytes=256 << 10, reps=1,
                                 protocol=protocol, seed=1)
                self.assertEqual(set(res_tcp), {"direct", "staged"})
            # put_tensor of a CUDA tensor (copied to host) and get_tensor back.
            import kvstash
            s = kvstash.MooncakeDistributedStore()
            self.assertEqual(s.setup("localhost", "", 0, 0, "auto", "", master), 0)
            t = torch.randn(64, 64, device="cuda").to(torch.bfloat16)
            self.assertEqual(s.put_tensor("cuda-put", t), 0)
            got = s.get_tensor("cuda-put")
            self.assertTrue(torch.equal(got.view(torch.int16), t.cpu().view(torch.int16)))
            s.close()
        finally:
            proc.terminate()
            proc.wait(10)
        for mode, r in res.items():
            print(f"\n  {mode:8s} {r['ms']:8.2f} ms {r['GB/s']:6.2f} GB/s staged_reads "
                  f"{r['staged_reads']} fills {r['fills']} fallbacks {r['fallbacks']}")
        self.assertEqual(res["direct"]["staged_reads"], 0)


if __name__ == "__main__":
    unittest.main()
