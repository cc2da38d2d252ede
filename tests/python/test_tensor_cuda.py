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
            self.puts_from_device(master)
        finally:
            proc.terminate()
            proc.wait(10)
        for mode, r in res.items():
            print(f"\n  {mode:8s} {r['ms']:8.2f} ms {r['GB/s']:6.2f} GB/s staged_reads "
                  f"{r['staged_reads']} fills {r['fills']} fallbacks {r['fallbacks']}")
        self.assertEqual(res["direct"]["staged_reads"], 0)
        self.assertGreater(res["staged"]["staged_reads"], 0)  # the staged path ran
        self.assertEqual(res["staged"]["fallbacks"], 0)

    def puts_from_device(self, master):
        """put_tensor of registered CUDA tensors writes from the device (no host copy); of
        unregistered ones, from a host copy; an upsert too. Every byte read back."""
        import kvstash
        from kvstash import _tensor
        s = kvstash.MooncakeDistributedStore()
        self.assertEqual(s.setup("localhost", "", 0, 0, "auto", "", master), 0)
        copies = []
        real = _tensor._host_copy
        _tensor._host_copy = lambda t: copies.append(t.shape) or real(t)
        try:
            reg = [torch.randn(256, 512, device="cuda").to(torch.bfloat16) for _ in range(4)]
            for t in reg:
                self.assertEqual(s.register_buffer(t.data_ptr(), t.numel() * 2), 0)
            keys = [f"cuda-reg-{i}" for i in range(4)]
            self.assertEqual(s.batch_put_tensor(keys, reg), [0] * 4)
            self.assertEqual(copies, [])  # written from the device
            self.assertEqual(s.put_tensor(keys[0], reg[1]), 0)  # exists: the first stays
            for k, t in zip(keys, reg):
                got = s.get_tensor(k)
                self.assertTrue(torch.equal(got.view(torch.int16), t.cpu().view(torch.int16)))
            loose = torch.randn(64, 64, device="cuda").to(torch.bfloat16)
            self.assertEqual(s.put_tensor("cuda-loose", loose), 0)
            self.assertEqual(len(copies), 1)  # not registered: from a host copy
            got = s.get_tensor("cuda-loose")
            self.assertTrue(torch.equal(got.view(torch.int16), loose.cpu().view(torch.int16)))
            self.assertEqual(s.upsert_tensor(keys[1], reg[2]), 0)
            got = s.get_tensor(keys[1])
            self.assertTrue(torch.equal(got.view(torch.int16), reg[2].cpu().view(torch.int16)))
            for t in reg:
                s.unregister_buffer(t.data_ptr())
        finally:
            _tensor._host_copy = real
            s.close()


if __name__ == "__main__":
    unittest.main()
