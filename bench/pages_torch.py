#!/usr/bin/env python3
"""The page-table read from Python against what a PyTorch user writes instead, side by side in one
process on one GPU: N objects of K bytes, stored from host memory, read into a paged CUDA pool of
P-byte pages whose page ids are a random permutation.

  page-table staged   batch_get_into_pages(keys, [page_region(pool)], ids) with
                      MC_STORE_GPU_STAGING=1 (one scatter per fill, ids straight to the kernel)
  page-table direct   the same call without staging (one copy per page)
  page-table auto     the same call with MC_STORE_GPU_STAGING=auto (the adaptive policy)
  contiguous + index  batch_get_into each object into one contiguous CUDA buffer (direct), then
                      one pool.index_copy_ of every page: the PyTorch alternative
  pinned H2D          one pinned host tensor copied to the device: the limit

Every read is checked page by page (torch.equal on the GPU). Rounds rotate the method order;
medians are reported, with the ratios between methods from this run.

    PYTHONPATH=build-gpu/python python3 bench/pages_torch.py --server build-gpu/kvstash-server \
        --keys 96 --key-bytes 12MiB --page-bytes 8KiB --protocol shm --reps 10
"""
import argparse
import os
import statistics
import sys
import time

import torch

import kvstash

from bench_common import open_store, size, start_server  # noqa: E402




def timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", default="kvstash-server")
    ap.add_argument("--keys", type=int, default=96)
    ap.add_argument("--key-bytes", type=size, default=12 << 20)
    ap.add_argument("--page-bytes", type=size, default=8 << 10)
    ap.add_argument("--protocol", default="shm", choices=["shm", "tcp"])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--markdown", help="append the result table to this file")
    a = ap.parse_args()
    if a.key_bytes % a.page_bytes:
        sys.exit("--key-bytes must be a multiple of --page-bytes")
    per = a.key_bytes // a.page_bytes
    npages = a.keys * per
    total = a.keys * a.key_bytes
    proc, master = start_server(a.server, f"{total + (256 << 20)}")
    try:
        gen = torch.Generator().manual_seed(1)
        host = torch.randint(0, 256, (total,), dtype=torch.uint8, generator=gen).pin_memory()
        want = host.to("cuda").view(npages, a.page_bytes)
        pool = torch.zeros((npages, a.page_bytes), dtype=torch.uint8, device="cuda")
        contig = torch.empty((total,), dtype=torch.uint8, device="cuda")
        ids = torch.randperm(npages, generator=gen).to(torch.int32).view(a.keys, per)
        ids_cuda = ids.view(-1).to(torch.int64).cuda()
        keys = [f"pages-torch-{os.getpid()}-{i}" for i in range(a.keys)]
        staged = open_store(master, "1", a.protocol)
        direct = open_store(master, "0", a.protocol)
        auto = open_store(master, "auto", a.protocol)
        for s in (staged, direct, auto):
            for t in (pool, contig):
                assert s.register_buffer(t.data_ptr(), t.numel()) == 0
        assert direct.register_buffer(host.data_ptr(), total) == 0
        res = direct.batch_put_from(keys, [host.data_ptr() + i * a.key_bytes
                                           for i in range(a.keys)], [a.key_bytes] * a.keys)
        assert res == [0] * a.keys, res
        region = [kvstash.page_region(pool)]

        def check():
            if not torch.equal(pool[ids_cuda], want):
                raise SystemExit("wrong bytes in the pool")
            pool.zero_()

        def page_table(store):
            res = store.batch_get_into_pages(keys, region, ids, "page")
            if res != [a.key_bytes] * a.keys:
                raise SystemExit(f"batch_get_into_pages: {res[:4]}")

        def contiguous_index():
            res = direct.batch_get_into(keys, [contig.data_ptr() + i * a.key_bytes
                                               for i in range(a.keys)], [a.key_bytes] * a.keys)
            if res != [a.key_bytes] * a.keys:
                raise SystemExit(f"batch_get_into: {res[:4]}")
            pool.index_copy_(0, ids_cuda, contig.view(npages, a.page_bytes))

        h2d_dst = torch.empty_like(host, device="cuda")
        methods = {
            "page-table staged": lambda: page_table(staged),
            "page-table direct": lambda: page_table(direct),
            "page-table auto": lambda: page_table(auto),
            "contiguous + index_copy_": contiguous_index,
            "pinned H2D": lambda: h2d_dst.copy_(host, non_blocking=True),
        }
        times = {m: [] for m in methods}
        names = list(methods)
        for r in range(a.reps + 1):  # the first round warms up
            for k in range(len(names)):
                m = names[(k + r) % len(names)]
                ms = timed(methods[m])
                if m != "pinned H2D":
                    check()
                if r > 0:
                    times[m].append(ms)
        before = staged.get_stats()
        page_table(staged)
        after = staged.get_stats()
        check()
        med = {m: statistics.median(v) for m, v in times.items()}
        lim = med["pinned H2D"]
        lines = [f"\n{a.keys} x {a.key_bytes >> 10} KiB objects, {a.page_bytes >> 10} KiB pages "
                 f"({npages} pages), {a.protocol}, {a.reps} rounds, medians, "
                 f"{torch.cuda.get_device_name()}",
                 "",
                 "| method | median ms | GB/s | x pinned H2D | x page-table staged |",
                 "|---|---|---|---|---|"]
        for m in names:
            lines.append(f"| {m} | {med[m]:.2f} | {total / med[m] / 1e6:.1f} | "
                         f"{med[m] / lim:.3f} | {med[m] / med['page-table staged']:.3f} |")
        fills = after["fills"] - before["fills"]
        plan_us = (after["plan_ns_total"] - before["plan_ns_total"]) / 1e3
        over_us = (after.get("plan_overlapped_ns", 0) - before.get("plan_overlapped_ns", 0)) / 1e3
        lines.append("")
        lines.append(f"page-table staged: {fills} fills per call, serial planning {plan_us:.0f} us "
                     f"({plan_us * 1e3 / npages:.2f} ns/page), plan built during the first fill "
                     f"{over_us:.0f} us; the PyTorch alternative takes "
                     f"{med['contiguous + index_copy_'] / med['page-table staged']:.2f}x as long")
        text = "\n".join(lines)
        print(text)
        if a.markdown:
            with open(a.markdown, "a") as f:
                f.write(text + "\n")
        st = auto.get_stats()
        print("auto: " + ", ".join(f"{k} {st[k]}" for k in sorted(st) if k.startswith("auto_")))
        for s in (staged, direct, auto):
            s.close()
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
