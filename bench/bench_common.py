"""What the Python benchmarks share: size arguments, the example's server start-up, and clients
opened with a given MC_STORE_GPU_STAGING setting."""
import argparse
import os
import sys

import kvstash

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from paged_kv_cache import start_server  # noqa: E402,F401  (re-exported)


def size(text):
    """An argparse type: '12MiB' and the like, as kvstash parses sizes."""
    v = kvstash._kvstash._parse_size(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"not a size: {text}")
    return v


def open_store(master, staging, protocol):
    """A client of `master` over `protocol` with MC_STORE_GPU_STAGING=staging ('0', '1', 'auto';
    read at setup)."""
    os.environ["MC_STORE_GPU_STAGING"] = staging
    store = kvstash.MooncakeDistributedStore()
    rc = store.setup("localhost", "", 0, 0, protocol, "", master)
    os.environ.pop("MC_STORE_GPU_STAGING", None)
    if rc != 0:
        raise RuntimeError(f"setup failed: {rc}")
    return store
