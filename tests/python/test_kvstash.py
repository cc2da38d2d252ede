"""The kvstash Python module against a real kvstash-server (standard library unittest only)."""
import os
import tempfile
import threading
import unittest
import warnings

import kvstash

from kvs_harness import GUARD, Buffer, Server, pattern


class StoreTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def setUp(self):
        self.store = kvstash.MooncakeDistributedStore()
        rc = self.store.setup("localhost", "http://ignored:8080/metadata", 0, "16MB", "tcp", "",
                              self.server.master)
        self.assertEqual(rc, 0)
        self.prefix = self.id().rsplit(".", 1)[-1] + "-"

    def tearDown(self):
        self.assertEqual(self.store.close(), 0)

    def k(self, name):
        return self.prefix + name

    # -- setup ------------------------------------------------------------------------------

    def test_setup_forms_and_errors(self):
        s = kvstash.MooncakeDistributedStore()
        self.assertEqual(s.put("x", b"1"), -600)  # not set up yet
        self.assertEqual(s.get("x"), b"")
        cfg = {"local_hostname": "localhost", "metadata_server": "P2PHANDSHAKE",
               "global_segment_size": "8MB", "local_buffer_size": "1GiB", "protocol": "rdma",
               "device_name": "mlx5_0", "master_server_address": self.server.master}
        # Bad values are codes, as Mooncake's (dict values go through str()).
        self.assertEqual(s.setup(dict(cfg, global_segment_size="10%")), -600)
        self.assertEqual(s.setup(dict(cfg, protocol=5)), -600)
        for required in ("local_hostname", "metadata_server"):
            self.assertEqual(s.setup({k: v for k, v in cfg.items() if k != required}), -600)
        self.assertEqual(s.health_check(), 1)
        self.assertEqual(s.setup(cfg), 0)  # rdma means auto (one warning line on stderr)
        self.assertEqual(s.health_check(), 0)
        self.assertEqual(s.setup(cfg), -600)  # twice
        # The segment's name: local_hostname with this process's data port.
        host, port = s.get_hostname().rsplit(":", 1)
        self.assertEqual(host, "localhost")
        self.assertTrue(port.isdigit() and int(port) > 0, port)
        # global_segment_size > 0: this process serves a segment and objects can live there.
        self.assertEqual(s.put(self.k("on-me"), b"abc"), 0)
        self.assertEqual(s.get(self.k("on-me")), b"abc")
        self.assertEqual(s.close(), 0)
        self.assertEqual(s.get_size(self.k("x")), -600)
        bad = kvstash.MooncakeDistributedStore()
        self.assertEqual(bad.setup("localhost", "", 0, 0, "tcp", "", "127.0.0.1:1"), -900)
        self.assertEqual(bad.setup("localhost", "", 0, 0, "carrier-pigeon", "",
                                   self.server.master), -600)

    # -- copying calls -----------------------------------------------------------------------

    def test_put_get_size_exist_remove(self):
        s, key = self.store, self.k("a")
        data = pattern(key, 100000)
        self.assertEqual(s.put(key, data), 0)
        # Mooncake's convention: a put of an existing key succeeds and keeps the first value.
        self.assertEqual(s.put(key, b"other"), 0)
        self.assertEqual(s.get(key), data)
        self.assertEqual(s.get(key), data)
        self.assertEqual(s.get_size(key), len(data))
        self.assertEqual(s.is_exist(key), 1)
        self.assertEqual(s.batch_is_exist([key, self.k("none")]), [1, 0])
        self.assertEqual(s.get(self.k("none")), b"")
        self.assertEqual(s.get_size(self.k("none")), -704)
        # The reads above are over and released their leases (with the next request).
        self.assertEqual(s.remove(key), 0)
        self.assertEqual(s.is_exist(key), 0)
        self.assertEqual(s.put(key, data), 0)
        self.assertEqual(s.remove(key, force=True), 0)
        self.assertEqual(s.is_exist(key), 0)
        self.assertEqual(s.put("", b"x"), -600)
        self.assertEqual(s.put(self.k("empty"), b""), -600)
        with self.assertRaises(TypeError):
            s.put(self.k("t"), "not bytes")
        with self.assertRaises(TypeError):
            s.put(self.k("t"), b"x", config="replica_num=2")

    def test_replicate_config(self):
        s = self.store
        c = kvstash.ReplicateConfig()
        self.assertEqual((c.replica_num, c.preferred_segment, c.prefer_alloc_in_same_node),
                         (1, "", False))
        c.replica_num = 2  # clamped to the one segment there is
        c.prefer_alloc_in_same_node = True
        self.assertEqual(s.put(self.k("r"), b"xyz", c), 0)
        c = kvstash.ReplicateConfig(replica_num=0)
        self.assertEqual(s.put(self.k("r0"), b"xyz", c), -600)
        c = kvstash.ReplicateConfig(preferred_segment="no-such-segment")
        self.assertEqual(s.put(self.k("pref"), b"xyz", c), 0)  # a preference, not a demand

    # -- zero-copy calls ---------------------------------------------------------------------

    def test_put_from_get_into_and_batches(self):
        s = self.store
        src, dst = Buffer(1 << 20), Buffer(1 << 20)
        self.assertEqual(s.register_buffer(src.ptr, src.size), 0)
        self.assertEqual(s.register_buffer(dst.ptr, dst.size), 0)
        keys = [self.k(f"b{i}") for i in range(4)]
        sizes = [1, 4097, 70000, 200003]
        offs = [0, 16, 8192, 100000]
        for key, off, n in zip(keys, offs, sizes):
            src.write(off, pattern(key, n))
        self.assertEqual(s.put_from(keys[0], src.ptr, 1), 0)
        self.assertEqual(s.batch_put_from(keys[1:], [src.ptr + o for o in offs[1:]], sizes[1:]),
                         [0, 0, 0])
        self.assertEqual(s.get_into(keys[3], dst.ptr, dst.size), sizes[3])
        self.assertEqual(dst.bytes(0, sizes[3]), pattern(keys[3], sizes[3]))
        self.assertEqual(s.get_into(keys[3], dst.ptr, 10), -600)  # too small
        got = s.batch_get_into(keys + [self.k("none")],
                               [dst.ptr + 300000 + o for o in offs] + [dst.ptr], sizes + [10])
        self.assertEqual(got, sizes + [-704])
        for key, off, n in zip(keys, offs, sizes):
            self.assertEqual(dst.bytes(300000 + off, n), pattern(key, n))
        # Unregistered memory is refused before any I/O.
        other = Buffer(100)
        self.assertEqual(s.put_from(self.k("u"), other.ptr, 100), -600)
        self.assertEqual(s.get_into(keys[0], other.ptr, 100), -600)
        self.assertEqual(s.unregister_buffer(other.ptr), -600)
        # Mismatched list lengths: -600 per key, nothing done.
        self.assertEqual(s.batch_put_from([self.k("m1"), self.k("m2")], [src.ptr], [1, 2]),
                         [-600, -600])
        self.assertEqual(s.is_exist(self.k("m1")), 0)
        with self.assertRaises(TypeError):
            s.batch_get_into(keys, ["0"] * 4, sizes)
        with self.assertRaises(TypeError):
            s.batch_get_into("notalist", [0], [1])
        self.assertEqual(s.unregister_buffer(src.ptr), 0)
        self.assertEqual(s.unregister_buffer(dst.ptr), 0)

    def test_multi_buffers(self):
        s = self.store
        pool = Buffer(4 << 20)
        self.assertEqual(s.register_buffer(pool.ptr, pool.size), 0)
        key, size = self.k("multi"), 300001
        data = pattern(key, size)
        # Put gathered from three pieces kept in reverse order.
        cuts = [0, 1000, 150000, size]
        pieces = [data[cuts[i]:cuts[i + 1]] for i in range(3)]
        where = [2000000 + 200000 * (2 - i) for i in range(3)]
        for w, p in zip(where, pieces):
            pool.write(w, p)
        self.assertEqual(s.batch_put_from_multi_buffers(
            [key], [[pool.ptr + w for w in where]], [[len(p) for p in pieces]]), [0])
        # Read into 8 KiB pages in shuffled order, the same key twice, a missing key, a size
        # mismatch and a fragment outside registered memory.
        pages = list(range(0, 1 << 20, 8192))
        pages.reverse()
        frag_sizes = [8192] * (size // 8192) + [size % 8192]
        a = [pool.ptr + pages[i] for i in range(len(frag_sizes))]
        b = [pool.ptr + (1 << 20) + 8192 * i for i in range(len(frag_sizes))]
        short = [pool.ptr + 3000000]
        outside = Buffer(size)
        for rounds in (False, True):
            got = s.batch_get_into_multi_buffers(
                [key, key, self.k("gone"), key, key],
                [a, b, [pool.ptr + 3500000], short, [outside.ptr]],
                [frag_sizes, frag_sizes, [100], [size - 1], [size]],
                prefer_alloc_in_same_node=rounds)
            self.assertEqual(got, [size, size, -704, -600, -600])
            got_a = b"".join(pool.bytes(p - pool.ptr, n) for p, n in zip(a, frag_sizes))
            got_b = b"".join(pool.bytes(p - pool.ptr, n) for p, n in zip(b, frag_sizes))
            self.assertEqual(got_a, data)
            self.assertEqual(got_b, data)
            self.assertEqual(pool.bytes(3000000, size - 1), bytes([GUARD]) * (size - 1))
            self.assertEqual(outside.bytes(0, size), bytes([GUARD]) * size)
        self.assertEqual(s.batch_get_into_multi_buffers([key], [a, b], [frag_sizes]), [-600])
        self.assertEqual(s.batch_get_into_multi_buffers([key], [a], [frag_sizes[:-1]]), [-600])
        with self.assertRaises(TypeError):
            s.batch_get_into_multi_buffers([key], [a[0]], [frag_sizes])
        stats = s.get_stats()
        self.assertGreaterEqual(stats["get_calls"], 2)
        self.assertEqual(stats["registered_buffers"], 1)
        self.assertEqual(s.unregister_buffer(pool.ptr), 0)

    # -- threads -----------------------------------------------------------------------------

    def test_concurrent_setups_open_one_client(self):
        # Both used to connect and mount: the later one replaced (and leaked) the earlier.
        s = kvstash.MooncakeDistributedStore()
        results = []
        go = threading.Barrier(6)

        def setup():
            go.wait()
            results.append(s.setup("localhost", "", "4MB", 0, "tcp", "", self.server.master))

        threads = [threading.Thread(target=setup) for _ in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        self.assertEqual(sorted(results), [-600] * 5 + [0])
        self.assertEqual(s.close(), 0)
        self.assertEqual(s.setup("localhost", "", 0, 0, "tcp", "", self.server.master), 0)
        self.assertEqual(s.close(), 0)

    def test_key_list_changed_during_a_call(self):
        # The call holds its own references: another thread clearing the list (and reusing
        # the freed memory) while the GIL is released must not change the keys the call uses.
        # A put reads them twice, before and after its transfer: the second read used to see
        # freed memory, so PUT_END named garbage keys and the objects stayed pending.
        s = self.store
        n, size = 64, 256 << 10
        buf = Buffer(n * size)
        self.assertEqual(s.register_buffer(buf.ptr, buf.size), 0)
        for attempt in range(3):
            keys = [self.k(f"list-{attempt}-{i:04d}-" + "x" * 48) for i in range(n)]
            live = [str(k.encode().decode()) for k in keys]  # objects only this list holds
            started = threading.Event()

            def clobber():
                started.wait()
                live.clear()
                junk = [f"junk-{i:04d}-" + "y" * 60 for i in range(20000)]
                del junk

            th = threading.Thread(target=clobber)
            th.start()
            started.set()
            res = s.batch_put_from(live, [buf.ptr + i * size for i in range(n)], [size] * n)
            th.join()
            self.assertEqual(res, [0] * n)
            self.assertEqual(s.batch_is_exist(keys), [1] * n)
        self.assertEqual(s.unregister_buffer(buf.ptr), 0)

    def test_threads_share_one_store(self):
        s = self.store
        errors = []

        def worker(t):
            buf = Buffer(300000)
            if s.register_buffer(buf.ptr, buf.size) != 0:
                errors.append("register")
                return
            for i in range(20):
                key = self.k(f"t{t}-{i}")
                data = pattern(key, 1000 + 9973 * i % 250000)
                if s.put(key, data) != 0:
                    errors.append(("put", key))
                if s.get_into(key, buf.ptr, buf.size) != len(data) or \
                        buf.bytes(0, len(data)) != data:
                    errors.append(("get_into", key))
                if s.get(key) != data:
                    errors.append(("get", key))
            if s.unregister_buffer(buf.ptr) != 0:
                errors.append("unregister")

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        self.assertEqual(errors, [])
        self.assertEqual(s.get_stats()["put_keys"], 160)


class AuthTest(unittest.TestCase):
    """setup's auth_token_file and tls keys against a store that requires the token."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.token = os.path.join(cls.tmp.name, "token")
        cls.wrong = os.path.join(cls.tmp.name, "wrong")
        for path, text in ((cls.token, "python-test-token-0123456789\n"),
                           (cls.wrong, "another-token-abcdefghijklmn\n")):
            with open(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600), "w") as f:
                f.write(text)
        cls.server = Server(segment="16MiB", extra=("--auth-token-file", cls.token, "--tls"))

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        cls.tmp.cleanup()

    def config(self, **extra):
        cfg = {"local_hostname": "localhost", "metadata_server": "P2PHANDSHAKE",
               "global_segment_size": 0, "local_buffer_size": 0, "protocol": "tcp",
               "master_server_address": self.server.master}
        cfg.update(extra)
        return cfg

    def test_token_and_tls(self):
        store = kvstash.MooncakeDistributedStore()
        self.assertEqual(store.setup(self.config(auth_token_file=self.token, tls=True)), 0)
        data = pattern("auth-py", 70000)
        self.assertEqual(store.put("auth-py", data), 0)
        self.assertEqual(store.get("auth-py"), data)
        self.assertEqual(store.close(), 0)

    def test_refused_without_the_token(self):
        for extra in ({}, {"tls": True}, {"auth_token_file": self.wrong, "tls": True},
                      {"auth_token_file": self.token}):
            store = kvstash.MooncakeDistributedStore()
            self.assertLess(store.setup(self.config(**extra)), 0, extra)

    def test_bad_token_file(self):
        store = kvstash.MooncakeDistributedStore()
        self.assertEqual(store.setup(self.config(auth_token_file="/nonexistent/token")), -600)


if __name__ == "__main__":
    warnings.simplefilter("default")
    unittest.main()
