"""ticketing.AsyncClient against a real ``ticketing dev`` (one per module)."""

import asyncio
import secrets
import unittest

import ticketing

from ._dev import DevCluster

cluster: "DevCluster | None" = None


def setUpModule() -> None:
    global cluster
    cluster = DevCluster()


def tearDownModule() -> None:
    if cluster is not None:
        cluster.stop()


class AsyncClientTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self) -> None:
        assert cluster is not None
        self.path = cluster.socket
        self.prefix = f"pya-{secrets.token_hex(4)}/"

    def key(self, name: str) -> str:
        return self.prefix + name

    async def test_async_lock(self) -> None:
        async with ticketing.AsyncClient(self.path) as a, ticketing.AsyncClient(self.path) as b:
            await a.ping()
            async with a.lock(self.key("seats/42"), lease=30, wait=5) as token:
                self.assertGreater(token, 0)
                with self.assertRaises(ticketing.BusyError):
                    await b.acquire(self.key("seats/42"), lease=10, wait=0)
                with self.assertRaises(ticketing.LockTimeoutError):
                    await b.acquire(self.key("seats/42"), lease=10, wait=0.1)
            t2 = await b.acquire(self.key("seats/42"), lease=10, wait=0)
            self.assertGreater(t2, token)
            await b.release(self.key("seats/42"), t2)
            with self.assertRaises(ticketing.ServerError) as cm:
                await b.release(self.key("seats/42"), t2)
            self.assertEqual(cm.exception.code, "not_held")

    async def test_released_when_block_raises(self) -> None:
        async with ticketing.AsyncClient(self.path) as a, ticketing.AsyncClient(self.path) as b:
            with self.assertRaises(ValueError):
                async with a.lock(self.key("k"), lease=30, wait=1):
                    raise ValueError("boom")
            await b.acquire(self.key("k"), lease=10, wait=0)

    async def test_pipelined_gather(self) -> None:
        async with ticketing.AsyncClient(self.path) as c:
            tokens = await asyncio.gather(*(c.acquire(self.key(f"k{i}"), lease=10, wait=0) for i in range(50)))
            self.assertEqual(len(set(tokens)), 50)
            held = await c.held()
            self.assertEqual(sorted(held), sorted((self.key(f"k{i}"), t) for i, t in enumerate(tokens)))
            await asyncio.gather(*(c.release(self.key(f"k{i}"), t) for i, t in enumerate(tokens)))
            self.assertEqual(await c.held(), [])
            info = await c.info()
            self.assertTrue(info.cluster)

    async def test_fifo_handoff(self) -> None:
        """Waiters queued one after the other (each starts once the one
        before is queued) get the key in that order, each by the release of
        the one before: every release is answered OK (a lease that ran out
        would answer not_held, and the lock's exit would raise
        LockLostError), and a waiter's wait (60 s) is shorter than the
        leases (120 s), so no grant can come from a lease running out."""
        clients = [ticketing.AsyncClient(self.path) for _ in range(4)]
        try:
            t0 = await clients[0].acquire(self.key("k"), lease=120, wait=0)
            order = []
            locks = []

            async def waiter(i: int, queued: asyncio.Event) -> None:
                lock = clients[i].lock(self.key("k"), lease=120, wait=60, on_queued=queued.set)
                locks.append(lock)
                async with lock as token:
                    order.append((i, token))
                    self.assertEqual(await clients[i].held(), [(self.key("k"), token)])

            tasks = []
            for i in (1, 2, 3):
                queued = asyncio.Event()
                tasks.append(asyncio.ensure_future(waiter(i, queued)))
                await asyncio.wait_for(queued.wait(), 30)
            self.assertEqual(order, [])  # all three are waiting
            await clients[0].release(self.key("k"), t0)  # OK: t0 was still held
            await asyncio.gather(*tasks)
            self.assertEqual([i for i, _ in order], [1, 2, 3])
            self.assertEqual([t for _, t in order], sorted(t for _, t in order))
            self.assertGreater(order[0][1], t0)
            for lock in locks:
                self.assertFalse(lock.lost.is_set(), lock)
            for c in clients:
                self.assertEqual(await c.held(), [])
        finally:
            for c in clients:
                await c.close()

    async def test_cancelled_waiter_holds_nothing(self) -> None:
        async with ticketing.AsyncClient(self.path) as a, ticketing.AsyncClient(self.path) as b:
            t1 = await a.acquire(self.key("k"), lease=60, wait=0)
            queued = asyncio.Event()
            task = asyncio.ensure_future(b.acquire(self.key("k"), lease=30, wait=30, on_queued=queued.set))
            # Cancel only once it is in the queue: the key then goes to it
            # on release, and only the client's own release frees it.
            await asyncio.wait_for(queued.wait(), 30)
            task.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await task
            await a.release(self.key("k"), t1)
            # The cancelled acquire is granted by the sidecar; the client
            # then releases that grant itself (well before its 30 s lease).
            t2 = await a.acquire(self.key("k"), lease=10, wait=25)
            self.assertGreater(t2, t1)
            self.assertEqual(await b.held(), [])

    async def test_unreachable(self) -> None:
        c = ticketing.AsyncClient("/nonexistent/ticketing.sock")
        with self.assertRaises(ticketing.SidecarConnectionError):
            await c.ping()


if __name__ == "__main__":
    unittest.main()
