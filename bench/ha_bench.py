"""High availability's figures (docs/ha.md), on one machine with a real etcd:

  failover  kill -9 of the leader master, with default settings (etcd's own defaults, a 2 s
            lease): the time until a client's next call succeeds, over --trials trials;
  puts      single puts of --put-size bytes against a store whose master leads through etcd,
            and against the same store alone: what the owners' index costs a put.

usage: PYTHONPATH=build/python KVS_SERVER_PATH=build/kvstash-server python3 bench/ha_bench.py
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "python"))
import ha_harness as H  # noqa: E402

from kvstash import MooncakeDistributedStore  # noqa: E402


def client(master):
    st = MooncakeDistributedStore()
    rc = st.setup("localhost", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", master)
    if rc != 0:
        raise SystemExit("setup failed: %d" % rc)
    st.is_exist("warm-up")
    return st


def failover(etcd, trials, ttl):
    times = []
    for t in range(trials):
        pfx = "/kvs-bench-%d-%d" % (os.getpid(), t)
        ms = [H.master(etcd, pfx, ttl=ttl) for _ in range(2)]
        port = H.wait_for(lambda: etcd.leader(pfx), 10, "a leader").split()[0].rsplit(":", 1)[1]
        ow = H.owner(etcd, pfx)
        st = client("etcd://%s%s" % (etcd.endpoint, pfx))
        data = {"k%d" % i: os.urandom(65536) for i in range(64)}
        for k, v in data.items():
            assert st.put(k, v) == 0
        leader = [m for m in ms if str(m.port()) == port][0]
        t0 = time.monotonic()
        leader.kill9()
        assert st.get("k0") == data["k0"]
        took = time.monotonic() - t0
        assert all(st.get(k) == v for k, v in data.items())
        times.append(took)
        print("  trial %d: %.3f s" % (t + 1, took), flush=True)
        st.close()
        for p in ms + [ow]:
            p.stop()
    return times


def puts(master, n, size):
    st = client(master)
    v = os.urandom(size)
    lat = []
    for i in range(n):
        t0 = time.perf_counter()
        assert st.put("p%d" % i, v) == 0
        lat.append(time.perf_counter() - t0)
    st.close()
    return statistics.median(lat) * 1e6, sorted(lat)[int(0.99 * n)] * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--ttl", type=int, default=2, help="the leader's lease TTL, seconds")
    ap.add_argument("--puts", type=int, default=3000)
    ap.add_argument("--put-size", type=int, default=16384)
    ap.add_argument("--fast-etcd", action="store_true",
                    help="etcd with --heartbeat-interval 10 --election-timeout 100, so that a "
                         "1 s lease is possible (etcd raises shorter ones to 1.5x its election "
                         "time-out)")
    a = ap.parse_args()
    why = H.why_not_available()
    if why:
        raise SystemExit("cannot run: " + why)
    etcd = H.Etcd(fast=a.fast_etcd)  # etcd's defaults: the lease TTL is at least 2 s
    try:
        print("failover, lease TTL %d s, etcd %s:" %
              (a.ttl, "fast timings" if a.fast_etcd else "defaults"))
        ts = failover(etcd, a.trials, a.ttl)
        print("failover: median %.3f s, min %.3f s, max %.3f s over %d trials" %
              (statistics.median(ts), min(ts), max(ts), len(ts)))
        rows = []
        for name, extra in (("alone", []), ("etcd", ["--etcd", etcd.endpoint,
                                                     "--etcd-prefix", "/kvs-bench-puts"])):
            p = H.Proc(["--port", "0", "--segment-size", "256MiB", *extra], name=name)
            port = p.port()
            master = ("etcd://%s/kvs-bench-puts" % etcd.endpoint) if extra else \
                "127.0.0.1:%d" % port
            med, p99 = puts(master, a.puts, a.put_size)
            rows.append((name, med, p99))
            p.stop()
        for name, med, p99 in rows:
            print("put %d B (%s): median %.1f us, p99 %.1f us over %d puts" %
                  (a.put_size, name, med, p99, a.puts))
        print("put median ratio etcd/alone: %.2f" % (rows[1][1] / rows[0][1]))
    finally:
        etcd.stop()


if __name__ == "__main__":
    main()
