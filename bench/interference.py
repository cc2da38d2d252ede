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

The GEMM rate comes from GPU timestamps (CUDA events around every GEMM, and marker events on
an idle stream at each window's ends), not from host clocks, and the loop keeps --gemm-depth
GEMMs queued so that no host-side delay (the GIL, a busy core) idles its stream; the idle time
of the GEMM stream inside each window is reported, and a window idle for more than 1% fails the
run. The pool is checked page by page (torch.equal) after the first read and after the last
read beside the GEMMs, outside the timed parts.

A row "default" sets neither variable: the defaults the library chose from this table. A control
row ("pinned copy") replaces the staged read by one pinned host-to-device copy of the
same bytes into a contiguous buffer (torch, no kvstash, no kernel): what the copy engine's traffic
alone costs the GEMM. Where nvidia-smi exists, the SM clock is sampled and its median reported
per phase.

    PYTHONPATH=build-gpu/python python3 bench/interference.py --server build-gpu/kvstash-server \
        --blocks 0,32,16,8 --priority normal,high --markdown out/interference.md
"""
import argparse
import datetime
import json
import os
import shutil
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
    """bf16 n x n x n GEMMs back to back on a stream of their own, from a thread, at most `depth`
    queued; CUDA events before and after each give its GPU start and end."""

    def __init__(self, n, depth):
        self.n, self.depth = n, depth
        self.a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        self.b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        self.c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
        self.stream = torch.cuda.Stream()
        self.marks = torch.cuda.Stream()  # idle: an event on it is stamped when recorded
        self.gemms = []  # (start event, end event)
        self.stop = threading.Event()

    def _run(self):
        with torch.cuda.stream(self.stream):
            while not self.stop.is_set():
                ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                ev0.record(self.stream)
                torch.mm(self.a, self.b, out=self.c)
                ev1.record(self.stream)
                self.gemms.append((ev0, ev1))
                if len(self.gemms) > self.depth:
                    self.gemms[-1 - self.depth][1].synchronize()
        self.stream.synchronize()

    def mark(self):
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(self.marks)
        return ev

    def start(self):
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        while len(self.gemms) < 20 + self.depth:  # past the first GEMMs (clocks, heuristics)
            if not self.thread.is_alive():
                raise SystemExit("the GEMM loop stopped")
            time.sleep(0.005)
        self.gemms[-1 - self.depth][1].synchronize()
        self.base = self.gemms[0][0]

    def finish(self):
        self.stop.set()
        self.thread.join()

    def rate(self, w):
        """(TFLOP/s, idle fraction) over the window w = (start mark, end mark): the GEMMs that
        ended inside it, from the first such end to the last, and the time the stream had no
        GEMM running between them."""
        t0, t1 = self.base.elapsed_time(w[0]), self.base.elapsed_time(w[1])
        spans = [(self.base.elapsed_time(a), self.base.elapsed_time(b)) for a, b in self.gemms]
        inside = [i for i, (_, e) in enumerate(spans) if t0 <= e <= t1]
        if len(inside) < 2:
            return float("nan"), float("nan")
        first, last = inside[0], inside[-1]
        busy = spans[last][1] - spans[first][1]
        idle = sum(max(0.0, spans[i][0] - spans[i - 1][1]) for i in inside[1:])
        return (last - first) * 2 * self.n ** 3 / (busy / 1e3) / 1e12, idle / busy


class Smi:
    """nvidia-smi sampling the SM clock (MHz) every 20 ms, if it exists. (Its power.draw is a
    one-second average, too slow for these half-second phases, so it is not sampled.)"""

    def __init__(self):
        self.samples, self.proc = [], None
        if shutil.which("nvidia-smi") is None:
            return
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=timestamp,clocks.sm",
             "--format=csv,noheader,nounits", "-lms", "20", "-i",
             # nvidia-smi's index: the same GPU on a one-GPU machine (under CUDA_VISIBLE_DEVICES
             # or another device order it may name another one)
             str(torch.cuda.current_device())], stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                ts, mhz = [x.strip() for x in line.split(",")]
                t = datetime.datetime.strptime(ts, "%Y/%m/%d %H:%M:%S.%f").timestamp()
                self.samples.append((t, float(mhz)))
            except ValueError:
                continue

    def median(self, t0, t1):
        inside = [m for t, m in self.samples if t0 <= t <= t1]
        return statistics.median(inside) if inside else None

    def close(self):
        if self.proc:
            self.proc.terminate()
            self.proc.wait(5)


def worker(a):
    per = a.key_bytes // a.page_bytes
    npages = a.keys * per
    want = data(a.keys * a.key_bytes).view(npages, a.page_bytes)
    if a.load == "staged":
        store = open_store(a.master, "1", a.protocol)
        pool = torch.zeros((npages, a.page_bytes), dtype=torch.uint8, device="cuda")
        assert store.register_buffer(pool.data_ptr(), pool.numel()) == 0
        gen = torch.Generator().manual_seed(SEED)
        ids = torch.randperm(npages, generator=gen).to(torch.int32).view(a.keys, per)
        keys = [f"interference-{i}" for i in range(a.keys)]
        region = [kvstash.page_region(pool)]
        where = ids.view(-1).to(torch.int64).cuda()

        def read():
            t0 = time.perf_counter()
            # No device-wide synchronise: it would wait for the GEMMs too. The call returns after
            # its copies and scatters completed (DESIGN §6: ownership returns after completion).
            res = store.batch_get_into_pages(keys, region, ids, "page")
            if res != [a.key_bytes] * a.keys:
                raise SystemExit(f"batch_get_into_pages: {res[:4]}")
            return (time.perf_counter() - t0) * 1e3

        def check(when):
            if not torch.equal(pool[where], want):
                raise SystemExit(f"wrong bytes in the pool {when}")
            pool.zero_()
            torch.cuda.synchronize()  # before the next read's streams write the pool
    else:  # the control: the copy engine's traffic alone, no kvstash and no kernel
        host = want.view(-1).cpu().pin_memory()
        dst = torch.zeros_like(want.view(-1))
        copies = torch.cuda.Stream()

        def read():
            t0 = time.perf_counter()
            with torch.cuda.stream(copies):
                dst.copy_(host, non_blocking=True)
            copies.synchronize()
            return (time.perf_counter() - t0) * 1e3

        def check(when):
            if not torch.equal(dst, want.view(-1)):
                raise SystemExit(f"wrong bytes in the copy {when}")
            dst.zero_()
            torch.cuda.synchronize()

    read()
    check("after the first read")
    gemm = GemmLoop(a.gemm, a.gemm_depth)
    phases = {}

    def phase(name, fn):
        w0, e0 = gemm.mark(), time.time()
        out = fn()
        phases[name] = (w0, gemm.mark(), e0, time.time())
        return out

    alone = phase("read_alone", lambda: [read() for _ in range(a.reps)])
    gemm.start()
    span = max(sum(alone) / 1e3, 0.5)
    phase("gemm_before", lambda: time.sleep(span))
    together = phase("together", lambda: [read() for _ in range(a.reps)])
    phase("gemm_after", lambda: time.sleep(span))  # before and after: drift is not read as loss
    gemm.finish()
    check("after the reads beside the GEMMs")
    if a.load == "staged":
        st = store.get_stats()
        falls = {k: v for k, v in st.items() if k.startswith("fallback_") and v}
        if falls or not st.get("staged_reads"):  # a fallback reads the same bytes, unstaged
            raise SystemExit(f"not staged: {st.get('staged_reads')} staged reads, fallbacks {falls}")
        store.close()
    rates = {k: gemm.rate(phases[k][:2]) for k in ("gemm_before", "together", "gemm_after")}
    for k, (rate, idle) in rates.items():
        if rate != rate:  # NaN
            raise SystemExit(f"fewer than two GEMMs ended inside the {k} window")
        if not idle <= 0.01:  # the harness starved the GEMM stream: not the GPU's doing
            raise SystemExit(f"the GEMM stream was idle {100 * idle:.1f}% of the {k} window")
    g_before, g_after = rates["gemm_before"][0], rates["gemm_after"][0]
    print(json.dumps({"read_alone_ms": statistics.median(alone),
                      "read_together_ms": statistics.median(together),
                      "gemm_alone_tflops": (g_before + g_after) / 2,
                      "gemm_alone_spread": abs(g_before - g_after) / ((g_before + g_after) / 2),
                      "gemm_together_tflops": rates["together"][0],
                      "gemm_idle": max(idle for _, idle in rates.values()),
                      "epochs": {k: v[2:] for k, v in phases.items()}}), flush=True)


def run_workers(a, master, runs):
    """One worker process per (priority, blocks) run; "pinned-copy" runs the control."""
    smi = Smi()
    rows = []
    try:
        for prio, blocks in runs:
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith("MC_STORE_GPU_STAGING_SCATTER_")}
            # Enough hardware queues that the idle marker stream never waits behind the GEMMs.
            env["CUDA_DEVICE_MAX_CONNECTIONS"] = "32"
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--master", master]
            if blocks == "pinned-copy":
                cmd += ["--load", "pinned-copy"]
            elif blocks != "default":  # "default": neither variable set
                env.update(MC_STORE_GPU_STAGING_SCATTER_BLOCKS=blocks,
                           MC_STORE_GPU_STAGING_SCATTER_PRIORITY=prio)
            for opt in ("keys", "key_bytes", "page_bytes", "protocol", "reps", "gemm",
                        "gemm_depth"):
                cmd += ["--" + opt.replace("_", "-"), str(getattr(a, opt))]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
            if out.returncode != 0:
                print(out.stdout, out.stderr)
                raise SystemExit(f"worker (blocks {blocks}, {prio}) failed")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            r.update(blocks=blocks, priority=prio)
            for k, (e0, e1) in r.pop("epochs").items():
                m = smi.median(e0, e1)
                if m:
                    r[f"{k}_mhz"] = m
            rows.append(r)
            print(f"blocks {blocks:>3} {prio:6}: " + ", ".join(
                f"{k} {v:.3f}" for k, v in r.items() if isinstance(v, float)), flush=True)
    finally:
        smi.close()
    return rows


def table(a, rows):
    full = next((r for r in rows if r["blocks"] == "0" and r["priority"] == "normal"), rows[0])
    smi = "gemm_before_mhz" in full
    lines = [f"\n{a.keys} x {a.key_bytes >> 20} MiB staged page-table reads "
             f"({a.page_bytes >> 10} KiB pages, {a.protocol}) beside a bf16 {a.gemm}^3 GEMM "
             f"loop ({a.gemm_depth} queued), {a.reps} reads per phase, medians, "
             f"{torch.cuda.get_device_name()}; GEMM rates from GPU timestamps",
             "",
             "| scatter blocks | priority | read alone ms | read with GEMM ms | read x alone | "
             "read alone x full grid | read with GEMM x full grid alone | "
             "GEMM alone TFLOP/s | GEMM with reads TFLOP/s | GEMM loss | GEMM stream idle |"
             + (" SM MHz: GEMM before / with reads / after |" if smi else ""),
             "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if smi else "")]
    for r in rows:
        name = {"0": "full", "pinned-copy": "pinned copy (no kvstash)",
                "default": "default (unset)"}.get(r["blocks"], r["blocks"])
        row = (f"| {name} | {r['priority']} | "
               f"{r['read_alone_ms']:.2f} | {r['read_together_ms']:.2f} | "
               f"{r['read_together_ms'] / r['read_alone_ms']:.3f} | "
               f"{r['read_alone_ms'] / full['read_alone_ms']:.3f} | "
               f"{r['read_together_ms'] / full['read_alone_ms']:.3f} | "
               f"{r['gemm_alone_tflops']:.0f} (spread {100 * r['gemm_alone_spread']:.1f}%) | "
               f"{r['gemm_together_tflops']:.0f} | "
               f"{100 * (1 - r['gemm_together_tflops'] / r['gemm_alone_tflops']):.1f}% | "
               f"{100 * r['gemm_idle']:.2f}% |")
        if smi:
            row += " " + " / ".join(f"{r.get(k + '_mhz', float('nan')):.0f}"
                                    for k in ("gemm_before", "together", "gemm_after")) + " |"
        lines.append(row)
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", default="kvstash-server")
    ap.add_argument("--keys", type=int, default=96)
    ap.add_argument("--key-bytes", type=size, default=12 << 20)
    ap.add_argument("--page-bytes", type=size, default=8 << 10)
    ap.add_argument("--protocol", default="shm", choices=["shm", "tcp"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--gemm", type=int, default=8192, help="GEMM size n (n x n x n, bf16)")
    ap.add_argument("--gemm-depth", type=int, default=8, help="GEMMs kept queued")
    ap.add_argument("--blocks", default="0,32,16,8",
                    help="MC_STORE_GPU_STAGING_SCATTER_BLOCKS values (0: a full grid)")
    ap.add_argument("--priority", default="normal,high")
    ap.add_argument("--control", action=argparse.BooleanOptionalAction, default=True,
                    help="also a pinned host-to-device copy of the same bytes (no kvstash)")
    ap.add_argument("--default", action=argparse.BooleanOptionalAction, default=True,
                    help="also the settings' defaults (neither variable set)")
    ap.add_argument("--load", default="staged", choices=["staged", "pinned-copy"],
                    help=argparse.SUPPRESS)
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
        runs = [(p, b) for p in a.priority.split(",") for b in a.blocks.split(",")]
        runs += [("-", "default")] if a.default else []
        runs += [("-", "pinned-copy")] if a.control else []
        rows = run_workers(a, master, runs)
        lines = table(a, rows)
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
