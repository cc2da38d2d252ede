"""One client process of the multi-host test, run inside a network namespace ("host"):
puts or reads keys with contents derived from their names and prints a JSON summary."""
import argparse
import hashlib
import json
import sys
import time

from kvstash import MooncakeDistributedStore, ReplicateConfig


def content(key, size):
    d = hashlib.sha256(key.encode()).digest()
    return (d * (size // len(d) + 1))[:size]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--master", required=True)
    ap.add_argument("--node", required=True)
    ap.add_argument("--protocol", default="auto")
    ap.add_argument("--mode", choices=["put", "get", "loop"], required=True)
    ap.add_argument("--keys", required=True, help="PREFIX:N:SIZE[,...]")
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--same-node", action="store_true")
    ap.add_argument("--seconds", type=float, default=0)
    a = ap.parse_args()
    st = MooncakeDistributedStore()
    rc = st.setup(a.node, "P2PHANDSHAKE", 0, 16 << 20, a.protocol, "", a.master)
    if rc != 0:
        print(json.dumps({"setup": rc}))
        return 1
    groups = []
    for spec in a.keys.split(","):
        p, n, size = spec.split(":")
        groups.append([("%s-%d" % (p, i), int(size)) for i in range(int(n))])
    # Interleaved (a0, b0, a1, b1, ...): a loop meets every group early.
    keys = [k for row in __import__("itertools").zip_longest(*groups) for k in row if k]
    out = {"setup": 0}
    if a.mode == "put":
        cfg = ReplicateConfig()
        cfg.replica_num = a.replicas
        cfg.prefer_alloc_in_same_node = a.same_node
        out["rc"] = [st.put(k, content(k, n), cfg) for k, n in keys]
        out["nodes"] = {k: sorted(r.node for r in st.get_replica_desc(k)) for k, _ in keys}
    elif a.mode == "get":
        ok = bad = err = 0
        for k, n in keys:
            v = st.get(k)
            if v == content(k, n):
                ok += 1
            elif v:
                bad += 1
            else:
                err += 1
        out.update(ok=ok, bad=bad, err=err)
    else:
        reads = []
        end = time.monotonic() + a.seconds
        t0 = time.monotonic()
        while time.monotonic() < end:
            for k, n in keys:
                s = time.monotonic()
                v = st.get(k)
                e = time.monotonic()
                r = "ok" if v == content(k, n) else ("wrong" if v else "err")
                reads.append([k, round(s - t0, 3), round(e - s, 3), r])
        out["reads"] = reads
    out["stats"] = {k: v for k, v in st.get_stats().items() if isinstance(v, int)}
    st.close()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
