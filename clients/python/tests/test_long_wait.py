"""Issue 41: a wait may be up to an hour (3600 s) from a sidecar of
protocol version 6. Against an older sidecar a wait over 300 s is refused
with NotSupportedError before anything is sent (the sidecar would answer
invalid_wait, which reads as the caller's mistake); over an hour is a
ValueError everywhere. The real sidecar's side is the conformance
scenario long_wait_queues_and_is_granted."""

from __future__ import annotations

import asyncio
import time
import unittest

import ticketing
from ticketing import _protocol as p

from .test_lost import ScriptedSidecar


class LongWaitVersion(unittest.TestCase):
    def setUp(self) -> None:
        self.fake = ScriptedSidecar()  # answers HELLO 4 events

    def tearDown(self) -> None:
        self.fake.close()

    def test_sync_refuses_a_long_wait_from_an_older_sidecar(self) -> None:
        with ticketing.Client(self.fake.path) as c:
            with self.assertRaises(ticketing.NotSupportedError):
                c.acquire("k", lease=30, wait=300.001)
            with self.assertRaises(ticketing.NotSupportedError):
                c.acquire_block(["a", "b"], lease=30, wait=3600)
            with self.assertRaises(ValueError):
                c.acquire("k", lease=30, wait=3600.001)
            self.assertEqual(self.fake.sent("ACQUIRE"), [])
            c.acquire("k", lease=30, wait=300)  # the old bound as before
            self.assertEqual(self.fake.sent("ACQUIRE"), ["ACQUIRE k 30 300"])

    def test_async_refuses_a_long_wait_from_an_older_sidecar(self) -> None:
        async def main() -> None:
            async with ticketing.AsyncClient(self.fake.path) as c:
                with self.assertRaises(ticketing.NotSupportedError):
                    await c.acquire("k", lease=30, wait=301)
                self.assertEqual(self.fake.sent("ACQUIRE"), [])

        asyncio.run(main())

    def test_a_version_6_sidecar_gets_the_long_wait(self) -> None:
        orig = self.fake.answer
        self.fake.answer = lambda line: "HELLO 6 events" if line == p.HELLO_EVENTS_LINE else orig(line)  # type: ignore[method-assign]
        with ticketing.Client(self.fake.path) as c:
            c.acquire("k", lease=30, wait=3600)
            self.assertEqual(self.fake.sent("ACQUIRE"), ["ACQUIRE k 30 3600"])


class RenewAfterWait(unittest.TestCase):
    """A grant whose wait took more than half its lease is renewed by one
    EXTEND of the same lease before acquire() returns (a wait may be an
    hour, a lease at most 250 s): on OK the deadline counts from the
    EXTEND's send; on not_held the lock is lost (moved); on anything else
    the deadline stays the ACQUIRE's. A grant with more than half its lease
    left is not renewed."""

    def setUp(self) -> None:
        self.fake = ScriptedSidecar()
        self.delay = 0.0
        self.fake.before_reply = lambda line: (time.sleep(self.delay) or []) if line.startswith("ACQUIRE") else []

    def tearDown(self) -> None:
        self.fake.close()

    def test_sync(self) -> None:
        with ticketing.Client(self.fake.path) as c:
            self.delay = 0.6  # of a 1 s lease: 0.74 s of validity, half is 0.37
            lock = c.lock("k", lease=1, wait=300)
            token = lock.acquire()
            self.assertEqual(self.fake.sent("EXTEND"), [f"EXTEND k {token} 1"])
            self.assertGreater(lock.remaining(), 0.5, "the renewal's OK did not move the deadline")
            self.assertFalse(lock.lost.is_set())
            lock.release()
            self.fake.replies["EXTEND"] = "ERR not_held the lease ran out"
            gone = c.lock("k2", lease=1, wait=300)
            gone.acquire()
            self.assertTrue(gone.lost.is_set())
            self.assertEqual(gone.lost_reason, "moved")
            self.fake.replies["EXTEND"] = "INDETERMINATE"
            unknown = c.lock("k3", lease=1, wait=300)
            unknown.acquire()
            self.assertLessEqual(unknown.remaining(), p.validity(1) - 0.6 + 0.05)  # the ACQUIRE's deadline
            del self.fake.replies["EXTEND"]
            self.delay = 0.0
            quick = c.lock("k4", lease=10, wait=300)
            quick.acquire()
            self.assertEqual(len(self.fake.sent("EXTEND")), 3, "a grant with most of its lease left was renewed")

    def test_async(self) -> None:
        async def main() -> None:
            async with ticketing.AsyncClient(self.fake.path) as c:
                self.delay = 0.6
                lock = c.lock("k", lease=1, wait=300)
                token = await lock.acquire()
                self.assertEqual(self.fake.sent("EXTEND"), [f"EXTEND k {token} 1"])
                self.assertGreater(lock.remaining(), 0.5)
                await lock.release()

        asyncio.run(main())


if __name__ == "__main__":
    unittest.main()

