"""Monitoring with a real Prometheus (Debian's prometheus package): it scrapes a kvstash-server
(master and owner on one --metrics-port) and a Python client (enable_client_http_server), and
after a known workload the values it stored, read back through its HTTP API, must equal the
workload's counts. `promtool check metrics` must accept every endpoint's text.

Exits 77 (skipped) without prometheus and promtool, or when this build has no metrics endpoint
(libmicrohttpd)."""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import kvstash
from kvs_harness import SERVER, Server, pattern

SIZE = 40000  # one data request per key (below the data chunk)
NKEYS = 7
SCRAPE_S = 1
WAIT_S = float(os.environ.get("KVS_TEST_PROMETHEUS_WAIT_S", "60"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fetch(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def promql(base, query):
    """The instant vector of `query`, as {frozenset(labels): value}."""
    url = base + "/api/v1/query?" + urllib.parse.urlencode({"query": query})
    body = json.loads(fetch(url))
    if body.get("status") != "success":
        raise RuntimeError(f"prometheus query {query!r} failed: {body}")
    out = {}
    for r in body["data"]["result"]:
        labels = {k: v for k, v in r["metric"].items() if k not in ("__name__", "instance")}
        out[frozenset(labels.items())] = float(r["value"][1])
    return out


class Prometheus:
    def __init__(self, targets):
        self.dir = tempfile.mkdtemp(prefix="kvs-prom-")
        self.port = free_port()
        cfg = os.path.join(self.dir, "prometheus.yml")
        jobs = "".join(
            f"  - job_name: {job}\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
            for job, port in targets.items())
        with open(cfg, "w") as f:
            f.write(f"global:\n  scrape_interval: {SCRAPE_S}s\n  scrape_timeout: {SCRAPE_S}s\n"
                    f"scrape_configs:\n{jobs}")
        self.log = open(os.path.join(self.dir, "log"), "w")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={self.dir}/data",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                if "Ready" in fetch(self.base + "/-/ready", timeout=1):
                    break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("prometheus did not become ready:\n" + self.tail())
            time.sleep(0.2)

    def tail(self):
        self.log.flush()
        with open(os.path.join(self.dir, "log")) as f:
            return "".join(f.readlines()[-20:])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def check_promtool(name, text):
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                       text=True)
    print(f"promtool check metrics ({name}): rc {r.returncode} {r.stdout.strip()} "
          f"{r.stderr.strip()}")
    assert r.returncode == 0, f"promtool rejects the {name} endpoint: {r.stdout}{r.stderr}"


def main():
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            print(f"SKIP: {tool} not found (Debian package prometheus)")
            return 77
    features = subprocess.run([SERVER, "--version"], capture_output=True, text=True).stdout
    if "metrics yes" not in features:
        print("SKIP: this kvstash-server has no metrics endpoint (libmicrohttpd)")
        return 77

    # A same-host socket directory of this test's own: other tests' clients sweep the shared
    # one (connecting to every owner's socket), which the owner's counters would see.
    shm_dir = tempfile.mkdtemp(prefix="kvs-mon-shm-")
    os.environ["KVS_SHM_DIR"] = shm_dir
    server_port, client_port = free_port(), free_port()
    srv = Server(segment="64MiB", metrics_port=server_port)
    store = prom = None
    try:
        store = kvstash.MooncakeDistributedStore()
        # tcp only: every byte goes through the owner, so its counters see the workload.
        rc = store.setup("localhost", "", 0, "16MB", "tcp", "", srv.master,
                         enable_client_http_server=True, client_http_port=client_port)
        assert rc == 0, f"setup: {rc}"
        assert store.metrics_port() == client_port, store.metrics_port()

        # A second store cannot take the same port: a warning, and the store still works.
        other = kvstash.MooncakeDistributedStore()
        import warnings
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            rc = other.setup("localhost", "", 0, "16MB", "tcp", "", srv.master,
                             enable_client_http_server=True, client_http_port=client_port)
        assert rc == 0 and other.metrics_port() == 0, (rc, other.metrics_port())
        assert any("metrics" in str(x.message) for x in w), [str(x.message) for x in w]
        other.close()

        # A client with a segment of its own is its owner: its endpoint has the owner metrics.
        seg_port = free_port()
        holder = kvstash.MooncakeDistributedStore()
        assert holder.setup("localhost", "", "32MB", "16MB", "tcp", "", srv.master,
                            enable_client_http_server=True, client_http_port=seg_port) == 0
        holder_text = fetch(f"http://127.0.0.1:{seg_port}/metrics")
        check_promtool("client with a segment", holder_text)
        owned = [l for l in holder_text.splitlines()
                 if l.startswith("kvstash_owner_segment_bytes{")]
        assert len(owned) == 1 and owned[0].endswith(f" {32 * 1000 * 1000}"), owned
        holder.close()

        prom = Prometheus({"kvstash_server": server_port, "kvstash_client": client_port})

        # The workload: NKEYS puts, each read back alone, then one batch of 3 keys, one
        # lookup of an absent key, two exists calls.
        keys = [f"mon-{i}" for i in range(NKEYS)]
        for k in keys:
            assert store.put(k, pattern(k, SIZE)) == 0
        for k in keys:
            assert store.get(k) == pattern(k, SIZE), k
        batch = store.get_batch(keys[:3])
        assert [bytes(b) for b in batch] == [pattern(k, SIZE) for k in keys[:3]]
        assert store.get("mon-absent") == b""
        assert store.is_exist(keys[0]) == 1 and store.is_exist("mon-absent") == 0
        reads = NKEYS + 3  # keys read with success
        # get() and get_batch() ask the sizes first (one lookup per key), then read (another):
        # the absent key ends at its size, with no read call.
        lookups_hit = 2 * reads
        read_calls = NKEYS + 1  # single gets and the batch
        s = store.get_stats()
        print("client get_stats:", {k: v for k, v in s.items() if v and "latency" not in k})

        # Each endpoint's text, as Prometheus sees it.
        server_text = fetch(f"http://127.0.0.1:{server_port}/metrics")
        client_text = fetch(f"http://127.0.0.1:{client_port}/metrics")
        check_promtool("master+owner", server_text)
        check_promtool("client", client_text)

        seg = frozenset({("job", "kvstash_server")})
        cli = frozenset({("job", "kvstash_client")})

        def lab(base, **kw):
            return frozenset(set(base) | set(kw.items()))

        expect = [
            # master
            ("kvstash_master_objects", {seg: NKEYS}),
            ("kvstash_master_segments", {seg: 1}),  # the holder's segment went with it
            ("kvstash_master_puts_started_total", {seg: NKEYS}),
            ("kvstash_master_puts_ended_total", {seg: NKEYS}),
            ("kvstash_master_lookup_hits_total", {seg: lookups_hit}),
            ("kvstash_master_leases_granted_total", {seg: lookups_hit}),
            ("sum(kvstash_master_segment_capacity_bytes)", {frozenset(): 64 << 20}),
            # owner (tcp: every put is a write, every successful key read a read)
            ('kvstash_owner_requests_total{op="write"}', None),
            ('kvstash_owner_served_bytes_total{op="read"}', None),
            # client
            ("kvstash_client_put_calls_total", {cli: NKEYS}),
            ("kvstash_client_put_bytes_total", {cli: NKEYS * SIZE}),
            ("kvstash_client_get_calls_total", {cli: read_calls}),
            ("kvstash_client_get_bytes_total", {cli: reads * SIZE}),
            ("sum(kvstash_client_reads_total)", {frozenset(): read_calls}),
            ('kvstash_client_transfers_total{transport="tcp"}',
             {lab(cli, transport="tcp"): NKEYS + reads}),
            ("kvstash_client_get_latency_seconds_count", {cli: read_calls}),
            ("kvstash_client_exists_calls_total", {cli: 2}),
            ("up", {seg: 1, cli: 1}),  # the latest scrape of each target succeeded
        ]
        owner_get = lambda q: {frozenset(l for l in k if l[0] not in ("owner",)): v
                               for k, v in promql(prom.base, q).items()}
        expect_owner = {
            'kvstash_owner_requests_total{op="write"}':
                {lab(seg, transport="tcp", op="write"): NKEYS},
            'kvstash_owner_served_bytes_total{op="read"}':
                {lab(seg, transport="tcp", op="read"): reads * SIZE},
            'kvstash_owner_requests_total{op="read"}':
                {lab(seg, transport="tcp", op="read"): reads},
        }

        # Scrapes come every second: wait until every value has caught up, or fail with both.
        deadline = time.monotonic() + WAIT_S
        while True:
            got, bad = {}, []
            for q, want in expect:
                if want is None:
                    continue
                got[q] = promql(prom.base, q)
                if got[q] != want:
                    bad.append((q, want, got[q]))
            for q, want in expect_owner.items():
                got[q] = owner_get(q)
                if want is not None and got[q] != want:
                    bad.append((q, want, got[q]))
            if not bad:
                break
            if time.monotonic() > deadline:
                for q, want, g in bad:
                    print(f"MISMATCH {q}: want {want}, prometheus has {g}")
                print(prom.tail())
                return 1
            time.sleep(0.5)
        for q, v in got.items():
            print(f"prometheus: {q} = {sorted((str(sorted(k)), x) for k, x in v.items())}")
        # Every label of the owner names it; the master's per-segment usage names the segment.
        seg_used = promql(prom.base, "kvstash_master_segment_used_bytes")
        assert len(seg_used) == 1 and next(iter(seg_used.values())) >= NKEYS * SIZE, seg_used
        names = [dict(k).get("segment") for k in seg_used]
        assert names[0], seg_used
        # The client keeps its tcp connections to the owner open between calls.
        conns = promql(prom.base, 'kvstash_owner_connections{transport="tcp"}')
        assert len(conns) == 1 and next(iter(conns.values())) >= 1, conns
        refused = promql(prom.base, "kvstash_owner_refusals_total > 0")
        assert refused == {}, f"refusals by reason: {refused}"
        hist = promql(prom.base, 'kvstash_client_get_latency_seconds_bucket{le="+Inf"}')
        assert list(hist.values()) == [read_calls], hist
        print("monitoring: every scraped value equals the workload's count")
        return 0
    finally:
        if prom is not None:
            prom.stop()
        if store is not None:
            store.close()
        srv.stop()
        shutil.rmtree(shm_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
