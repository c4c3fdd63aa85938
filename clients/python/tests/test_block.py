"""Seat blocks (acquire_block, lock_block) with ticketing.Client and
ticketing.AsyncClient against a real ``ticketing dev``, and against a fake
version-1 sidecar."""

import asyncio
import os
import secrets
import socket
import tempfile
import threading
import time
import unittest
from typing import Callable, List

import ticketing
from ticketing import _protocol as p

from ._dev import DevCluster

cluster: "DevCluster | None" = None


def setUpModule() -> None:
    global cluster
    cluster = DevCluster()


def tearDownModule() -> None:
    if cluster is not None:
        cluster.stop()


class BlockArguments(unittest.TestCase):
    def test_block_line(self) -> None:
        self.assertEqual(p.acquire_block_line(["s/1", "s/2"], 30, 5), ("ACQUIRE s/1 s/2 30 5", 5.0))
        self.assertEqual(p.acquire_block_line(("k",), 10, 0.25)[0], "ACQUIRE k 10 0.25")
        keys = [f"{i:02d}" + "~" * 253 for i in range(16)]
        line = p.acquire_block_line(keys, 250, 300.0)[0]
        self.assertEqual(len(line), 8 + 16 * 255 + 15 + len(" 250 300"))
        self.assertLessEqual(len(line), p.MAX_LINE)

    def test_bad_keys(self) -> None:
        for keys in ([], ["a", "a"], ["a", "b", "a"], [f"k{i}" for i in range(17)], ["ok", "with space"], ["ok", ""]):
            with self.subTest(keys=keys), self.assertRaises(ValueError):
                p.check_keys(keys)
        for keys in ("seat/1", b"seat/1", 5, None, ["ok", 5]):
            with self.subTest(keys=keys), self.assertRaises(TypeError):
                p.check_keys(keys)  # type: ignore[arg-type]
        client = ticketing.Client("/nonexistent/ticketing.sock")
        with self.assertRaises(ValueError):
            client.lock_block(["a", "a"])
        with self.assertRaises(ValueError):
            client.lock_block(["a", "b"], lease=0)
        with self.assertRaises(ValueError):
            ticketing.AsyncClient("/nonexistent/ticketing.sock").lock_block([])

    def test_parse_hello(self) -> None:
        self.assertEqual(p.parse_hello("HELLO 3"), 3)
        self.assertEqual(p.parse_hello("HELLO 2"), 2)
        self.assertEqual(p.parse_hello("HELLO 1"), 1)
        self.assertEqual(p.parse_hello('ERR unknown_verb unixapi: unknown verb: "HELLO" (verbs are ...)'), 1)
        self.assertEqual(p.parse_hello_reply("HELLO 4 events"), (4, True))
        self.assertEqual(p.parse_hello_reply("HELLO 6 events"), (6, True))
        self.assertEqual(p.parse_hello_reply("HELLO 3 events"), (3, True))
        self.assertEqual(p.parse_hello_reply("HELLO 2"), (2, False))
        self.assertEqual(p.parse_hello_reply("HELLO 7 events"), (7, True))
        self.assertEqual(p.parse_hello_reply("HELLO 8 events"), (8, True))
        self.assertEqual(p.parse_hello_reply("HELLO 9 events"), (9, True))
        for bad in ("HELLO 10", "HELLO 10 events", "HELLO 4 events ", "HELLO 2 events", "HELLO 3 bogus", "HELLO 3 ", "HELLO x", "HELLO", "OK"):
            with self.subTest(reply=bad), self.assertRaises(ticketing.ProtocolError):
                p.parse_hello(bad)
        with self.assertRaises(ticketing.ServerError) as cm:
            p.parse_hello("ERR bad_request no")
        self.assertEqual(cm.exception.code, "bad_request")


class SyncBlockTest(unittest.TestCase):
    def setUp(self) -> None:
        assert cluster is not None
        self.prefix = f"pyb-{secrets.token_hex(4)}/"
        self.clients: "list[ticketing.Client]" = []

    def tearDown(self) -> None:
        for c in self.clients:
            c.close()

    def client(self) -> ticketing.Client:
        assert cluster is not None
        c = ticketing.Client(cluster.socket)
        self.clients.append(c)
        return c

    def keys(self, *names: str) -> List[str]:
        return [self.prefix + n for n in names]

    def test_lock_block_context_manager(self) -> None:
        a, b = self.client(), self.client()
        seats = self.keys("seat/2", "seat/1", "seat/3")
        # The version both speak: the client may be a version ahead of the
        # sidecar of this tree while the sidecar's side of it is built.
        self.assertEqual(a.hello(), min(p.PROTOCOL_VERSION, a.info().protocol))
        lock = a.lock_block(seats, lease=30, wait=5)
        self.assertEqual(lock.keys, tuple(seats))
        self.assertEqual(lock.key, seats[0])
        with lock as token:
            self.assertIsInstance(token, int)
            self.assertEqual(sorted(a.held()), sorted((k, token) for k in seats))
            for k in seats:
                with self.assertRaises(ticketing.BusyError):
                    b.acquire(k, lease=10, wait=0)
            self.assertIn("seat/3", repr(lock))
        self.assertEqual(a.held(), [])
        t2 = b.acquire_block(seats[1:], lease=10, wait=0)
        self.assertGreater(t2, token)
        b.release(seats[2], t2)  # any key releases the block
        self.assertEqual(b.held(), [])

    def test_block_released_when_body_raises(self) -> None:
        a, b = self.client(), self.client()
        seats = self.keys("a", "b")
        with self.assertRaises(KeyError):
            with a.lock_block(seats, lease=30, wait=1):
                raise KeyError("boom")
        self.assertGreater(b.acquire_block(seats, lease=10, wait=0), 0)

    def test_busy_timeout_and_waiting(self) -> None:
        a, b, c = self.client(), self.client(), self.client()
        k1, k2, k3 = self.keys("k1", "k2", "k3")
        t1 = b.acquire(k2, lease=30, wait=0)
        with self.assertRaises(ticketing.BusyError):
            a.acquire_block([k1, k2, k3], lease=30, wait=0)
        t0 = time.monotonic()
        with self.assertRaises(ticketing.LockTimeoutError):
            a.acquire_block([k1, k2, k3], lease=30, wait=0.3)
        self.assertGreaterEqual(time.monotonic() - t0, 0.25)
        self.assertEqual(a.held(), [])
        got: "list[int]" = []
        queued = threading.Event()
        waiter = threading.Thread(
            target=lambda: got.append(a.acquire_block([k1, k2, k3], lease=30, wait=60, on_queued=queued.set))
        )
        waiter.start()
        self.assertTrue(queued.wait(30), "the block was never queued")
        with self.assertRaises(ticketing.BusyError):  # reserved for the waiting block
            c.acquire(k1, lease=10, wait=0)
        b.release(k2, t1)
        waiter.join(90)
        self.assertEqual(len(got), 1)
        self.assertGreater(got[0], t1)

    def test_close_releases_block(self) -> None:
        a, b = self.client(), self.client()
        seats = self.keys("x", "y")
        t1 = a.acquire_block(seats, lease=60, wait=0)
        a.close()
        self.assertGreater(b.acquire_block(seats, lease=10, wait=2), t1)


class AsyncBlockTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self) -> None:
        assert cluster is not None
        self.path = cluster.socket
        self.prefix = f"pyab-{secrets.token_hex(4)}/"

    def keys(self, *names: str) -> List[str]:
        return [self.prefix + n for n in names]

    async def test_async_lock_block(self) -> None:
        seats = self.keys("s1", "s2", "s3")
        async with ticketing.AsyncClient(self.path) as a, ticketing.AsyncClient(self.path) as b:
            self.assertEqual(await a.hello(), min(p.PROTOCOL_VERSION, (await a.info()).protocol))
            async with a.lock_block(seats, lease=30, wait=5) as token:
                self.assertEqual(sorted(await a.held()), sorted((k, token) for k in seats))
                with self.assertRaises(ticketing.BusyError):
                    await b.acquire_block(seats[1:], lease=10, wait=0)
                with self.assertRaises(ticketing.LockTimeoutError):
                    await b.acquire(seats[2], lease=10, wait=0.1)
            self.assertEqual(await a.held(), [])
            t2 = await b.acquire_block(seats, lease=10, wait=0)
            self.assertGreater(t2, token)
            await b.release(seats[1], t2)
            self.assertEqual(await b.held(), [])

    async def test_cancelled_block_waiter_holds_nothing(self) -> None:
        seats = self.keys("k1", "k2")
        async with ticketing.AsyncClient(self.path) as a, ticketing.AsyncClient(self.path) as b:
            t1 = await a.acquire(seats[1], lease=60, wait=0)
            queued = asyncio.Event()
            task = asyncio.ensure_future(b.acquire_block(seats, lease=30, wait=30, on_queued=queued.set))
            await asyncio.wait_for(queued.wait(), 30)  # cancel a block that is in the queues
            task.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await task
            await a.release(seats[1], t1)
            # The block is still queued, so it is granted; the client then
            # releases it itself, and the keys come free.
            t2 = await a.acquire_block(seats, lease=10, wait=25)
            self.assertGreater(t2, t1)
            self.assertEqual(await b.held(), [])


class FakeSidecar:
    """A unix socket answering each request line with answer(line)."""

    def __init__(self, answer: Callable[[str], str]) -> None:
        self.dir = tempfile.mkdtemp(prefix="tk-fake-")
        self.path = os.path.join(self.dir, "s.sock")
        self.lines: List[str] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen()
        self.answer = answer
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._conn, args=(conn,), daemon=True).start()

    def _conn(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as f:
            for raw in f:
                line = raw.decode().rstrip("\n")
                self.lines.append(line)
                conn.sendall((self.answer(line) + "\n").encode())

    def close(self) -> None:
        self.sock.close()
        os.unlink(self.path)
        os.rmdir(self.dir)


def version1(line: str) -> str:
    """A version-1 sidecar: HELLO is an unknown verb, one-key ACQUIRE works."""
    if line.startswith("HELLO"):
        return 'ERR unknown_verb unixapi: unknown verb: "HELLO" (verbs are PING, ACQUIRE, RELEASE, INFO, HELD; upper case)'
    if line.startswith("ACQUIRE "):
        return "OK 7" if len(line.split(" ")) == 4 else "ERR bad_request wrong number of fields"
    return "OK"


class Version1SidecarTest(unittest.TestCase):
    """Against a version-1 sidecar a block is refused (NotSupportedError,
    nothing but the connection's first HELLO sent, which tells the version);
    a one-key block works."""

    def setUp(self) -> None:
        self.fake = FakeSidecar(version1)

    def tearDown(self) -> None:
        self.fake.close()

    def test_sync(self) -> None:
        with ticketing.Client(self.fake.path) as c:
            self.assertEqual(c.acquire_block(["only"], lease=30, wait=0), 7)
            for _ in range(2):
                with self.assertRaises(ticketing.NotSupportedError) as cm:
                    c.acquire_block(["a", "b"], lease=30, wait=0)
                self.assertIn("version 1", str(cm.exception))
            with self.assertRaises(ticketing.NotSupportedError):
                with c.lock_block(["a", "b"]):
                    self.fail("entered")
            self.assertEqual(c.hello(), 1)
        self.assertEqual(self.fake.lines, ["HELLO 9 events", "ACQUIRE only 30 0"])

    def test_async(self) -> None:
        async def body() -> None:
            async with ticketing.AsyncClient(self.fake.path) as c:
                with self.assertRaises(ticketing.NotSupportedError):
                    await c.acquire_block(["a", "b"], lease=30, wait=0)
                with self.assertRaises(ticketing.NotSupportedError):
                    async with c.lock_block(["a", "b"]):
                        self.fail("entered")
                self.assertEqual(await c.hello(), 1)
                self.assertEqual(await c.acquire_block(["only"], lease=30, wait=0), 7)

        asyncio.run(body())
        self.assertEqual(self.fake.lines, ["HELLO 9 events", "ACQUIRE only 30 0"])


if __name__ == "__main__":
    unittest.main()
