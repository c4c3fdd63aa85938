"""The ``on_position`` hook of both clients against a scripted fake sidecar
(no cluster; the real sidecar's side of version 7 is built apart):
``! POSITION <n> <position> <estimate|-> <key>`` reaches the acquire
written as line *n* of the connection, each line in the order sent, only
before that acquire returns; malformed lines are ignored like every bad
event line; a version-6 sidecar's answer works as before."""

from __future__ import annotations

import asyncio
import threading
import unittest
from typing import Callable, List

import ticketing
from ticketing import Position
from ticketing import _protocol as p

from .test_lost import WAIT, ScriptedSidecar, wait_until

# Well-formed-looking lines that are not a position this client may take:
# ignored, and never counted as a reply.
MALFORMED_POSITIONS = [
    "! POSITION {n} 0 5 k", "! POSITION 0 1 5 k", "! POSITION {n} 1 5", "! POSITION {n} 1 5 k extra",
    "! POSITION {n} x 5 k", "! POSITION {n} 1 -5 k", "! POSITION {n} +1 5 k", "! POSITION {n} 1 5.5 k",
    "! POSITION {n} 1  k", "!  POSITION {n} 1 5 k", "! position {n} 1 5 k", "! POSITION {n} 1 5 k ",
    "! POSITION {n} 1 5 k\tk", "! POSITION {n} \u0661 5 k", "! POSITION",
]


class PositionSidecar(ScriptedSidecar):
    """Answers HELLO with *version* and writes, before each ACQUIRE's reply
    (wait > 0), the lines ``script(n, keys)`` returns ({n} already filled
    in), *n* being the line's position on the connection; *after* lines
    follow the reply."""

    def __init__(self, version: int = 7) -> None:
        super().__init__(seed=41)
        self.version = version
        self.script: Callable[[int, List[str]], List[str]] = lambda n, keys: []
        self.after: Callable[[int, List[str]], List[str]] = lambda n, keys: []
        self.before_reply = self._before
        self._per_conn = threading.local()

    def answer(self, line: str) -> str:
        if line == p.HELLO_EVENTS_LINE:
            return f"HELLO {self.version} events"
        reply = super().answer(line)
        words = line.split(" ")
        if words[0] == "ACQUIRE" and words[-1] != "0":
            reply = "\n".join([reply] + self.after(self._per_conn.n, words[1:-2]))
        return reply

    def _before(self, line: str) -> List[str]:
        n = self._per_conn.n = getattr(self._per_conn, "n", 0) + 1  # every line counts
        words = line.split(" ")
        if words[0] != "ACQUIRE" or words[-1] == "0":
            return []
        return self.script(n, words[1:-2])


class Recorder:
    def __init__(self) -> None:
        self.got: List[object] = []
        self.threads: List[str] = []

    def __call__(self, pos: Position) -> None:
        self.got.append(pos)
        self.threads.append(threading.current_thread().name.split(" ")[0])


class ParsePosition(unittest.TestCase):
    def test_lines(self) -> None:
        ev = p.parse_event("! POSITION 3 12 34 seats/42")
        self.assertEqual(ev, p.PositionEvent(3, Position("seats/42", 12, 34)))
        self.assertEqual(p.parse_event("! POSITION 3 1 - a:b").report, Position("a:b", 1, None))  # type: ignore[union-attr]
        self.assertEqual(p.parse_event("! POSITION 3 1 0 k").report.estimate, 0)  # type: ignore[union-attr]
        for line in MALFORMED_POSITIONS:
            with self.subTest(line=line):
                self.assertIsNone(p.parse_event(line.format(n=3)))


class SyncOnPosition(unittest.TestCase):
    def setUp(self) -> None:
        self.fake = PositionSidecar()
        self.client = ticketing.Client(self.fake.path)

    def tearDown(self) -> None:
        self.client.close()
        self.fake.close()

    def test_every_report_in_order_before_the_reply_and_none_after(self) -> None:
        self.fake.script = lambda n, keys: (
            [f"! QUEUED {n} k", f"! POSITION {n} 12 34 k"]
            + [m.format(n=n) for m in MALFORMED_POSITIONS]
            + [f"! POSITION {n + 1} 2 2 k", f"! POSITION {n} 2 2 other", f"! POSITION {n} 3 - k", f"! POSITION {n} 1 0 k"]
        )
        self.fake.after = lambda n, keys: [f"! POSITION {n} 1 0 k"]
        rec = Recorder()
        self.client.ping()  # line 2; the ACQUIRE is line 3
        token = self.client.acquire("k", 10, 5, on_position=rec)
        returned = list(rec.got)
        self.assertGreater(token, 0)
        self.assertEqual(self.fake.lines[:3], ["HELLO 9 events", "PING", "ACQUIRE k 10 5"])
        want = [Position("k", 12, 34), Position("k", 3, None), Position("k", 1, 0)]
        self.assertEqual(returned, want)
        self.assertEqual(set(rec.threads), {"ticketing-reader"})
        self.client.ping()  # the reader has read the POSITION after the reply
        self.assertEqual(rec.got, want)

    def test_block_per_key_and_lock_objects(self) -> None:
        self.fake.script = lambda n, keys: [f"! POSITION {n} {i + 2} - {k}" for i, k in enumerate(keys)] + [
            f"! POSITION {n} 1 7 {keys[-1]}", f"! POSITION {n} 1 7 z"
        ]
        block, lk, lkb, obj = Recorder(), Recorder(), Recorder(), Recorder()
        self.client.acquire_block(["b", "a"], 10, 5, on_position=block)
        with self.client.lock("k", 10, 5, on_position=lk):
            pass
        with self.client.lock_block(["c", "d"], 10, 5, on_position=lkb):
            pass
        with ticketing.Lock(self.client, "o", 10, 5, on_position=obj):
            pass
        self.client.acquire("w0", 10, 0, on_position=block)  # wait 0: no reports
        self.assertEqual(block.got, [Position("b", 2, None), Position("a", 3, None), Position("a", 1, 7)])
        self.assertEqual(lk.got, [Position("k", 2, None), Position("k", 1, 7)])
        self.assertEqual(lkb.got, [Position("c", 2, None), Position("d", 3, None), Position("d", 1, 7)])
        self.assertEqual(obj.got, [Position("o", 2, None), Position("o", 1, 7)])

    def test_a_raising_hook_is_logged_and_the_reader_goes_on(self) -> None:
        self.fake.script = lambda n, keys: [f"! POSITION {n} 2 - k", f"! POSITION {n} 1 - k"]
        calls: List[int] = []

        def boom(pos: Position) -> None:
            calls.append(pos.position)
            raise KeyError("boom")

        with self.assertLogs("ticketing", "ERROR") as logs:
            self.client.acquire("k", 10, 5, on_position=boom)
        self.assertIn("on_position", logs.output[0])
        self.assertEqual(calls, [2, 1])
        self.client.ping()

    def test_a_hook_may_not_wait_for_a_reply(self) -> None:
        self.fake.script = lambda n, keys: [f"! POSITION {n} 1 - k"]
        errors: List[BaseException] = []

        def waits(pos: Position) -> None:
            try:
                self.client.ping()
            except RuntimeError as e:
                errors.append(e)

        self.client.acquire("k", 10, 5, on_position=waits)
        self.assertEqual(len(errors), 1)
        self.assertEqual(self.fake.sent("PING"), [])  # nothing sent
        self.client.ping()

    def test_a_given_up_acquire_gets_no_more_reports(self) -> None:
        # The reply never comes in time: the caller gives up (no reply
        # within its budget); reports for its request still pending at the
        # sidecar reach nobody.
        client = ticketing.Client(self.fake.path, reply_grace=0.2)
        self.addCleanup(client.close)
        rec = Recorder()
        orig = self.fake.answer

        def slow(line: str) -> str:
            # An ACQUIRE gets a report (line 2 of the new connection), and
            # no reply yet.
            return "! POSITION 2 3 - k" if line.startswith("ACQUIRE") else orig(line)

        self.fake.before_reply = None
        self.fake.answer = slow  # type: ignore[method-assign]
        with self.assertRaises(ticketing.IndeterminateError):
            client.acquire("k", 10, 0.1, on_position=rec)
        self.assertEqual(rec.got, [Position("k", 3, None)])
        self.fake.push("! POSITION 2 1 - k")
        self.fake.push("OK 555")  # the late grant: released by the client
        self.assertTrue(wait_until(lambda: "RELEASE k 555" in self.fake.lines))
        self.assertEqual(rec.got, [Position("k", 3, None)])

    def test_version6_sidecar(self) -> None:
        self.fake.version = 6
        rec = Recorder()
        queued: List[int] = []
        self.fake.script = lambda n, keys: [f"! QUEUED {n} k"]
        self.assertEqual(self.client.hello(), 6)
        self.client.acquire("k", 10, 5, on_position=rec, on_queued=lambda: queued.append(1))
        self.assertEqual(self.fake.lines[0], "HELLO 9 events")
        self.assertEqual((rec.got, queued), ([], [1]))

    def test_bad_argument(self) -> None:
        with self.assertRaises(TypeError):
            self.client.acquire("k", 10, 5, on_position=3)  # type: ignore[arg-type]
        with self.assertRaises(TypeError):
            self.client.lock("k", 10, 5, on_position="x")  # type: ignore[arg-type]
        self.assertEqual(self.fake.sent("ACQUIRE"), [])


class AsyncOnPosition(unittest.TestCase):
    def setUp(self) -> None:
        self.fake = PositionSidecar()

    def tearDown(self) -> None:
        self.fake.close()

    def test_in_the_loop_in_order_and_none_after(self) -> None:
        self.fake.script = lambda n, keys: (
            [f"! POSITION {n} {i + 4} {i} {k}" for i, k in enumerate(keys)]
            + [m.format(n=n) for m in MALFORMED_POSITIONS]
            + [f"! POSITION {n} 1 - {keys[0]}"]
        )
        self.fake.after = lambda n, keys: [f"! POSITION {n} 1 0 {keys[0]}"]
        got: List[object] = []

        async def body() -> None:
            loop = asyncio.get_running_loop()
            loop_thread = threading.current_thread()

            def hook(name: str):  # noqa: ANN202
                def on_position(pos: Position) -> None:
                    self.assertIs(threading.current_thread(), loop_thread)
                    asyncio.get_running_loop()  # raises outside the loop
                    got.append((name, pos))

                return on_position

            async with ticketing.AsyncClient(self.fake.path) as c:
                await c.acquire("k", 10, 5, on_position=hook("acquire"))
                got.append("returned")
                await c.acquire_block(["a", "b"], 10, 5, on_position=hook("block"))
                async with c.lock("l", 10, 5, on_position=hook("lock")):
                    pass
                async with c.lock_block(["x", "y"], 10, 5, on_position=hook("lock_block")):
                    pass
                await c.acquire("w0", 10, 0, on_position=hook("wait0"))
                await c.ping()
                self.assertEqual(self.fake.lines[0], "HELLO 9 events")

                errors: List[dict] = []
                loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))

                def boom(pos: Position) -> None:
                    raise KeyError("boom")

                await c.acquire("z", 10, 5, on_position=boom)
                self.assertEqual(len(errors), 2)  # both reports, each its own error
                self.assertIsInstance(errors[0]["exception"], KeyError)
                await c.ping()

        asyncio.run(asyncio.wait_for(body(), WAIT * 4))
        self.assertEqual(got, [
            ("acquire", Position("k", 4, 0)), ("acquire", Position("k", 1, None)), "returned",
            ("block", Position("a", 4, 0)), ("block", Position("b", 5, 1)), ("block", Position("a", 1, None)),
            ("lock", Position("l", 4, 0)), ("lock", Position("l", 1, None)),
            ("lock_block", Position("x", 4, 0)), ("lock_block", Position("y", 5, 1)), ("lock_block", Position("x", 1, None)),
        ])

    def test_cancelled_acquire_gets_no_more_reports(self) -> None:
        got: List[Position] = []

        async def body() -> None:
            async with ticketing.AsyncClient(self.fake.path) as c:
                await c.ping()  # line 2; the ACQUIRE is line 3
                orig = self.fake.answer
                self.fake.before_reply = None
                self.fake.answer = lambda line: (  # type: ignore[method-assign]
                    "! POSITION 3 2 - k" if line.startswith("ACQUIRE") else orig(line)
                )
                task = asyncio.ensure_future(c.acquire("k", 10, 5, on_position=got.append))
                for _ in range(500):
                    if got:
                        break
                    await asyncio.sleep(0.01)
                task.cancel()
                with self.assertRaises(asyncio.CancelledError):
                    await task
                self.fake.push("! POSITION 3 1 - k")
                self.fake.push("TIMEOUT")
                self.fake.answer = orig  # type: ignore[method-assign]
                await c.ping()

        asyncio.run(asyncio.wait_for(body(), WAIT * 4))
        self.assertEqual(got, [Position("k", 2, None)])


if __name__ == "__main__":
    unittest.main()
