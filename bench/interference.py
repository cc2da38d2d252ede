#!/usr/bin/env python3
"""The staged read's scatter beside model compute: a bf16 GEMM loop on its own stream while
staged page-table reads repeat, for several scatter grid sizes and stream priorities.

Each configuration runs in its own process (MC_STORE_GPU_STAGING_SCATTER_BLOCKS and
MC_STORE_GPU_STAGING_SCATTER_PRIORITY are read once per process) against one kvstash-server
that holds N objects of K bytes. A worker measures, in one process:

  read alone   the staged read of every object into a paged CUDA pool (P-byte pages, a random
               permutation of page ids), median of --reps
  GEMM alone   the GEMM loop's rate (TFLOP/s) over a window as long as the reads', before
               and after the reads beside it (their mean; their spread is reported)
  together     the same reads while the GEMM loop runs: each read's median, and the GEMM
               loop's rate over the reads' window

The GEMM loop keeps at most two GEMMs in flight, so the host-side completion times it records
follow the GPU within one GEMM. The pool is checked page by page (torch.equal) after the first
read and after the last read beside the GEMMs, outside the timed parts.

    PYTHONPATH=build-gpu/python python3 bench/interference.py --server build-gpu/kvstash-server \
        --blocks 0,32,16,8 --priority normal,high --markdown out/interference.md
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import torch

import kvstash

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import open_store, size, start_server  # noqa: E402

SEED = 7


def data(total):
    g = torch.Generator(device="cuda")
    g.manual_seed(SEED)
    return torch.randint(0, 256, (total,), dtype=torch.uint8, device="cuda", generator=g)


class GemmLoop:
    """bf16 n x n x n GEMMs back to back on a stream of their own, from a thread; records the
    host time at which each one is known to be complete."""

    def __init__(self, n):
        self.n = n
        self.a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        self.b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        self.c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
        self.stream = torch.cuda.Stream()
        self.done = []  # host completion times
        self.stop = threading.Event()

    def _run(self):
        events = []
        with torch.cuda.stream(self.stream):
            while not self.stop.is_set():
                torch.mm(self.a, self.b, out=self.c)
                ev = torch.cuda.Event()
                ev.record(self.stream)
                events.append(ev)
                if len(events) >= 2:
                    events.pop(0).synchronize()
                    self.done.append(time.perf_counter())
            for ev in events:
                ev.synchronize()
                self.done.append(time.perf_counter())

    def start(self):
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        while len(self.done) < 20:  # past the first GEMMs (clocks, heuristics)
            if not self.thread.is_alive():
                raise SystemExit("the GEMM loop stopped")
            time.sleep(0.005)

    def finish(self):
        self.stop.set()
        self.thread.join()

    def rate(self, t0, t1):
        """TFLOP/s over [t0, t1]: GEMMs completed within it, from the first completion in it."""
        inside = [t for t in self.done if t0 <= t <= t1]
        if len(inside) < 2:
            return float("nan")
        return (len(inside) - 1) * 2 * self.n ** 3 / (inside[-1] - inside[0]) / 1e12


def worker(a):
    store = open_store(a.master, "1", a.protocol)
    per = a.key_bytes // a.page_bytes
    npages = a.keys * per
    pool = torch.zeros((npages, a.page_bytes), dtype=torch.uint8, device="cuda")
    assert store.register_buffer(pool.data_ptr(), pool.numel()) == 0
    gen = torch.Generator().manual_seed(SEED)
    ids = torch.randperm(npages, generator=gen).to(torch.int32).view(a.keys, per)
    keys = [f"interference-{i}" for i in range(a.keys)]
    region = [kvstash.page_region(pool)]

    def read():
        t0 = time.perf_counter()
        # No device-wide synchronise: it would wait for the GEMMs too. The call returns after
        # its copies and scatters completed (DESIGN §6: ownership returns after completion).
        res = store.batch_get_into_pages(keys, region, ids, "page")
        if res != [a.key_bytes] * a.keys:
            raise SystemExit(f"batch_get_into_pages: {res[:4]}")
        return (time.perf_counter() - t0) * 1e3

    want = data(a.keys * a.key_bytes).view(npages, a.page_bytes)
    where = ids.view(-1).to(torch.int64).cuda()

    def check(when):
        if not torch.equal(pool[where], want):
            raise SystemExit(f"wrong bytes in the pool {when}")
        pool.zero_()

    read()
    check("after the first read")
    alone = [read() for _ in range(a.reps)]
    gemm = GemmLoop(a.gemm)
    gemm.start()

    def gemm_alone():
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < max(sum(alone) / 1e3, 0.5):
            time.sleep(0.01)
        return gemm.rate(t0, time.perf_counter())

    g_before = gemm_alone()
    t0 = time.perf_counter()
    together = [read() for _ in range(a.reps)]
    t1 = time.perf_counter()
    g_after = gemm_alone()  # before and after: clock or power drift is not read as loss
    gemm.finish()
    check("after the reads beside the GEMMs")
    st = store.get_stats()
    falls = {k: v for k, v in st.items() if k.startswith("fallback_") and v}
    if falls or not st.get("staged_reads"):  # a fallback reads the same bytes, unstaged
        raise SystemExit(f"not staged: {st.get('staged_reads')} staged reads, fallbacks {falls}")
    print(json.dumps({"read_alone_ms": statistics.median(alone),
                      "read_together_ms": statistics.median(together),
                      "gemm_alone_tflops": (g_before + g_after) / 2,
                      "gemm_alone_spread": abs(g_before - g_after) / ((g_before + g_after) / 2),
                      "gemm_together_tflops": gemm.rate(t0, t1)}), flush=True)
    store.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", default="kvstash-server")
    ap.add_argument("--keys", type=int, default=96)
    ap.add_argument("--key-bytes", type=size, default=12 << 20)
    ap.add_argument("--page-bytes", type=size, default=8 << 10)
    ap.add_argument("--protocol", default="shm", choices=["shm", "tcp"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--gemm", type=int, default=8192, help="GEMM size n (n x n x n, bf16)")
    ap.add_argument("--blocks", default="0,32,16,8",
                    help="MC_STORE_GPU_STAGING_SCATTER_BLOCKS values (0: a full grid)")
    ap.add_argument("--priority", default="normal,high")
    ap.add_argument("--markdown")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--master", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.key_bytes % a.page_bytes:
        sys.exit("--key-bytes must be a multiple of --page-bytes")
    if a.worker:
        return worker(a)
    total = a.keys * a.key_bytes
    # Room below the master's eviction watermark (0.90): no stored key may be evicted.
    proc, master = start_server(a.server, f"{int(total / 0.85) + (256 << 20)}", wait_s=30.0,
                                extra=("--no-metrics",))
    try:
        src = data(total).cpu().pin_memory()
        w = open_store(master, "0", a.protocol)
        assert w.register_buffer(src.data_ptr(), total) == 0
        keys = [f"interference-{i}" for i in range(a.keys)]
        res = w.batch_put_from(keys, [src.data_ptr() + i * a.key_bytes for i in range(a.keys)],
                               [a.key_bytes] * a.keys)
        assert res == [0] * a.keys, res
        assert w.batch_is_exist(keys) == [1] * a.keys, "stored keys are missing"
        w.close()
        del src
        rows = []
        for prio in a.priority.split(","):
            for blocks in a.blocks.split(","):
                env = dict(os.environ, MC_STORE_GPU_STAGING_SCATTER_BLOCKS=blocks,
                           MC_STORE_GPU_STAGING_SCATTER_PRIORITY=prio)
                cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--master", master]
                for opt in ("keys", "key_bytes", "page_bytes", "protocol", "reps", "gemm"):
                    cmd += ["--" + opt.replace("_", "-"), str(getattr(a, opt))]
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
                if out.returncode != 0:
                    print(out.stdout, out.stderr)
                    raise SystemExit(f"worker (blocks {blocks}, {prio}) failed")
                r = json.loads(out.stdout.strip().splitlines()[-1])
                r.update(blocks=blocks, priority=prio)
                rows.append(r)
                print(f"blocks {blocks:>3} {prio:6}: " + ", ".join(
                    f"{k} {v:.2f}" for k, v in r.items() if isinstance(v, float)), flush=True)
        full = next(r for r in rows if r["blocks"] == "0" and r["priority"] == "normal")
        lines = [f"\n{a.keys} x {a.key_bytes >> 20} MiB staged page-table reads "
                 f"({a.page_bytes >> 10} KiB pages, {a.protocol}) beside a bf16 {a.gemm}^3 GEMM "
                 f"loop, {a.reps} reads per phase, medians, {torch.cuda.get_device_name()}",
                 "",
                 "| scatter blocks | priority | read alone ms | read with GEMM ms | read x alone | "
                 "read alone x full grid | read with GEMM x full grid alone | "
                 "GEMM alone TFLOP/s | GEMM with reads TFLOP/s | GEMM loss |",
                 "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(
                f"| {'full' if r['blocks'] == '0' else r['blocks']} | {r['priority']} | "
                f"{r['read_alone_ms']:.2f} | {r['read_together_ms']:.2f} | "
                f"{r['read_together_ms'] / r['read_alone_ms']:.3f} | "
                f"{r['read_alone_ms'] / full['read_alone_ms']:.3f} | "
                f"{r['read_together_ms'] / full['read_alone_ms']:.3f} | "
                f"{r['gemm_alone_tflops']:.0f} (spread {100 * r['gemm_alone_spread']:.1f}%) | "
                f"{r['gemm_together_tflops']:.0f} | "
                f"{100 * (1 - r['gemm_together_tflops'] / r['gemm_alone_tflops']):.1f}% |")
        text = "\n".join(lines)
        print(text)
        if a.markdown:
            with open(a.markdown, "a") as f:
                f.write(text + "\n")
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    sys.exit(main())
