"""A multi-host cluster on one machine (docs/ha.md): network namespaces joined by veth pairs to
a bridge, each "host" with its own address and its own shared-memory directory (hosts share no
files). etcd and a master-only candidate on host e, default-mode servers (master candidate and
owner) on h1 and h2, an owner-only server on h4, readers on h3 and on the owners' hosts:

- every server binds its non-loopback address (the embedded owner dials its own master there);
- tcp crosses hosts, shm is used on the same host and never across;
- prefer_alloc_in_same_node places by host;
- h1's link is cut mid-read: its keys fail within their deadline or come from another replica,
  never with wrong bytes.

Run directly as root (python3 test_multihost.py); exits 77 where namespaces cannot be made or
etcd is missing."""
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

import ha_harness as H

TAG = "%04x" % (os.getpid() % 0xFFFF)
NET = "10.%d.%d" % (200 + os.getpid() % 50, (os.getpid() // 50) % 250)
HOSTS = {"e": NET + ".1", "h1": NET + ".11", "h2": NET + ".12", "h3": NET + ".13",
         "h4": NET + ".14"}
BRIDGE = "kvb" + TAG
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multihost_worker.py")


def ns(host):
    return "kv%s%s" % (TAG, host)


def veth(host):
    return "kv%s%sa" % (TAG, host)


def sh(*cmd, check=True):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError("%s: %s" % (" ".join(cmd), r.stderr.strip()))
    return r


def net_up():
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "link", "set", BRIDGE, "up")
    for h, addr in HOSTS.items():
        sh("ip", "netns", "add", ns(h))
        sh("ip", "link", "add", veth(h), "type", "veth", "peer", "name", "kv%s%sb" % (TAG, h))
        sh("ip", "link", "set", "kv%s%sb" % (TAG, h), "netns", ns(h))
        sh("ip", "link", "set", veth(h), "master", BRIDGE)
        sh("ip", "link", "set", veth(h), "up")
        sh("ip", "-n", ns(h), "addr", "add", addr + "/24", "dev", "kv%s%sb" % (TAG, h))
        sh("ip", "-n", ns(h), "link", "set", "kv%s%sb" % (TAG, h), "up")
        sh("ip", "-n", ns(h), "link", "set", "lo", "up")


def net_down():
    for h in HOSTS:
        sh("ip", "netns", "del", ns(h), check=False)
    sh("ip", "link", "del", BRIDGE, check=False)


def why_not_available():
    why = H.why_not_available()
    if why:
        return why
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return "needs root and iproute2 to make network namespaces"
    try:
        net_up()
        r = sh("ip", "netns", "exec", ns("h3"), "ping", "-c", "1", "-W", "2", HOSTS["e"],
               check=False) if shutil.which("ping") else None
        if r is not None and r.returncode != 0:
            return "namespaces made, but the bridge does not pass traffic"
    except RuntimeError as e:
        return "cannot make network namespaces: %s" % e
    finally:
        net_down()
    return None


class MultiHostTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        net_up()
        cls.dir = tempfile.mkdtemp(prefix="kvs-mh-")
        cls.token = os.path.join(cls.dir, "token")
        with open(os.open(cls.token, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(secrets.token_hex(32))
        cls.shm = {}
        for h in HOSTS:
            cls.shm[h] = os.path.join(cls.dir, "shm-" + h)
            os.mkdir(cls.shm[h], 0o700)  # owners listen only in a directory of their own
        cls.procs = []
        try:
            cls.etcd = H.Etcd(host=HOSTS["e"], netns=ns("e"))
            cls.etcd_ep = cls.etcd.endpoint
            common = ["--auth-token-file", cls.token, "--etcd-ttl-s", "1", "--log-level", "info",
                      "--heartbeat-timeout-ms", "2000"]
            # The master-only candidate on e first: it leads, so cutting h1 cuts an owner only.
            cls.start(H.Proc(["--master-only", "--bind", HOSTS["e"], "--port", "50051",
                              "--etcd", cls.etcd_ep, *common], netns=ns("e"), name="e master",
                             env={"KVS_SHM_DIR": cls.shm["e"]}))
            H.wait_for(lambda: cls.etcd.leader("/kvstash"), 10, "a leader")
            for h in ("h1", "h2"):
                cls.start(H.Proc(["--bind", HOSTS[h], "--port", "50051", "--etcd", cls.etcd_ep,
                                  "--node", h, "--segment-size", "64MiB", *common],
                                 netns=ns(h), name=h, env={"KVS_SHM_DIR": cls.shm[h]}))
            cls.start(H.Proc(["--owner-only", "--master", "etcd://" + cls.etcd_ep,
                              "--bind", HOSTS["h4"], "--node", "h4", "--segment-size", "64MiB",
                              "--auth-token-file", cls.token], netns=ns("h4"), name="h4",
                             env={"KVS_SHM_DIR": cls.shm["h4"]}))
        except Exception:
            cls.tearDownClass()
            raise

    @classmethod
    def start(cls, p):
        cls.procs.append(p)
        p.port()

    @classmethod
    def tearDownClass(cls):
        for p in cls.procs:
            p.stop()
        if getattr(cls, "etcd", None):
            cls.etcd.stop()
        net_down()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def worker(self, host, *args, background=False, timeout=120):
        env = dict(os.environ, KVS_SHM_DIR=self.shm[host], KVS_AUTH_TOKEN_FILE=self.token,
                   KVS_TRANSFER_TIMEOUT_MS="1000", KVS_LOG_LEVEL="error")
        cmd = ["ip", "netns", "exec", ns(host), sys.executable, WORKER,
               "--master", "etcd://" + self.etcd_ep, "--node", host, *args]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)
        if background:
            return p
        return self.result(p, timeout)

    def result(self, p, timeout=120):
        out, err = p.communicate(timeout=timeout)
        self.assertEqual(p.returncode, 0, err[-2000:])
        return json.loads(out.strip().splitlines()[-1])

    def test_1_tcp_across_hosts_shm_on_one(self):
        r = self.worker("h3", "--mode", "put", "--keys", "x:24:262144")
        self.assertEqual(r["rc"], [0] * 24)
        nodes = {n for v in r["nodes"].values() for n in v}
        self.assertTrue(nodes <= {"h1", "h2", "h4"} and len(nodes) >= 2, nodes)
        r = self.worker("h3", "--mode", "get", "--keys", "x:24:262144")
        self.assertEqual((r["ok"], r["bad"], r["err"]), (24, 0, 0))
        self.assertGreater(r["stats"]["tcp_transfers"], 0)
        self.assertEqual(r["stats"]["shm_transfers"], 0)  # no owner on h3
        # Same-node placement groups by host; reads on that host go through shared memory.
        for h in ("h1", "h2", "h4"):
            r = self.worker(h, "--mode", "put", "--same-node", "--keys", "s%s:8:65536" % h)
            self.assertEqual(r["rc"], [0] * 8)
            self.assertEqual({n for v in r["nodes"].values() for n in v}, {h}, r["nodes"])
            r = self.worker(h, "--mode", "get", "--keys", "s%s:8:65536" % h)
            self.assertEqual((r["ok"], r["bad"], r["err"]), (8, 0, 0))
            self.assertEqual(r["stats"]["shm_transfers"], 8)
            self.assertEqual(r["stats"]["tcp_transfers"], 0)
        # From h1, h2's objects come over tcp, never shm.
        r = self.worker("h1", "--mode", "get", "--keys", "sh2:8:65536")
        self.assertEqual((r["ok"], r["bad"], r["err"]), (8, 0, 0))
        self.assertEqual(r["stats"]["shm_transfers"], 0)
        self.assertEqual(r["stats"]["tcp_transfers"], 8)

    def test_2_link_cut_mid_read(self):
        r = self.worker("h3", "--mode", "put", "--replicas", "2", "--keys", "r:12:131072")
        self.assertEqual(r["rc"], [0] * 12)
        put = self.worker("h1", "--mode", "put", "--same-node", "--keys", "c:12:131072")
        self.assertEqual(put["rc"], [0] * 12)
        loop = self.worker("h3", "--mode", "loop", "--seconds", "8",
                           "--keys", "r:12:131072,c:12:131072", background=True)
        time.sleep(1.5)
        cut = time.monotonic()
        sh("ip", "link", "set", veth("h1"), "down")
        try:
            res = self.result(loop, timeout=120)
        finally:
            sh("ip", "link", "set", veth("h1"), "up")
        reads = res["reads"]
        wrong = [x for x in reads if x[3] == "wrong"]
        self.assertEqual(wrong, [], "wrong bytes returned as success")
        # Before the cut everything read; after it, h1's only copies fail, each within its
        # deadline (transfer 1 s, plus the master call), and doubly placed keys still read.
        errs = [x for x in reads if x[3] == "err"]
        self.assertTrue(errs, "the cut affected no read")
        self.assertTrue(all(x[2] < 7.0 for x in errs), max(x[2] for x in errs))
        first_err = min(x[1] for x in errs)
        r_after = [x for x in reads if x[0].startswith("r-") and x[1] > first_err]
        self.assertTrue(r_after)
        self.assertTrue(all(x[3] == "ok" for x in r_after),
                        [x for x in r_after if x[3] != "ok"][:5])
        c_after = [x for x in reads if x[0].startswith("c-") and x[1] > first_err + 2]
        self.assertTrue(c_after and all(x[3] == "err" for x in c_after))
        print("\nlink cut: %d reads, %d failed (slowest failure %.2f s), none wrong" %
              (len(reads), len(errs), max(x[2] for x in errs)))
        del cut


if __name__ == "__main__":
    why = why_not_available()
    if why:
        print("skipped: " + why)
        sys.exit(77)
    unittest.main(verbosity=2)
