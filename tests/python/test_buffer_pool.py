"""Mooncake's BufferPool against a real kvstash-server: size classes, reuse, registered memory
that the zero-copy calls take, views and release, exhaustion (refused, waited for, timed out),
trimming, oversize leases, garbage collection and close."""
import gc
import threading
import time
import unittest

import kvstash
from kvs_harness import Server, pattern

KIB = 1024


class BufferPoolTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server(segment="64MiB")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def setUp(self):
        self.s = kvstash.MooncakeDistributedStore()
        self.assertEqual(self.s.setup("localhost", "P2PHANDSHAKE", 0, "16MiB", "tcp", "",
                                      self.server.master), 0)
        self.addCleanup(self.s.close)

    def pool(self, **kw):
        p = kvstash.BufferPool(self.s, **kw)
        self.addCleanup(p.close)
        return p

    def waiter(self, pool, timeout):
        """A thread blocked in pool.acquire(1) (started, and seen waiting): its lease lands in
        the list returned."""
        got = []
        before = pool.stats()["waits"]
        t = threading.Thread(target=lambda: got.append(pool.acquire(1, timeout=timeout)))
        t.start()
        deadline = time.monotonic() + 10
        while pool.stats()["waits"] == before:
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.001)
        return got, t

    def test_arguments(self):
        with self.assertRaisesRegex(RuntimeError, "not initialized"):
            kvstash.BufferPool(kvstash.MooncakeDistributedStore())
        with self.assertRaisesRegex(RuntimeError, "MooncakeDistributedStore"):
            kvstash.BufferPool(object())
        with self.assertRaisesRegex(RuntimeError, "alignment"):
            kvstash.BufferPool(self.s, alignment=3000)
        with self.assertRaisesRegex(RuntimeError, "min_size_class"):
            kvstash.BufferPool(self.s, min_size_class=0)
        p = self.pool()
        self.assertEqual(p.max_bytes, 32 << 20)  # twice local_buffer_size
        with self.assertRaisesRegex(RuntimeError, "non-negative"):
            p.acquire(10, timeout=-1)
        with self.assertRaisesRegex(RuntimeError, "exceeds pool capacity"):
            p.acquire((32 << 20) + 1)
        self.assertIs(kvstash.RegisteredBufferPool, kvstash.BufferPool)

    def test_size_classes(self):
        p = self.pool(min_size_class=64 * KIB, alignment=1 << 20)
        self.assertEqual(p.size_class(0), 64 * KIB)
        self.assertEqual(p.size_class(64 * KIB), 64 * KIB)
        self.assertEqual(p.size_class(64 * KIB + 1), 128 * KIB)
        self.assertEqual(p.size_class(700 * KIB), 1 << 20)
        self.assertEqual(p.size_class((1 << 20) + 1), 2 << 20)

    def test_zero_copy_calls_and_reuse(self):
        p = self.pool()
        data = pattern("bp", 100 * KIB)
        with p.buffer(len(data)) as lease:
            self.assertEqual(lease.size, len(data))
            self.assertEqual(lease.ptr % (8 << 20), 0)  # aligned as asked (8 MiB default)
            view = lease.buffer
            self.assertEqual((view.format, view.nbytes, view.readonly), ("B", len(data), False))
            view[:] = data
            del view
            # Registered: put_from and get_into take it as it is.
            self.assertEqual(self.s.put_from("bp-key", lease.ptr, lease.size), 0)
            first = lease.ptr
        with p.acquire(len(data)) as again:
            self.assertEqual(again.ptr, first)  # the same region, reused
            self.assertEqual(self.s.get_into("bp-key", again.ptr, again.size), len(data))
            self.assertEqual(bytes(again.buffer), data)
        st = p.stats()
        self.assertEqual((st["created"], st["reused"], st["in_use"]), (1, 1, 0))
        with self.assertRaisesRegex(RuntimeError, "closed"):
            again.ptr
        zero = p.acquire(0)
        self.assertEqual((zero.size, len(zero.buffer)), (0, 0))
        zero.release()

    def test_views_block_release(self):
        p = self.pool()
        lease = p.acquire(4096)
        view = lease.buffer
        with self.assertRaisesRegex(RuntimeError, "exported views"):
            lease.release()
        del view
        gc.collect()
        lease.release()
        lease.release()  # a no-op once released

    def test_exhaustion_refused_timed_out_and_waited_for(self):
        p = self.pool(max_bytes=128 * KIB, min_size_class=64 * KIB, alignment=64 * KIB)
        a, b = p.acquire(1), p.acquire(1)
        with self.assertRaisesRegex(RuntimeError, "exhausted"):
            p.acquire(1, block=False)
        t0 = time.monotonic()
        with self.assertRaisesRegex(RuntimeError, "timed out"):
            p.acquire(1, timeout=0.2)
        self.assertGreaterEqual(time.monotonic() - t0, 0.19)
        self.assertEqual(p.stats()["timeouts"], 1)
        # A blocked acquire gets the region another thread releases.
        got, waiter = self.waiter(p, 10)
        ptr = a.ptr
        a.release()
        waiter.join(10)
        self.assertEqual(len(got), 1)
        self.assertEqual(got[0].ptr, ptr)
        got[0].release()
        b.release()
        # max_regions caps the regions too.
        q = self.pool(max_regions=1, min_size_class=64 * KIB, alignment=64 * KIB)
        one = q.acquire(10)
        with self.assertRaisesRegex(RuntimeError, "exhausted"):
            q.acquire(10, block=False)
        one.release()

    def test_idle_regions_are_trimmed_and_oversize_leases_go(self):
        p = self.pool(max_bytes=256 * KIB, min_size_class=64 * KIB, alignment=64 * KIB,
                      max_size_class=128 * KIB)
        small = [p.acquire(1) for _ in range(4)]
        for s in small:
            s.release()
        self.assertEqual(p.stats()["bytes"], 256 * KIB)
        big = p.acquire(128 * KIB)  # two idle 64 KiB regions make room
        self.assertEqual(p.stats()["trimmed"], 2)
        big.release()
        over = p.acquire(200 * KIB)  # above max_size_class: made for it, gone at release
        self.assertEqual(p.stats()["oversize"], 1)
        before = p.stats()["bytes"]
        over.release()
        self.assertEqual(p.stats()["bytes"], before - 256 * KIB)
        with self.assertRaisesRegex(RuntimeError, "oversize"):
            p.prewarm(200 * KIB, 1)

    def test_prewarm_gc_and_close(self):
        p = self.pool(min_size_class=64 * KIB, alignment=64 * KIB, prewarm_size=1000,
                      prewarm_count=2)
        self.assertEqual(p.stats()["regions"], 2)
        lease = p.acquire(1000)
        self.assertEqual(p.stats()["created"], 2)  # from the prewarmed ones
        with self.assertRaisesRegex(RuntimeError, "active leases"):
            p.close()
        del lease
        gc.collect()
        self.assertEqual(p.stats()["in_use"], 0)  # collected leases come back
        p.close()
        p.close()
        with self.assertRaisesRegex(RuntimeError, "closed"):
            p.acquire(1)


    def test_concurrent_release_counts_once(self):
        # Two threads release one lease; the view check is slowed down so that both are
        # inside release() together (before, both got past it and the count went to -1).
        class SlowViews(list):
            def __iter__(self):
                time.sleep(0.05)
                return super().__iter__()

        p = self.pool(min_size_class=64 * KIB, alignment=64 * KIB)
        lease = p.acquire(1)
        lease._views = SlowViews()
        go = threading.Barrier(2)
        errors = []

        def rel():
            go.wait()
            try:
                lease.release()
            except Exception as e:  # noqa: BLE001 - any failure is the defect
                errors.append(e)

        ts = [threading.Thread(target=rel) for _ in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(10)
        self.assertEqual(errors, [])
        self.assertEqual(p.stats()["in_use"], 0)
        p.close()  # nothing counted as still leased

    def test_dropped_lease_wakes_a_waiter(self):
        # A lease dropped (not released) by another thread while the pool is busy still
        # reaches a thread waiting for it.
        p = self.pool(max_regions=1, min_size_class=64 * KIB, alignment=64 * KIB)
        holder = [p.acquire(1)]
        got, waiter = self.waiter(p, 20)
        dropper = threading.Thread(target=holder.clear)  # the last reference goes there
        t0 = time.monotonic()
        with p._locked():  # the pool is busy when the lease goes
            dropper.start()
            time.sleep(0.05)
        dropper.join(10)
        waiter.join(20)
        self.assertEqual(len(got), 1)
        self.assertLess(time.monotonic() - t0, 5)
        got[0].release()

    def test_regions_survive_a_new_setup_and_close_is_final(self):
        p = self.pool(min_size_class=64 * KIB, alignment=64 * KIB)
        p.acquire(100).release()  # a free, registered region
        self.s.close()
        self.assertEqual(self.s.setup("localhost", "P2PHANDSHAKE", 0, "16MiB", "tcp", "",
                                      self.server.master), 0)
        with p.acquire(100) as lease:  # the same region, registered with the new client
            lease.buffer[:5] = b"again"
            self.assertEqual(self.s.put_from("bp-again", lease.ptr, 5), 0)
        self.assertEqual(self.s.get("bp-again"), b"again")
        p.close()
        with self.assertRaisesRegex(RuntimeError, "closed"):
            p.prewarm(100, 1)
        with self.assertRaisesRegex(RuntimeError, "max_regions"):
            kvstash.BufferPool(self.s, max_regions=0)


if __name__ == "__main__":
    unittest.main()
