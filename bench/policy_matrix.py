#!/usr/bin/env python3
"""The adaptive read mode (MC_STORE_GPU_STAGING=auto) against every fixed mode, over a matrix of
page sizes x object sizes x transports, on one GPU: each cell reads about --call-bytes of objects
into randomly permuted pages of a CUDA pool through batch_get_into_pages, in four modes

  direct    MC_STORE_GPU_STAGING=0, one submission per key
  grouped   the same, prefer_alloc_in_same_node=True (one submission per owner)
  staged    MC_STORE_GPU_STAGING=1
  auto      MC_STORE_GPU_STAGING=auto (after --warmup calls of the cell, in which it calibrates
            and tries the modes it finds plausible)

and reports per cell the median of --reps calls in rotating order, the best fixed mode, auto's
ratio to it and to direct, and which modes auto read in its timed calls (and how many of them
were explorations). Every read is checked (torch.equal of the pages on the GPU). Writes a
markdown table (--markdown), a CSV (--csv) and a plot (--plot).

    PYTHONPATH=build-gpu/python python3 bench/policy_matrix.py --server build-gpu/kvstash-server \\
        --markdown out/policy.md --csv out/policy.csv --plot out/policy.png
"""
import argparse
import csv
import statistics
import time

import torch

import kvstash

from bench_common import open_store, size, start_server  # noqa: E402

MODES = ["direct", "grouped", "staged", "auto"]



def sizes(text):
    return [size(t) for t in text.split(",")]


def human(n):
    return f"{n >> 20}M" if n >= 1 << 20 else f"{n >> 10}K"



def run_cell(stores, keys, key_bytes, page_bytes, pool, host_pages, reps, warmup, gen):
    """Median ms per mode for one cell; every read checked."""
    per = key_bytes // page_bytes
    npages = len(keys) * per
    view = pool.view(-1).view(-1, page_bytes)  # the pool as pages of this size
    ids = torch.randperm(view.shape[0], generator=gen)[:npages].to(torch.int32).view(len(keys), per)
    ids_cuda = ids.view(-1).to(torch.int64).cuda()
    region = [kvstash.page_region(view)]
    want = host_pages[: npages * page_bytes].view(npages, page_bytes).cuda()

    def call(mode):
        store = stores["direct" if mode == "grouped" else mode]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        res = store.batch_get_into_pages(keys, region, ids, "page", mode == "grouped")
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        if res != [key_bytes] * len(keys):
            raise SystemExit(f"{mode}: batch_get_into_pages returned {res[:4]}")
        if not torch.equal(view[ids_cuda], want):
            raise SystemExit(f"{mode}: wrong bytes in the pages")
        view[ids_cuda] = 0
        return ms

    def picks():
        st = stores["auto"].get_stats()
        return [st[f"auto_{m}_calls"] for m in ("direct", "grouped", "staged")] + [
            st["auto_explored"]]

    for _ in range(warmup):
        call("auto")
    times = {m: [] for m in MODES}
    before = None
    for r in range(reps + 1):  # the first round warms the fixed modes
        if r == 1:
            before = picks()
        for k in range(len(MODES)):
            m = MODES[(k + r) % len(MODES)]
            ms = call(m)
            if r > 0:
                times[m].append(ms)
    # What auto read during the timed calls: d/g/s calls and explorations among them.
    got = [b - a for a, b in zip(before, picks())]
    med = {m: statistics.median(v) for m, v in times.items()}
    med["auto_picks"] = f"{got[0]}/{got[1]}/{got[2]} ({got[3]} explored)"
    return med


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", default="kvstash-server")
    ap.add_argument("--pages", type=sizes, default=sizes("4KiB,8KiB,16KiB,64KiB,256KiB,1MiB"))
    ap.add_argument("--objects", type=sizes, default=sizes("64KiB,1MiB,12MiB"))
    ap.add_argument("--protocols", default="shm,tcp")
    ap.add_argument("--call-bytes", type=size, default=96 << 20)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=6)
    ap.add_argument("--markdown")
    ap.add_argument("--csv")
    ap.add_argument("--plot")
    a = ap.parse_args()
    total = a.call_bytes
    gen = torch.Generator().manual_seed(3)
    host = torch.randint(0, 256, (total,), dtype=torch.uint8, generator=gen).pin_memory()
    pool = torch.zeros((2 * total // (4 << 10), 4 << 10), dtype=torch.uint8, device="cuda")
    rows = []
    for proto in a.protocols.split(","):
        proc, master = start_server(a.server, f"{total + (256 << 20)}")
        try:
            stores = {"direct": open_store(master, "0", proto),
                      "staged": open_store(master, "1", proto),
                      "auto": open_store(master, "auto", proto)}
            for s in stores.values():
                assert s.register_buffer(pool.data_ptr(), pool.numel()) == 0
            assert stores["direct"].register_buffer(host.data_ptr(), total) == 0
            for obj in a.objects:
                n = total // obj
                keys = [f"pm-{proto}-{obj}-{i}" for i in range(n)]
                res = stores["direct"].batch_put_from(keys, [host.data_ptr() + i * obj
                                                             for i in range(n)], [obj] * n)
                assert res == [0] * n, res[:4]
                for page in a.pages:
                    if page > obj:
                        continue
                    med = run_cell(stores, keys, obj, page, pool, host, a.reps, a.warmup, gen)
                    fixed = {m: med[m] for m in MODES if m != "auto"}
                    auto_picks = med.pop("auto_picks")
                    best = min(fixed, key=fixed.get)
                    row = {"transport": proto, "object": human(obj), "page": human(page),
                           "keys": n, **{f"{m}_ms": round(med[m], 3) for m in MODES},
                           "best_fixed": best,
                           "auto_vs_best": round(med["auto"] / fixed[best], 3),
                           "auto_vs_direct": round(med["auto"] / med["direct"], 3),
                           "auto_picks": auto_picks}
                    rows.append(row)
                    print(", ".join(f"{k} {v}" for k, v in row.items()), flush=True)
                for k in keys:
                    stores["direct"].remove(k)
            st = stores["auto"].get_stats()
            print(f"{proto} auto: " + ", ".join(f"{k} {st[k]}" for k in sorted(st)
                                               if k.startswith("auto_")), flush=True)
            for s in stores.values():
                s.close()
        finally:
            proc.terminate()
            proc.wait(10)
    worst = max(r["auto_vs_best"] for r in rows)
    over_direct = max(r["auto_vs_direct"] for r in rows)
    lines = [f"\nAdaptive mode matrix, {torch.cuda.get_device_name()}, {human(total)} per call, "
             f"medians of {a.reps} calls per mode (auto after {a.warmup} warm-up calls)", "",
             "| transport | object | page | keys | direct ms | grouped ms | staged ms | auto ms "
             "| best fixed | auto / best | auto / direct | auto read d/g/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['transport']} | {r['object']} | {r['page']} | {r['keys']} | "
                     f"{r['direct_ms']:.2f} | {r['grouped_ms']:.2f} | {r['staged_ms']:.2f} | "
                     f"{r['auto_ms']:.2f} | {r['best_fixed']} | {r['auto_vs_best']:.3f} | "
                     f"{r['auto_vs_direct']:.3f} | {r['auto_picks']} |")
    lines.append("")
    lines.append(f"worst auto / best fixed: {worst:.3f}; worst auto / direct: {over_direct:.3f}")
    text = "\n".join(lines)
    print(text)
    if a.markdown:
        with open(a.markdown, "a") as f:
            f.write(text + "\n")
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(max(8, 0.5 * len(rows)), 5))
        xs = range(len(rows))
        for i, m in enumerate(MODES):
            ax.bar([x + (i - 1.5) * 0.2 for x in xs], [r[f"{m}_ms"] for r in rows], 0.2, label=m)
        ax.set_yscale("log")
        ax.set_ylabel("median ms per call")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([f"{r['transport']}\n{r['object']}\n{r['page']}" for r in rows],
                           fontsize=7)
        ax.set_title(f"kvstash adaptive mode: auto / best fixed at most {worst:.3f}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.plot, dpi=120)


if __name__ == "__main__":
    main()
