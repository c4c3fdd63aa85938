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
"""

from __future__ import annotations

import threading
import unittest
from typing import Callable

import ticketing
from ticketing import _protocol as p

from .test_lost import WAIT, ScriptedSidecar


class ConcurrentExtendCap(unittest.TestCase):
    def setUp(self) -> None:
        self.fake = ScriptedSidecar()
        self.client = ticketing.Client(self.fake.path)

    def tearDown(self) -> None:
        self.client.close()
        self.fake.close()

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


if __name__ == "__main__":
    unittest.main()
