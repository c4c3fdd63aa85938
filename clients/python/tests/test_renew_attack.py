"""Attack round on the renewal of a grant that waited (commit 9a76315):
interleavings during the renewal's EXTEND, before acquire() returns."""

from __future__ import annotations

import asyncio
import threading
import time
import unittest

import ticketing

from .test_lost import ScriptedSidecar


class RenewalInterleavings(unittest.TestCase):
    def setUp(self) -> None:
        self.fake = ScriptedSidecar()

    def tearDown(self) -> None:
        self.fake.close()

    def test_async_cancel_during_renewal_releases_the_grant(self) -> None:
        """AsyncClient.acquire promises: if the calling task is cancelled, a
        grant that arrives later is released. A cancel (wait_for's timeout)
        that lands while AsyncLock.acquire renews the grant must not leave
        the key held by nobody for a whole lease (and a fresh one if the
        renewal applied): the grant is released."""

        def before(line: str):
            if line.startswith("ACQUIRE"):
                time.sleep(0.6)  # of a 1 s lease: more than half of the validity
            elif line.startswith("EXTEND"):
                time.sleep(0.5)  # the caller gives up meanwhile
            return []

        self.fake.before_reply = before

        async def main() -> None:
            async with ticketing.AsyncClient(self.fake.path) as c:
                lock = c.lock("k", lease=1, wait=300)
                with self.assertRaises(asyncio.TimeoutError):
                    await asyncio.wait_for(lock.acquire(), 0.8)
                await asyncio.sleep(0.5)  # the EXTEND's reply, then any RELEASE
                self.assertEqual(len(self.fake.sent("EXTEND")), 1)
                self.assertEqual(self.fake.sent("RELEASE"), ["RELEASE k 101"],
                                 "cancelled during the renewal: the grant was never released")

        asyncio.run(main())

    def test_sync_client_release_during_renewal_marks_the_lock_released(self) -> None:
        """Client.release(key, token) of a lock object's key and token marks
        the object released (Go and Node do so for a grant under renewal:
        it is registered before the EXTEND). The Python Lock registers only
        after the renewal, so a release of its token made meanwhile (e.g. a
        thread releasing everything HELD lists) is missed: acquire() then
        returns a lock that reports validity for a key the cluster may
        already have handed on."""
        with ticketing.Client(self.fake.path) as c:
            released = threading.Event()

            def before(line: str):
                if line.startswith("ACQUIRE"):
                    time.sleep(0.6)
                elif line.startswith("EXTEND"):
                    def other() -> None:
                        c.release("k", 101)
                        released.set()
                    threading.Thread(target=other, daemon=True).start()
                    time.sleep(0.3)  # the other thread's release is under way
                return []

            self.fake.before_reply = before
            lock = c.lock("k", lease=1, wait=300)
            token = lock.acquire()
            self.assertEqual(token, 101)
            self.assertTrue(released.wait(2))
            self.assertEqual(lock.remaining(), 0.0,
                             "the key was released (RELEASE OK) yet the lock reports validity")


    def test_lost_event_during_renewal_then_indeterminate(self) -> None:
        """A ``! LOST`` event read while the renewal is in flight, then an
        INDETERMINATE reply: the lock comes lost (expired), sync and async,
        though the ACQUIRE's deadline has not passed."""

        def before(line: str):
            if line.startswith("ACQUIRE"):
                time.sleep(0.5)  # of a 1 s lease: 0.24 s of the ACQUIRE's validity left
            elif line.startswith("EXTEND"):
                tok = line.split(" ")[2]
                return [f"! LOST {tok} expired k"]
            return []

        self.fake.before_reply = before
        self.fake.replies["EXTEND"] = "INDETERMINATE"
        with ticketing.Client(self.fake.path) as c:
            lock = c.lock("k", lease=1, wait=300)
            lock.acquire()
            self.assertTrue(lock.lost.is_set())
            self.assertEqual(lock.lost_reason, "expired")
            self.assertEqual(lock.remaining(), 0.0)

        async def main() -> None:
            async with ticketing.AsyncClient(self.fake.path) as c:
                lock = c.lock("k", lease=1, wait=300)
                await lock.acquire()
                await asyncio.sleep(0)
                self.assertTrue(lock.lost.is_set())
                self.assertEqual(lock.lost_reason, "expired")
                self.assertEqual(lock.remaining(), 0.0)

        asyncio.run(main())


if __name__ == "__main__":
    unittest.main()
