"""Issue 41: a wait may be up to an hour (3600 s) from a sidecar of
protocol version 6. Against an older sidecar a wait over 300 s is refused
with NotSupportedError before anything is sent (the sidecar would answer
invalid_wait, which reads as the caller's mistake); over an hour is a
ValueError everywhere. The real sidecar's side is the conformance
scenario long_wait_queues_and_is_granted."""

from __future__ import annotations

import asyncio
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


if __name__ == "__main__":
    unittest.main()

