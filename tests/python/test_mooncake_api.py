"""Mooncake's store API, method by method, with its codes, against real kvstash-server processes.

Each test names the convention it checks (the README table of Mooncake methods says which
calls follow Mooncake exactly and where kvstash differs)."""
import gc
import threading
import unittest

import kvstash
from kvs_harness import GUARD, Buffer, Server, pattern

class Base(unittest.TestCase):
    segment = "64MiB"
    extra = ()

    @classmethod
    def setUpClass(cls):
        cls.server = Server(segment=cls.segment, extra=cls.extra)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def open(self, **kw):
        s = kvstash.MooncakeDistributedStore()
        args = dict(local_hostname="localhost", metadata_server="P2PHANDSHAKE",
                    global_segment_size=0, local_buffer_size=0, protocol="tcp",
                    rdma_devices="", master_server_addr=self.server.master)
        args.update(kw)
        self.assertEqual(s.setup(**args), 0)
        self.addCleanup(s.close)
        return s

    def setUp(self):
        self.store = self.open()
        self.prefix = self.id().rsplit(".", 1)[-1] + "-"

    def k(self, name):
        return self.prefix + name

    def registered(self, size):
        buf = Buffer(size)
        self.assertEqual(self.store.register_buffer(buf.ptr, buf.size), 0)
        self.addCleanup(self.store.unregister_buffer, buf.ptr)
        return buf


class SetupTest(Base):
    def test_eighth_positional_and_keywords(self):
        # SGLang passes the transfer engine as an 8th positional argument, plus keywords.
        s = kvstash.MooncakeDistributedStore()
        rc = s.setup("localhost", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", self.server.master,
                     None, enable_ssd_offload=False, ssd_offload_path="", tenant_id="default",
                     enable_client_http_server=False, client_http_port=9300)
        self.assertEqual(rc, 0)
        self.assertEqual(s.close(), 0)
        self.assertEqual(s.close(), 0)  # idempotent
        # An object in the engine slot is accepted with a warning (kvstash has no use for it).
        self.assertEqual(s.setup("localhost", "", 0, 0, "tcp", "", self.server.master, object()),
                         0)
        s.close()
        # Unknown keywords are TypeErrors naming them (SGLang drops those and retries).
        with self.assertRaises(TypeError) as cm:
            s.setup("localhost", "", 0, 0, "tcp", "", self.server.master, None, no_such=1)
        self.assertIn("no_such", str(cm.exception))

    def test_bad_values_are_codes(self):
        s = kvstash.MooncakeDistributedStore()
        m = self.server.master
        self.assertEqual(s.setup("", "", 0, 0, "tcp", "", m), -600)
        self.assertEqual(s.setup("localhost", "", "lots", 0, "tcp", "", m), -600)
        self.assertEqual(s.setup("localhost", "", -1, 0, "tcp", "", m), -600)
        self.assertEqual(s.setup("localhost", "", 0, "x", "tcp", "", m), -600)
        self.assertEqual(s.setup("localhost", "", 0, 0, "tcp", "", m, None,
                                 enable_ssd_offload=True), -600)  # no SSD tier: refused
        self.assertEqual(s.setup("localhost", "", 0, 0, "tcp", "", m, None,
                                 client_http_port=70000), -600)
        self.assertEqual(s.health_check(), 1)  # none of them set it up
        with self.assertRaises(TypeError):
            s.setup("localhost", "", 0, 0, 5, "", m)
        self.assertEqual(s.setup({"local_hostname": "localhost"}), -600)
        self.assertEqual(s.setup({"metadata_server": "x"}), -600)
        self.assertEqual(s.setup({"local_hostname": "localhost", "metadata_server": "x",
                                  "master_server_address": m, "global_segment_size": "1GB!"}),
                         -600)
        self.assertEqual(s.setup({"local_hostname": "localhost", "metadata_server": "x",
                                  "master_server_address": m, "client_http_port": "port"}), -600)
        self.assertEqual(s.setup({"local_hostname": "localhost", "metadata_server": "x",
                                  "master_server_address": m, "global_segment_size": 0}), 0)
        self.assertEqual(s.health_check(), 0)
        s.close()
        self.assertEqual(s.health_check(), 1)

    def test_health_check_master_gone(self):
        server = Server(segment="4MiB")
        s = kvstash.MooncakeDistributedStore()
        self.assertEqual(s.setup("localhost", "", 0, 0, "tcp", "", server.master), 0)
        self.assertEqual(s.health_check(), 0)
        server.stop()
        self.assertEqual(s.health_check(), 2)
        s.close()

    def test_hostname_is_the_segment_name(self):
        # local_hostname with a port names the segment; get_hostname() returns it, and
        # preferred_segment=get_hostname() places on this process's own segment.
        s = self.open(local_hostname="127.0.0.1:17001", global_segment_size="8MiB")
        self.assertEqual(s.get_hostname(), "127.0.0.1:17001")
        cfg = kvstash.ReplicateConfig()
        cfg.preferred_segment = s.get_hostname()
        key = self.k("mine")
        self.assertEqual(s.put(key, b"x" * 5000, cfg), 0)
        descs = s.get_replica_desc(key)
        self.assertEqual([d.segment_name for d in descs], ["127.0.0.1:17001"])
        # A bare host gets this process's data port added.
        t = self.open(local_hostname="127.0.0.1", global_segment_size="8MiB")
        host, port = t.get_hostname().rsplit(":", 1)
        self.assertEqual(host, "127.0.0.1")
        self.assertTrue(port.isdigit())
        # Without a segment: local_hostname itself; after close: "".
        u = self.open(local_hostname="node-a")
        self.assertEqual(u.get_hostname(), "node-a")
        u.close()
        self.assertEqual(u.get_hostname(), "")

    def test_subclassing(self):
        class AsyncStore(kvstash.MooncakeDistributedStore):
            def __init__(self):
                super().__init__()
                self.calls = 0

            def put(self, key, value, config=None):
                self.calls += 1
                return super().put(key, value, config)

        class MyConfig(kvstash.ReplicateConfig):
            pass

        s = AsyncStore()
        self.assertEqual(s.setup("localhost", "", 0, 0, "tcp", "", self.server.master), 0)
        self.assertEqual(s.put(self.k("sub"), b"abc", MyConfig(replica_num=1)), 0)
        self.assertEqual(s.calls, 1)
        self.assertEqual(s.get(self.k("sub")), b"abc")
        self.assertEqual(s.close(), 0)
        with self.assertRaises(TypeError):
            s.put(self.k("t"), b"x", config=object())


class ReplicateConfigTest(Base):
    def test_fields_and_defaults(self):
        c = kvstash.ReplicateConfig()
        self.assertEqual(c.replica_num, 1)
        self.assertEqual(c.preferred_segment, "")
        self.assertEqual(c.preferred_segments, [])
        self.assertFalse(c.prefer_alloc_in_same_node)
        self.assertIs(c.soft_pin_action, kvstash.SoftPinAction.PRESERVE)
        self.assertIsNone(c.soft_pin_ttl_ms)
        self.assertFalse(c.with_hard_pin)
        self.assertIsNone(c.group_ids)
        self.assertEqual((c.nof_replica_num, c.dfs_replica_num), (0, 0))
        self.assertEqual([int(a) for a in kvstash.SoftPinAction], [0, 1, 2])
        c.with_soft_pin = True
        self.assertIs(c.soft_pin_action, kvstash.SoftPinAction.ENABLE)
        self.assertIn("replica_num=1", str(c))
        # Tiers kvstash does not have are refused with -600, not ignored.
        self.assertEqual(self.store.put(self.k("nof"), b"x",
                                        kvstash.ReplicateConfig(nof_replica_num=1)), -600)
        self.assertEqual(self.store.put(self.k("r0"), b"x", kvstash.ReplicateConfig(0)), -600)


class PutFamilyTest(Base):
    def test_existing_key_keeps_first_value(self):
        s, key = self.store, self.k("first")
        self.assertEqual(s.put(key, b"one"), 0)
        self.assertEqual(s.put(key, b"two!"), 0)
        self.assertEqual(s.get(key), b"one")
        buf = self.registered(4096)
        buf.write(0, b"three")
        self.assertEqual(s.put_from(key, buf.ptr, 5), 0)
        self.assertEqual(s.batch_put_from([key, self.k("new")], [buf.ptr, buf.ptr], [5, 5]),
                         [0, 0])
        self.assertEqual(s.batch_put_from_multi_buffers([key], [[buf.ptr]], [[5]]), [0])
        self.assertEqual(s.get(key), b"one")
        self.assertEqual(s.get(self.k("new")), b"three")
        self.assertEqual(s.put_from(self.k("zero"), buf.ptr, 0), 0)  # nothing stored
        self.assertEqual(s.is_exist(self.k("zero")), 0)

    def test_put_parts(self):
        s, key = self.store, self.k("parts")
        meta, data = bytes(range(28)), pattern(key, 100000)
        self.assertEqual(s.put_parts(key, meta, memoryview(data), bytearray(b"tail")), 0)
        self.assertEqual(s.get(key), meta + data + b"tail")
        self.assertEqual(s.put_parts(key, b"other"), 0)  # exists: first value stays
        self.assertEqual(s.get(key), meta + data + b"tail")
        self.assertEqual(s.put_parts(self.k("none")), 0)  # empty total: nothing stored
        self.assertEqual(s.is_exist(self.k("none")), 0)
        self.assertEqual(s.put_parts(self.k("cfg"), b"a", b"b",
                                     config=kvstash.ReplicateConfig(replica_num=0)), -600)
        with self.assertRaises(RuntimeError):
            s.put_parts(self.k("2d"), memoryview(bytes(8)).cast("B", (2, 4)))
        with self.assertRaises(RuntimeError):
            s.put_parts(self.k("wide"), memoryview(bytes(8)).cast("i"))

    def test_put_batch(self):
        s = self.store
        keys = [self.k(f"pb{i}") for i in range(5)]
        vals = [pattern(k, 1000 + 777 * i) for i, k in enumerate(keys)]
        self.assertEqual(s.put_batch(keys, vals), 0)
        self.assertEqual(s.get_batch(keys), vals)
        self.assertEqual(s.put_batch(keys, [b"x"] * 5), 0)  # all exist
        self.assertEqual(s.get_batch(keys), vals)
        self.assertEqual(s.put_batch(keys, vals[:2]), -600)  # lengths differ
        self.assertEqual(s.put_batch([self.k("ok"), self.k("bad")], [b"x", b""]), -600)

    def test_put_from_with_metadata(self):
        s, key = self.store, self.k("meta")
        buf = self.registered(1 << 16)
        meta, data = b"M" * 40, pattern(key, 30000)
        buf.write(0, data)
        buf.write(40000, meta)
        self.assertEqual(s.put_from_with_metadata(key, buf.ptr, buf.ptr + 40000, len(data),
                                                  len(meta)), 0)
        self.assertEqual(s.get(key), meta + data)
        self.assertEqual(s.put_from_with_metadata(self.k("nothing"), buf.ptr, buf.ptr, 0, 40), 0)
        self.assertEqual(s.is_exist(self.k("nothing")), 0)
        other = Buffer(100)
        self.assertEqual(s.put_from_with_metadata(self.k("unreg"), other.ptr, buf.ptr, 100, 4),
                         -600)


class ReadFamilyTest(Base):
    def test_get_batch_and_buffers(self):
        s = self.store
        keys = [self.k(f"g{i}") for i in range(3)]
        vals = [pattern(k, 5000 * (i + 1)) for i, k in enumerate(keys)]
        for k, v in zip(keys, vals):
            self.assertEqual(s.put(k, v), 0)
        self.assertEqual(s.get_batch(keys + [self.k("none")]), vals + [b""])
        h = s.get_buffer(keys[1])
        self.assertIsInstance(h, kvstash.BufferHandle)
        self.assertEqual((h.size(), len(h)), (len(vals[1]), len(vals[1])))
        self.assertNotEqual(h.ptr(), 0)
        self.assertEqual(bytes(memoryview(h)), vals[1])
        self.assertEqual(memoryview(h).format, "b")
        self.assertIsNone(s.get_buffer(self.k("none")))
        hs = s.batch_get_buffer(keys + [self.k("none")])
        self.assertEqual([bytes(memoryview(x)) if x else None for x in hs], vals + [None])
        with self.assertRaises(TypeError):
            kvstash.BufferHandle()

    def test_buffer_handle_lifetime(self):
        s, key = self.store, self.k("life")
        data = pattern(key, 1 << 20)
        self.assertEqual(s.put(key, data), 0)
        h = s.get_buffer(key)
        # The handle's bytes are its own: removing the key (even forced) leaves them.
        self.assertEqual(s.remove(key, force=True), 0)
        self.assertEqual(s.is_exist(key), 0)
        self.assertEqual(bytes(memoryview(h)), data)
        view = memoryview(h)
        with self.assertRaises(BufferError):
            h.release()  # a view is alive
        self.assertEqual(view[:4].tobytes(), data[:4])
        view.release()
        h.release()
        self.assertEqual((h.size(), h.ptr()), (0, 0))
        self.assertEqual(bytes(memoryview(h)), b"")
        # Freed on garbage collection: many large handles do not accumulate.
        self.assertEqual(s.put(key, data), 0)
        for _ in range(64):
            x = s.get_buffer(key)
            self.assertEqual(len(x), len(data))
            del x
        gc.collect()

    def test_larger_fragments_filled_in_order(self):
        s, key = self.store, self.k("larger")
        data = pattern(key, 10000)
        self.assertEqual(s.put(key, data), 0)
        buf = self.registered(1 << 16)
        got = s.batch_get_into_multi_buffers([key], [[buf.ptr, buf.ptr + 20000]], [[6000, 9000]])
        self.assertEqual(got, [10000])  # the object's size, as Mooncake
        self.assertEqual(buf.bytes(0, 6000), data[:6000])
        self.assertEqual(buf.bytes(20000, 4000), data[6000:])
        self.assertEqual(buf.bytes(24000, 5000), bytes([GUARD]) * 5000)
        # Fewer bytes than the object: -600 before any I/O.
        buf.fill()
        self.assertEqual(s.batch_get_into_multi_buffers([key], [[buf.ptr]], [[9999]]), [-600])
        self.assertEqual(buf.bytes(0, 9999), bytes([GUARD]) * 9999)

    def test_fragment_lists_of_changing_sizes_and_from_threads(self):
        """The module keeps its fragment lists' working memory between calls: calls with more,
        then fewer, then more fragments, and calls from several threads at once (each finds the
        kept block taken or not), all land every byte where their own lists say."""
        s, key = self.store, self.k("frags")
        data = pattern(key, 1 << 16)
        self.assertEqual(s.put(key, data), 0)
        buf = self.registered(1 << 20)

        def read(pages, start):
            # `pages` fragments of 64 KiB / pages bytes, in reverse order from `start`.
            size = len(data) // pages
            ptrs = [buf.ptr + start + (pages - 1 - i) * size for i in range(pages)]
            return s.batch_get_into_multi_buffers([key], [ptrs], [[size] * pages]), size

        for pages in (1024, 16, 4096, 256):
            buf.fill()
            got, size = read(pages, 0)
            self.assertEqual(got, [len(data)])
            for i in range(pages):
                self.assertEqual(buf.bytes((pages - 1 - i) * size, size),
                                 data[i * size:(i + 1) * size])
        buf.fill()
        errors = []

        def worker(t):
            for pages in (64, 2048, 512):
                got, size = read(pages, t * (1 << 16))
                if got != [len(data)]:
                    errors.append((t, pages, got))
        threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        self.assertEqual(errors, [])
        size = len(data) // 512  # the last layout every thread wrote
        for t in range(8):
            for i in range(512):
                self.assertEqual(buf.bytes(t * (1 << 16) + (511 - i) * size, size),
                                 data[i * size:(i + 1) * size])

    def test_fragment_values_past_the_int_fast_path(self):
        """Addresses and sizes are read as 64-bit unsigned ints: 2^64 and negative values are
        refused with ValueError before any I/O; values past 2^63 (negative if read as signed)
        are addresses like any other, here unregistered: -600 for the key. (Real addresses,
        past 2^32, are read exactly by every other read test.)"""
        s, key = self.store, self.k("ints")
        self.assertEqual(s.put(key, b"x" * 100), 0)
        for bad in (1 << 64, -1):
            with self.assertRaisesRegex(ValueError, "negative or too large"):
                s.batch_get_into_multi_buffers([key], [[bad]], [[100]])
            with self.assertRaisesRegex(ValueError, "negative or too large"):
                s.batch_get_into_multi_buffers([key], [[4096]], [[bad]])
        for odd in ((1 << 32) + 4096, (1 << 63) + 4096, (1 << 64) - 4096):
            self.assertEqual(s.batch_get_into_multi_buffers([key], [[odd]], [[100]]), [-600])


class RemovalTest(Base):
    def test_remove_all_batch_remove_regex(self):
        s = self.store
        keys = [self.k(f"r{i:02d}") for i in range(12)]
        for k in keys:
            self.assertEqual(s.put(k, pattern(k, 3000)), 0)
        self.assertEqual(s.batch_remove(keys[:3] + [self.k("none")]), [0, 0, 0, -704])
        self.assertEqual(s.remove_by_regex("^" + self.prefix + "r0[3-5]$"), 3)
        self.assertEqual(s.batch_is_exist(keys[3:7]), [0, 0, 0, 1])
        self.assertEqual(s.remove_by_regex("([unbalanced"), -600)
        self.assertEqual(s.remove_by_regex(self.prefix + "nomatch"), 0)
        # remove_all counts this tenant's objects; the rest of this class's keys go too.
        n = s.remove_all()
        self.assertGreaterEqual(n, 6)
        self.assertEqual(s.batch_is_exist(keys), [0] * 12)
        self.assertEqual(s.remove_all(), 0)

    def test_leased_objects_need_force(self):
        s = self.store
        key = self.k("leased")
        self.assertEqual(s.put(key, b"x" * 100), 0)
        self.assertEqual(s.batch_get_session_start([key]), [0])  # holds a read lease
        self.assertEqual(s.batch_remove([key]), [-706])
        self.assertEqual(s.remove_by_regex("^" + key + "$"), 0)
        self.assertEqual(s.remove_all(), 0)
        self.assertEqual(s.is_exist(key), 1)
        self.assertEqual(s.remove_all(force=True), 1)
        self.assertEqual(s.is_exist(key), 0)
        self.assertEqual(s.batch_get_session_end([key]), 0)

    def test_replica_clear(self):
        owner = self.open(local_hostname="127.0.0.1:17011", global_segment_size="8MiB")
        key = self.k("clear")
        cfg = kvstash.ReplicateConfig(preferred_segment=owner.get_hostname())
        self.assertEqual(owner.put(key, b"y" * 9000, cfg), 0)
        self.assertEqual(owner.batch_replica_clear([key, self.k("none")], "127.0.0.1:17011"),
                         [key])
        self.assertEqual(owner.is_exist(key), 0)
        self.assertEqual(owner.put(key, b"z" * 9000), 0)
        self.assertEqual(owner.batch_replica_clear([key]), [key])
        self.assertEqual(owner.is_exist(key), 0)
        self.assertEqual(self.store.batch_replica_clear([]), [])
        # Only the writer's own objects: another client's call skips them.
        self.assertEqual(owner.put(key, b"w" * 9000), 0)
        self.assertEqual(self.store.batch_replica_clear([key]), [])
        self.assertEqual(owner.get(key), b"w" * 9000)
        # One segment of two: the other copy stays, and reads still get every byte.
        peer = self.open(local_hostname="127.0.0.1:17012", global_segment_size="8MiB")
        two = self.k("two")
        cfg = kvstash.ReplicateConfig(replica_num=2,
                                      preferred_segments=["127.0.0.1:17011", "127.0.0.1:17012"])
        self.assertEqual(owner.put(two, pattern(two, 20000), cfg), 0)
        self.assertEqual(owner.batch_replica_clear([two], "127.0.0.1:17011"), [two])
        self.assertEqual([d.segment_name for d in owner.get_replica_desc(two)],
                         ["127.0.0.1:17012"])
        self.assertEqual(peer.get(two), pattern(two, 20000))
        self.assertEqual(owner.batch_replica_clear([two], "127.0.0.1:17011"), [])
        with self.assertRaises(TypeError):
            owner.batch_replica_clear([two], None)


class PlacementTest(Base):
    def test_group_ids_place_together(self):
        a = self.open(local_hostname="127.0.0.1:17041", global_segment_size="8MiB")
        self.open(local_hostname="127.0.0.1:17042", global_segment_size="8MiB")
        first = self.k("g0")
        self.assertEqual(a.put(first, b"0" * 4096, kvstash.ReplicateConfig(
            preferred_segment="127.0.0.1:17041", group_ids=["req-A"])), 0)
        # Spread placement alone would pick the server's emptier 64 MiB segment; the group
        # keeps every later object beside its first, from any client.
        keys = [self.k(f"g{i}") for i in range(1, 6)]
        vals = [pattern(k, 5000) for k in keys]
        self.assertEqual(self.store.put_batch(keys, vals,
                                              kvstash.ReplicateConfig(group_ids=["req-A"])), 0)
        for k in keys:
            self.assertEqual([d.segment_name for d in self.store.get_replica_desc(k)],
                             ["127.0.0.1:17041"], k)
        self.assertEqual(self.store.get_batch(keys), vals)
        # Without the group: elsewhere.
        loose = self.k("loose")
        self.assertEqual(self.store.put(loose, b"l" * 5000), 0)
        self.assertNotEqual([d.segment_name for d in self.store.get_replica_desc(loose)],
                            ["127.0.0.1:17041"])
        # One group per key, or one for all; any other count is -600.
        per = [self.k("p0"), self.k("p1")]
        cfg = kvstash.ReplicateConfig(group_ids=["req-A", "req-B"])
        self.assertEqual(self.store.put_batch(per, [b"p" * 100, b"q" * 100], cfg), 0)
        self.assertEqual([d.segment_name for d in self.store.get_replica_desc(per[0])],
                         ["127.0.0.1:17041"])
        three = kvstash.ReplicateConfig(group_ids=["x", "y", "z"])
        self.assertEqual(self.store.put_batch([self.k("t0"), self.k("t1")], [b"a", b"b"], three),
                         -600)
        with self.assertRaises(TypeError):
            self.store.put(self.k("bad"), b"x", kvstash.ReplicateConfig(group_ids=[1]))

    def test_preferred_segments_for_every_copy(self):
        self.open(local_hostname="127.0.0.1:17051", global_segment_size="8MiB")
        self.open(local_hostname="127.0.0.1:17052", global_segment_size="8MiB")
        key = self.k("two")
        cfg = kvstash.ReplicateConfig(replica_num=2,
                                      preferred_segments=["127.0.0.1:17052", "127.0.0.1:17051"])
        self.assertEqual(self.store.put(key, pattern(key, 3000), cfg), 0)
        self.assertEqual([d.segment_name for d in self.store.get_replica_desc(key)],
                         ["127.0.0.1:17052", "127.0.0.1:17051"])
        self.assertEqual(self.store.get(key), pattern(key, 3000))
        # preferred_segment comes first, then the list.
        k2 = self.k("three")
        cfg = kvstash.ReplicateConfig(replica_num=2, preferred_segment="127.0.0.1:17051",
                                      preferred_segments=["127.0.0.1:17052"])
        self.assertEqual(self.store.put(k2, b"3" * 100, cfg), 0)
        self.assertEqual([d.segment_name for d in self.store.get_replica_desc(k2)],
                         ["127.0.0.1:17051", "127.0.0.1:17052"])
        too_many = kvstash.ReplicateConfig(preferred_segments=["s"] * 17)
        self.assertEqual(self.store.put(self.k("many"), b"x", too_many), -600)


class SessionTest(Base):
    def test_read_session_ranges(self):
        s = self.store
        keys = [self.k(f"layer{i}") for i in range(3)]
        size = 64 * 1024
        for k in keys:
            self.assertEqual(s.put(k, pattern(k, size)), 0)
        buf = self.registered(1 << 20)
        self.assertEqual(s.batch_get_session_start(keys + [self.k("none")]), [0, 0, 0, -704])
        # Per layer: each key's 4 KiB slice at layer * 4 KiB, into two pages each.
        for layer in range(4):
            ptrs = [[buf.ptr + i * 65536 + layer * 8192, buf.ptr + i * 65536 + layer * 8192 + 6000]
                    for i in range(3)]
            sizes = [[2048, 2048]] * 3
            offs = [[layer * 4096, layer * 4096 + 2048]] * 3
            self.assertEqual(s.batch_get_into_multi_buffer_ranges(keys, ptrs, sizes, offs),
                             [4096] * 3)
            for i, k in enumerate(keys):
                want = pattern(k, size)[layer * 4096:(layer + 1) * 4096]
                got = buf.bytes(i * 65536 + layer * 8192, 2048) + \
                    buf.bytes(i * 65536 + layer * 8192 + 6000, 2048)
                self.assertEqual(got, want)
        # Out of the object, and shape mismatches: -600 for the keys concerned.
        self.assertEqual(s.batch_get_into_multi_buffer_ranges(
            keys[:2], [[buf.ptr], [buf.ptr]], [[100], [100]], [[size - 50], [0, 1]]),
            [-600, -600])
        self.assertEqual(s.batch_get_into_multi_buffer_ranges(keys, [[buf.ptr]], [[1]], [[0]]),
                         [-600] * 3)
        self.assertEqual(s.batch_get_session_end(keys), 0)
        self.assertEqual(s.batch_get_session_end([]), 0)
        unset = kvstash.MooncakeDistributedStore()
        self.assertEqual(unset.batch_get_session_start(keys), [])
        self.assertEqual(unset.batch_get_session_end(keys), -1)

    def test_get_into_ranges(self):
        s = self.store
        a, b = self.k("ra"), self.k("rb")
        self.assertEqual(s.put(a, pattern(a, 10000)), 0)
        self.assertEqual(s.put(b, pattern(b, 10000)), 0)
        buf1, buf2 = self.registered(1 << 16), self.registered(1 << 16)
        got = s.get_into_ranges([buf1.ptr, buf2.ptr], [[a, b], [b]],
                                [[[0, 100], [5000]], [[0]]], [[[10, 9000], [1]], [[9990]]],
                                [[[50, 1000], [20]], [[10]]])
        self.assertEqual(got, [[[50, 1000], [20]], [[10]]])
        self.assertEqual(buf1.bytes(0, 50), pattern(a, 10000)[10:60])
        self.assertEqual(buf1.bytes(100, 1000), pattern(a, 10000)[9000:10000])
        self.assertEqual(buf1.bytes(5000, 20), pattern(b, 10000)[1:21])
        self.assertEqual(buf2.bytes(0, 10), pattern(b, 10000)[9990:])
        self.assertEqual(s.get_into_ranges([buf1.ptr], [[a], [b]], [[[0]]], [[[0]]], [[[1]]]),
                         [[[-600]]])
        unset = kvstash.MooncakeDistributedStore()
        self.assertEqual(unset.get_into_ranges([buf1.ptr], [[a]], [[[0]]], [[[0]]], [[[1]]]),
                         [[[-600]]])

    def test_own_changes_end_the_session(self):
        # A session keeps its lookup; this client's own upsert and remove end it, so its
        # later reads see what it did (other clients' changes are seen after the session).
        s, key = self.store, self.k("sess-own")
        self.assertEqual(s.put(key, b"one" * 1000), 0)
        buf = self.registered(1 << 16)
        self.assertEqual(s.batch_get_session_start([key]), [0])
        self.assertEqual(s.upsert(key, b"two" * 2000), 0)
        self.assertEqual(s.get_into(key, buf.ptr, buf.size), 6000)
        self.assertEqual(buf.bytes(0, 6000), b"two" * 2000)
        self.assertEqual(s.batch_get_session_start([key]), [0])
        self.assertEqual(s.remove(key), -706)  # the session's lease
        self.assertEqual(s.remove(key, force=True), 0)
        self.assertEqual(s.get_into(key, buf.ptr, buf.size), -704)
        self.assertEqual(s.batch_get_session_end([key]), 0)

    @unittest.skipUnless(hasattr(kvstash.MooncakeDistributedStore, "batch_put_session_start"),
                         "the put session calls are not implemented yet (issue 25 remains open)")
    def test_put_session(self):
        s = self.store
        keys = [self.k("ps0"), self.k("ps1"), self.k("ps2")]
        size = 8192
        buf = self.registered(1 << 16)
        data = [pattern(k, size) for k in keys]
        for i, d in enumerate(data):
            buf.write(i * size, d)
        self.assertEqual(s.batch_put_session_start(keys, [size] * 3), [0, 0, 0])
        # Two halves per key, second half first.
        for half in (1, 0):
            ptrs = [[buf.ptr + i * size + half * 4096] for i in range(3)]
            r = s.batch_put_from_multi_buffer_ranges(keys, ptrs, [[4096]] * 3,
                                                     [[half * 4096]] * 3)
            self.assertEqual(r, [4096] * 3)
            if half == 1:
                self.assertEqual(s.batch_is_exist(keys), [0, 0, 0])  # not readable yet
        self.assertEqual(s.batch_put_from_multi_buffer_ranges(
            [keys[0]], [[buf.ptr]], [[10]], [[size - 5]]), [-600])  # beyond the object
        self.assertEqual(s.batch_put_session_end(keys[:2]), [0, 0])
        self.assertEqual(s.batch_put_session_revoke(keys[2:]), [0])
        self.assertEqual(s.get_batch(keys), data[:2] + [b""])
        # A session ended before every byte was written is refused and revoked.
        k = self.k("partial")
        self.assertEqual(s.batch_put_session_start([k], [size]), [0])
        self.assertEqual(s.batch_put_from_multi_buffer_ranges([k], [[buf.ptr]], [[100]], [[0]]),
                         [100])
        self.assertEqual(s.batch_put_session_end([k]), [-700])
        self.assertEqual(s.is_exist(k), 0)
        self.assertEqual(s.batch_put_session_end([self.k("never")]), [-600])


class InspectionTest(Base):
    def test_replica_desc(self):
        owner = self.open(local_hostname="127.0.0.1:17021", global_segment_size="8MiB")
        key = self.k("desc")
        cfg = kvstash.ReplicateConfig(preferred_segment="127.0.0.1:17021")
        self.assertEqual(owner.put(key, b"d" * 12345, cfg), 0)
        descs = self.store.get_replica_desc(key)
        self.assertEqual(len(descs), 1)
        d = descs[0]
        self.assertTrue(d.is_memory_replica())
        self.assertFalse(d.is_disk_replica())
        self.assertFalse(d.is_local_disk_replica())
        self.assertEqual(d.status, kvstash.ReplicaStatus.COMPLETE)
        self.assertEqual(d.segment_name, "127.0.0.1:17021")
        self.assertEqual(d.get_memory_descriptor().buffer_descriptor.size, 12345)
        with self.assertRaises(RuntimeError):
            d.get_disk_descriptor()
        self.assertEqual(self.store.get_replica_desc(self.k("none")), [])
        got = self.store.batch_get_replica_desc([key, self.k("none")])
        self.assertEqual(list(got), [key])
        # The lookup's lease was released: the object can be removed at once.
        self.assertEqual(self.store.remove(key), 0)


class UpsertTest(Base):
    def test_upsert_family(self):
        s = self.store
        key = self.k("u")
        self.assertEqual(s.upsert(key, b"v1"), 0)  # absent: a put
        self.assertEqual(s.upsert(key, b"version-2"), 0)
        self.assertEqual(s.get(key), b"version-2")
        self.assertEqual(s.upsert_parts(key, b"v", b"3"), 0)
        self.assertEqual(s.get(key), b"v3")
        buf = self.registered(1 << 16)
        buf.write(0, b"from-buffer")
        self.assertEqual(s.upsert_from(key, buf.ptr, 11), 0)
        self.assertEqual(s.get(key), b"from-buffer")
        keys = [key, self.k("u2")]
        self.assertEqual(s.batch_upsert_from(keys, [buf.ptr, buf.ptr + 5], [4, 6]), [0, 0])
        self.assertEqual(s.get_batch(keys), [b"from", b"buffer"])
        self.assertEqual(s.upsert_batch(keys, [b"a", b"bb"]), 0)
        self.assertEqual(s.get_batch(keys), [b"a", b"bb"])
        # A key twice in one batch: its last value, as one upsert after another.
        self.assertEqual(s.upsert_batch([key, keys[1], key], [b"x", b"y", b"z"]), 0)
        self.assertEqual(s.get_batch(keys), [b"z", b"y"])
        unset = kvstash.MooncakeDistributedStore()
        self.assertEqual(unset.upsert(key, b"x"), -600)

    def test_upsert_atomic_under_readers(self):
        # Readers only ever see one whole version, byte-exactly, while a writer replaces it.
        s, key = self.store, self.k("atomic")
        size = 256 * 1024
        versions = [bytes([v]) * size for v in range(1, 9)]
        self.assertEqual(s.put(key, versions[0]), 0)
        stop = threading.Event()
        bad, seen = [], set()

        def reader():
            r = self.open()
            buf = Buffer(size)
            r.register_buffer(buf.ptr, buf.size)
            while not stop.is_set():
                n = r.get_into(key, buf.ptr, size)
                if n < 0:
                    continue
                got = buf.bytes(0, size)
                if n != size or got not in versions:
                    bad.append((n, got[:8], got[-8:]))
                else:
                    seen.add(got[0])
            r.unregister_buffer(buf.ptr)

        threads = [threading.Thread(target=reader, daemon=True) for _ in range(3)]
        for t in threads:
            t.start()
        try:
            for _ in range(5):
                for v in versions[1:]:
                    self.assertEqual(s.upsert(key, v), 0)
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        self.assertEqual(bad, [])
        self.assertGreater(len(seen), 1)
        self.assertEqual(s.get(key), versions[-1])


class TenantTest(Base):
    def test_tenants_never_see_each_other(self):
        a = self.open(tenant_id="team-a")
        b = self.open(tenant_id="team-b")
        d = self.store  # "default"
        key = self.k("shared-name")
        self.assertEqual(a.put(key, b"A"), 0)
        self.assertEqual(b.put(key, b"BB"), 0)
        self.assertEqual(d.put(key, b"DDD"), 0)
        self.assertEqual((a.get(key), b.get(key), d.get(key)), (b"A", b"BB", b"DDD"))
        self.assertEqual(a.remove(key), 0)
        self.assertEqual((a.is_exist(key), b.is_exist(key), d.is_exist(key)), (0, 1, 1))
        self.assertEqual(b.remove_all(), 1)
        self.assertEqual(d.get(key), b"DDD")
        self.assertEqual(a.setup("localhost", "", 0, 0, "tcp", "", self.server.master, None,
                                 tenant_id="bad tenant!"), -600)
        bad = kvstash.MooncakeDistributedStore()
        self.assertEqual(bad.setup("localhost", "", 0, 0, "tcp", "", self.server.master, None,
                                   tenant_id="bad tenant!"), -600)


class PinTest(Base):
    segment = "1MiB"

    def test_soft_and_hard_pins_under_eviction(self):
        s = self.store
        hard = kvstash.ReplicateConfig(with_hard_pin=True)
        soft = kvstash.ReplicateConfig(soft_pin_action=kvstash.SoftPinAction.ENABLE,
                                       soft_pin_ttl_ms=60000)
        self.assertEqual(s.put(self.k("hard"), b"h" * 100000, hard), 0)
        self.assertEqual(s.put(self.k("soft"), b"s" * 100000, soft), 0)
        # Far more unpinned bytes than the segment holds: the pinned objects stay.
        for i in range(40):
            self.assertEqual(s.put(self.k(f"plain{i}"), bytes([i]) * 100000), 0)
        self.assertEqual(s.get(self.k("hard")), b"h" * 100000)
        self.assertEqual(s.get(self.k("soft")), b"s" * 100000)
        self.assertEqual(s.is_exist(self.k("plain0")), 0)
        bad = kvstash.ReplicateConfig(soft_pin_action=kvstash.SoftPinAction.ENABLE,
                                      soft_pin_ttl_ms=10 ** 12)
        self.assertEqual(s.put(self.k("too-long"), b"x", bad), -600)
        self.assertEqual(s.put(self.k("bad"), b"x", kvstash.ReplicateConfig(
            soft_pin_action=7)), -600)
        self.assertEqual(s.remove_all(force=True) >= 2, True)


class DummyTest(Base):
    def test_setup_dummy_with_host_allocator(self):
        # SGLang's standalone mode: memory from MooncakeHostMemAllocator, the local server owns
        # the store's memory.
        alloc = kvstash.MooncakeHostMemAllocator()
        size = 1 << 20
        ptr = alloc.alloc(size)
        s = kvstash.MooncakeDistributedStore()
        self.assertEqual(s.setup_dummy(size, 16 << 20, self.server.master), 0)
        self.assertEqual(s.get_hostname(), "")
        self.assertEqual(s.register_buffer(ptr, size), 0)
        keys = [self.k(f"dummy{i}") for i in range(4)]
        import ctypes
        for i, k in enumerate(keys):
            ctypes.memmove(ptr + i * 65536, pattern(k, 65536), 65536)
        self.assertEqual(s.batch_put_from(keys, [ptr + i * 65536 for i in range(4)], [65536] * 4),
                         [0] * 4)
        ctypes.memset(ptr, 0, size)
        self.assertEqual(s.batch_get_into(keys, [ptr + 300000 + i * 65536 for i in range(4)],
                                          [65536] * 4), [65536] * 4)
        for i, k in enumerate(keys):
            self.assertEqual(ctypes.string_at(ptr + 300000 + i * 65536, 65536), pattern(k, 65536))
        self.assertEqual(s.unregister_buffer(ptr), 0)
        self.assertEqual(s.close(), 0)
        self.assertEqual(alloc.free(ptr), 0)
        self.assertEqual(alloc.free(ptr), -1)
        with self.assertRaises(RuntimeError):
            alloc.alloc(0)
        self.assertEqual(s.setup_dummy(size, 0, ""), -600)


if __name__ == "__main__":
    unittest.main()
