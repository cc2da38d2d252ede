"""kvstash: a distributed object store for LLM KV cache.

`MooncakeDistributedStore` follows Mooncake's store API (method names, argument order and
defaults, return conventions), so code written for `mooncake.store` switches by its import:

    from kvstash import MooncakeDistributedStore, ReplicateConfig

The data paths live in the native module `kvstash._kvstash`; this file holds Mooncake's
conventions where they are plain Python (setup's argument rules, the small descriptor types) and
the methods whose cost is one call into the native store. README.md has a table of every method
of Mooncake's binding and its status here.
"""
import ctypes
import enum
import logging
import mmap
import socket
import threading

from . import _kvstash
from . import _tensor
from ._pool import (BufferLease, BufferLeaseView, BufferPool, RegisteredBufferLease,
                    RegisteredBufferLeaseView, RegisteredBufferPool)
from ._kvstash import BufferHandle, __version__

__all__ = [
    "page_region",
    "BufferHandle",
    "BufferLease",
    "BufferLeaseView",
    "BufferPool",
    "Descriptor",
    "DiskDescriptor",
    "MemoryDescriptor",
    "MooncakeDistributedStore",
    "MooncakeHostMemAllocator",
    "RegisteredBufferLease",
    "RegisteredBufferLeaseView",
    "RegisteredBufferPool",
    "ReplicaDescriptor",
    "ReplicaStatus",
    "ReplicateConfig",
    "SoftPinAction",
    "__version__",
]

log = logging.getLogger("kvstash")

# Mooncake's ErrorCode numbers for the codes this file returns itself.
INVALID_PARAMS = -600

DEFAULT_MASTER = "127.0.0.1:50051"
DEFAULT_SIZE = 16 * 1024 * 1024


class SoftPinAction(enum.IntEnum):
    """What a put does to the object's soft pin (Mooncake's numbers)."""

    PRESERVE = 0  # keep the pin the key has (none for a new key)
    ENABLE = 1  # pin for soft_pin_ttl_ms (None: the master's default; 0 clears the pin)
    DISABLE = 2  # clear the pin


class ReplicaStatus(enum.IntEnum):
    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


class ReplicateConfig:
    """Placement of a put (Mooncake's fields; `ReplicateConfig()` gives the defaults).

    kvstash keeps objects in memory only: `nof_replica_num` and `dfs_replica_num` must stay 0
    (other tiers), and `data_type` is accepted and ignored. `with_soft_pin` is the older
    bindings' name for `soft_pin_action = ENABLE`.
    """

    def __init__(self, replica_num=1, preferred_segment="", prefer_alloc_in_same_node=False,
                 *, preferred_segments=None, soft_pin_action=SoftPinAction.PRESERVE,
                 soft_pin_ttl_ms=None, with_hard_pin=False, group_ids=None, nof_replica_num=0,
                 dfs_replica_num=0, preferred_nof_segments=None, data_type=0):
        self.replica_num = replica_num
        self.preferred_segment = preferred_segment
        self.prefer_alloc_in_same_node = prefer_alloc_in_same_node
        self.preferred_segments = [] if preferred_segments is None else preferred_segments
        self.soft_pin_action = soft_pin_action
        self.soft_pin_ttl_ms = soft_pin_ttl_ms
        self.with_hard_pin = with_hard_pin
        self.group_ids = group_ids
        self.nof_replica_num = nof_replica_num
        self.dfs_replica_num = dfs_replica_num
        self.preferred_nof_segments = [] if preferred_nof_segments is None else \
            preferred_nof_segments
        self.data_type = data_type

    @property
    def with_soft_pin(self):
        return self.soft_pin_action == SoftPinAction.ENABLE

    @with_soft_pin.setter
    def with_soft_pin(self, on):
        self.soft_pin_action = SoftPinAction.ENABLE if on else SoftPinAction.PRESERVE

    def __repr__(self):
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"ReplicateConfig({fields})"

    __str__ = __repr__


_kvstash._register_config(ReplicateConfig)


class Descriptor:
    """Where one replica's bytes are: its size, offset in the owner's segment and endpoint."""

    def __init__(self, size=0, buffer_address=0, transport_endpoint=""):
        self.size = size
        self.buffer_address = buffer_address
        self.transport_endpoint = transport_endpoint

    def __repr__(self):
        return (f"<Descriptor size={self.size} buffer_address={self.buffer_address} "
                f"transport_endpoint={self.transport_endpoint}>")


class MemoryDescriptor:
    def __init__(self, buffer_descriptor):
        self.buffer_descriptor = buffer_descriptor

    def __repr__(self):
        return f"<MemoryDescriptor {self.buffer_descriptor!r}>"


class DiskDescriptor:
    def __init__(self, file_path="", object_size=0):
        self.file_path = file_path
        self.object_size = object_size


class ReplicaDescriptor:
    """One complete replica of an object. kvstash keeps memory replicas only.

    Beyond Mooncake's accessors it names the segment (`segment_name`) and its node (`node`).
    """

    def __init__(self, segment_name, endpoint, node, offset, size):
        self._memory = MemoryDescriptor(Descriptor(size, offset, endpoint))
        self.segment_name = segment_name
        self.node = node

    @property
    def status(self):
        return ReplicaStatus.COMPLETE

    def is_memory_replica(self):
        return True

    def is_disk_replica(self):
        return False

    def is_local_disk_replica(self):
        return False

    def get_memory_descriptor(self):
        return self._memory

    def get_disk_descriptor(self):
        raise RuntimeError("kvstash keeps memory replicas only: this replica has no disk "
                           "descriptor")

    def __repr__(self):
        d = self._memory.buffer_descriptor
        return (f"<ReplicaDescriptor memory segment={self.segment_name!r} "
                f"endpoint={d.transport_endpoint!r} size={d.size}>")


class MooncakeHostMemAllocator:
    """Host memory for a store set up with `setup_dummy` (SGLang's standalone mode).

    Regions are shared anonymous mappings, page aligned; any host memory can be registered
    with kvstash, so they need nothing else. `alloc` raises RuntimeError when the system has
    no memory for the region (as Mooncake's does); `free` returns 0, or -1 for an address it
    did not allocate.
    """

    def __init__(self):
        self._regions = {}
        self._lock = threading.Lock()

    def alloc(self, size, /):
        if not isinstance(size, int) or size <= 0:
            raise RuntimeError(f"MooncakeHostMemAllocator.alloc: size must be a positive int, "
                               f"not {size!r}")
        try:
            region = mmap.mmap(-1, size, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
        except OSError as e:
            raise RuntimeError(f"MooncakeHostMemAllocator.alloc({size}): {e}") from None
        view = ctypes.c_char.from_buffer(region)
        addr = ctypes.addressof(view)
        del view  # the export would keep the region from being closed
        with self._lock:
            self._regions[addr] = region
        return addr

    def free(self, ptr, /):
        with self._lock:
            region = self._regions.pop(ptr, None)
        if region is None:
            return -1
        region.close()
        return 0


def page_region(tensor):
    """The (base, page_bytes, stride, npages) region of a paged KV tensor whose first dimension
    indexes pages (one layer's pool, say shape (num_pages, 16, heads, head_dim)): for
    batch_get_into_pages and batch_put_from_pages. Each page must be contiguous."""
    if not hasattr(tensor, "data_ptr") or tensor.dim() < 1 or tensor.shape[0] < 1:
        raise ValueError("page_region wants a tensor of at least one page")
    page = tensor[0]
    if not page.is_contiguous():
        raise ValueError("page_region: a page (tensor[i]) must be contiguous")
    esize = tensor.element_size()
    return (tensor.data_ptr(), page.numel() * esize, tensor.stride(0) * esize, tensor.shape[0])


def _page_ids(ids):
    """CPU torch tensors as numpy views (no copy): the native call reads any integer buffer."""
    if hasattr(ids, "numpy") and hasattr(ids, "device"):
        if ids.device.type != "cpu":
            raise ValueError("page_ids must be on the CPU (the host plans the reads)")
        return ids.contiguous().numpy()
    if isinstance(ids, (list, tuple)):
        return [_page_ids(i) if hasattr(i, "device") else i for i in ids]
    return ids


def _size(value, what):
    """A size argument (int, or a string such as '16MB' or '4GiB') as an int, or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str):
        n = _kvstash._parse_size(value)
        return n if n >= 0 else None
    raise TypeError(f"setup: {what} must be an int or a size string, not "
                    f"{type(value).__name__}")


def _flag(value):
    """A dict value read as a bool the way Mooncake reads strings ('true', '1', 'yes')."""
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def _refuse(why):
    log.warning("kvstash setup: %s", why)
    return INVALID_PARAMS


class MooncakeDistributedStore(_kvstash.MooncakeDistributedStore):
    """A kvstash store client with Mooncake's API. Call setup() first.

    Integer results: >= 0 success, negative codes with Mooncake's numbers (-200 store full,
    -600 invalid parameters, -703 not ready, -704 object not found, -706 leased, -707 lease
    expired, -800 transfer failed, -900 RPC failed). Calls before setup() return -600 (or the
    empty value of their type) instead of failing.
    """

    def setup(self, local_hostname, metadata_server=None, global_segment_size=DEFAULT_SIZE,
              local_buffer_size=DEFAULT_SIZE, protocol="tcp", rdma_devices="",
              master_server_addr=DEFAULT_MASTER, engine=None, enable_ssd_offload=False,
              ssd_offload_path="", tenant_id="default", enable_client_http_server=False,
              client_http_port=9300):
        """Connects to the master; global_segment_size > 0 also mounts a segment this process
        serves (it is an owner too). Returns 0 or a negative code, never raising for bad
        values (wrong types raise TypeError, as Mooncake's binding does).

        setup(config: dict) takes Mooncake's keys: local_hostname and metadata_server are
        required; global_segment_size, local_buffer_size, protocol, rdma_devices (or
        device_name), master_server_addr (or master_server_address), tenant_id,
        enable_ssd_offload, ssd_offload_path, enable_client_http_server, client_http_port; and
        kvstash's auth_token_file and tls.

        kvstash needs no metadata server, local buffer or RDMA devices: those are accepted and
        ignored. protocol 'rdma' means 'auto' (one warning). local_hostname "host:port" names
        this client's segment; a bare host gets the data port added (get_hostname() says which).
        engine (a Mooncake TransferEngine) is not used: one warning. enable_ssd_offload=True is
        refused (-600): kvstash keeps objects in memory only. enable_client_http_server=True
        serves this client's metrics for Prometheus at http://0.0.0.0:client_http_port/metrics
        (as $KVS_CLIENT_METRICS_PORT does); a port taken is a RuntimeWarning, not a failure.
        """
        extra = {}
        if isinstance(local_hostname, dict):
            cfg = local_hostname
            for key in ("local_hostname", "metadata_server"):
                if cfg.get(key) in (None, ""):
                    return _refuse(f"the config dict needs '{key}'")

            def get(*names, default=None):
                for n in names:
                    if cfg.get(n) is not None:
                        return cfg[n]
                return default

            local_hostname = str(cfg["local_hostname"])
            global_segment_size = get("global_segment_size", default=DEFAULT_SIZE)
            local_buffer_size = get("local_buffer_size", default=DEFAULT_SIZE)
            protocol = str(get("protocol", default="tcp"))
            master_server_addr = str(get("master_server_addr", "master_server_address",
                                         default=DEFAULT_MASTER))
            tenant_id = str(get("tenant_id", default="default"))
            enable_ssd_offload = _flag(get("enable_ssd_offload", default=False))
            enable_client_http_server = _flag(get("enable_client_http_server", default=False))
            client_http_port = get("client_http_port", default=9300)
            try:
                client_http_port = int(str(client_http_port))
            except ValueError:
                return _refuse(f"client_http_port {client_http_port!r} is not a port number")
            if not isinstance(global_segment_size, (int, str)):
                global_segment_size = str(global_segment_size)
            if not isinstance(local_buffer_size, (int, str)):
                local_buffer_size = str(local_buffer_size)
            if get("auth_token_file") is not None:
                extra["token_file"] = str(cfg["auth_token_file"])
            if get("tls") is not None:
                extra["tls"] = 1 if _flag(cfg["tls"]) else 0
        for name, value in (("local_hostname", local_hostname), ("protocol", protocol),
                            ("master_server_addr", master_server_addr),
                            ("tenant_id", tenant_id)):
            if not isinstance(value, str):
                raise TypeError(f"setup: {name} must be a str, not {type(value).__name__}")
        if not local_hostname:
            return _refuse("local_hostname is empty")
        seg = _size(global_segment_size, "global_segment_size")
        if seg is None:
            return _refuse(f"global_segment_size {global_segment_size!r} is not a size such as "
                           f"4096, '16MB' or '4GiB' (no percentages)")
        local = _size(local_buffer_size, "local_buffer_size")
        if local is None:
            return _refuse(f"local_buffer_size {local_buffer_size!r} is not a size")
        self._local_buffer_size = local  # a BufferPool's default capacity is twice this
        if enable_ssd_offload:
            return _refuse("enable_ssd_offload: kvstash keeps objects in memory only (no SSD "
                           "tier); set it to False")
        if not isinstance(client_http_port, int) or not 0 < client_http_port < 65536:
            return _refuse(f"client_http_port {client_http_port!r} is not a port number")
        if engine is not None:
            log.warning("kvstash setup: the transfer engine passed is not used (kvstash has "
                        "its own transports)")
        if protocol == "rdma":
            log.warning("kvstash setup: protocol 'rdma' means 'auto' here (tcp, and shared "
                        "memory to owners on this host)")
            protocol = "auto"
        host, sep, port = local_hostname.rpartition(":")
        if not sep or not host or not port.isdigit():
            host, name = local_hostname, None  # the data port is added to the name
        else:
            name = local_hostname
        rc = self._open(master_server_addr, protocol, host, seg, name, tenant_id,
                        extra.get("token_file"), extra.get("tls", -1), False)
        if rc == 0 and enable_client_http_server and self.metrics_port() == 0:
            # Mooncake's client HTTP server: this client's metrics for Prometheus. A port
            # taken is a warning, as a missing HTTP library is: the store works without it.
            self._serve_metrics(client_http_port)
        return rc

    def batch_get_into_pages(self, keys, regions, page_ids, order="page",
                             prefer_alloc_in_same_node=False):
        """Reads key i into its pages of every region: regions are (base, page_bytes, stride,
        npages) tuples in registered memory (page_region(tensor) makes one), page_ids an
        integer array of shape (len(keys), pages) (numpy, array.array, a CPU torch tensor) or
        a list of per-key arrays or lists. order 'page' takes each page of every region in
        turn (vLLM's blocks), 'region' every page of the first region, then the next. Returns
        sizes or negative codes, as batch_get_into_multi_buffers; a page id past a region is
        -600 for every key before any I/O."""
        return super().batch_get_into_pages(keys, regions, _page_ids(page_ids), order,
                                            prefer_alloc_in_same_node)

    def batch_put_from_pages(self, keys, regions, page_ids, order="page", config=None):
        """Stores key i gathered from its pages, named as in batch_get_into_pages."""
        return super().batch_put_from_pages(keys, regions, _page_ids(page_ids), order, config)

    def setup_dummy(self, mem_pool_size, local_buffer_size, server_address):
        """SGLang's standalone mode: attach to the local kvstash-server at server_address
        ("host:port" of its master), which owns the memory, without a segment of this
        process's own. Reads and writes reach that server's segment through shared memory
        (tcp when it is on another host). Memory from MooncakeHostMemAllocator, or any host
        memory, is registered with register_buffer as usual. Returns 0 or a negative code.
        get_hostname() is "" on such a store, as Mooncake's."""
        for name, value in (("mem_pool_size", mem_pool_size),
                            ("local_buffer_size", local_buffer_size)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"setup_dummy: {name} must be an int")
            if value < 0:
                return _refuse(f"setup_dummy: {name} must not be negative")
        if not isinstance(server_address, str):
            raise TypeError("setup_dummy: server_address must be a str")
        if not server_address:
            return _refuse("setup_dummy: server_address is empty")
        return self._open(server_address, "auto", socket.gethostname(), 0, None, "default",
                          None, -1, True)

    def init_all(self, protocol, device_name, mount_segment_size, /):
        """Mooncake's shorthand: setup("localhost", ...) against the default master with a
        segment of mount_segment_size bytes."""
        return self.setup("localhost", "", mount_segment_size, 0, protocol, device_name,
                          DEFAULT_MASTER)

    # -- writes built from the native calls ------------------------------------------------

    @staticmethod
    def _join_parts(parts):
        views = []
        for p in parts:
            v = memoryview(p)
            if v.ndim != 1 or v.itemsize != 1:
                raise RuntimeError("parts must be 1-D bytes-like objects")
            views.append(v)
        return b"".join(views)

    def put_parts(self, key, *parts, config=None):
        """Stores the parts, in order, as one object. 0 for an existing key (the first value
        stays) and for an empty total (nothing stored), else as put()."""
        data = self._join_parts(parts)
        return 0 if not data else self.put(key, data, config)

    def upsert_batch(self, keys, values, config=None):
        """Upserts the values (bytes-like) in one batch: 0, or the first failing key's code. A
        key given more than once takes its last value, as upserts one after another would."""
        if isinstance(keys, (list, tuple)) and isinstance(values, (list, tuple)) and \
                len(keys) == len(values) and len(set(keys)) < len(keys):
            last = {k: v for k, v in zip(keys, values)}  # insertion order: first appearance
            keys, values = list(last), list(last.values())
        return super().upsert_batch(keys, values, config)

    def upsert_parts(self, key, *parts, config=None):
        """As put_parts, replacing an existing value (atomically: see upsert())."""
        data = self._join_parts(parts)
        return 0 if not data else self.upsert(key, data, config)

    # -- tensors (Mooncake's tensor API; kvstash/_tensor.py, docs/tensor_format.md) ------------

    def put_tensor(self, key, tensor):
        return _tensor.put_tensor(self, key, tensor)

    def get_tensor(self, key):
        return _tensor.get_tensor(self, key)

    def batch_put_tensor(self, keys, tensors_list):
        return _tensor.batch_put_tensor(self, keys, tensors_list)

    def batch_get_tensor(self, keys):
        return _tensor.batch_get_tensor(self, keys)

    def get_tensor_into(self, key, buffer_ptr, size):
        return _tensor.get_tensor_into(self, key, buffer_ptr, size)

    def batch_get_tensor_into(self, keys, buffer_ptrs, sizes):
        return _tensor.batch_get_tensor_into(self, keys, buffer_ptrs, sizes)

    def get_tensor_into_cuda(self, key, tensor):
        return _tensor.get_tensor_into_cuda(self, key, tensor)

    def batch_get_tensor_into_cuda(self, keys, tensors_list):
        return _tensor.batch_get_tensor_into_cuda(self, keys, tensors_list)

    def put_tensor_from(self, key, buffer_ptr, size):
        return _tensor.put_tensor_from(self, key, buffer_ptr, size)

    def batch_put_tensor_from(self, keys, buffer_ptrs, sizes):
        return _tensor.batch_put_tensor_from(self, keys, buffer_ptrs, sizes)

    def upsert_tensor(self, key, tensor):
        return _tensor.upsert_tensor(self, key, tensor)

    def upsert_tensor_from(self, key, buffer_ptr, size):
        return _tensor.upsert_tensor_from(self, key, buffer_ptr, size)

    def batch_upsert_tensor(self, keys, tensors_list):
        return _tensor.batch_put_tensor(self, keys, tensors_list, upsert=True)

    def batch_upsert_tensor_from(self, keys, buffer_ptrs, sizes):
        return _tensor.batch_put_tensor_from(self, keys, buffer_ptrs, sizes, upsert=True)

    def pub_tensor(self, key, tensor, config=None):
        return _tensor.pub_tensor(self, key, tensor, config)

    def batch_pub_tensor(self, keys, tensors_list, config=None):
        return _tensor.batch_put_tensor(self, keys, tensors_list, config)

    def upsert_pub_tensor(self, key, tensor, config=None):
        if not _tensor._checked_config(config):
            return INVALID_PARAMS
        return _tensor.batch_put_tensor(self, [key], [tensor], config, upsert=True)[0]

    def batch_upsert_pub_tensor(self, keys, tensors_list, config=None):
        return _tensor.batch_put_tensor(self, keys, tensors_list, config, upsert=True)

    def pub_tensor_with_tp(self, key, tensor, config=None, tp_rank=0, tp_size=1, split_dim=0):
        return _tensor.pub_tensor_with_tp(self, key, tensor, config, tp_rank, tp_size, split_dim)

    def batch_pub_tensor_with_tp(self, base_keys, tensors_list, config=None, tp_rank=0,
                                 tp_size=1, split_dim=0):
        return _tensor.batch_pub_tensor_with_tp(self, base_keys, tensors_list, config, tp_rank,
                                                tp_size, split_dim)

    def put_tensor_with_tp_from(self, key, buffer_ptr, size, tp_rank=0, tp_size=1, split_dim=0):
        return _tensor.put_tensor_with_tp_from(self, key, buffer_ptr, size, tp_rank, tp_size,
                                               split_dim)

    def batch_put_tensor_with_tp_from(self, base_keys, buffer_ptrs, sizes, tp_rank=0, tp_size=1,
                                      split_dim=0):
        return _tensor.batch_put_tensor_with_tp_from(self, base_keys, buffer_ptrs, sizes,
                                                     tp_rank, tp_size, split_dim)

    def put_tensor_with_tp(self, key, tensor, tp_rank=0, tp_size=1, split_dim=0):
        return _tensor.put_tensor_with_tp(self, key, tensor, tp_rank, tp_size, split_dim)

    def get_tensor_with_tp(self, key, tp_rank=0, tp_size=1, split_dim=0):
        return _tensor.get_tensor_with_tp(self, key, tp_rank, tp_size, split_dim)

    def batch_put_tensor_with_tp(self, base_keys, tensors_list, tp_rank=0, tp_size=1,
                                 split_dim=0):
        return _tensor.batch_put_tensor_with_tp(self, base_keys, tensors_list, tp_rank, tp_size,
                                                split_dim)

    def batch_get_tensor_with_tp(self, base_keys, tp_rank=0, tp_size=1):
        return _tensor.batch_get_tensor_with_tp(self, base_keys, tp_rank, tp_size)

    def get_tensor_with_tp_into(self, key, buffer_ptr, size, tp_rank=0, tp_size=1, split_dim=0):
        return _tensor.get_tensor_with_tp_into(self, key, buffer_ptr, size, tp_rank, tp_size,
                                               split_dim)

    def batch_get_tensor_with_tp_into(self, base_keys, buffer_ptrs, sizes, tp_rank=0, tp_size=1,
                                      split_dim=0):
        return _tensor.batch_get_tensor_with_tp_into(self, base_keys, buffer_ptrs, sizes,
                                                     tp_rank, tp_size, split_dim)

    def save_tensor_to_safetensor(self, key, file_name=None):
        return _tensor.save_tensor_to_safetensor(self, key, file_name)

    def load_tensor_from_safetensor(self, key=None, file_name=None):
        return _tensor.load_tensor_from_safetensor(self, key, file_name)

    # -- inspection ---------------------------------------------------------------------------

    def batch_replica_clear(self, keys, segment_name=""):
        """Frees the space of this client's own objects among `keys` that are complete and not
        leased by a reader: their replicas on `segment_name`, or whole objects when it is "".
        Returns the keys cleared (the others are skipped, as in Mooncake)."""
        if not isinstance(segment_name, str):
            raise TypeError("segment_name must be a str")
        keys = list(keys)
        if not keys:
            return []
        res = self._replica_clear(keys, segment_name)
        return [k for k, r in zip(keys, res) if r == 0]

    def batch_get_replica_desc(self, keys):
        """{key: [ReplicaDescriptor, ...]} for the keys found complete; others are left out."""
        out = {}
        for key, reps in zip(keys, self._replica_desc(keys)):
            if reps:
                out[key] = [ReplicaDescriptor(*r) for r in reps]
        return out

    def get_replica_desc(self, key):
        """[ReplicaDescriptor, ...] of a complete object; [] when absent or on error."""
        if not isinstance(key, str):
            raise TypeError("key must be a str")
        return self.batch_get_replica_desc([key]).get(key, [])

    # -- reads built from the native calls ----------------------------------------------------

    def get_into_ranges(self, buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets,
                        all_sizes):
        """For buffer i, key j and fragment k: reads all_sizes[i][j][k] bytes of object
        all_keys[i][j] at all_src_offsets[i][j][k] into buffer_ptrs[i] +
        all_dst_offsets[i][j][k] (registered memory). Returns, with the same shape, the bytes
        read per fragment or the key's negative code. Shapes that do not match give -600 for
        the entries concerned, before any I/O."""
        n = len(buffer_ptrs)
        if not (len(all_keys) == len(all_dst_offsets) == len(all_src_offsets) ==
                len(all_sizes) == n):
            return [[[INVALID_PARAMS]] for _ in range(n)]
        keys, ptrs, sizes, offs, where = [], [], [], [], []
        out = []
        for i in range(n):
            row = []
            for j, key in enumerate(all_keys[i]):
                try:
                    dst, src, sz = all_dst_offsets[i][j], all_src_offsets[i][j], all_sizes[i][j]
                except IndexError:
                    row.append([INVALID_PARAMS])
                    continue
                if not (len(dst) == len(src) == len(sz)) or not sz:
                    row.append([INVALID_PARAMS] * max(len(sz), 1))
                    continue
                row.append(None)
                keys.append(key)
                ptrs.append([buffer_ptrs[i] + d for d in dst])
                sizes.append(list(sz))
                offs.append(list(src))
                where.append((i, j))
            out.append(row)
        if keys:
            res = self.batch_get_into_multi_buffer_ranges(keys, ptrs, sizes, offs)
            if len(res) != len(keys):  # not set up: [] from the native call
                res = [INVALID_PARAMS] * len(keys)
            for (i, j), r, sz in zip(where, res, sizes):
                out[i][j] = list(sz) if r >= 0 else [r] * len(sz)
        return out
