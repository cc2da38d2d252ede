#!/usr/bin/env python3
"""A vLLM-like paged KV cache saved to and loaded from kvstash through its Python module.

The cache is one CUDA tensor of pages per layer and K/V. Each key holds one block of tokens for
every layer (its pages spread over the cache). Blocks are saved with
batch_put_from_multi_buffers straight from device pages, then loaded back into other, shuffled
pages with batch_get_into_multi_buffers in the four read modes: direct, grouped
(prefer_alloc_in_same_node), staged and grouped staged (GPU read staging, enabled through its
environment variables). Every page is checked with torch.equal, and every page that was not a
destination must be unchanged.

    PYTHONPATH=build/python python3 examples/paged_kv_cache.py            # starts a server
    PYTHONPATH=build/python python3 examples/paged_kv_cache.py --master 127.0.0.1:50051
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import kvstash


def start_server(path, segment, wait_s=5.0, extra=()):
    """A kvstash-server with an embedded master on a free port: (process, "host:port")."""
    d = tempfile.mkdtemp()
    port_file = os.path.join(d, "port")
    proc = subprocess.Popen([path, "--port", "0", "--port-file", port_file, "--segment-size",
                             segment, "--log-level", "warn", *extra], stdout=subprocess.DEVNULL)
    for _ in range(int(wait_s * 100)):
        if os.path.exists(port_file):
            with open(port_file) as f:
                port = f.read().strip()
            if port:
                return proc, "127.0.0.1:" + port
        if proc.poll() is not None:
            raise RuntimeError("kvstash-server exited")
        time.sleep(0.01)
    raise RuntimeError("kvstash-server did not start")


def open_store(master, staged):
    """A store client; staging is read from the environment at setup."""
    if staged:
        os.environ["MC_STORE_GPU_STAGING"] = "1"
        os.environ["MC_STORE_GPU_STAGING_BUFFER_BYTES"] = "64MiB"
    else:
        os.environ.pop("MC_STORE_GPU_STAGING", None)
    store = kvstash.MooncakeDistributedStore()
    rc = store.setup("localhost", "", 0, 0, "tcp" if os.environ.get("KVS_PROTOCOL") == "tcp"
                     else "auto", "", master)
    if rc != 0:
        raise RuntimeError(f"setup failed: {rc}")
    return store


def run(master, layers=4, page_tokens=16, kv_heads=2, head_dim=128, blocks=24,
        block_tokens=256, reps=3, seed=0):
    """Saves and loads `blocks` KV blocks; returns per-mode timings and staging counters."""
    torch.manual_seed(seed)
    dev = torch.device("cuda")
    page_elems = page_tokens * kv_heads * head_dim            # bf16: 8 KiB per page by default
    pages_per_block = block_tokens // page_tokens              # per layer and K/V
    num_pages = 2 * blocks * pages_per_block + 64              # room for sources and targets
    # The paged cache: [layer][K or V][page] -> page_elems bf16 values.
    cache = torch.zeros(layers, 2, num_pages, page_elems, dtype=torch.bfloat16, device=dev)
    page_bytes = page_elems * cache.element_size()

    def page_ptr(l, kv, p):
        return cache[l, kv, p].data_ptr()

    # Block tables: where each block's pages live, per layer and K/V (the same table for all
    # layers, as in vLLM). Sources and destinations are disjoint, destinations shuffled.
    perm = torch.randperm(num_pages).tolist()
    src_tables = [perm[b * pages_per_block:(b + 1) * pages_per_block] for b in range(blocks)]
    rest = perm[blocks * pages_per_block:]
    dst_tables = [rest[b * pages_per_block:(b + 1) * pages_per_block] for b in range(blocks)]
    for t in src_tables:
        cache[:, :, t] = torch.randn(layers, 2, len(t), page_elems, device=dev).to(torch.bfloat16)
    torch.cuda.synchronize()

    def frags(table):
        ptrs = [page_ptr(l, kv, p) for l in range(layers) for kv in range(2) for p in table]
        return ptrs, [page_bytes] * len(ptrs)

    keys = [f"example/req-{os.getpid()}/block-{b}" for b in range(blocks)]
    writer = open_store(master, staged=False)
    assert writer.register_buffer(cache.data_ptr(), cache.numel() * cache.element_size()) == 0
    src = [frags(t) for t in src_tables]
    rcs = writer.batch_put_from_multi_buffers(keys, [f[0] for f in src], [f[1] for f in src])
    assert rcs == [0] * blocks, rcs
    block_bytes = layers * 2 * pages_per_block * page_bytes

    dst = [frags(t) for t in dst_tables]
    dst_pages = {p for t in dst_tables for p in t}
    results = {}
    for mode, staged, grouped in [("direct", False, False), ("grouped", False, True),
                                  ("staged", True, False), ("grouped staged", True, True)]:
        store = open_store(master, staged)
        assert store.register_buffer(cache.data_ptr(), cache.numel() * cache.element_size()) == 0
        times = []
        for r in range(reps + 1):
            cache[:, :, list(dst_pages)] = 0
            before = cache.clone()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            sizes = store.batch_get_into_multi_buffers(keys, [f[0] for f in dst],
                                                       [f[1] for f in dst], grouped)
            t1 = time.perf_counter()
            assert sizes == [block_bytes] * blocks, (mode, sizes)
            for b in range(blocks):          # every destination page equals its source page
                for i, (s, d) in enumerate(zip(src_tables[b], dst_tables[b])):
                    assert torch.equal(cache[:, :, d], cache[:, :, s]), (mode, b, i)
            untouched = [p for p in range(num_pages) if p not in dst_pages]
            assert torch.equal(cache[:, :, untouched], before[:, :, untouched]), mode
            if r > 0:
                times.append(t1 - t0)
        stats = store.get_stats()
        results[mode] = {
            "ms": statistics.median(times) * 1e3,
            "GB/s": blocks * block_bytes / statistics.median(times) / 1e9,
            "staged_reads": stats["staged_reads"], "fills": stats["fills"],
            "scatter_launches": stats["scatter_launches"],
            "fallbacks": sum(v for k, v in stats.items() if k.startswith("fallback_")),
        }
        assert store.unregister_buffer(cache.data_ptr()) == 0
        store.close()
    for k in keys:
        writer.remove(k, force=True)
    writer.close()
    return {"blocks": blocks, "block_bytes": block_bytes, "fragments_per_block":
            layers * 2 * pages_per_block, "page_bytes": page_bytes, "modes": results}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--master", help="HOST:PORT of a running store (default: start one)")
    ap.add_argument("--server", default="build/kvstash-server")
    ap.add_argument("--blocks", type=int, default=24)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to show")
        return 0
    proc = None
    master = args.master
    if master is None:
        proc, master = start_server(args.server, "1GiB")
    try:
        res = run(master, blocks=args.blocks)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}")
    print(f"{res['blocks']} blocks x {res['block_bytes'] >> 20} MiB, "
          f"{res['fragments_per_block']} pages of {res['page_bytes']} B per block; "
          "every page checked with torch.equal, every other page unchanged")
    for mode, r in res["modes"].items():
        print(f"  {mode:15s} {r['ms']:8.2f} ms  {r['GB/s']:6.2f} GB/s   staged_reads "
              f"{r['staged_reads']}, fills {r['fills']}, scatter launches "
              f"{r['scatter_launches']}, fallbacks {r['fallbacks']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
