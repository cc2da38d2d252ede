"""Replays of the store calls of the three engines that use Mooncake's MooncakeDistributedStore,
against a real kvstash-server, with every byte checked:

- vLLM's Mooncake store connector worker
  (vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/worker.py),
- SGLang HiCache's Mooncake backend (python/sglang/srt/mem_cache/storage/mooncake_store/
  mooncake_store.py) and its direct linker (mooncake_direct_linker.py),
- LMCache's connector (lmcache/v1/storage_backend/connector/mooncakestore_connector.py).

Each replay makes the calls in the engine's order, with its argument forms (positional counts,
keywords, list shapes) and reads the results the way the engine does. The KV caches are plain
host memory laid out as the engines lay out theirs (per-layer K and V pages of each block)."""
import ctypes
import unittest
import uuid

from kvstash import MooncakeDistributedStore, MooncakeHostMemAllocator, ReplicateConfig
from kvs_harness import Buffer, Server, pattern


class PagedCache:
    """`layers` layers of K and V, each `blocks` pages of `page` bytes, in one allocation."""

    def __init__(self, layers, blocks, page):
        self.layers, self.blocks, self.page = layers, blocks, page
        self.buf = Buffer(2 * layers * blocks * page)

    def addr(self, kv, layer, block):
        return self.buf.ptr + ((kv * self.layers + layer) * self.blocks + block) * self.page

    def fill_block(self, block, key):
        for kv in (0, 1):
            for layer in range(self.layers):
                off = self.addr(kv, layer, block) - self.buf.ptr
                self.buf.write(off, pattern(f"{key}/{kv}/{layer}", self.page))

    def block_ok(self, block, key):
        return all(
            self.buf.bytes(self.addr(kv, layer, block) - self.buf.ptr, self.page) ==
            pattern(f"{key}/{kv}/{layer}", self.page)
            for kv in (0, 1) for layer in range(self.layers))

    def block_lists(self, block):
        addrs = [self.addr(kv, layer, block) for kv in (0, 1) for layer in range(self.layers)]
        return addrs, [self.page] * len(addrs)


class Engines(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server(segment="128MiB")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_vllm_store_connector(self):
        store = MooncakeDistributedStore()
        # setup with exactly 7 positional arguments; any non-zero return is fatal to vLLM.
        ret = store.setup("127.0.0.1", "P2PHANDSHAKE", 32 << 20, 64 << 20, "tcp", "",
                          self.server.master)
        self.assertEqual(ret, 0)
        cfg = ReplicateConfig()
        cache = PagedCache(layers=4, blocks=16, page=16 << 10)
        # register_kv_caches: one registration per storage.
        self.assertEqual(store.register_buffer(cache.buf.ptr, cache.buf.size), 0)
        keys = [f"vllm@model@{i:04x}" for i in range(12)]
        for i, k in enumerate(keys):
            cache.fill_block(i, k)
        # Save: batch_is_exist, then batch_put_from_multi_buffers for keys whose state != 1.
        for round_keys in (keys[:8], keys):  # the second save finds the first 8 stored
            states = store.batch_is_exist(round_keys)
            missing = [k for k, st in zip(round_keys, states) if st != 1]
            self.assertEqual(len(missing), len(round_keys) - (8 if round_keys is keys else 0))
            lists = [cache.block_lists(keys.index(k)) for k in missing]
            res = store.batch_put_from_multi_buffers(missing, [a for a, _ in lists],
                                                     [s for _, s in lists], cfg)
            self.assertFalse([v for v in res if v < 0], res)
        # Load into other blocks: batch_get_into_multi_buffers with 3 positional arguments,
        # failure = value < 0; values are summed as bytes.
        cache.buf.fill(0)
        dst = list(range(4, 16))
        lists = [cache.block_lists(b) for b in dst]
        res = store.batch_get_into_multi_buffers(keys, [a for a, _ in lists],
                                                 [s for _, s in lists])
        self.assertFalse([v for v in res if v < 0], res)
        self.assertEqual(sum(res), len(keys) * 2 * 4 * (16 << 10))
        for b, k in zip(dst, keys):
            self.assertTrue(cache.block_ok(b, k), k)
        # The optional tier log.
        descs = store.batch_get_replica_desc(keys[:2])
        self.assertTrue(descs.get(keys[0])[0].is_memory_replica())
        self.assertFalse(descs.get(keys[0])[0].is_disk_replica())
        # Lookup from the scheduler: a hit only when every entry is 1.
        self.assertEqual(store.batch_is_exist(keys), [1] * len(keys))
        # Reset: remove_all(force=True) (return value ignored by vLLM).
        store.remove_all(force=True)
        self.assertEqual(store.batch_is_exist(keys), [0] * len(keys))
        self.assertEqual(store.unregister_buffer(cache.buf.ptr), 0)
        self.assertEqual(store.close(), 0)

    def test_sglang_hicache(self):
        store = MooncakeDistributedStore()
        # 8 positional arguments (the transfer engine, None here) plus optional keywords.
        ret = store.setup("127.0.0.1", "P2PHANDSHAKE", 32 << 20, 16 << 20, "tcp", "",
                          self.server.master, None, enable_client_http_server=False)
        self.assertEqual(ret, 0)
        # Warm-up with a 4 KiB key until put returns 0.
        key = "sglang_mooncake_store_warmup_key" + uuid.uuid4().hex
        value = bytes(4096)
        for _ in range(10):
            if store.put(key, value) == 0:
                break
        self.assertEqual(store.is_exist(key), 1)
        self.assertEqual(store.get(key), value)
        # Host KV pool: one registration; pages of 32 KiB for k and v.
        page = 32 << 10
        pool = Buffer(64 * page)
        self.assertEqual(store.register_buffer(pool.ptr, pool.size), 0)
        pages = [f"tag_model-name_{i:08x}" for i in range(8)]
        keys, ptrs = [], []
        for i, p in enumerate(pages):
            for j, suffix in enumerate(("_0_k", "_0_v")):
                keys.append(p + suffix)
                ptrs.append(pool.ptr + (2 * i + j) * page)
                pool.write((2 * i + j) * page, pattern(p + suffix, page))
        sizes = [page] * len(keys)
        # batch_set: existing keys (== 1) count as stored; the rest go through batch_put_from
        # (3-argument form); a page is stored when all its results are 0.
        for _ in range(2):
            exist = store.batch_is_exist(keys)
            todo = [i for i, e in enumerate(exist) if e != 1]
            if todo:
                res = store.batch_put_from([keys[i] for i in todo], [ptrs[i] for i in todo],
                                           [sizes[i] for i in todo])
                self.assertEqual(res, [0] * len(todo))
        # A second writer racing on the same keys also counts success (Mooncake's put rule).
        self.assertEqual(store.batch_put_from(keys[:2], ptrs[:2], sizes[:2]), [0, 0])
        # batch_get: success is > 0 for every component.
        dst = [pool.ptr + (32 + i) * page for i in range(len(keys))]
        res = store.batch_get_into(keys, dst, sizes)
        self.assertTrue(all(v > 0 for v in res), res)
        for i, k in enumerate(keys):
            self.assertEqual(pool.bytes((32 + i) * page, page), pattern(k, page))
        # exists: the number of leading pages whose components are all 1.
        q = store.batch_is_exist(keys + ["tag_model-name_missing_0_k"])
        self.assertEqual(q, [1] * len(keys) + [0])
        # Direct linker: session start must be all 0, each layer's ranged read must return
        # exactly the sum of its sizes, and the session always ends.
        res = store.batch_get_session_start(keys)
        self.assertEqual(list(res), [0] * len(keys))
        gpu = Buffer(len(keys) * page)
        self.assertEqual(store.register_buffer(gpu.ptr, gpu.size), 0)
        layers = 4
        per = page // layers
        try:
            for layer in range(layers):
                lptrs = [[gpu.ptr + i * page + layer * per] for i in range(len(keys))]
                lsizes = [[per] for _ in keys]
                loffs = [[layer * per] for _ in keys]
                r = store.batch_get_into_multi_buffer_ranges(keys, lptrs, lsizes, loffs)
                self.assertEqual(list(r), [sum(s) for s in lsizes])
        finally:
            store.batch_get_session_end(keys)
        for i, k in enumerate(keys):
            self.assertEqual(gpu.bytes(i * page, page), pattern(k, page))
        # clear(): remove_all() without force.
        self.assertGreaterEqual(store.remove_all(), len(keys))
        self.assertEqual(store.batch_is_exist(keys), [0] * len(keys))
        self.assertEqual(store.unregister_buffer(gpu.ptr), 0)
        self.assertEqual(store.unregister_buffer(pool.ptr), 0)
        store.close()

    def test_sglang_standalone(self):
        # Standalone storage: the host pool comes from MooncakeHostMemAllocator and the store
        # attaches to the local server with setup_dummy.
        alloc = MooncakeHostMemAllocator()
        size = 16 * 65536
        base = alloc.alloc(size)
        store = MooncakeDistributedStore()
        self.assertEqual(store.setup_dummy(size, 16 << 20, self.server.master), 0)
        self.assertEqual(store.register_buffer(base, size), 0)
        keys = [f"standalone_{i}_k" for i in range(8)]
        for i, k in enumerate(keys):
            ctypes.memmove(base + i * 65536, pattern(k, 65536), 65536)
        exist = store.batch_is_exist(keys)
        self.assertEqual(exist, [0] * 8)
        self.assertEqual(store.batch_put_from(keys, [base + i * 65536 for i in range(8)],
                                              [65536] * 8), [0] * 8)
        ctypes.memset(base, 0, size)
        res = store.batch_get_into(keys, [base + (8 + i) * 65536 for i in range(8)], [65536] * 8)
        self.assertTrue(all(v > 0 for v in res), res)
        for i, k in enumerate(keys):
            self.assertEqual(ctypes.string_at(base + (8 + i) * 65536, 65536), pattern(k, 65536))
        store.remove_all()
        self.assertEqual(store.unregister_buffer(base), 0)
        store.close()
        self.assertEqual(alloc.free(base), 0)

    def test_lmcache_connector(self):
        store = MooncakeDistributedStore()
        # 7 positional arguments; LMCache ignores the return value.
        store.setup("127.0.0.1", "P2PHANDSHAKE", 32 << 20, 64 << 20, "tcp", "",
                    self.server.master)
        cfg = ReplicateConfig()
        cfg.replica_num = 1
        cfg.preferred_segment = store.get_hostname()  # prefer_local_alloc
        chunk = 256 << 10
        pinned = Buffer(8 * chunk)  # the allocator's pinned uint8 buffer
        self.assertEqual(store.register_buffer(pinned.ptr, pinned.size), 0)
        keys = [f"lmcache@model@{i}@{'ab' * 8}" for i in range(4)]
        for i, k in enumerate(keys):
            pinned.write(i * chunk, pattern(k, chunk))
        # exists is used as a bool.
        self.assertFalse(any(store.is_exist(k) for k in keys))
        # Zero-copy put (its return value is ignored by LMCache; it must still succeed).
        for i, k in enumerate(keys[:2]):
            self.assertEqual(store.put_from(k, pinned.ptr + i * chunk, chunk, cfg), 0)
        # The placement preference worked: the objects live on this client's segment.
        for k in keys[:2]:
            self.assertEqual([d.segment_name for d in store.get_replica_desc(k)],
                             [store.get_hostname()])
        # save_chunk_meta: put_parts(key, 28-byte header, data).
        meta = bytes(range(28))
        for i, k in enumerate(keys[2:], 2):
            self.assertEqual(store.put_parts(k, meta, pinned.bytes(i * chunk, chunk)), 0)
        self.assertTrue(all(store.is_exist(k) for k in keys))
        # Zero-copy batched get: n <= 0 is a miss, n is the bytes read.
        pinned.fill(0)
        n = store.batch_get_into(keys[:2], [pinned.ptr + (4 + i) * chunk for i in range(2)],
                                 [chunk, chunk])
        self.assertEqual(n, [chunk, chunk])
        for i, k in enumerate(keys[:2]):
            self.assertEqual(pinned.bytes((4 + i) * chunk, chunk), pattern(k, chunk))
        # With chunk meta: batch_get_buffer, None is a miss, the header is the first 28 bytes.
        bufs = store.batch_get_buffer(keys[2:] + ["lmcache@missing"])
        self.assertIsNone(bufs[-1])
        for k, b in zip(keys[2:], bufs):
            view = memoryview(b)
            self.assertEqual(view[:28].tobytes(), meta)
            self.assertEqual(len(view), chunk + 28)
            self.assertEqual(view[28:].tobytes(), pattern(k, chunk))
            view.release()
        self.assertEqual(store.unregister_buffer(pinned.ptr), 0)
        store.close()


if __name__ == "__main__":
    unittest.main()
