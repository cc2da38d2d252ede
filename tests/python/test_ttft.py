"""bench/ttft/ttft.py on the CPU with a tiny model of the same code: recompute and direct loads
(batch_get_into_multi_buffers, and batch_get_into_pages) match the storing request (prefix KV bytes, first-token logits, greedy tokens) over tcp and shm,
and the check is not blind: one stored page with other bytes, and two pages swapped, are both
caught. The staged mode, SDPA, torch._grouped_mm and transformers' config run only on the H200
(scripts/device.sh ttft): Debian's torch 1.13 has none of them."""
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
             "--modes", "recompute,direct,direct-pages", "--decode", "16"]


@unittest.skipIf(torch is None, "needs torch")
class TtftTest(unittest.TestCase):
    def test_every_mode_matches_the_storing_request(self):
        out = subprocess.run([sys.executable, os.path.join(BENCH, "ttft.py"), "--server", SERVER,
                              "--rounds", "1", *TINY_ARGS], capture_output=True, text=True,
                             timeout=240)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("all identical to the storing request's", out.stdout)
        self.assertEqual(out.stdout.count(": same prefix KV bytes, first-token logits and 16 "
                                          "greedy tokens"), 12, out.stdout)
        self.assertIn("| tcp | 600 | 592 |", out.stdout)

    def test_other_bytes_in_the_store_are_caught(self):
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
            b.store_prompt(store, p)
            self.assertEqual(b.request(p, "direct", store, 16)[2], "")
            self.assertEqual(b.request(p, "recompute", None, 16)[2], "")
            good = bytearray(store.get(p.keys[0]))
            pb = b.pool.page_bytes()
            nreg = len(b.regions)

            def replace(raw):
                self.assertEqual(store.remove(p.keys[0]), 0)
                self.assertEqual(store.put(p.keys[0], bytes(raw)), 0)

            # One 16-token page of layer 0's K (page-major: page 3 of region 0), signs flipped.
            raw = bytearray(good)
            torch.frombuffer(raw, dtype=torch.float32)[3 * nreg * pb // 4:][:pb // 4].neg_()
            replace(raw)
            why = b.request(p, "direct", store, 16)[2]
            self.assertIn("prefix KV differs in 1 ", why)
            # Pages 3 and 5 of region 0 swapped: every byte is a right one, in the wrong place.
            raw = bytearray(good)
            p3, p5 = 3 * nreg * pb, 5 * nreg * pb
            raw[p3:p3 + pb], raw[p5:p5 + pb] = good[p5:p5 + pb], good[p3:p3 + pb]
            replace(raw)
            self.assertIn("prefix KV differs in 2 ", b.request(p, "direct", store, 16)[2])
            replace(good)
            self.assertEqual(b.request(p, "direct", store, 16)[2], "")
            self.assertEqual(b.request(p, "recompute", None, 16)[2], "")
            store.close()
        finally:
            srv.stop()


if __name__ == "__main__":
    unittest.main()
