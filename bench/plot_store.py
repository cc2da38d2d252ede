#!/usr/bin/env python3
"""Plot of `kvstash bench store --csv`: median ms per read mode for every topology, layout and
reader count, with the limit measured in the same run. Usage: plot_store.py RESULTS.csv OUT.png"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MODES = ["direct", "grouped", "staged", "grouped staged", "page-table staged"]


def main(src, dst):
    with open(src, newline="") as f:
        rows = list(csv.DictReader(f))
    configs = []
    for r in rows:
        c = (r["topology"], r["layout"], r["readers"])
        if c not in configs:
            configs.append(c)
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(configs)), 5))
    width = 0.8 / len(MODES)
    for m, mode in enumerate(MODES):
        ys = []
        for c in configs:
            v = [float(r["median_ms"]) for r in rows
                 if (r["topology"], r["layout"], r["readers"]) == c and r["mode"] == mode]
            ys.append(v[0] if v else 0.0)
        ax.bar([i + (m - (len(MODES) - 1) / 2) * width for i in range(len(configs))], ys, width, label=mode)
    limits = [next(float(r["limit_ms"]) for r in rows
                   if (r["topology"], r["layout"], r["readers"]) == c) for c in configs]
    ax.scatter(range(len(configs)), limits, marker="_", s=900, color="black", zorder=3,
               label="limit (same run)")
    ax.set_yscale("log")
    ax.set_ylabel("median ms per call (slowest reader)")
    ax.set_xticks(range(len(configs)))
    ax.set_xticklabels([f"{t}\n{l}\n{n} reader(s)" for t, l, n in configs], fontsize=8)
    ax.set_title("kvstash bench store: reads into paged destinations, limits from the same run")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=120)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
