"""ATTACK (attack branch): interleavings of the lock objects' local
deadline and lost signal found by adversarial testing; each test names the
scenario. Scripted sidecar on a real unix socket (test_lost.ScriptedSidecar).
"""

from __future__ import annotations

import threading
import time
import unittest
from typing import List

import ticketing
from ticketing import _protocol as p

from .test_lost import WAIT, ScriptedSidecar


class ConnectionLossMidExtend(unittest.TestCase):
    def setUp(self) -> None:
        self.fake = ScriptedSidecar()
        self.client = ticketing.Client(self.fake.path)

    def tearDown(self) -> None:
        self.client.close()
        self.fake.close()

    def test_extend_failing_with_the_connection_finds_the_lock_lost(self) -> None:
        """The sidecar closes the connection while an EXTEND is in flight
        (it shut down: it releases the session's locks and may hand the key
        on). The reader fails the pending requests first and loses the lock
        objects after (sync _Connection._carry_out, Teardown); the extend's
        caller, woken by its request's failure, runs before that and sees
        its lock held (lost unset, remaining() > 0) although the session is
        gone. The asyncio shell and Go/Node tell the locks first. The pause
        of the reader between the two steps is made deterministic here (it
        is a thread switch in the wild): the lock's on-answer callback,
        which runs on the reader between them, is held for a moment."""
        lock = self.client.lock("k", lease=60, wait=0)
        lock.acquire()
        orig_answer = self.fake.answer

        def answer(line: str) -> str:
            if line.startswith("EXTEND"):
                self.fake.drop()  # no reply: the connection ends
            return orig_answer(line)

        self.fake.answer = answer  # type: ignore[method-assign]
        orig_answered = lock._extend_answered
        reader_paused: List[bool] = []

        def answered(ext: object) -> None:
            reader_paused.append(True)
            time.sleep(0.3)  # the reader thread preempted
            orig_answered(ext)  # type: ignore[arg-type]

        lock._extend_answered = answered  # type: ignore[method-assign]
        with self.assertRaises(ticketing.SidecarConnectionError):
            lock.extend(30)
        seen_lost, seen_remaining = lock.lost.is_set(), lock.remaining()
        self.assertTrue(lock.lost.wait(WAIT))
        self.assertEqual(reader_paused, [True])
        self.assertTrue(seen_lost and seen_remaining == 0,
                        f"extend raised SidecarConnectionError with the lock not lost "
                        f"(lost={seen_lost}, remaining={seen_remaining:.1f} s): the session is gone")


if __name__ == "__main__":
    unittest.main()


class ExtendAsTheConnectionEnds(unittest.TestCase):
    def setUp(self) -> None:
        self.fake = ScriptedSidecar()
        self.client = ticketing.Client(self.fake.path)

    def tearDown(self) -> None:
        self.client.close()
        self.fake.close()

    def test_extend_as_the_connection_ends_finds_the_lock_lost(self) -> None:
        """The sidecar closes the connection; an extend starts right then.
        The reader records the end in the session (under the connection's
        lock), then loses the lock objects outside it (_carry_out); an
        extend in between fails at once with SidecarConnectionError (the
        session refuses to send) while its lock is not lost, remaining() >
        0, although the session is gone. The reader's pause between the
        two steps (a thread switch in the wild) is made deterministic by
        holding its _carry_out of the teardown for a moment."""
        lock = self.client.lock("k", lease=60, wait=0)
        lock.acquire()
        conn = lock._conn
        assert conn is not None
        orig_carry_out = conn._carry_out
        paused = threading.Event()

        def carry_out(decisions: object) -> None:
            decisions = list(decisions)  # type: ignore[call-overload]
            if conn.on_reader_thread() and any(isinstance(d, p.Teardown) for d in decisions):
                paused.set()
                time.sleep(0.3)  # the reader thread preempted
            orig_carry_out(decisions)

        conn._carry_out = carry_out  # type: ignore[method-assign]
        self.fake.drop()
        self.assertTrue(paused.wait(WAIT))
        # Refused as lost (nothing sent) or by the ended connection.
        with self.assertRaises((ticketing.SidecarConnectionError, ticketing.LockLostError)):
            lock.extend(30)
        seen_lost, seen_remaining = lock.lost.is_set(), lock.remaining()
        self.assertTrue(lock.lost.wait(WAIT))
        self.assertTrue(seen_lost and seen_remaining == 0,
                        f"extend raised SidecarConnectionError with the lock not lost "
                        f"(lost={seen_lost}, remaining={seen_remaining:.1f} s): the session is gone")
