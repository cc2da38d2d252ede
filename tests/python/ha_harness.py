"""A real etcd and kvstash processes for the high-availability tests (docs/ha.md)."""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

SERVER = os.environ.get("KVS_SERVER_PATH", "kvstash-server")
ETCD = shutil.which("etcd") or "/usr/bin/etcd"
ETCDCTL = shutil.which("etcdctl") or "/usr/bin/etcdctl"


def free_port(host="127.0.0.1"):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def why_not_available():
    """None when the tests can run, else why they cannot (they then exit 77)."""
    if not os.path.exists(ETCD):
        return "etcd is not installed (Debian: etcd-server)"
    r = subprocess.run([SERVER, "--version"], capture_output=True, text=True)
    if "etcd yes" not in r.stdout:
        return "this kvstash build has no etcd support (libcurl and json-c)"
    return None


def has_test_hooks():
    r = subprocess.run([SERVER, "--version"], capture_output=True, text=True)
    return "test-hooks yes" in r.stdout


def wait_for(pred, timeout, what, step=0.01):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)
    raise AssertionError("timed out waiting for " + what)


class Etcd:
    """One etcd member with short raft timings (so leases may be 1 s), in a temporary dir.
    `netns`: run it inside that network namespace."""

    def __init__(self, host="127.0.0.1", netns=None, fast=True):
        self.dir = tempfile.mkdtemp(prefix="kvs-etcd-")
        self.host = host
        self.port = free_port() if netns is None else 2379
        peer = free_port() if netns is None else 2380
        self.endpoint = "%s:%d" % (host, self.port)
        cmd = [ETCD, "--data-dir", os.path.join(self.dir, "data"), "--name", "kvs",
               "--listen-client-urls", "http://%s" % self.endpoint,
               "--advertise-client-urls", "http://%s" % self.endpoint,
               "--listen-peer-urls", "http://%s:%d" % (host, peer),
               "--initial-advertise-peer-urls", "http://%s:%d" % (host, peer),
               "--initial-cluster", "kvs=http://%s:%d" % (host, peer)]
        if fast:
            cmd += ["--heartbeat-interval", "10", "--election-timeout", "100"]
        if netns:
            cmd = ["ip", "netns", "exec", netns] + cmd
        self.log = open(os.path.join(self.dir, "etcd.log"), "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(lambda: self.ctl("put", "/kvs-ready", "1", netns=netns).returncode == 0, 20,
                 "etcd to start")
        self.netns = netns

    def ctl(self, *args, netns=None):
        cmd = [ETCDCTL, "--endpoints", self.endpoint, *args]
        if netns or getattr(self, "netns", None):
            cmd = ["ip", "netns", "exec", netns or self.netns] + cmd
        return subprocess.run(cmd, capture_output=True, text=True,
                              env=dict(os.environ, ETCDCTL_API="3"))

    def leader(self, prefix):
        """The leader record ("HOST:PORT INCARNATION") under `prefix`, or None."""
        r = self.ctl("get", prefix + "/leader", "--print-value-only")
        v = r.stdout.strip()
        return v or None

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class Proc:
    """A kvstash-server process; its log is kept for the test's messages."""

    def __init__(self, args, env=None, netns=None, name="kvstash-server"):
        self.dir = tempfile.mkdtemp(prefix="kvs-ha-")
        self.port_file = os.path.join(self.dir, "port")
        self.log_path = os.path.join(self.dir, "log")
        self.log = open(self.log_path, "w")
        cmd = [SERVER, "--port-file", self.port_file, *args]
        if netns:
            cmd = ["ip", "netns", "exec", netns] + cmd
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, **(env or {})))
        self.name = name

    def port(self, timeout=20):
        def got():
            if self.proc.poll() is not None:
                raise AssertionError("%s exited: %s" % (self.name, self.text()))
            try:
                with open(self.port_file) as f:
                    return int(f.read().strip() or 0)
            except FileNotFoundError:
                return 0
        return wait_for(got, timeout, self.name + "'s port")

    def text(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def signal(self, sig):
        self.proc.send_signal(sig)

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def master(etcd, prefix, ttl=1, host="127.0.0.1", netns=None, extra=()):
    p = Proc(["--master-only", "--port", "0", "--bind", host, "--etcd", etcd.endpoint,
              "--etcd-prefix", prefix, "--etcd-ttl-s", str(ttl), *extra], netns=netns,
             name="master")
    p.port()
    return p


def owner(etcd, prefix, size="32MiB", host="127.0.0.1", netns=None, env=None, extra=()):
    p = Proc(["--owner-only", "--master", "etcd://" + etcd.endpoint, "--etcd-prefix", prefix,
              "--segment-size", size, "--bind", host, *extra], env=env, netns=netns,
             name="owner")
    p.port()
    return p
