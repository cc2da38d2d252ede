"""Page-table reads and writes from Python: regions named once, page ids per key from lists,
array.array, numpy arrays and CPU torch tensors (no per-element object work in the buffer
forms), both fragment orders, regions of different strides, ids out of range (-600 before any
I/O) and duplicate pages. numpy and torch parts skip where those are not installed."""
import array
import ctypes
import unittest

import kvstash

from kvs_harness import GUARD, Buffer, Server, pattern

try:
    import numpy as np
except ImportError:  # pragma: no cover - depends on the interpreter
    np = None
try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

PAGES = 32
K_PAGE, V_PAGE = 1024, 512  # two regions: K pages of 1 KiB every 1.5 KiB, V of 512 B every 2 KiB
K_STRIDE, V_STRIDE = 1536, 2048
PER_KEY = 4


class PagesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def setUp(self):
        self.store = kvstash.MooncakeDistributedStore()
        self.assertEqual(self.store.setup("localhost", "", 0, "16MB", "tcp", "",
                                          self.server.master), 0)
        self.pool = Buffer(PAGES * K_STRIDE + PAGES * V_STRIDE)
        self.assertEqual(self.store.register_buffer(self.pool.ptr, self.pool.size), 0)
        self.regions = [(self.pool.ptr, K_PAGE, K_STRIDE, PAGES),
                        (self.pool.ptr + PAGES * K_STRIDE, V_PAGE, V_STRIDE, PAGES)]
        self.size = PER_KEY * (K_PAGE + V_PAGE)
        self.prefix = self.id().rsplit(".", 1)[-1] + "-"

    def tearDown(self):
        self.assertEqual(self.store.unregister_buffer(self.pool.ptr), 0)
        self.assertEqual(self.store.close(), 0)

    def put_keys(self, n):
        keys = [f"{self.prefix}{i}" for i in range(n)]
        for k in keys:
            self.assertEqual(self.store.put(k, pattern(k, self.size)), 0)
        return keys

    def gathered(self, ids, order):
        """The bytes a key's pages hold now, in `order`."""
        parts = []
        if order == "page":
            for p in ids:
                for base, page, stride, _ in self.regions:
                    parts.append(ctypes.string_at(base + int(p) * stride, page))
        else:
            for base, page, stride, _ in self.regions:
                for p in ids:
                    parts.append(ctypes.string_at(base + int(p) * stride, page))
        return b"".join(parts)

    def check_read(self, keys, ids_per_key, page_ids, order):
        self.pool.fill()
        res = self.store.batch_get_into_pages(keys, self.regions, page_ids, order)
        self.assertEqual(res, [self.size] * len(keys))
        for k, ids in zip(keys, ids_per_key):
            self.assertEqual(self.gathered(ids, order), pattern(k, self.size), (k, order))

    def test_lists_both_orders_and_write_back(self):
        keys = self.put_keys(3)
        ids = [[31, 2, 17, 8], [0, 30, 9, 21], [14, 3, 26, 11]]
        for order in ("page", "region"):
            self.check_read(keys, ids, ids, order)
            copies = [k + "-" + order for k in keys]
            self.assertEqual(self.store.batch_put_from_pages(copies, self.regions, ids, order),
                             [0, 0, 0])
            for k, c in zip(keys, copies):
                self.assertEqual(self.store.get(c), pattern(k, self.size))
        # Bytes outside the named pages stay as they were.
        self.check_read(keys[:1], ids[:1], ids[:1], "page")
        named = {(0, p) for p in ids[0]} | {(1, p) for p in ids[0]}
        for r, (base, page, stride, _) in enumerate(self.regions):
            for p in range(PAGES):
                if (r, p) not in named:
                    self.assertEqual(ctypes.string_at(base + p * stride, page),
                                     bytes([GUARD]) * page)

    def test_array_and_buffer_forms(self):
        keys = self.put_keys(2)
        ids = [[4, 19, 1, 28], [12, 6, 23, 15]]
        flat = array.array("I", [p for row in ids for p in row])  # one buffer, n x pages
        self.check_read(keys, ids, flat, "page")
        per_key = [array.array("q", row) for row in ids]  # per-key buffers of int64
        self.check_read(keys, ids, per_key, "region")
        self.check_read(keys, ids, memoryview(array.array("i", flat)), "page")

    @unittest.skipIf(np is None, "numpy is not installed for this interpreter")
    def test_numpy(self):
        keys = self.put_keys(2)
        ids = np.array([[5, 9, 13, 2], [29, 20, 10, 0]], dtype=np.int32)
        self.check_read(keys, ids.tolist(), ids, "page")
        self.check_read(keys, ids.tolist(), ids.astype(np.uint64), "region")
        # Not C-contiguous: a clear error rather than wrong pages.
        with self.assertRaises((BufferError, ValueError)):
            self.store.batch_get_into_pages(keys, self.regions, ids.T.copy().T, "page")
        with self.assertRaises(TypeError):
            self.store.batch_get_into_pages(keys, self.regions, ids.astype(np.float32), "page")

    @unittest.skipIf(torch is None, "torch is not installed for this interpreter")
    def test_torch_tensors(self):
        keys = self.put_keys(2)
        ids = torch.tensor([[3, 8, 27, 16], [22, 1, 11, 30]], dtype=torch.int64)
        self.check_read(keys, ids.tolist(), ids, "page")
        self.check_read(keys, ids.tolist(), [ids[0], ids[1]], "region")
        # page_region of a paged pool tensor: the same region the tuples name.
        pool = torch.zeros((PAGES, 16, 8), dtype=torch.float16)
        base, page, stride, n = kvstash.page_region(pool)
        self.assertEqual((base, page, stride, n), (pool.data_ptr(), 256, 256, PAGES))

    def test_refusals_before_any_io(self):
        keys = self.put_keys(2)
        self.pool.fill()
        before = self.store.get_stats()["get_calls"]
        # A page id past the regions, a negative one: -600 for every key, nothing read.
        self.assertEqual(self.store.batch_get_into_pages(keys, self.regions,
                                                         [[0, 1, 2, PAGES], [3, 4, 5, 6]]),
                         [-600, -600])
        self.assertEqual(self.store.batch_get_into_pages(keys, self.regions,
                                                         [[0, 1, 2, -1], [3, 4, 5, 6]]),
                         [-600, -600])
        self.assertEqual(self.store.batch_get_into_pages(
            keys, self.regions, array.array("I", [0, 1, 2, 3, 4, 5, 6, PAGES])), [-600, -600])
        # Ids past 2^32 never wrap onto a valid page, in lists or 8-byte buffers.
        self.assertEqual(self.store.batch_get_into_pages(keys, self.regions,
                                                         [[0, 1, 2, 2 ** 32 + 3], [3, 4, 5, 6]]),
                         [-600, -600])
        self.assertEqual(self.store.batch_get_into_pages(
            keys, self.regions, array.array("q", [0, 1, 2, 2 ** 32 + 3, 3, 4, 5, 6])),
            [-600, -600])
        self.assertEqual(self.store.batch_get_into_pages(
            keys, self.regions, array.array("i", [0, 1, 2, -5, 3, 4, 5, 6])), [-600, -600])
        # The smallest region's npages bounds the ids; a region whose pages run past the
        # registered pool is refused whole, even when the ids named stay inside.
        short = [self.regions[0], (self.regions[1][0], V_PAGE, V_STRIDE, 8)]
        self.assertEqual(self.store.batch_get_into_pages(keys, short,
                                                         [[0, 1, 2, 9], [3, 4, 5, 6]]),
                         [-600, -600])
        over = [(self.regions[0][0], K_PAGE, K_STRIDE, PAGES * 4)]
        self.assertEqual(self.store.batch_get_into_pages(keys, over, [[0, 1], [2, 3]]),
                         [-600, -600])
        self.assertEqual(self.store.batch_get_into_pages(keys, [(-1, 1, 1, 1)], [[0], [0]]),
                         [-600, -600])
        # Not n keys' worth of ids; a region with a stride below its page.
        self.assertEqual(self.store.batch_get_into_pages(keys, self.regions, [[0, 1, 2, 3]]),
                         [-600, -600])
        bad = [(self.pool.ptr, 1024, 512, PAGES)]
        self.assertEqual(self.store.batch_get_into_pages(keys, bad, [[0, 1], [2, 3]]),
                         [-600, -600])
        self.assertEqual(self.store.get_stats()["get_calls"], before)
        self.assertEqual(self.pool.bytes(0, self.pool.size), bytes([GUARD]) * self.pool.size)
        with self.assertRaises(ValueError):
            self.store.batch_get_into_pages(keys, self.regions, [[0] * 4, [1] * 4], "rows")
        with self.assertRaises(TypeError):
            self.store.batch_get_into_pages(keys, [(1, 2)], [[0] * 4, [1] * 4])

    def test_duplicate_pages_follow_the_overlap_rule(self):
        keys = self.put_keys(1)
        # Two fragments on one page: the read answers (its bytes there are unspecified).
        res = self.store.batch_get_into_pages(keys, self.regions, [[6, 6, 7, 8]])
        self.assertEqual(res, [self.size])
        self.assertEqual(self.gathered([7, 8], "page"), pattern(keys[0], self.size)[
            2 * (K_PAGE + V_PAGE):])


if __name__ == "__main__":
    unittest.main()
