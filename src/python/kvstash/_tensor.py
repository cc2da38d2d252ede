"""Mooncake's tensor calls over the store: a tensor is one object, a 304-byte header (the layout
of Mooncake's object header version 1, little-endian; docs/tensor_format.md) followed by its
elements in C order. PyTorch is imported on first use, so `import kvstash` works without it.

Every call follows Mooncake's conventions: int calls return 0 or a negative code (-600 for bad
arguments), tensor calls return a tensor or None. The functions take the store first; the
package binds them as methods of MooncakeDistributedStore."""
import ctypes
import math
import struct
import sys
import threading

from . import _kvstash

INVALID_PARAMS = -600
NOT_FOUND = -704

HEADER_SIZE = 304
MAGIC = 0x4D4F4F4E  # "MOON"
VERSION = 1
MAX_DIMS = 8
MAX_AXES = 4
LAYOUT_FULL, LAYOUT_SHARD = 0, 1
AXIS_TP = 1

# magic, version, header_size, dtype, ndim, layout_kind, reserved_flags, data_offset, data_bytes
_HEAD = struct.Struct("<IHHiiIIQQ")
_SHAPE = struct.Struct("<8q")
_AXES_HEAD = struct.Struct("<II")  # axis_count, reserved0
_AXIS = struct.Struct("<iiiiiiq")  # kind, axis_index, shard_rank, shard_count, split_dim, r0, r1
_SHAPE_AT, _LOCAL_AT, _AXES_AT = 40, 104, 168
assert _AXES_AT + _AXES_HEAD.size + MAX_AXES * _AXIS.size == HEADER_SIZE

# Mooncake's dtype numbers (0..14), then kvstash's own from 100 (clear of the numbers Mooncake
# may add) for the dtypes Mooncake has no number for.
_DTYPE_NAMES = {
    0: "float32", 1: "float64", 2: "int8", 3: "uint8", 4: "int16", 5: "uint16", 6: "int32",
    7: "uint32", 8: "int64", 9: "uint64", 10: "bool", 11: "float16", 12: "bfloat16",
    13: "float8_e4m3fn", 14: "float8_e5m2",
    # kvstash's (Mooncake readers refuse these numbers)
    100: "complex32", 101: "complex64", 102: "complex128", 103: "float8_e4m3fnuz",
    104: "float8_e5m2fnuz", 105: "float8_e8m0fnu", 106: "float4_e2m1fn_x2",
}

_torch = None
_codes = None  # torch dtype -> number
_dtypes = None  # number -> torch dtype
_itemsize = None  # number -> bytes per element


def _t():
    """PyTorch, imported on first use."""
    global _torch, _codes, _dtypes, _itemsize
    if _torch is None:
        try:
            import torch
        except ImportError as e:
            raise ImportError("kvstash's tensor calls need PyTorch (python3-torch or the torch "
                              "wheel): " + str(e)) from e
        codes, dtypes, sizes = {}, {}, {}
        for num, name in _DTYPE_NAMES.items():
            dt = getattr(torch, name, None)  # older PyTorch lacks some (uint16, float8, ...)
            if isinstance(dt, torch.dtype):
                codes[dt] = num
                dtypes[num] = dt
                sizes[num] = torch.empty((), dtype=dt).element_size()
        _codes, _dtypes, _itemsize, _torch = codes, dtypes, sizes, torch
    return _torch


def dtype_code(dtype):
    """The stored number of a torch dtype, or None when it has none (quantized, sub-byte)."""
    _t()
    return _codes.get(dtype)


# ---- the header ------------------------------------------------------------------------------

def _pack(dtype_num, shape, nbytes, global_shape=None, axes=()):
    ndim = len(shape)
    buf = bytearray(HEADER_SIZE)
    _HEAD.pack_into(buf, 0, MAGIC, VERSION, HEADER_SIZE, dtype_num, ndim,
                    LAYOUT_SHARD if axes else LAYOUT_FULL, 0, HEADER_SIZE, nbytes)
    pad = [-1] * (MAX_DIMS - ndim)
    _SHAPE.pack_into(buf, _SHAPE_AT, *(list(global_shape or shape) + pad))
    _SHAPE.pack_into(buf, _LOCAL_AT, *(list(shape) + pad))
    _AXES_HEAD.pack_into(buf, _AXES_AT, len(axes), 0)
    for i, axis in enumerate(axes):
        _AXIS.pack_into(buf, _AXES_AT + _AXES_HEAD.size + i * _AXIS.size, *axis)
    return buf


class Meta:
    """A parsed, checked header."""
    __slots__ = ("dtype", "shape", "global_shape", "layout", "axes", "nbytes")


def parse(header, total):
    """The Meta of an object of `total` bytes whose first 304 bytes are `header`, or None when
    they are not a valid tensor header for that size (every field is checked, as Mooncake's
    reader does)."""
    if total < HEADER_SIZE or len(header) < HEADER_SIZE:
        return None
    (magic, version, hsize, dnum, ndim, layout, _flags, off, nbytes) = _HEAD.unpack_from(header)
    if (magic != MAGIC or version != VERSION or hsize != HEADER_SIZE or off != HEADER_SIZE or
            not 0 <= ndim <= MAX_DIMS or layout > LAYOUT_SHARD or nbytes != total - off):
        return None
    _t()
    dtype = _dtypes.get(dnum)
    if dtype is None:
        return None
    gshape = _SHAPE.unpack_from(header, _SHAPE_AT)
    lshape = _SHAPE.unpack_from(header, _LOCAL_AT)
    if any(d < 0 for d in gshape[:ndim] + lshape[:ndim]) or \
            any(d != -1 for d in gshape[ndim:] + lshape[ndim:]):
        return None
    naxes, _ = _AXES_HEAD.unpack_from(header, _AXES_AT)
    if naxes > MAX_AXES:
        return None
    axes = [_AXIS.unpack_from(header, _AXES_AT + _AXES_HEAD.size + i * _AXIS.size)
            for i in range(naxes)]
    for kind, _ix, rank, count, split, _r0, _r1 in axes:
        if not (0 <= kind <= 4 and count > 0 and 0 <= rank < count and -1 <= split < ndim):
            return None
    if math.prod(lshape[:ndim]) * _itemsize[dnum] != nbytes:
        return None
    m = Meta()
    m.dtype, m.shape, m.global_shape = dtype, tuple(lshape[:ndim]), tuple(gshape[:ndim])
    m.layout, m.axes, m.nbytes = layout, axes, nbytes
    return m


def _host_bytes(store, ptr, n):
    """n bytes at ptr, copied, when they lie in registered host memory; else None (device
    memory, or memory not registered, which is never read)."""
    if store._buffer_domain(ptr, n) != -1:
        return None
    return ctypes.string_at(ptr, n)


def _view(owner, offset, m):
    """A tensor of m's dtype and shape over `owner` (any writable buffer) from `offset`; it
    keeps `owner` alive."""
    torch = _t()
    if m.nbytes == 0:
        return torch.empty(m.shape, dtype=m.dtype)
    flat = torch.frombuffer(owner, dtype=torch.uint8, count=m.nbytes, offset=offset)
    return flat.view(m.dtype).reshape(m.shape)


# ---- encoding a tensor -----------------------------------------------------------------------

class _Encoded:
    """A tensor ready to store: header bytes and the memory of its elements (host memory, or
    the device's for a CUDA tensor), kept alive."""
    __slots__ = ("header", "tensor", "frags", "on_gpu")

    def __init__(self, header, tensor):
        self.header, self.tensor = header, tensor
        self.on_gpu = tensor.device.type == "cuda"
        hptr = ctypes.addressof((ctypes.c_char * HEADER_SIZE).from_buffer(header))
        self.frags = ([hptr], [HEADER_SIZE])
        n = tensor.numel() * tensor.element_size()
        if n:
            self.frags[0].append(tensor.data_ptr())
            self.frags[1].append(n)


def _host_copy(t):
    """A tensor's contents in host memory (the put path of GPU tensors whose memory is not
    registered)."""
    return t.cpu()


def _encode(tensor, global_shape=None, axes=()):
    """_Encoded, or None for what cannot be stored (not a tensor, an unsupported dtype, more
    than 8 dimensions). Non-contiguous tensors are stored in C order (a contiguous copy, as
    Mooncake does); CUDA tensors stay on their device (the put writes them from there when
    their memory is registered, else from a host copy); other devices are copied to the host."""
    torch = _t()
    if not isinstance(tensor, torch.Tensor) or tensor.dim() > MAX_DIMS or \
            tensor.layout != torch.strided or tensor.is_quantized or tensor.is_meta:
        return None
    num = _codes.get(tensor.dtype)
    if num is None:
        return None
    try:
        t = tensor.detach()
        if t.device.type not in ("cpu", "cuda"):
            t = _host_copy(t)
        t = t.contiguous()
        if t.is_conj():
            t = t.resolve_conj()
        if t.is_neg():
            t = t.resolve_neg()
    except (RuntimeError, NotImplementedError):  # a tensor PyTorch cannot lay out in memory
        return None
    header = _pack(num, tuple(t.shape), t.numel() * t.element_size(), global_shape, axes)
    return _Encoded(header, t)


def _checked_config(config):
    """Mooncake's check of a config for pub_tensor: preferred_segments, when given, name one
    segment per replica."""
    if config is not None and config.preferred_segments and \
            len(config.preferred_segments) != config.replica_num:
        return False
    return True


def _put_gpu(store, keys, encs, config):
    """Puts CUDA tensors from their registered device memory through a put session: the
    headers from a host buffer registered for the call, then the elements from the device,
    then the end that makes each object readable at once. Returns a code per key, None for
    those whose memory is not registered (revoked: the caller copies them to the host)."""
    n = len(keys)
    out = [None] * n
    heads = bytearray(HEADER_SIZE * n)
    for j, e in enumerate(encs):
        heads[j * HEADER_SIZE:(j + 1) * HEADER_SIZE] = e.header
    hptr = ctypes.addressof((ctypes.c_char * len(heads)).from_buffer(heads))
    if store.register_buffer(hptr, len(heads)) != 0:
        return out
    try:
        sizes = [HEADER_SIZE + e.frags[1][1] for e in encs]
        started = store.batch_put_session_start(keys, sizes, config)
        if len(started) != n:
            return [INVALID_PARAMS] * n
        live = []
        for j, r in enumerate(started):
            if r == 0:
                live.append(j)
            else:
                out[j] = 0 if r == -705 else r  # Mooncake: an existing key keeps its value
        if not live:
            return out
        ks = [keys[j] for j in live]
        wrote = store.batch_put_from_multi_buffer_ranges(
            ks, [[encs[j].frags[0][1]] for j in live], [[encs[j].frags[1][1]] for j in live],
            [[HEADER_SIZE]] * len(live))
        ok, again = [], []
        for j, r in zip(live, wrote if len(wrote) == len(live) else [INVALID_PARAMS] * len(live)):
            (ok if r >= 0 else again).append(j)
        if again:  # not registered (or failed): revoked, and put again from the host
            store.batch_put_session_revoke([keys[j] for j in again])
        if ok:
            hdr = store.batch_put_from_multi_buffer_ranges(
                [keys[j] for j in ok], [[hptr + j * HEADER_SIZE] for j in ok],
                [[HEADER_SIZE]] * len(ok), [[0]] * len(ok))
            ended = store.batch_put_session_end([keys[j] for j in ok])
            for j, h, r in zip(ok, hdr, ended):
                out[j] = h if h < 0 and r != 0 else r
    finally:
        store.unregister_buffer(hptr)
    return out


def _put_encoded(store, keys, encs, config=None, upsert=False):
    """Stores encoded tensors (None entries: -600) in one batch; a code per key. CUDA
    tensors go from their device memory where it is registered (plain puts), else from a
    host copy."""
    out = [INVALID_PARAMS] * len(keys)
    gpu = [i for i, e in enumerate(encs) if e is not None and e.on_gpu and e.frags[1][1:]]
    if gpu and not upsert:
        res = _put_gpu(store, [keys[i] for i in gpu], [encs[i] for i in gpu], config)
        for i, r in zip(gpu, res):
            if r is not None:
                out[i] = r
                encs[i] = None
    for i, e in enumerate(encs):
        if e is not None and e.on_gpu:  # upserts, unregistered memory, empty tensors
            encs[i] = _Encoded(e.header, _host_copy(e.tensor))
    idx = [i for i, e in enumerate(encs) if e is not None]
    if idx:
        res = store._put_frags([keys[i] for i in idx], [encs[i].frags[0] for i in idx],
                               [encs[i].frags[1] for i in idx], config, upsert)
        if len(res) != len(idx):
            res = [INVALID_PARAMS] * len(idx)
        for i, r in zip(idx, res):
            out[i] = r
    return out


def _batch_args(keys, *lists):
    """The keys as a list, and whether every other list has as many entries (a mismatch is
    -600 for every key, as in Mooncake)."""
    keys = list(keys)
    return keys, all(len(x) == len(keys) for x in lists)


# ---- puts ------------------------------------------------------------------------------------

def put_tensor(store, key, tensor):
    return _put_encoded(store, [key], [_encode(tensor)])[0]


def upsert_tensor(store, key, tensor):
    return _put_encoded(store, [key], [_encode(tensor)], upsert=True)[0]


def pub_tensor(store, key, tensor, config=None):
    if not _checked_config(config):
        return INVALID_PARAMS
    return _put_encoded(store, [key], [_encode(tensor)], config)[0]


def batch_put_tensor(store, keys, tensors_list, config=None, upsert=False):
    keys, same = _batch_args(keys, tensors_list)
    if not same:
        return [INVALID_PARAMS] * len(keys)
    if not keys:
        return []
    if not _checked_config(config):
        return [INVALID_PARAMS] * len(keys)
    return _put_encoded(store, keys, [_encode(t) for t in tensors_list], config, upsert)


def _from_ok(store, ptr, size):
    """A serialized tensor of `size` bytes at ptr, in registered memory (its header checked
    when that memory is the host's)."""
    if not isinstance(ptr, int) or not isinstance(size, int) or isinstance(size, bool) or \
            ptr <= 0 or size < HEADER_SIZE:
        return False
    dom = store._buffer_domain(ptr, size)
    if dom == -1:
        return parse(ctypes.string_at(ptr, HEADER_SIZE), size) is not None
    return dom >= 0


def put_tensor_from(store, key, buffer_ptr, size):
    if not _from_ok(store, buffer_ptr, size):
        return INVALID_PARAMS
    return store.put_from(key, buffer_ptr, size)


def upsert_tensor_from(store, key, buffer_ptr, size):
    if not _from_ok(store, buffer_ptr, size):
        return INVALID_PARAMS
    return store.upsert_from(key, buffer_ptr, size)


def batch_put_tensor_from(store, keys, buffer_ptrs, sizes, upsert=False):
    keys, same = _batch_args(keys, buffer_ptrs, sizes)
    if not same:
        return [INVALID_PARAMS] * len(keys)
    if not keys:
        return []
    if not all(_from_ok(store, p, n) for p, n in zip(buffer_ptrs, sizes)):
        return [INVALID_PARAMS] * len(keys)  # Mooncake: a bad entry fails the batch
    call = store.batch_upsert_from if upsert else store.batch_put_from
    return call(keys, list(buffer_ptrs), list(sizes))


# ---- gets ------------------------------------------------------------------------------------

def _from_handle(h):
    if h is None:
        return None
    mv = memoryview(h)
    m = parse(mv[:HEADER_SIZE], len(mv))
    return None if m is None else _view(h, HEADER_SIZE, m)


def get_tensor(store, key):
    return _from_handle(store.get_buffer(key))


def batch_get_tensor(store, keys):
    keys = list(keys)
    if not keys:
        return []
    handles = store.batch_get_buffer(keys)
    if len(handles) != len(keys):
        return [None] * len(keys)
    return [_from_handle(h) for h in handles]


def _into(store, ptr, n):
    """The tensor read into registered host memory at ptr (n bytes), a view of it; None
    otherwise."""
    if n < HEADER_SIZE or store._buffer_domain(ptr, n) != -1:
        return None
    head = ctypes.string_at(ptr, HEADER_SIZE)
    m = None if head is None else parse(head, n)
    if m is None:
        return None
    return _view((ctypes.c_char * n).from_address(ptr), HEADER_SIZE, m)


def get_tensor_into(store, key, buffer_ptr, size):
    if not isinstance(buffer_ptr, int) or store._buffer_domain(buffer_ptr, HEADER_SIZE) != -1:
        return None  # device memory: get_tensor_into_cuda reads there
    n = store.get_into(key, buffer_ptr, size)
    return _into(store, buffer_ptr, n) if n >= 0 else None


def batch_get_tensor_into(store, keys, buffer_ptrs, sizes):
    keys, same = _batch_args(keys, buffer_ptrs, sizes)
    if not same:
        return [INVALID_PARAMS] * len(keys)  # Mooncake's ints here, not None
    if not keys:
        return []
    res = store.batch_get_into(keys, list(buffer_ptrs), list(sizes))
    if len(res) != len(keys):
        return [INVALID_PARAMS] * len(keys)
    return [_into(store, p, n) if n >= 0 else None for p, n in zip(buffer_ptrs, res)]


def _dst_ok(d):
    torch = _t()
    return isinstance(d, torch.Tensor) and d.dtype in _codes and d.layout == torch.strided and \
        d.is_contiguous() and not d.is_conj() and not d.is_neg() and d.dim() <= MAX_DIMS and \
        d.device.type in ("cpu", "cuda")


def batch_get_tensor_into_cuda(store, keys, tensors_list):
    """Reads each tensor's elements into the registered, contiguous tensor of the same dtype
    and shape (on a GPU or not), through the store's direct or staged GPU paths: no host copy.
    Each object is one read, its header into scratch memory on the destination's device and
    its elements into the destination, so header and elements are always of one version.
    Returns the elements' bytes per key, or a negative code (a destination that does not match
    the stored header gets -600, after the read)."""
    torch = _t()
    keys, same = _batch_args(keys, tensors_list)
    if not same:
        return [INVALID_PARAMS] * len(keys)
    if not keys:
        return []
    out = [INVALID_PARAMS] * len(keys)
    go = [i for i, d in enumerate(tensors_list) if _dst_ok(d)]
    if not go:
        return out
    # One scratch tensor of headers per device: the store's own, registered once and kept
    # (another thread's call meanwhile gets scratch of its own for the call).
    scratch, where = {}, {}
    for i in go:
        dev = tensors_list[i].device
        where[i] = (dev, len(scratch.setdefault(dev, [])))
        scratch[dev].append(i)
    cache, lock = _scratch_cache(store)
    mine = lock.acquire(blocking=False)
    registered = []
    try:
        bufs = {}
        for dev, ix in scratch.items():
            need = len(ix) * HEADER_SIZE
            b = cache.get(dev) if mine else None
            if b is None or b.numel() < need or store._buffer_domain(b.data_ptr(), need) == -600:
                if b is not None and mine:
                    store.unregister_buffer(b.data_ptr())
                    cache.pop(dev, None)
                b = torch.empty(max(need, 64 * HEADER_SIZE), dtype=torch.uint8, device=dev)
                if store.register_buffer(b.data_ptr(), b.numel()) != 0:
                    return out
                if mine:
                    cache[dev] = b
                else:
                    registered.append(b.data_ptr())
            bufs[dev] = b
        ptrs, sizes = [], []
        for i in go:
            d = tensors_list[i]
            dev, slot = where[i]
            n = d.numel() * d.element_size()
            ptrs.append([bufs[dev].data_ptr() + slot * HEADER_SIZE] + ([d.data_ptr()] if n else []))
            sizes.append([HEADER_SIZE] + ([n] if n else []))
        res = store.batch_get_into_multi_buffers([keys[i] for i in go], ptrs, sizes)
        if len(res) != len(go):
            return out
        heads = {dev: bytes(b[:len(scratch[dev]) * HEADER_SIZE].cpu().numpy())
                 for dev, b in bufs.items()}
        # A whole tensor's header is one byte string per dtype and shape: most keys match the
        # one their destination implies, byte for byte; the others are parsed in full.
        expected = {}
        for i, r in zip(go, res):
            if r < 0:
                out[i] = r
                continue
            d = tensors_list[i]
            dev, slot = where[i]
            head = heads[dev][slot * HEADER_SIZE:(slot + 1) * HEADER_SIZE]
            nbytes = r - HEADER_SIZE
            want = expected.get((d.dtype, d.shape))
            if want is None:
                want = expected[(d.dtype, d.shape)] = bytes(
                    _pack(_codes[d.dtype], tuple(d.shape), d.numel() * d.element_size()))
            if head == want and r == HEADER_SIZE + _HEAD.unpack_from(want)[8]:
                out[i] = nbytes
                continue
            m = parse(head, r)
            ok = m is not None and m.dtype == d.dtype and m.shape == tuple(d.shape)
            out[i] = m.nbytes if ok else INVALID_PARAMS
    finally:
        for p in registered:
            store.unregister_buffer(p)
        if mine:
            lock.release()
    return out


_scratch_lock = threading.Lock()


def _scratch_cache(store):
    """The store's cache of header scratch tensors (per device) and its lock."""
    with _scratch_lock:
        c = getattr(store, "_tensor_scratch", None)
        if c is None:
            c = store._tensor_scratch = ({}, threading.Lock())
        return c


def get_tensor_into_cuda(store, key, tensor):
    return batch_get_tensor_into_cuda(store, [key], [tensor])[0]


# ---- tensor parallelism ----------------------------------------------------------------------

MAX_TP = 4096  # ranks of one split
MAX_KEYS = 65536  # keys of one call (the store's batch limit)


def tp_key(key, rank):
    return f"{key}_tp_{rank}"


def _shards(tensor, tp_size, split_dim):
    """[(rank, shard, global shape, axes)] as torch.chunk sizes them (ceil(dim / tp_size) each,
    the last ranks possibly smaller or empty), or None for a bad split."""
    torch = _t()
    if not isinstance(tensor, torch.Tensor) or not isinstance(split_dim, int) or \
            isinstance(split_dim, bool) or not 0 <= split_dim < tensor.dim():
        return None
    dim = tensor.shape[split_dim]
    chunk = -(-dim // tp_size)
    out = []
    for r in range(tp_size):
        start = min(r * chunk, dim)
        length = max(0, min(chunk, dim - start))
        shard = tensor.narrow(split_dim, start, length)
        axes = [(AXIS_TP, 0, r, tp_size, split_dim, 0, length)]
        out.append((r, shard, tuple(tensor.shape), axes))
    return out


def batch_put_tensor_with_tp(store, base_keys, tensors_list, tp_rank=0, tp_size=1, split_dim=0,
                             config=None):
    """Stores every shard of each tensor (tp_rank is unused, as in Mooncake): 0 per key when
    all its shards were stored, else the first failing shard's code."""
    keys, same = _batch_args(base_keys, tensors_list)
    if not same or not isinstance(tp_size, int) or isinstance(tp_size, bool) or \
            tp_size > MAX_TP or len(keys) * max(tp_size, 1) > MAX_KEYS:
        return [INVALID_PARAMS] * len(keys)
    if tp_size <= 1:
        return batch_put_tensor(store, keys, tensors_list, config)
    all_keys, encs, owner = [], [], []
    for i, t in enumerate(tensors_list):
        shards = _shards(t, tp_size, split_dim)
        if shards is None:
            continue
        for r, shard, gshape, axes in shards:
            all_keys.append(tp_key(keys[i], r))
            encs.append(_encode(shard, gshape, axes))
            owner.append(i)
    out = [INVALID_PARAMS] * len(keys)
    done = set()
    res = _put_encoded(store, all_keys, encs, config) if all_keys else []
    for i, r in zip(owner, res):
        if i not in done:
            out[i] = r
            done.add(i)
        elif out[i] == 0 and r != 0:
            out[i] = r
    return out


def put_tensor_with_tp(store, key, tensor, tp_rank=0, tp_size=1, split_dim=0):
    return batch_put_tensor_with_tp(store, [key], [tensor], tp_rank, tp_size, split_dim)[0]


def pub_tensor_with_tp(store, key, tensor, config=None, tp_rank=0, tp_size=1, split_dim=0):
    if not _checked_config(config):
        return INVALID_PARAMS
    return batch_put_tensor_with_tp(store, [key], [tensor], tp_rank, tp_size, split_dim,
                                    config)[0]


def batch_pub_tensor_with_tp(store, base_keys, tensors_list, config=None, tp_rank=0, tp_size=1,
                             split_dim=0):
    if not _checked_config(config):
        return [INVALID_PARAMS] * len(list(base_keys))
    return batch_put_tensor_with_tp(store, base_keys, tensors_list, tp_rank, tp_size,
                                    split_dim, config)


def batch_put_tensor_with_tp_from(store, base_keys, buffer_ptrs, sizes, tp_rank=0, tp_size=1,
                                  split_dim=0):
    """Each buffer holds a whole serialized tensor (registered host memory), split and stored
    as put_tensor_with_tp does."""
    keys, same = _batch_args(base_keys, buffer_ptrs, sizes)
    if not same:
        return [INVALID_PARAMS] * len(keys)
    tensors = [_into(store, p, n) if isinstance(p, int) and isinstance(n, int) else None
               for p, n in zip(buffer_ptrs, sizes)]
    out = batch_put_tensor_with_tp(store, keys, tensors, tp_rank, tp_size, split_dim)
    return [INVALID_PARAMS if t is None else r for t, r in zip(tensors, out)]


def put_tensor_with_tp_from(store, key, buffer_ptr, size, tp_rank=0, tp_size=1, split_dim=0):
    return batch_put_tensor_with_tp_from(store, [key], [buffer_ptr], [size], tp_rank, tp_size,
                                         split_dim)[0]


def _shard_ok(t, h, tp_rank):
    """Whether the object read for rank tp_rank is that rank's TP shard."""
    if t is None:
        return False
    mv = memoryview(h) if h is not None else None
    m = parse(mv[:HEADER_SIZE], len(mv)) if mv is not None else None
    return m is not None and m.layout == LAYOUT_SHARD and \
        any(a[0] == AXIS_TP and a[2] == tp_rank for a in m.axes)


def batch_get_tensor_with_tp(store, base_keys, tp_rank=0, tp_size=1):
    """Shard tp_rank of each tensor (None where absent or not such a shard)."""
    keys = list(base_keys)
    if tp_size <= 1:
        return batch_get_tensor(store, keys)
    if not keys:
        return []
    handles = store.batch_get_buffer([tp_key(k, tp_rank) for k in keys])
    if len(handles) != len(keys):
        return [None] * len(keys)
    out = []
    for h in handles:
        t = _from_handle(h)
        out.append(t if _shard_ok(t, h, tp_rank) else None)
    return out


def get_tensor_with_tp(store, key, tp_rank=0, tp_size=1, split_dim=0):
    return batch_get_tensor_with_tp(store, [key], tp_rank, tp_size)[0]


def batch_get_tensor_with_tp_into(store, base_keys, buffer_ptrs, sizes, tp_rank=0, tp_size=1,
                                  split_dim=0):
    keys = list(base_keys)
    if tp_size > 1:
        keys = [tp_key(k, tp_rank) for k in keys]
    got = batch_get_tensor_into(store, keys, buffer_ptrs, sizes)
    if tp_size <= 1:
        return got
    out = []
    for t, p in zip(got, buffer_ptrs):
        if not hasattr(t, "shape"):
            out.append(None)
            continue
        head = _host_bytes(store, p, HEADER_SIZE)
        m = parse(head, HEADER_SIZE + t.numel() * t.element_size()) if head else None
        ok = m is not None and m.layout == LAYOUT_SHARD and \
            any(a[0] == AXIS_TP and a[2] == tp_rank for a in m.axes)
        out.append(t if ok else None)
    return out


def get_tensor_with_tp_into(store, key, buffer_ptr, size, tp_rank=0, tp_size=1, split_dim=0):
    got = batch_get_tensor_with_tp_into(store, [key], [buffer_ptr], [size], tp_rank, tp_size,
                                        split_dim)
    return got[0] if hasattr(got[0], "shape") else None


# ---- safetensors -----------------------------------------------------------------------------

FILE_NOT_FOUND = -1100


def _safetensors():
    try:
        import safetensors.torch as st
    except ImportError as e:
        raise ImportError("save_tensor_to_safetensor and load_tensor_from_safetensor need the "
                          "safetensors package: " + str(e)) from e
    return st


def save_tensor_to_safetensor(store, key, file_name=None):
    st = _safetensors()
    t = get_tensor(store, key)
    if t is None:
        return FILE_NOT_FOUND
    try:
        st.save_file({key: t.contiguous()}, file_name or key)
    except Exception as e:  # Mooncake: any failure is a code
        print(f"kvstash save_tensor_to_safetensor: {e}", file=sys.stderr)
        return INVALID_PARAMS
    return 0


def load_tensor_from_safetensor(store, key=None, file_name=None):
    st = _safetensors()
    if file_name is None:
        return None
    try:
        tensors = st.load_file(file_name)
    except Exception as e:  # a missing or corrupt file (SafetensorError): None, as Mooncake
        print(f"kvstash load_tensor_from_safetensor: {e}", file=sys.stderr)
        return None
    name = key if key is not None else file_name
    if not tensors:
        return None
    t = tensors.get(name, next(iter(tensors.values())))
    return t if put_tensor(store, name, t) == 0 else None
