"""bench/ttft/ttft.py on the CPU with a tiny model of the same code: recompute and direct loads
give the storing request's greedy tokens over tcp and shm, and the check is not blind: one
stored page whose bytes differ changes the tokens. (The H200 runs the full model: scripts/device.sh
ttft.)"""
import os
import subprocess
import sys
import unittest

from kvs_harness import SERVER, Server

try:
    import torch
except ImportError:  # pragma: no cover - depends on the interpreter
    torch = None

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "ttft")
TINY_ARGS = ["--model", "tiny", "--device", "cpu", "--dtype", "fp32", "--lengths", "100,600",
             "--modes", "recompute,direct", "--decode", "16"]


@unittest.skipIf(torch is None, "needs torch")
class TtftTest(unittest.TestCase):
    def test_every_mode_gives_the_storing_requests_tokens(self):
        out = subprocess.run([sys.executable, os.path.join(BENCH, "ttft.py"), "--server", SERVER,
                              "--rounds", "1", *TINY_ARGS], capture_output=True, text=True,
                             timeout=240)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("all identical to the storing request's", out.stdout)
        self.assertEqual(out.stdout.count(": same 16 greedy tokens"), 8, out.stdout)
        self.assertIn("| tcp | 600 | 592 |", out.stdout)

    def test_a_stored_key_with_other_bytes_changes_the_tokens(self):
        sys.path.insert(0, BENCH)
        import ttft
        from qwen3_moe import TINY, build_config
        a = ttft.parse_args(["--server", SERVER, *TINY_ARGS])
        b = ttft.Bench(a, build_config(TINY)[0])
        srv = Server("64MiB")
        try:
            store = ttft.open_store(srv.master, "0", "tcp")
            b.register(store)
            p = b.prompts[600]
            want, _ = b.store_prompt(store, p)
            self.assertEqual(b.request(p, "direct", store, 16)[2], want)
            self.assertEqual(b.request(p, "recompute", None, 16)[2], want)
            # One 16-token page of layer 0's K in key 0 (page-major: page 3 of region 0) with
            # its values' signs flipped, stored as any other bytes.
            raw = bytearray(store.get(p.keys[0]))
            pb = b.pool.page_bytes()
            page = torch.frombuffer(raw, dtype=torch.float32)[3 * len(b.regions) * pb // 4:]
            page[:pb // 4].neg_()
            self.assertEqual(store.remove(p.keys[0]), 0)
            self.assertEqual(store.put(p.keys[0], bytes(raw)), 0)
            self.assertNotEqual(b.request(p, "direct", store, 16)[2], want)
            self.assertEqual(b.request(p, "recompute", None, 16)[2], want)
            store.close()
        finally:
            srv.stop()


if __name__ == "__main__":
    unittest.main()
