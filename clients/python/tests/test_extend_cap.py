"""Issue 39 (attack round 5): a concurrent EXTEND's OK must not lift the cap
of another EXTEND in flight (sync client).

Lock.extend computes the new deadline under the lock's mutex
(extended_deadline: min(send + validity, caps in flight)), releases the
mutex, then arms it with _arm(deadline), which sets that precomputed value
unconditionally. A second thread's extend that begins in between
(begin_extend + _arm_capped: the deadline lowered to its cap) is undone by
the first thread's late _arm: the deadline jumps back to the first OK's
send + validity while the second (shorter) EXTEND is in flight, and stays
there when the second ends INDETERMINATE. The sidecar takes the second
EXTEND (the first is answered there), the cluster applies its short lease
and hands the key on ~95 s before this holder's deadline.

The pause between the two steps is a GIL switch (every 5 ms by default)
or any preemption; the test makes it deterministic by holding the first
thread just before it arms its OK's deadline (_arm_with) until the second
EXTEND reached the sidecar. Fixed: the OK's deadline is computed inside
_arm_with, under the mutex, so it takes in the second EXTEND's cap.

Its first form raced: when the second EXTEND's INDETERMINATE was handled
before the first thread armed, the second's cap was already dropped (it
was no longer in flight) and the OK lifted the deadline anyway. An EXTEND
answered while another is under way now keeps bounding that one's OK
(LockState.settle_extend); the tests below pin each order, and the same
for the asyncio client when the second caller gives up (cancelled).
"""

from __future__ import annotations

import asyncio
import threading
import unittest
from typing import Callable

import ticketing
from ticketing import _protocol as p

from .test_lost import WAIT, ScriptedSidecar, SyncFakeCase


def _hold_arm(lock: ticketing.Lock, thread: Callable[[], threading.Thread], before: threading.Event,
              until: threading.Event) -> None:
    """Hold *thread*'s second _arm_with of *lock* (the first is its own cap,
    the second its OK's deadline): set *before*, then wait for *until*."""
    orig = lock._arm_with
    calls = [0]

    def held(deadline_of: Callable[[], float]) -> None:
        if threading.current_thread() is thread():
            calls[0] += 1
            if calls[0] == 2:
                before.set()
                until.wait(WAIT)
        orig(deadline_of)

    lock._arm_with = held  # type: ignore[method-assign]


class ConcurrentExtendCap(SyncFakeCase):

    def test_ok_of_one_extend_keeps_the_cap_of_another_in_flight(self) -> None:
        lock = self.client.lock("k", lease=60, wait=0)
        token = lock.acquire()
        orig_answer = self.fake.answer

        def answer(line: str) -> str:
            if line == f"EXTEND k {token} 5":
                return "INDETERMINATE"  # the reply is lost: it may have applied
            return orig_answer(line)

        self.fake.answer = answer  # type: ignore[method-assign]
        second_sent = threading.Event()
        self.fake.before_reply = lambda line: (second_sent.set() or []) if line == f"EXTEND k {token} 5" else []

        first_computed = threading.Event()
        orig_arm_with = lock._arm_with
        calls = [0]

        def slow_arm_with(deadline_of: Callable[[], float]) -> None:
            if threading.current_thread() is t1:
                calls[0] += 1
                if calls[0] == 2:  # the first OK (1: its own cap): recorded, not armed yet
                    first_computed.set()
                    second_sent.wait(WAIT)
            orig_arm_with(deadline_of)

        lock._arm_with = slow_arm_with  # type: ignore[method-assign]
        t1 = threading.Thread(target=lambda: lock.extend(100))
        t1.start()
        self.assertTrue(first_computed.wait(WAIT))
        with self.assertRaises(ticketing.IndeterminateError):
            lock.extend(5)  # may have applied: the holding ends 5 s after it did
        t1.join(WAIT)
        self.assertFalse(t1.is_alive())
        left = lock.remaining()
        self.assertLessEqual(
            left, p.validity(5),
            f"two holders: the lock counts on {left:.1f} s after an EXTEND to 5 s that may have applied "
            f"(the cluster hands the key on within 5 s); the first EXTEND's OK lifted the second's cap")

    def test_ok_handled_after_the_other_extend_was_answered(self) -> None:
        # The first thread arms its OK only after the second EXTEND's
        # INDETERMINATE was handled and its call is over: the order that
        # made the first form of this test fail in CI.
        lock = self.client.lock("k", lease=60, wait=0)
        token = lock.acquire()
        orig_answer = self.fake.answer
        self.fake.answer = lambda line: (  # type: ignore[method-assign]
            "INDETERMINATE" if line == f"EXTEND k {token} 5" else orig_answer(line))
        first_ok, second_done = threading.Event(), threading.Event()
        t1 = threading.Thread(target=lambda: lock.extend(100))
        _hold_arm(lock, lambda: t1, first_ok, second_done)
        t1.start()
        self.assertTrue(first_ok.wait(WAIT))
        with self.assertRaises(ticketing.IndeterminateError):
            lock.extend(5)
        second_done.set()
        t1.join(WAIT)
        self.assertFalse(t1.is_alive())
        self.assertLessEqual(lock.remaining(), p.validity(5),
                             "the first EXTEND's OK lifted the cap of the second, answered INDETERMINATE meanwhile")

    def test_ok_handled_after_the_other_extend_succeeded(self) -> None:
        # The two may apply in either order: after both OKs the deadline is
        # at most the shorter one's (the sidecar runs them concurrently).
        lock = self.client.lock("k", lease=60, wait=0)
        lock.acquire()
        first_ok, second_done = threading.Event(), threading.Event()
        t1 = threading.Thread(target=lambda: lock.extend(100))
        _hold_arm(lock, lambda: t1, first_ok, second_done)
        t1.start()
        self.assertTrue(first_ok.wait(WAIT))
        lock.extend(5)
        second_done.set()
        t1.join(WAIT)
        self.assertFalse(t1.is_alive())
        self.assertLessEqual(lock.remaining(), p.validity(5),
                             "the first EXTEND's late OK lifted the deadline the second one's OK set")


class AsyncConcurrentExtendCap(unittest.TestCase):
    def setUp(self) -> None:
        self.fake = ScriptedSidecar()

    def tearDown(self) -> None:
        self.fake.close()

    def test_ok_keeps_the_cap_of_a_cancelled_extend(self) -> None:
        # The second caller gives up (its task is cancelled) while its
        # EXTEND is written: it may still apply, after the first. The
        # first's OK must stay at most the second's cap.
        async def main() -> None:
            async with ticketing.AsyncClient(self.fake.path) as client:
                lock = client.lock("k", lease=60, wait=0)
                token = await lock.acquire()
                go = threading.Event()
                self.fake.before_reply = lambda line: (
                    go.wait(WAIT) and []) if line == f"EXTEND k {token} 100" else []
                first = asyncio.ensure_future(lock.extend(100))
                await asyncio.sleep(0)
                second = asyncio.ensure_future(lock.extend(5))
                await asyncio.sleep(0)
                second.cancel()
                with self.assertRaises(asyncio.CancelledError):
                    await second
                go.set()
                await asyncio.wait_for(first, WAIT)
                self.assertLessEqual(
                    lock.remaining(), p.validity(5),
                    "the first EXTEND's OK lifted the cap of the second, whose caller gave up before its answer")
                await client.ping()  # the second's OK has come: later extends are free of its cap
                await lock.extend(100)
                self.assertGreater(lock.remaining(), p.validity(60))

        asyncio.run(main())


class ExtendFromOnQueued(unittest.TestCase):
    """An extend() from an on_queued callback (the reader thread) is refused
    with RuntimeError before anything is recorded: it used to lower the
    lock's deadline to the unsent EXTEND's end first (liveness: the lock
    was lost early though nothing changed in the cluster)."""

    def test_refused_before_the_deadline_moves(self) -> None:
        from .test_queued import QueuingSidecar

        fake = QueuingSidecar()
        try:
            with ticketing.Client(fake.path) as c:
                held = c.lock("h", lease=60, wait=0)
                held.acquire()
                before = held.remaining()
                errors = []

                def on_queued() -> None:
                    try:
                        held.extend(2)
                    except RuntimeError as e:
                        errors.append(e)

                c.acquire("k", lease=30, wait=5, on_queued=on_queued)
                self.assertEqual(len(errors), 1, errors)
                self.assertGreater(held.remaining(), before - 5, "the refused extend lowered the deadline")
                self.assertEqual(fake.sent("EXTEND"), [])
        finally:
            fake.close()


if __name__ == "__main__":
    unittest.main()
