"""The ``on_queued`` hook of both clients against a scripted fake sidecar
(no cluster): ``! QUEUED <n> <keys>`` reaches the acquire written as line
*n* of the connection, on the reader thread (blocking client) or in the
event loop (asyncio), before the acquire returns."""

from __future__ import annotations

import asyncio
import threading
import unittest
from typing import List

import ticketing

from .test_lost import WAIT, ScriptedSidecar


class QueuingSidecar(ScriptedSidecar):
    """Writes ``! QUEUED <n> <keys>`` before the reply of every ACQUIRE with
    a wait > 0, *n* being the line's position on the connection (shift:
    a wrong position, to check that it is not matched)."""

    def __init__(self, shift: int = 0, version: int = 4) -> None:
        super().__init__(seed=30)
        self.shift = shift
        self.version = version
        self.before_reply = self._queued
        self._per_conn = threading.local()  # each connection has its thread

    def answer(self, line: str) -> str:
        if line == "HELLO 9 events":
            return f"HELLO {self.version} events"
        return super().answer(line)

    def _queued(self, line: str) -> List[str]:
        n = self._per_conn.n = getattr(self._per_conn, "n", 0) + 1  # every line counts
        words = line.split(" ")
        if self.version < 4 or words[0] != "ACQUIRE" or words[-1] == "0":
            return []
        return [f"! QUEUED {n + self.shift} {' '.join(words[1:-2])}"]


class SyncOnQueued(unittest.TestCase):
    def setUp(self) -> None:
        self.fake = QueuingSidecar()
        self.client = ticketing.Client(self.fake.path)
        self.events: List[str] = []

    def tearDown(self) -> None:
        self.client.close()
        self.fake.close()

    def hook(self, name: str):  # noqa: ANN201
        def on_queued() -> None:
            self.events.append(f"{name} on {threading.current_thread().name.split(' ')[0]}")

        return on_queued

    def test_called_before_the_reply_on_the_reader_thread(self) -> None:
        self.client.ping()  # line 2; the ACQUIRE is line 3
        token = self.client.acquire("k", 10, 5, on_queued=self.hook("acquire"))
        self.events.append("returned")
        self.assertEqual(self.fake.lines[:3], ["HELLO 9 events", "PING", "ACQUIRE k 10 5"])
        self.assertEqual(self.events, ["acquire on ticketing-reader", "returned"])
        self.assertGreater(token, 0)

    def test_block_lock_and_lock_block(self) -> None:
        self.client.acquire_block(["a", "b"], 10, 5, on_queued=self.hook("block"))
        with self.client.lock("k", 10, 5, on_queued=self.hook("lock")):
            pass
        with self.client.lock_block(["c", "d"], 10, 5, on_queued=self.hook("lock_block")):
            pass
        self.client.acquire("w0", 10, 0, on_queued=self.hook("wait0"))  # no QUEUED for wait 0
        self.assertEqual([e.split(" ")[0] for e in self.events], ["block", "lock", "lock_block"])

    def test_wrong_position_is_not_matched(self) -> None:
        self.fake.shift = 1
        self.client.acquire("k", 10, 5, on_queued=self.hook("acquire"))
        self.client.acquire("k2", 10, 5, on_queued=self.hook("acquire"))  # line 3, told 4
        self.assertEqual(self.events, [])

    def test_a_raising_hook_is_logged_and_the_reader_goes_on(self) -> None:
        def boom() -> None:
            raise KeyError("boom")

        with self.assertLogs("ticketing", "ERROR") as logs:
            self.client.acquire("k", 10, 5, on_queued=boom)
        self.assertIn("on_queued", logs.output[0])
        self.client.ping()

    def test_a_hook_may_not_wait_for_a_reply(self) -> None:
        errors: List[BaseException] = []

        def waits() -> None:
            try:
                self.client.ping()
            except RuntimeError as e:
                errors.append(e)

        self.client.acquire("k", 10, 5, on_queued=waits)
        self.assertEqual(len(errors), 1)
        self.assertEqual(self.fake.sent("PING"), [])  # nothing sent
        self.client.ping()

    def test_version3_sidecar_never_queues(self) -> None:
        self.fake.version = 3
        self.assertEqual(self.client.hello(), 3)
        self.client.acquire("k", 10, 5, on_queued=self.hook("acquire"))
        self.assertEqual(self.events, [])


class AsyncOnQueued(unittest.TestCase):
    def setUp(self) -> None:
        self.fake = QueuingSidecar()

    def tearDown(self) -> None:
        self.fake.close()

    def test_called_in_the_loop_before_the_reply(self) -> None:
        events: List[str] = []

        async def body() -> None:
            loop = asyncio.get_running_loop()
            loop_thread = threading.current_thread()

            def hook(name: str):  # noqa: ANN202
                def on_queued() -> None:
                    self.assertIs(threading.current_thread(), loop_thread)
                    asyncio.get_running_loop()  # raises outside the loop
                    events.append(name)

                return on_queued

            async with ticketing.AsyncClient(self.fake.path) as c:
                await c.ping()
                await c.acquire("k", 10, 5, on_queued=hook("acquire"))
                events.append("returned")
                await c.acquire_block(["a", "b"], 10, 5, on_queued=hook("block"))
                async with c.lock("l", 10, 5, on_queued=hook("lock")):
                    pass
                async with c.lock_block(["x", "y"], 10, 5, on_queued=hook("lock_block")):
                    pass
                await c.acquire("w0", 10, 0, on_queued=hook("wait0"))
                self.assertEqual(self.fake.lines[2], "ACQUIRE k 10 5")

                errors: List[dict] = []
                loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))

                def boom() -> None:
                    raise KeyError("boom")

                await c.acquire("z", 10, 5, on_queued=boom)
                self.assertEqual(len(errors), 1)
                self.assertIsInstance(errors[0]["exception"], KeyError)
                await c.ping()

        asyncio.run(asyncio.wait_for(body(), WAIT * 4))
        self.assertEqual(events, ["acquire", "returned", "block", "lock", "lock_block"])


class ConformanceAwaitQueued(unittest.TestCase):
    """The conformance runner's await_queued op, with both adapters: passes
    on the QUEUED event, fails when the reply came without one."""

    def setUp(self) -> None:
        self.fake = QueuingSidecar()

    def tearDown(self) -> None:
        self.fake.close()

    def scenario(self, wait: float) -> dict:
        return {"name": "await_queued", "steps": [
            {"conn": "a", "op": "acquire", "key": "k", "lease": 10, "wait": wait, "background": "w"},
            {"op": "await_queued", "id": "w"},
            {"op": "await", "id": "w", "expect": "ok"},
            {"conn": "a", "op": "acquire_block", "block": ["x", "y"], "lease": 10, "wait": wait, "background": "b"},
            {"op": "await_queued", "id": "b"},
        ]}

    def test_both_adapters(self) -> None:
        from . import conformance

        for adapter in (conformance.SyncAdapter, conformance.AsyncAdapter):
            with self.subTest(adapter=adapter.name):
                conformance.run_scenario(adapter, self.fake.path, self.scenario(5), 0)
                with self.assertRaisesRegex(conformance.ScenarioFailure, "finished without a QUEUED event"):
                    conformance.run_scenario(adapter, self.fake.path, self.scenario(0), 1)


if __name__ == "__main__":
    unittest.main()
