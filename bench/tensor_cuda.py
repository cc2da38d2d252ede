#!/usr/bin/env python3
"""batch_get_tensor_into_cuda on a GPU: bf16 tensors read from a kvstash-server straight into
registered CUDA tensors, direct and staged, every byte checked, timed against the pinned
host-to-device copy of the same bytes (torch, one pinned tensor, non_blocking).

    PYTHONPATH=build-gpu/python python3 bench/tensor_cuda.py --server build-gpu/kvstash-server \
        --total 1GiB --tensor 1MiB --reps 5
"""
import argparse
import os
import statistics
import sys
import time

import torch

import kvstash

from bench_common import size, start_server  # noqa: E402,F401  (sizes, the server start-up)


def open_store(master, staged, protocol):
    if staged:
        os.environ["MC_STORE_GPU_STAGING"] = "1"
        os.environ.setdefault("MC_STORE_GPU_STAGING_BUFFER_BYTES", "64MiB")
    else:
        os.environ.pop("MC_STORE_GPU_STAGING", None)
    store = kvstash.MooncakeDistributedStore()
    rc = store.setup("localhost", "", 0, 0, protocol, "", master)
    if rc != 0:
        raise RuntimeError(f"setup failed: {rc}")
    return store


def pinned_h2d_ms(nbytes, reps):
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    times = []
    for _ in range(reps + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[1:])


def run(master, total=64 << 20, tensor_bytes=1 << 20, reps=3, protocol="auto", seed=0):
    """Stores total/tensor_bytes bf16 tensors, reads them into CUDA tensors in both modes;
    returns {mode: {ms, GB/s, staged_reads, ...}} after checking every byte."""
    n = total // tensor_bytes
    elems = tensor_bytes // 2
    g = torch.Generator().manual_seed(seed)
    src = [torch.randint(0, 1 << 16, (elems,), generator=g, dtype=torch.int32)
           .to(torch.int16).view(torch.bfloat16).reshape(elems // 256, 256) for _ in range(n)]
    keys = [f"tensor-cuda-{seed}-{i}" for i in range(n)]
    writer = open_store(master, False, protocol)
    try:
        res = writer.batch_put_tensor(keys, src)
        if res != [0] * n:
            raise RuntimeError(f"batch_put_tensor: {sorted(set(res))}")
    finally:
        writer.close()
    want = torch.stack(src).cuda()
    out = {}
    for mode in ("direct", "staged"):
        store = open_store(master, mode == "staged", protocol)
        try:
            big = torch.full((n,) + tuple(src[0].shape), -1, dtype=torch.bfloat16, device="cuda")
            if store.register_buffer(big.data_ptr(), big.numel() * 2) != 0:
                raise RuntimeError("register_buffer of the CUDA destination failed")
            dst = list(big.unbind(0))
            times = []
            for r in range(reps + 1):
                big.fill_(-1)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                got = store.batch_get_tensor_into_cuda(keys, dst)
                torch.cuda.synchronize()
                times.append((time.perf_counter() - t0) * 1e3)
                if got != [tensor_bytes] * n:
                    raise RuntimeError(f"{mode}: batch_get_tensor_into_cuda: {sorted(set(got))}")
                if not torch.equal(big.view(torch.int16), want.view(torch.int16)):
                    raise RuntimeError(f"{mode}: bytes differ")
            st = store.get_stats()
            ms = statistics.median(times[1:])
            out[mode] = {"ms": ms, "GB/s": total / ms / 1e6,
                         "staged_reads": st["staged_reads"], "fills": st["fills"],
                         "fallbacks": sum(v for k, v in st.items() if k.startswith("fallback_"))}
            store.unregister_buffer(big.data_ptr())
        finally:
            store.close()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", default="kvstash-server")
    ap.add_argument("--master", help="an existing store (else one is started)")
    ap.add_argument("--total", type=size, default=1 << 30)
    ap.add_argument("--tensor", type=size, default=1 << 20)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--protocol", default="auto")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("tensor_cuda: no CUDA device", file=sys.stderr)
        return 77
    proc, master = (None, a.master) if a.master else start_server(a.server, f"{a.total * 2}")
    try:
        res = run(master, a.total, a.tensor, a.reps, a.protocol)
    finally:
        if proc:
            proc.terminate()
            proc.wait(10)
    limit = pinned_h2d_ms(a.total, a.reps)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, protocol {a.protocol}: "
          f"{a.total >> 20} MiB in {a.total // a.tensor} bf16 tensors of {a.tensor >> 10} KiB, "
          f"median of {a.reps}")
    print(f"  pinned host->device copy {limit:8.2f} ms {a.total / limit / 1e6:6.2f} GB/s")
    for mode, r in res.items():
        print(f"  {mode:8s} {r['ms']:8.2f} ms {r['GB/s']:6.2f} GB/s = {r['ms'] / limit:.2f}x the "
              f"limit; staged reads {r['staged_reads']} fills {r['fills']} "
              f"fallbacks {r['fallbacks']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
