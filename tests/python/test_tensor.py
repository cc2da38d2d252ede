"""Mooncake's tensor API (kvstash/_tensor.py) against a real kvstash-server, with PyTorch on the
CPU: byte-exact round trips of every dtype this PyTorch has, shapes, non-contiguous and zero-size
tensors, the _into/_from/upsert/pub families, TP sharding along every dimension, and the reads
into registered tensors that GPU destinations use (here with host tensors)."""
import ctypes
import os
import tempfile
import threading
import unittest

import kvstash
from kvstash import _tensor
from kvs_harness import Buffer, Server

try:
    import torch
except ImportError as e:  # the test command installs python3-torch; say so where it cannot
    raise unittest.SkipTest(f"PyTorch is not importable here ({e}): tensor tests skipped")

DTYPES = [getattr(torch, n) for n in _tensor._DTYPE_NAMES.values()
          if isinstance(getattr(torch, n, None), torch.dtype)]


def raw(t):
    """The tensor's bytes in C order (NaN payloads and all)."""
    t = t.contiguous().reshape(-1)
    return bytes(t.view(torch.uint8).numpy()) if t.numel() else b""


def sample(dtype, shape, seed=0):
    """A tensor of random bit patterns (0/1 for bool)."""
    g = torch.Generator().manual_seed(seed)
    n = 1
    for d in shape:
        n *= d
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g, dtype=torch.uint8).bool().reshape(shape)
    size = torch.empty((), dtype=dtype).element_size()
    b = torch.randint(0, 256, (n * size,), generator=g, dtype=torch.uint8)
    return b.view(dtype).reshape(shape)


class TensorTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # Room for the upsert race's tombstones (each lasts its reader's lease, 10 s) beside
        # the other cases' objects, so that none of them is evicted meanwhile.
        cls.server = Server(segment="512MiB")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def setUp(self):
        self.s = kvstash.MooncakeDistributedStore()
        self.assertEqual(self.s.setup("localhost", "P2PHANDSHAKE", 0, 0, "tcp", "",
                                      self.server.master), 0)
        self.addCleanup(self.s.close)
        self.prefix = self.id().rsplit(".", 1)[-1] + "-"

    def k(self, name):
        return self.prefix + name

    def assertSame(self, got, want):
        self.assertIsNotNone(got)
        self.assertEqual(got.dtype, want.dtype)
        self.assertEqual(tuple(got.shape), tuple(want.shape))
        self.assertEqual(raw(got), raw(want))

    def registered(self, size):
        buf = Buffer(size)
        self.assertEqual(self.s.register_buffer(buf.ptr, buf.size), 0)
        self.addCleanup(self.s.unregister_buffer, buf.ptr)
        return buf

    def test_every_dtype_round_trips_byte_exact(self):
        self.assertIn(torch.bfloat16, DTYPES)
        for i, dt in enumerate(DTYPES):
            with self.subTest(dtype=dt):
                t = sample(dt, (3, 5, 8), seed=i)
                key = self.k(str(dt))
                self.assertEqual(self.s.put_tensor(key, t), 0)
                self.assertSame(self.s.get_tensor(key), t)
        # The stored object is the header plus the elements.
        t = sample(torch.float16, (4, 4))
        self.assertEqual(self.s.put_tensor(self.k("sz"), t), 0)
        self.assertEqual(self.s.get_size(self.k("sz")), 304 + 32)
        self.assertEqual(self.s.get(self.k("sz"))[:4], (0x4D4F4F4E).to_bytes(4, "little"))

    def test_shapes_noncontiguous_and_zero_size(self):
        s = self.s
        base = sample(torch.float32, (6, 8, 10))
        cases = {
            "scalar": torch.tensor(3.5, dtype=torch.float64),
            "empty": torch.empty((0, 4), dtype=torch.int32),
            "empty3": torch.empty((2, 0, 3), dtype=torch.bfloat16),
            "transposed": base.transpose(0, 2),
            "strided": base[::2, 1::3, :],
            "expanded": torch.arange(4, dtype=torch.int16).expand(3, 4),
            "eight_dims": sample(torch.uint8, (1, 2, 1, 2, 1, 2, 1, 2)),
        }
        for name, t in cases.items():
            with self.subTest(name):
                self.assertEqual(s.put_tensor(self.k(name), t), 0)
                got = s.get_tensor(self.k(name))
                self.assertSame(got, t.contiguous())
                self.assertTrue(got.is_contiguous())
        self.assertEqual(s.put_tensor(self.k("nine"), torch.zeros([1] * 9)), -600)
        self.assertEqual(s.put_tensor(self.k("list"), [1, 2, 3]), -600)
        self.assertEqual(s.put_tensor(self.k("q"), torch.quantize_per_tensor(
            torch.ones(4), 0.1, 0, torch.qint8)), -600)
        self.assertIsNone(s.get_tensor(self.k("absent")))
        # An object that is not a tensor reads as None.
        self.assertEqual(s.put(self.k("bytes"), b"x" * 400), 0)
        self.assertIsNone(s.get_tensor(self.k("bytes")))

    def test_existing_key_keeps_first_and_upsert_replaces(self):
        s, key = self.s, self.k("u")
        a, b = sample(torch.int64, (16,), 1), sample(torch.float32, (2, 3), 2)
        self.assertEqual(s.put_tensor(key, a), 0)
        self.assertEqual(s.put_tensor(key, b), 0)  # Mooncake: 0, the first value stays
        self.assertSame(s.get_tensor(key), a)
        self.assertEqual(s.upsert_tensor(key, b), 0)
        self.assertSame(s.get_tensor(key), b)
        keys = [self.k("bu0"), self.k("bu1")]
        self.assertEqual(s.batch_upsert_tensor(keys, [a, b]), [0, 0])
        self.assertEqual(s.batch_upsert_tensor(keys, [b, a]), [0, 0])
        got = s.batch_get_tensor(keys)
        self.assertSame(got[0], b)
        self.assertSame(got[1], a)

    def test_batches_and_codes(self):
        s = self.s
        keys = [self.k(f"b{i}") for i in range(5)]
        ts = [sample(DTYPES[i % len(DTYPES)], (i + 1, 3), i) for i in range(5)]
        self.assertEqual(s.batch_put_tensor(keys, ts), [0] * 5)
        got = s.batch_get_tensor(keys + [self.k("none")])
        for g, t in zip(got, ts):
            self.assertSame(g, t)
        self.assertIsNone(got[5])
        self.assertEqual(s.batch_put_tensor(keys, ts[:2]), [-600] * 5)  # one per key
        self.assertEqual(s.batch_put_tensor([], []), [])
        self.assertEqual(s.batch_put_tensor([self.k("x0"), self.k("x1")], [ts[0], "no"]),
                         [0, -600])
        self.assertEqual(s.batch_get_tensor([]), [])

    def test_pub_tensor_with_config(self):
        s = self.s
        t = sample(torch.bfloat16, (8, 8))
        cfg = kvstash.ReplicateConfig(replica_num=1, with_hard_pin=True)
        self.assertEqual(s.pub_tensor(self.k("p"), t, cfg), 0)
        self.assertSame(s.get_tensor(self.k("p")), t)
        bad = kvstash.ReplicateConfig(replica_num=1, preferred_segments=["a", "b"])
        self.assertEqual(s.pub_tensor(self.k("bad"), t, bad), -600)
        self.assertEqual(s.batch_pub_tensor([self.k("p1"), self.k("p2")], [t, t], cfg), [0, 0])
        self.assertEqual(s.batch_pub_tensor([self.k("p3")], [t], bad), [-600])

    def test_into_and_from(self):
        s = self.s
        t = sample(torch.float16, (32, 16), 7)
        key = self.k("into")
        self.assertEqual(s.put_tensor(key, t), 0)
        need = 304 + t.numel() * t.element_size()
        buf = self.registered(need + 100)
        got = s.get_tensor_into(key, buf.ptr, buf.size)
        self.assertSame(got, t)
        # A view of the buffer, not a copy.
        self.assertEqual(got.data_ptr(), buf.ptr + 304)
        self.assertIsNone(s.get_tensor_into(key, buf.ptr, need - 1))  # too small
        self.assertIsNone(s.get_tensor_into(self.k("none"), buf.ptr, buf.size))
        # What get_tensor_into left in the buffer is a serialized tensor put_tensor_from takes.
        self.assertEqual(s.put_tensor_from(self.k("from"), buf.ptr, need), 0)
        self.assertSame(s.get_tensor(self.k("from")), t)
        self.assertEqual(s.put_tensor_from(self.k("trail"), buf.ptr, need + 8), -600)
        self.assertEqual(s.put_tensor_from(self.k("short"), buf.ptr, 100), -600)
        garbage = self.registered(4096)
        self.assertEqual(s.put_tensor_from(self.k("junk"), garbage.ptr, 4096), -600)
        u = sample(torch.float16, (32, 16), 8)
        self.assertEqual(s.upsert_tensor(self.k("scratch"), u), 0)
        self.assertSame(s.get_tensor_into(self.k("scratch"), buf.ptr, buf.size), u)
        self.assertEqual(s.upsert_tensor_from(self.k("from"), buf.ptr, need), 0)
        self.assertSame(s.get_tensor(self.k("from")), u)
        # Batches.
        keys = [self.k("bi0"), self.k("bi1")]
        ts = [sample(torch.int32, (10,), 1), sample(torch.float64, (3, 3), 2)]
        self.assertEqual(s.batch_put_tensor(keys, ts), [0, 0])
        b2 = [self.registered(1024), self.registered(1024)]
        got = s.batch_get_tensor_into(keys, [b.ptr for b in b2], [1024, 1024])
        self.assertSame(got[0], ts[0])
        self.assertSame(got[1], ts[1])
        self.assertEqual(s.batch_get_tensor_into(keys, [b2[0].ptr], [1024]), [-600, -600])
        sizes = [304 + 40, 304 + 72]
        k2 = [self.k("bf0"), self.k("bf1")]
        self.assertEqual(s.batch_put_tensor_from(k2, [b.ptr for b in b2], sizes), [0, 0])
        self.assertSame(s.get_tensor(k2[1]), ts[1])
        self.assertEqual(s.batch_put_tensor_from(k2, [b2[0].ptr, garbage.ptr], sizes),
                         [-600, -600])
        self.assertEqual(s.batch_upsert_tensor_from(k2, [b2[1].ptr, b2[0].ptr],
                                                    [sizes[1], sizes[0]]), [0, 0])
        self.assertSame(s.get_tensor(k2[0]), ts[1])

    def test_with_buffer_pool(self):
        # A BufferPool lease is registered memory the _into and _from calls take as it is.
        s = self.s
        t = sample(torch.bfloat16, (128, 64), 9)
        self.assertEqual(s.put_tensor(self.k("pool"), t), 0)
        pool = kvstash.BufferPool(s, max_bytes=1 << 20, min_size_class=64 << 10,
                                  alignment=64 << 10)
        self.addCleanup(pool.close)
        with pool.buffer(304 + t.numel() * 2) as lease:
            got = s.get_tensor_into(self.k("pool"), lease.ptr, lease.size)
            self.assertSame(got, t)
            self.assertEqual(s.put_tensor_from(self.k("pool2"), lease.ptr, lease.size), 0)
            del got
        self.assertSame(s.get_tensor(self.k("pool2")), t)

    def test_into_registered_tensors(self):
        # The call GPU destinations use, here with host tensors registered as they would be.
        s = self.s
        keys = [self.k(f"c{i}") for i in range(3)]
        ts = [sample(torch.bfloat16, (64, 128), i) for i in range(3)]
        self.assertEqual(s.batch_put_tensor(keys, ts), [0] * 3)
        dst = [torch.full_like(t, -1) for t in ts]
        for d in dst:
            n = d.numel() * d.element_size()
            self.assertEqual(s.register_buffer(d.data_ptr(), n), 0)
            self.addCleanup(s.unregister_buffer, d.data_ptr())
        nbytes = ts[0].numel() * 2
        self.assertEqual(s.batch_get_tensor_into_cuda(keys, dst), [nbytes] * 3)
        for d, t in zip(dst, ts):
            self.assertSame(d, t)
        # One key, and the refusals: wrong dtype or shape, missing key, unregistered memory.
        self.assertEqual(s.get_tensor_into_cuda(keys[0], dst[1]), nbytes)
        self.assertSame(dst[1], ts[0])
        wrong = torch.empty((64, 128), dtype=torch.float16)
        self.assertEqual(s.get_tensor_into_cuda(keys[0], wrong), -600)
        self.assertEqual(s.get_tensor_into_cuda(keys[0], dst[0].reshape(128, 64)), -600)
        self.assertEqual(s.get_tensor_into_cuda(self.k("none"), dst[0]), -704)
        loose = torch.empty((64, 128), dtype=torch.bfloat16)
        self.assertLess(s.get_tensor_into_cuda(keys[0], loose), 0)
        self.assertEqual(s.batch_get_tensor_into_cuda(keys, dst[:1]), [-600] * 3)
        self.assertEqual(s.get_tensor_into_cuda(keys[0], dst[0].t()), -600)  # not contiguous

    def test_into_registered_tensors_never_mixes_versions(self):
        # Upserts racing the reads, alternating a float32 tensor and an int32 one of the same
        # size: a read that took the header of one and the elements of the other would give
        # float32 values other than 1.0 (or shapes that lie). Each read is one version.
        s = self.s
        key = self.k("race")
        a = torch.full((64, 64), 1.0, dtype=torch.float32)
        b = torch.full((64, 64), 7, dtype=torch.int32)
        self.assertEqual(s.put_tensor(key, a), 0)
        dst = torch.empty_like(a)
        self.assertEqual(s.register_buffer(dst.data_ptr(), dst.numel() * 4), 0)
        self.addCleanup(s.unregister_buffer, dst.data_ptr())
        w = kvstash.MooncakeDistributedStore()  # another client, and this one too
        self.assertEqual(w.setup("localhost", "", 0, 0, "tcp", "", self.server.master), 0)
        self.addCleanup(w.close)
        stop = threading.Event()

        def writer():
            i = 0
            while not stop.is_set():
                (w if i % 2 else s).upsert_tensor(key, b if i % 2 else a)
                i += 1

        t = threading.Thread(target=writer)
        t.start()
        outcomes = {"a": 0, "b": 0}
        try:
            for _ in range(3000):
                r = s.get_tensor_into_cuda(key, dst)
                if r == a.numel() * 4:
                    self.assertTrue(bool((dst == 1.0).all()), "a read mixed two versions")
                    outcomes["a"] += 1
                elif r == -600:
                    outcomes["b"] += 1  # the int32 version: not this destination's dtype
        finally:
            stop.set()
            t.join(30)
        self.assertGreater(outcomes["a"], 0)
        self.assertGreater(outcomes["b"], 0)

    def test_bad_pointers_and_destinations(self):
        s = self.s
        t = sample(torch.float32, (4, 4))
        self.assertEqual(s.put_tensor(self.k("t"), t), 0)
        # Pointers that are not registered memory are refused, never read.
        for p in (4096, 0, -1, 1 << 70, "x"):
            self.assertEqual(s.put_tensor_from(self.k("p"), p, 400), -600)
            self.assertEqual(s.upsert_tensor_from(self.k("p"), p, 400), -600)
        self.assertEqual(s.batch_put_tensor_from([self.k("p")], [4096], [400]), [-600])
        loose = ctypes.create_string_buffer(4096)
        self.assertIsNone(s.get_tensor_into(self.k("t"), ctypes.addressof(loose), 4096))
        # Destinations that are views over other bytes, or of no memory.
        c = torch.zeros(4, 4, dtype=torch.complex64)
        self.assertEqual(s.register_buffer(c.data_ptr(), c.numel() * 8), 0)
        self.addCleanup(s.unregister_buffer, c.data_ptr())
        self.assertEqual(s.put_tensor(self.k("c"), c), 0)
        self.assertEqual(s.get_tensor_into_cuda(self.k("c"), c.conj()), -600)
        self.assertEqual(s.put_tensor(self.k("meta"), torch.empty(4, device="meta")), -600)
        self.assertEqual(s.put_tensor(self.k("csr"), torch.eye(3).to_sparse_csr()), -600)
        # An object with bytes after its elements is no tensor, on every read path.
        buf = self.registered(1024)
        n = s.get_into(self.k("t"), buf.ptr, buf.size)
        self.assertEqual(n, 304 + 64)
        self.assertEqual(s.put_from(self.k("trail"), buf.ptr, n + 8), 0)
        self.assertIsNone(s.get_tensor(self.k("trail")))
        dst = torch.empty(4, 4)
        self.assertEqual(s.register_buffer(dst.data_ptr(), 64), 0)
        self.addCleanup(s.unregister_buffer, dst.data_ptr())
        self.assertEqual(s.get_tensor_into_cuda(self.k("trail"), dst), -600)
        self.assertEqual(s.get_tensor_into_cuda(self.k("t"), dst), 64)
        self.assertSame(dst, t)

    def test_pub_upsert_and_tp_from(self):
        s = self.s
        t = sample(torch.int16, (6, 4), 5)
        u = sample(torch.int16, (6, 4), 6)
        cfg = kvstash.ReplicateConfig(replica_num=1)
        self.assertEqual(s.upsert_pub_tensor(self.k("up"), t, cfg), 0)
        self.assertEqual(s.upsert_pub_tensor(self.k("up"), u, cfg), 0)
        self.assertSame(s.get_tensor(self.k("up")), u)
        self.assertEqual(s.batch_upsert_pub_tensor([self.k("up")], [t], cfg), [0])
        self.assertSame(s.get_tensor(self.k("up")), t)
        self.assertEqual(s.pub_tensor_with_tp(self.k("ptp"), t, cfg, 0, 2, 0), 0)
        self.assertSame(s.get_tensor_with_tp(self.k("ptp"), 1, 2), t[3:])
        self.assertEqual(s.batch_pub_tensor_with_tp([self.k("ptp2")], [t], cfg, 0, 3, 1), [0])
        self.assertSame(s.get_tensor_with_tp(self.k("ptp2"), 2, 3), t[:, 4:])  # empty rank
        buf = self.registered(1024)
        n = s.get_into(self.k("up"), buf.ptr, buf.size)
        self.assertEqual(s.put_tensor_with_tp_from(self.k("tf"), buf.ptr, n, 0, 2, 1), 0)
        self.assertSame(s.get_tensor_with_tp(self.k("tf"), 0, 2), t[:, :2])
        self.assertEqual(s.batch_put_tensor_with_tp_from([self.k("tf2")], [4096], [n], 0, 2),
                         [-600])
        self.assertEqual(s.put_tensor_with_tp(self.k("x"), t, tp_size=True), -600)
        self.assertEqual(s.put_tensor_with_tp(self.k("x"), t, tp_size=1 << 31), -600)
        self.assertEqual(s.put_tensor_with_tp(self.k("x"), t, tp_size=2, split_dim=True), -600)

    def test_tp_sharding_every_dimension(self):
        s = self.s
        t = sample(torch.float32, (6, 7, 5), 3)
        for tp in (2, 3, 4):
            for dim in range(t.dim()):
                with self.subTest(tp=tp, dim=dim):
                    key = self.k(f"tp{tp}d{dim}")
                    self.assertEqual(s.put_tensor_with_tp(key, t, tp_size=tp, split_dim=dim), 0)
                    shards = [s.get_tensor_with_tp(key, r, tp, dim) for r in range(tp)]
                    want = torch.chunk(t, tp, dim)
                    for r, sh in enumerate(shards):
                        if r < len(want):
                            self.assertSame(sh, want[r].contiguous())
                        else:
                            self.assertEqual(sh.shape[dim], 0)  # ranks past the end: empty
                    self.assertSame(torch.cat(shards, dim), t)
                    # Shards are objects of their own, named as Mooncake names them.
                    self.assertSame(s.get_tensor(f"{key}_tp_1"), shards[1])
        # tp_size 1 is the plain key; a shard must be that rank's.
        self.assertEqual(s.put_tensor_with_tp(self.k("one"), t, tp_size=1), 0)
        self.assertSame(s.get_tensor(self.k("one")), t)
        self.assertSame(s.get_tensor_with_tp(self.k("one")), t)
        self.assertIsNone(s.get_tensor_with_tp(self.k("one"), 0, 2))
        self.assertEqual(s.put(f"{self.k('fake')}_tp_0", b"x" * 400), 0)
        self.assertIsNone(s.get_tensor_with_tp(self.k("fake"), 0, 2))
        self.assertEqual(s.put_tensor_with_tp(self.k("bad"), t, tp_size=2, split_dim=3), -600)
        self.assertEqual(s.put_tensor_with_tp(self.k("bad"), t, tp_size=2, split_dim=-1), -600)

    def test_tp_batches_and_into(self):
        s = self.s
        keys = [self.k("m0"), self.k("m1")]
        ts = [sample(torch.bfloat16, (8, 4), 1), sample(torch.int8, (4, 6), 2)]
        self.assertEqual(s.batch_put_tensor_with_tp(keys, ts, tp_size=2, split_dim=1), [0, 0])
        for r in range(2):
            got = s.batch_get_tensor_with_tp(keys, r, 2)
            for g, t in zip(got, ts):
                self.assertSame(g, torch.chunk(t, 2, 1)[r].contiguous())
        bufs = [self.registered(512), self.registered(512)]
        got = s.batch_get_tensor_with_tp_into(keys, [b.ptr for b in bufs], [512, 512], 1, 2)
        for g, t in zip(got, ts):
            self.assertSame(g, torch.chunk(t, 2, 1)[1].contiguous())
        one = s.get_tensor_with_tp_into(keys[0], bufs[0].ptr, 512, 0, 2)
        self.assertSame(one, torch.chunk(ts[0], 2, 1)[0].contiguous())
        self.assertIsNone(s.get_tensor_with_tp_into(keys[0], bufs[0].ptr, 512, 5, 8))
        self.assertEqual(s.batch_put_tensor_with_tp(keys, ts[:1], tp_size=2), [-600, -600])

    def test_safetensors(self):
        try:
            import safetensors  # noqa: F401
        except ImportError:
            with self.assertRaises(ImportError) as cm:
                self.s.save_tensor_to_safetensor(self.k("st"), "/nonexistent")
            self.assertIn("safetensors", str(cm.exception))
            self.skipTest("safetensors is not installed: only its clear error was checked")
        t = sample(torch.float32, (4, 5))
        self.assertEqual(self.s.put_tensor(self.k("st"), t), 0)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.safetensors")
            self.assertEqual(self.s.save_tensor_to_safetensor(self.k("st"), path), 0)
            self.assertEqual(self.s.save_tensor_to_safetensor(self.k("none"), path), -1100)
            got = self.s.load_tensor_from_safetensor(self.k("st2"), path)
            self.assertSame(got, t)
            self.assertSame(self.s.get_tensor(self.k("st2")), t)

    def test_not_set_up(self):
        s = kvstash.MooncakeDistributedStore()
        t = torch.ones(3)
        self.assertEqual(s.put_tensor("k", t), -600)
        self.assertIsNone(s.get_tensor("k"))
        self.assertEqual(s.batch_put_tensor(["a"], [t]), [-600])
        self.assertEqual(s.batch_get_tensor(["a"]), [None])


if __name__ == "__main__":
    unittest.main()
