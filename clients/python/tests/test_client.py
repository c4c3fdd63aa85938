"""ticketing.Client against a real ``ticketing dev`` (one per module)."""

import os
import secrets
import threading
import time
import unittest
from unittest import mock

import ticketing

from ._dev import DevCluster

cluster: "DevCluster | None" = None


def setUpModule() -> None:
    global cluster
    cluster = DevCluster()


def tearDownModule() -> None:
    if cluster is not None:
        cluster.stop()


class ClientTest(unittest.TestCase):
    def setUp(self) -> None:
        assert cluster is not None
        self.prefix = f"py-{secrets.token_hex(4)}/"
        self.clients: "list[ticketing.Client]" = []

    def tearDown(self) -> None:
        for c in self.clients:
            c.close()

    def client(self) -> ticketing.Client:
        assert cluster is not None
        c = ticketing.Client(cluster.socket)
        self.clients.append(c)
        return c

    def key(self, name: str) -> str:
        return self.prefix + name

    def test_lock_context_manager(self) -> None:
        a, b = self.client(), self.client()
        with a.lock(self.key("seats/42"), lease=30, wait=5) as token:
            self.assertIsInstance(token, int)
            self.assertGreater(token, 0)
            self.assertEqual(a.held(), [(self.key("seats/42"), token)])
            with self.assertRaises(ticketing.BusyError):
                b.acquire(self.key("seats/42"), lease=10, wait=0)
        self.assertEqual(a.held(), [])
        t2 = b.acquire(self.key("seats/42"), lease=10, wait=0)
        self.assertGreater(t2, token)

    def test_lock_released_when_block_raises(self) -> None:
        a, b = self.client(), self.client()
        lock = a.lock(self.key("k"), lease=30, wait=1)
        with self.assertRaises(KeyError):
            with lock as token:
                raise KeyError("boom")
        self.assertIsNone(lock.token)
        self.assertGreater(b.acquire(self.key("k"), lease=10, wait=0), token)
        with self.assertRaises(RuntimeError):
            lock.acquire()  # a Lock is used once

    def test_busy_and_timeout(self) -> None:
        a, b = self.client(), self.client()
        a.acquire(self.key("k"), lease=30, wait=0)
        with self.assertRaises(ticketing.BusyError) as busy:
            with b.lock(self.key("k"), lease=10, wait=0):
                self.fail("entered a held lock")
        self.assertEqual(busy.exception.code, "busy")
        t0 = time.monotonic()
        with self.assertRaises(TimeoutError):  # LockTimeoutError is a TimeoutError
            b.acquire(self.key("k"), lease=10, wait=0.2)
        self.assertGreaterEqual(time.monotonic() - t0, 0.15)

    def test_release_errors_carry_code(self) -> None:
        a = self.client()
        token = a.acquire(self.key("k"), lease=10, wait=0)
        with self.assertRaises(ticketing.ServerError) as cm:
            a.release(self.key("other"), token)
        self.assertEqual(cm.exception.code, "not_held")
        self.assertTrue(cm.exception.message)
        a.release(self.key("k"), token)

    def test_failed_release_after_block_is_raised(self) -> None:
        a = self.client()
        with self.assertRaises(ticketing.ServerError) as cm:
            with a.lock(self.key("k"), lease=10, wait=0) as token:
                a.release(self.key("k"), token)  # released behind the Lock's back
        self.assertEqual(cm.exception.code, "not_held")
        with a.lock(self.key("k"), lease=10, wait=0) as lock_token:
            self.assertGreater(lock_token, token)
        lock = a.lock(self.key("k"), lease=10, wait=0)
        with lock:
            lock.release()  # early release through the Lock itself is fine
        self.assertEqual(a.held(), [])

    def test_close_releases_locks(self) -> None:
        a, b = self.client(), self.client()
        a.acquire(self.key("k"), lease=60, wait=0)
        queued, done = threading.Event(), threading.Event()

        def close_once_queued() -> None:
            # Close only once b is in the key's queue, so that its grant
            # can only come from the close (the lease is 60 s, b waits 30).
            if queued.wait(30):
                a.close()
                done.set()

        threading.Thread(target=close_once_queued).start()
        b.acquire(self.key("k"), lease=10, wait=30, on_queued=queued.set)
        self.assertTrue(queued.is_set())
        self.assertTrue(done.is_set())
        with self.assertRaises(ticketing.SidecarConnectionError):
            a.ping()  # a closed client stays closed

    def test_threads_share_one_client(self) -> None:
        """Threads pipeline on one connection; every reply reaches its caller."""
        c = self.client()
        tokens: "list[int]" = []
        errors: "list[BaseException]" = []
        guard = threading.Lock()

        def worker(i: int) -> None:
            try:
                for j in range(10):
                    with c.lock(self.key(f"t{i}/{j % 3}"), lease=10, wait=0) as token:
                        c.ping()
                        with guard:
                            tokens.append(token)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(errors, [])
        self.assertEqual(len(set(tokens)), 80)
        self.assertEqual(c.held(), [])

    def test_mutual_exclusion(self) -> None:
        """One client per thread (waiting acquires should not share a
        connection: replies come in request order)."""
        inside = 0
        overlap = []
        tokens: "list[int]" = []
        guard = threading.Lock()

        def worker(c: ticketing.Client) -> None:
            nonlocal inside
            for _ in range(5):
                with c.lock(self.key("counter"), lease=10, wait=10) as token:
                    with guard:
                        inside += 1
                        overlap.append(inside)
                        tokens.append(token)
                    time.sleep(0.002)
                    with guard:
                        inside -= 1

        threads = [threading.Thread(target=worker, args=(self.client(),)) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(len(tokens), 30)
        self.assertEqual(max(overlap), 1)
        self.assertEqual(tokens, sorted(tokens))

    def test_many_clients_fifo(self) -> None:
        holder = self.client()
        t0 = holder.acquire(self.key("k"), lease=120, wait=0)
        order: "list[tuple[int, int]]" = []

        def waiter(i: int, c: ticketing.Client, queued: threading.Event) -> None:
            with c.lock(self.key("k"), lease=30, wait=60, on_queued=queued.set) as token:
                order.append((i, token))

        threads = []
        for i in range(4):
            # The next waiter starts only once this one is in the queue.
            queued = threading.Event()
            t = threading.Thread(target=waiter, args=(i, self.client(), queued))
            t.start()
            threads.append(t)
            self.assertTrue(queued.wait(30), f"waiter {i} was never queued")
        holder.release(self.key("k"), t0)
        for t in threads:
            t.join(90)
        self.assertEqual([i for i, _ in order], [0, 1, 2, 3])
        self.assertEqual([t for _, t in order], sorted(t for _, t in order))
        self.assertGreater(order[0][1], t0)

    def test_info_and_default_path(self) -> None:
        assert cluster is not None
        with mock.patch.dict(os.environ, {"TICKETING_SOCKET": cluster.socket}):
            with ticketing.Client() as c:
                self.assertEqual(c.path, cluster.socket)
                c.ping()
                info = c.info()
        self.assertTrue(info.cluster)
        self.assertGreaterEqual(info.total, 3)
        self.assertLessEqual(info.connected, info.total)
        with mock.patch.dict(os.environ, {"TICKETING_SOCKET": ""}):
            self.assertEqual(ticketing.Client().path, "./ticketing.sock")

    def test_unreachable_socket(self) -> None:
        c = ticketing.Client("/nonexistent/ticketing.sock")
        with self.assertRaises(ticketing.SidecarConnectionError) as cm:
            c.ping()
        self.assertIsInstance(cm.exception, ConnectionError)
        self.assertIn("/nonexistent/ticketing.sock", str(cm.exception))

    def test_reconnects_after_server_closed(self) -> None:
        c = self.client()
        c.acquire(self.key("k"), lease=60, wait=0)
        reply = c.raw("PING " + "x" * 5000)  # over-long: ERR, then the sidecar closes
        self.assertTrue(reply.startswith("ERR "), reply)
        deadline = time.monotonic() + 2
        while c.connected and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertFalse(c.connected)
        c.ping()  # a new connection, a new session: the old lock is gone
        self.assertEqual(c.held(), [])
        self.assertGreater(self.client().acquire(self.key("k"), lease=10, wait=1), 0)


if __name__ == "__main__":
    unittest.main()


class NoSidecarTest(unittest.TestCase):
    """A missing or stale socket: the error names the path and what to start
    (sync and asyncio clients; no cluster needed)."""

    def test_missing_and_stale_socket(self) -> None:
        import asyncio
        import socket
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            stale = os.path.join(d, "stale.sock")
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(stale)
            s.close()  # the file stays, as a killed sidecar leaves it
            for path, why in ((os.path.join(d, "missing.sock"), "no socket file there"),
                              (stale, "nothing serves that socket file")):

                async def aping() -> None:
                    await ticketing.AsyncClient(path).ping()

                for name, call in (("sync", lambda: ticketing.Client(path).ping()),
                                   ("asyncio", lambda: asyncio.run(aping()))):
                    with self.subTest(path=path, client=name):
                        with self.assertRaises(ticketing.SidecarConnectionError) as cm:
                            call()
                        msg = str(cm.exception)
                        for want in (path, why, "ticketing dev", "ticketing sidecar"):
                            self.assertIn(want, msg)
