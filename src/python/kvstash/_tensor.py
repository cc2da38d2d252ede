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

# Mooncake's dtype numbers (0..14), then kvstash's for the dtypes Mooncake has no number for.
_DTYPE_NAMES = [
    "float32", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
    "uint64", "bool", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2",
    # kvstash extensions (Mooncake readers refuse these numbers)
    "complex32", "complex64", "complex128", "float8_e4m3fnuz", "float8_e5m2fnuz",
    "float8_e8m0fnu", "float4_e2m1fn_x2",
]

_torch = None
_codes = None  # torch dtype -> number
_dtypes = None  # number -> torch dtype


def _t():
    """PyTorch, imported on first use."""
    global _torch, _codes, _dtypes
    if _torch is None:
        try:
            import torch
        except ImportError as e:
            raise ImportError("kvstash's tensor calls need PyTorch (python3-torch or the torch "
                              "wheel): " + str(e)) from e
        codes, dtypes = {}, {}
        for num, name in enumerate(_DTYPE_NAMES):
            dt = getattr(torch, name, None)  # older PyTorch lacks some (uint16, float8, ...)
            if isinstance(dt, torch.dtype):
                codes[dt] = num
                dtypes[num] = dt
        _codes, _dtypes, _torch = codes, dtypes, torch
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
    itemsize = _torch.empty((), dtype=dtype).element_size()
    if math.prod(lshape[:ndim]) * itemsize != nbytes:
        return None
    m = Meta()
    m.dtype, m.shape, m.global_shape = dtype, tuple(lshape[:ndim]), tuple(gshape[:ndim])
    m.layout, m.axes, m.nbytes = layout, axes, nbytes
    return m


def _host_bytes(ptr, n):
    """n bytes at a host address, copied; None for device memory."""
    if _kvstash._memory_device(ptr) != -1:
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
    """A tensor ready to store: header bytes and the memory of its elements, kept alive."""
    __slots__ = ("header", "tensor", "frags")

    def __init__(self, header, tensor):
        self.header, self.tensor = header, tensor
        hptr = ctypes.addressof((ctypes.c_char * HEADER_SIZE).from_buffer(header))
        self.frags = ([hptr], [HEADER_SIZE])
        n = tensor.numel() * tensor.element_size()
        if n:
            self.frags[0].append(tensor.data_ptr())
            self.frags[1].append(n)


def _encode(tensor, global_shape=None, axes=()):
    """_Encoded, or None for what cannot be stored (not a tensor, an unsupported dtype, more
    than 8 dimensions). Non-contiguous tensors are stored in C order (a contiguous copy, as
    Mooncake does); tensors on a GPU are copied to host memory."""
    torch = _t()
    if not isinstance(tensor, torch.Tensor) or tensor.dim() > MAX_DIMS:
        return None
    num = _codes.get(tensor.dtype)
    if num is None or tensor.is_sparse or tensor.is_quantized:
        return None
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    header = _pack(num, tuple(t.shape), t.numel() * t.element_size(), global_shape, axes)
    return _Encoded(header, t)


def _checked_config(config):
    """Mooncake's check of a config for pub_tensor: preferred_segments, when given, name one
    segment per replica."""
    if config is not None and config.preferred_segments and \
            len(config.preferred_segments) != config.replica_num:
        return False
    return True


def _put_encoded(store, keys, encs, config=None, upsert=False):
    """Stores encoded tensors (None entries: -600) in one batch; a code per key."""
    out = [INVALID_PARAMS] * len(keys)
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


def _from_ok(ptr, size):
    """A serialized tensor at ptr: checked when it is in host memory."""
    if not isinstance(ptr, int) or not isinstance(size, int) or ptr == 0 or size < HEADER_SIZE:
        return False
    head = _host_bytes(ptr, HEADER_SIZE)
    return head is None or parse(head, size) is not None


def put_tensor_from(store, key, buffer_ptr, size):
    if not _from_ok(buffer_ptr, size):
        return INVALID_PARAMS
    return store.put_from(key, buffer_ptr, size)


def upsert_tensor_from(store, key, buffer_ptr, size):
    if not _from_ok(buffer_ptr, size):
        return INVALID_PARAMS
    return store.upsert_from(key, buffer_ptr, size)


def batch_put_tensor_from(store, keys, buffer_ptrs, sizes, upsert=False):
    keys, same = _batch_args(keys, buffer_ptrs, sizes)
    if not same:
        return [INVALID_PARAMS] * len(keys)
    if not keys:
        return []
    if not all(_from_ok(p, s) for p, s in zip(buffer_ptrs, sizes)):
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


def _into(ptr, n):
    """The tensor read into host memory at ptr (n bytes), a view of it; None otherwise."""
    if n < HEADER_SIZE:
        return None
    head = _host_bytes(ptr, HEADER_SIZE)
    m = None if head is None else parse(head, n)
    if m is None:
        return None
    return _view((ctypes.c_char * n).from_address(ptr), HEADER_SIZE, m)


def get_tensor_into(store, key, buffer_ptr, size):
    n = store.get_into(key, buffer_ptr, size)
    return _into(buffer_ptr, n) if n >= 0 else None


def batch_get_tensor_into(store, keys, buffer_ptrs, sizes):
    keys, same = _batch_args(keys, buffer_ptrs, sizes)
    if not same:
        return [INVALID_PARAMS] * len(keys)  # Mooncake's ints here, not None
    if not keys:
        return []
    res = store.batch_get_into(keys, list(buffer_ptrs), list(sizes))
    if len(res) != len(keys):
        return [INVALID_PARAMS] * len(keys)
    return [_into(p, n) if n >= 0 else None for p, n in zip(buffer_ptrs, res)]


def batch_get_tensor_into_cuda(store, keys, tensors_list):
    """Reads each tensor's elements into the registered, contiguous tensor of the same dtype
    and shape (on a GPU or not), through the store's direct or staged GPU paths: no host copy.
    One read lease covers the header and the elements, so an upsert between them never mixes
    versions. Returns the bytes read per key or a negative code."""
    torch = _t()
    keys, same = _batch_args(keys, tensors_list)
    if not same:
        return [INVALID_PARAMS] * len(keys)
    if not keys:
        return []
    n = len(keys)
    out = [INVALID_PARAMS] * n
    ok = [i for i, d in enumerate(tensors_list)
          if isinstance(d, torch.Tensor) and d.is_contiguous() and d.dim() <= MAX_DIMS]
    if not ok:
        return out
    ks = [keys[i] for i in ok]
    heads = bytearray(HEADER_SIZE * len(ok))
    hptr = ctypes.addressof((ctypes.c_char * len(heads)).from_buffer(heads))
    if store.register_buffer(hptr, len(heads)) != 0:
        return out
    started = store.batch_get_session_start(ks)
    try:
        res = store.batch_get_into_multi_buffer_ranges(
            ks, [[hptr + j * HEADER_SIZE] for j in range(len(ok))],
            [[HEADER_SIZE]] * len(ok), [[0]] * len(ok))
        if len(res) != len(ok):
            res = [INVALID_PARAMS] * len(ok)
        go = []
        for j, (i, r) in enumerate(zip(ok, res)):
            if r < 0:
                out[i] = r
                continue
            d = tensors_list[i]
            # The object's size is the header's plus its data_bytes.
            nbytes = _HEAD.unpack_from(heads, j * HEADER_SIZE)[8]
            m = parse(heads[j * HEADER_SIZE:(j + 1) * HEADER_SIZE], HEADER_SIZE + nbytes)
            if m is None or m.dtype != d.dtype or tuple(d.shape) != m.shape:
                out[i] = INVALID_PARAMS
                continue
            if m.nbytes == 0:
                out[i] = 0
                continue
            go.append(i)
        if go:
            res = store.batch_get_into_multi_buffer_ranges(
                [keys[i] for i in go], [[tensors_list[i].data_ptr()] for i in go],
                [[tensors_list[i].numel() * tensors_list[i].element_size()] for i in go],
                [[HEADER_SIZE]] * len(go))
            if len(res) != len(go):
                res = [INVALID_PARAMS] * len(go)
            for i, r in zip(go, res):
                out[i] = r
    finally:
        store.batch_get_session_end([k for k, r in zip(ks, started) if r == 0])
        store.unregister_buffer(hptr)
    return out


def get_tensor_into_cuda(store, key, tensor):
    return batch_get_tensor_into_cuda(store, [key], [tensor])[0]


# ---- tensor parallelism ----------------------------------------------------------------------

def tp_key(key, rank):
    return f"{key}_tp_{rank}"


def _shards(tensor, tp_size, split_dim):
    """[(rank, shard, global shape, axes)] as torch.chunk sizes them (ceil(dim / tp_size) each,
    the last ranks possibly smaller or empty), or None for a bad split."""
    torch = _t()
    if not isinstance(tensor, torch.Tensor) or not isinstance(split_dim, int) or \
            not 0 <= split_dim < tensor.dim():
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
    if not same or not isinstance(tp_size, int):
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
        head = _host_bytes(p, HEADER_SIZE)
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
    except (OSError, ValueError, TypeError) as e:
        print(f"kvstash save_tensor_to_safetensor: {e}", file=sys.stderr)
        return INVALID_PARAMS
    return 0


def load_tensor_from_safetensor(store, key=None, file_name=None):
    st = _safetensors()
    if file_name is None:
        return None
    try:
        tensors = st.load_file(file_name)
    except (OSError, ValueError) as e:
        print(f"kvstash load_tensor_from_safetensor: {e}", file=sys.stderr)
        return None
    name = key if key is not None else file_name
    if not tensors:
        return None
    t = tensors.get(name, next(iter(tensors.values())))
    return t if put_tensor(store, name, t) == 0 else None
