"""What the Python tests share: a real kvstash-server, plain memory with addresses, patterns."""
import ctypes
import os
import subprocess
import tempfile
import time

SERVER = os.environ.get("KVS_SERVER_PATH", "kvstash-server")
GUARD = 0x5A


def pattern(key: str, size: int, salt: int = 0) -> bytes:
    seed = (sum(key.encode()) + salt * 101) % 251
    return bytes((seed + i * 7) % 256 for i in range(size))


def read_text(path):
    with open(path) as f:
        return f.read().strip()


class Server:
    """kvstash-server (owner + embedded master) on a free port."""

    def __init__(self, segment="64MiB", extra=(), metrics_port=None):
        self.dir = tempfile.TemporaryDirectory()
        port_file = os.path.join(self.dir.name, "port")
        # Tests run side by side: none takes the default metrics port unless it asks for one.
        metrics = ["--no-metrics"] if metrics_port is None else ["--metrics-port",
                                                                 str(metrics_port)]
        self.proc = subprocess.Popen(
            [SERVER, "--port", "0", "--port-file", port_file, "--segment-size", segment,
             "--log-level", "error", *metrics, *extra], stdout=subprocess.DEVNULL)
        for _ in range(500):
            if os.path.exists(port_file) and read_text(port_file):
                break
            if self.proc.poll() is not None:
                raise RuntimeError("kvstash-server exited")
            time.sleep(0.01)
        self.master = "127.0.0.1:" + read_text(port_file)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)
        self.dir.cleanup()


class Buffer:
    """Plain memory with its address, filled with guard bytes."""

    def __init__(self, size):
        self.mem = ctypes.create_string_buffer(bytes([GUARD]) * size, size)
        self.ptr = ctypes.addressof(self.mem)
        self.size = size

    def bytes(self, off, n):
        return ctypes.string_at(self.ptr + off, n)

    def write(self, off, data):
        ctypes.memmove(self.ptr + off, data, len(data))

    def fill(self, value=GUARD):
        ctypes.memset(self.ptr, value, self.size)
