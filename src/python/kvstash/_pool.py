"""Mooncake's BufferPool: registered host memory carved into size classes, leased out for the
zero-copy calls (get_into, put_from, get_tensor_into, ...) and taken back for reuse, so that a
caller never registers memory per call.

Sizes round up to a class: at most min_size_class gives min_size_class, at most alignment the
next power of two, beyond that a multiple of alignment. A lease takes a free region of its class
or maps and registers a new one while the pool is under max_bytes (and max_regions); idle
regions of other classes are returned to the system to make room. A size above max_size_class
is "oversize": its region is made for it and goes at its release. When nothing is left, acquire
waits (block_on_exhaustion, up to its time-out) or raises RuntimeError."""
import collections
import contextlib
import ctypes
import mmap
import threading
import time
import weakref

DEFAULT_MAX_BYTES = 1 << 30


class _Region:
    __slots__ = ("map", "addr", "size")

    def __init__(self, size, alignment):
        # Mapped with room to align the start; the mapping stays whole until the region goes.
        extra = alignment if alignment > mmap.PAGESIZE else 0
        self.map = mmap.mmap(-1, size + extra, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.addr = (base + alignment - 1) & ~(alignment - 1) if extra else base
        self.size = size

    def close(self):
        try:
            self.map.close()
        except BufferError:  # a view made of it still lives: it goes with that view
            pass


class BufferLeaseView:
    """The memory of a lease as a writable 1-D buffer (format 'B'), through `.buffer`; while
    a view lives, its lease cannot be released and stays alive."""

    def __init__(self, lease):
        with lease._pool._locked():  # against a release() in another thread
            arr = (ctypes.c_ubyte * lease._size).from_address(lease._addr())
            arr.lease = lease  # the memory's owner lives while the view does
            lease._views = [w for w in lease._views if w() is not None] + [weakref.ref(arr)]
        self._mv = memoryview(arr).cast("B")

    @property
    def buffer(self):
        return self._mv


class BufferLease:
    """Registered memory of at least `size` bytes at `ptr`, until release() (or the end of a
    `with` block, or garbage collection)."""

    def __init__(self, pool, region, size, oversize):
        self._pool, self._region, self._size, self._oversize = pool, region, size, oversize
        self._views = []  # weak references to the views' memory (ctypes arrays)

    def _addr(self):
        if self._region is None:
            raise RuntimeError("buffer lease is closed")
        return self._region.addr

    @property
    def ptr(self):
        return self._addr()

    @property
    def size(self):
        return self._size

    @property
    def buffer(self):
        """A new writable memoryview (format 'B') of the lease's `size` bytes."""
        self._addr()
        return BufferLeaseView(self).buffer

    def release(self):
        """Returns the memory to the pool; RuntimeError while views of it live."""
        pool = self._pool
        with pool._locked():
            if self._region is None:
                return
            if any(w() is not None for w in self._views):
                raise RuntimeError("cannot release buffer while exported views exist")
            region, self._region = self._region, None
            pool._returns_late()
            pool._return(region, self._oversize)
            pool._cond.notify_all()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False

    def __del__(self):
        # No view can live here (each view holds its lease). When this runs inside the pool's
        # own code (garbage collection in the thread holding its lock), the region waits for
        # that code to take it back; in any other thread it goes back at once.
        if getattr(self, "_region", None) is not None:
            region, self._region = self._region, None
            self._pool._give_back(region, self._oversize)


class BufferPool:
    """Mooncake's constructor: BufferPool(store, max_bytes=0, min_size_class=65536,
    max_size_class=None, alignment=8 MiB, block_on_exhaustion=True, default_timeout=None,
    max_regions=None, prewarm_size=None, prewarm_count=0). max_bytes 0 takes twice the store's
    local_buffer_size, or 1 GiB when it has none."""

    def __init__(self, store, max_bytes=0, min_size_class=65536, max_size_class=None,
                 alignment=8 * 1024 * 1024, block_on_exhaustion=True, default_timeout=None,
                 max_regions=None, prewarm_size=None, prewarm_count=0):
        from . import MooncakeDistributedStore
        if not isinstance(store, MooncakeDistributedStore):
            raise RuntimeError("BufferPool store parameter must be a MooncakeDistributedStore")
        if store.get_hostname() == "":
            raise RuntimeError("MooncakeDistributedStore is not initialized")
        for name, v in (("max_bytes", max_bytes), ("min_size_class", min_size_class),
                        ("alignment", alignment), ("prewarm_count", prewarm_count)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise RuntimeError(f"BufferPool {name} must be an int >= 0")
        if min_size_class == 0:
            raise RuntimeError("BufferPool min_size_class must be > 0")
        if alignment < 8 or alignment & (alignment - 1):
            raise RuntimeError("BufferPool alignment must be a power of two >= 8")
        if default_timeout is not None and default_timeout < 0:
            raise RuntimeError("timeout must be non-negative")
        if max_regions is not None and (not isinstance(max_regions, int) or
                                        isinstance(max_regions, bool) or max_regions < 1):
            raise RuntimeError("BufferPool max_regions must be None or an int >= 1")
        if max_bytes == 0:
            local = getattr(store, "_local_buffer_size", 0)
            max_bytes = 2 * local if local else DEFAULT_MAX_BYTES
        self._store = store
        self.max_bytes = max_bytes
        self.min_size_class = min_size_class
        self.max_size_class = min(max_size_class or max_bytes, max_bytes)
        self.alignment = alignment
        self.block_on_exhaustion = bool(block_on_exhaustion)
        self.default_timeout = default_timeout
        self.max_regions = max_regions
        self._lock = threading.Lock()  # not reentrant: see BufferLease.__del__
        self._cond = threading.Condition(self._lock)
        self._owner = None  # the thread holding the lock
        self._late = collections.deque()  # regions given back by its holder, in __del__
        self._free = {}  # class size -> [regions]
        self._bytes = 0  # of every region, free or leased
        self._regions = 0
        self._in_use = 0
        self._closed = False
        self._stats = {"acquired": 0, "created": 0, "reused": 0, "oversize": 0, "trimmed": 0,
                       "waits": 0, "timeouts": 0}
        if prewarm_size is not None and prewarm_count:
            self.prewarm(prewarm_size, prewarm_count)

    # -- locking ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self):
        self._lock.acquire()
        self._owner = threading.get_ident()
        try:
            yield
        finally:
            if self._late:  # leases collected in this very section: back, and waiters told
                self._returns_late()
                self._cond.notify_all()
            self._owner = None
            self._lock.release()

    def _wait(self, timeout):
        self._owner = None
        try:
            self._cond.wait(timeout)
        finally:
            self._owner = threading.get_ident()

    # -- size classes and regions -------------------------------------------------------------

    def size_class(self, size):
        """The region size a lease of `size` bytes gets."""
        s = max(size, 1)
        if s <= self.min_size_class:
            return self.min_size_class
        if s <= self.alignment:
            return 1 << (s - 1).bit_length()
        return -(-s // self.alignment) * self.alignment

    def _new_region(self, cls):
        """A registered region of cls bytes; RuntimeError when it cannot be made."""
        try:
            r = _Region(cls, self.alignment)
        except (OSError, ValueError) as e:
            raise RuntimeError(f"buffer pool: cannot map {cls} bytes: {e}") from None
        if self._store.register_buffer(r.addr, cls) != 0:
            r.close()
            raise RuntimeError("buffer registration failed")
        self._stats["created"] += 1
        return r

    def _drop_region(self, r):
        self._store.unregister_buffer(r.addr)
        r.close()

    def _room(self, cls):
        return self._bytes + cls <= self.max_bytes and \
            (self.max_regions is None or self._regions < self.max_regions)

    def _trim_for(self, cls):
        """Returns idle regions of other classes to the system until cls fits; nothing when
        even all of them would not make room (the caller holds the lock)."""
        idle = [(c, len(r)) for c, r in self._free.items() if c != cls]
        if self._bytes - sum(c * k for c, k in idle) + cls > self.max_bytes or \
                (self.max_regions is not None and
                 self._regions - sum(k for _, k in idle) >= self.max_regions):
            return
        for c in sorted(self._free, reverse=True):
            regions = self._free[c]
            while regions and c != cls and not self._room(cls):
                self._drop_region(regions.pop())
                self._bytes -= c
                self._regions -= 1
                self._stats["trimmed"] += 1
            if self._room(cls):
                return

    def _take(self, cls):
        """A region of class cls, or None when the pool has no room (lock held)."""
        regions = self._free.get(cls)
        while regions:
            r = regions.pop()
            # Registrations end with the store's client (close, then setup again): renewed.
            if self._store._buffer_domain(r.addr, r.size) == -1 or \
                    self._store.register_buffer(r.addr, r.size) == 0:
                self._stats["reused"] += 1
                return r
            r.close()
            self._bytes -= cls
            self._regions -= 1
        if not self._room(cls):
            self._trim_for(cls)
        if not self._room(cls):
            return None
        r = self._new_region(cls)
        self._bytes += cls
        self._regions += 1
        return r

    def _return(self, region, oversize):
        """A leased region back (lock held)."""
        self._in_use -= 1
        if oversize or self._closed:
            self._drop_region(region)
            self._bytes -= region.size
            self._regions -= 1
        else:
            self._free.setdefault(region.size, []).append(region)

    def _returns_late(self):
        while self._late:
            self._return(*self._late.popleft())

    def _give_back(self, region, oversize):
        """A region back from a lease's __del__."""
        if self._owner == threading.get_ident():
            self._late.append((region, oversize))  # this thread is inside the pool: it takes it
            return
        with self._locked():
            self._returns_late()
            self._return(region, oversize)
            self._cond.notify_all()

    # -- Mooncake's methods -------------------------------------------------------------------

    def acquire(self, size, block=None, timeout=None):
        """A lease of at least `size` bytes of registered memory. When the pool is exhausted:
        waits (block, default block_on_exhaustion) up to `timeout` seconds (default
        default_timeout, None: for ever), else raises RuntimeError."""
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise RuntimeError("buffer size must be an int >= 0")
        block = self.block_on_exhaustion if block is None else bool(block)
        timeout = self.default_timeout if timeout is None else timeout
        if timeout is not None and timeout < 0:
            raise RuntimeError("timeout must be non-negative")
        if max(size, 1) > self.max_bytes:
            raise RuntimeError("requested buffer size exceeds pool capacity")
        oversize = max(size, 1) > self.max_size_class
        cls = -(-max(size, 1) // self.alignment) * self.alignment if oversize else \
            self.size_class(size)
        if cls > self.max_bytes:
            cls = max(size, 1)  # an oversize region may be exactly the capacity
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._locked():
            while True:
                if self._closed:
                    raise RuntimeError("buffer pool is closed")
                self._returns_late()
                r = self._take(cls)
                if r is not None:
                    break
                if self._late:  # returned meanwhile, by this thread's own collection
                    continue
                if not block:
                    raise RuntimeError("buffer pool is exhausted")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    self._stats["timeouts"] += 1
                    raise RuntimeError("timed out waiting for buffer")
                self._stats["waits"] += 1
                self._wait(left)
            self._in_use += 1
            self._stats["acquired"] += 1
            self._stats["oversize"] += oversize
        return BufferLease(self, r, size, oversize)

    def buffer(self, size, block=None, timeout=None):
        """acquire(), for `with pool.buffer(n) as lease:`."""
        return self.acquire(size, block, timeout)

    def prewarm(self, size, count):
        """Maps and registers `count` free regions of size's class now."""
        if max(size, 1) > self.max_size_class:
            raise RuntimeError("cannot prewarm oversize buffers")
        cls = self.size_class(size)
        with self._locked():
            if self._closed:
                raise RuntimeError("buffer pool is closed")
            self._returns_late()
            for _ in range(count):
                if not self._room(cls):
                    raise RuntimeError("buffer pool is exhausted")
                r = self._new_region(cls)
                self._bytes += cls
                self._regions += 1
                self._free.setdefault(cls, []).append(r)

    def stats(self):
        with self._locked():
            self._returns_late()
            return dict(self._stats, bytes=self._bytes, regions=self._regions,
                        in_use=self._in_use, max_bytes=self.max_bytes)

    def close(self):
        """Unregisters and unmaps the pool's regions; RuntimeError while leases are out."""
        with self._locked():
            if self._closed:
                return
            self._returns_late()
            if self._in_use:
                raise RuntimeError("cannot close buffer pool with active leases")
            for regions in self._free.values():
                for r in regions:
                    self._drop_region(r)
            self._free.clear()
            self._bytes = self._regions = 0
            self._closed = True
            self._cond.notify_all()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:  # leases still out, or the store is gone: nothing to do here
            pass


RegisteredBufferPool = BufferPool
RegisteredBufferLease = BufferLease
RegisteredBufferLeaseView = BufferLeaseView
