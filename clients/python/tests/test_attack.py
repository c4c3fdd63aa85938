"""Interleavings of the lock objects' local
deadline and lost signal found by an adversarial test round; each test names the
scenario. Scripted sidecar on a real unix socket (test_lost.ScriptedSidecar).
"""

from __future__ import annotations

import threading
import time
import unittest
from typing import List, Optional

import ticketing
from ticketing import _protocol as p

from .test_lost import WAIT, ScriptedSidecar, SyncFakeCase


class ConnectionLossMidExtend(SyncFakeCase):

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



class ExtendAsTheConnectionEnds(SyncFakeCase):

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


# -- random interleavings of concurrent extends (these hold) -------------------

import asyncio  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import socket  # noqa: E402
import tempfile  # noqa: E402
from typing import Any, Dict  # noqa: E402


def _bound(recs: List[Dict[str, Any]]) -> float:
    """The earliest end (receive time + validity) of an EXTEND that may have
    applied last: one not followed by an OK EXTEND received after it was
    answered."""
    bound = float("inf")
    for e in recs:
        if not any(f is not e and f["outcome"] == "OK" and f["recv"] > e["answer"] for f in recs):
            bound = min(bound, e["recv"] + p.validity(e["lease"]))
    return bound


def _outcome(rng: random.Random) -> str:
    o = rng.random()
    return "OK" if o < 0.6 else "INDETERMINATE" if o < 0.8 else "ERR unavailable no leader"


class _InOrderFake:
    """A sidecar that answers HELLO and ACQUIRE at once and EXTENDs when the
    test says (reply_oldest), in order."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="tk-attack-")
        self.path = os.path.join(self.dir, "s.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen()
        self.pending: List[Dict[str, Any]] = []
        self.received = 0
        self.mu = threading.Lock()
        self.conn: Any = None
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        self.conn = conn
        token = 100
        try:
            with conn.makefile("rb") as f:
                for raw in f:
                    line = raw.decode().rstrip("\n")
                    if line.startswith("HELLO"):
                        conn.sendall(b"HELLO 4 events\n")
                    elif line.startswith("ACQUIRE"):
                        token += 1
                        conn.sendall(f"OK {token}\n".encode())
                    elif line.startswith("EXTEND"):
                        with self.mu:
                            self.pending.append({"lease": int(line.split()[3]), "recv": time.monotonic()})
                            self.received += 1
        except OSError:
            pass

    def reply_oldest(self, outcome: str) -> Optional[Dict[str, Any]]:
        with self.mu:
            if not self.pending:
                return None
            r = self.pending.pop(0)
            r["outcome"], r["answer"] = outcome, time.monotonic()
            self.conn.sendall((outcome + "\n").encode())
            return r

    def close(self) -> None:
        self.sock.close()
        if self.conn is not None:
            self.conn.close()
        os.unlink(self.path)
        os.rmdir(self.dir)


class StressConcurrentExtends(unittest.TestCase):
    ROUNDS = 40

    def test_sync_threads(self) -> None:
        for seed in range(1, self.ROUNDS + 1):
            rng = random.Random(seed)
            fake = _InOrderFake()
            client = ticketing.Client(fake.path)
            try:
                lock = client.lock("k", lease=200, wait=0)
                lock.acquire()
                base = client.requests_sent
                n = rng.randint(2, 6)
                threads: List[threading.Thread] = []
                recs: List[Dict[str, Any]] = []

                def ext(lease: int) -> None:
                    try:
                        lock.extend(lease)
                    except ticketing.TicketingError:
                        pass

                while (len(threads) < n or any(t.is_alive() for t in threads) or fake.pending
                       or fake.received < client.requests_sent - base):
                    if len(threads) < n and rng.random() < 0.5:
                        t = threading.Thread(target=ext, args=(rng.randint(1, 199),))
                        t.start()
                        threads.append(t)
                    else:
                        r = fake.reply_oldest(_outcome(rng))
                        if r is not None:
                            recs.append(r)
                    time.sleep(rng.choice([0, 0, 0.0005, 0.002]))
                now = time.monotonic()
                left, bound = lock.remaining(), _bound(recs)
                self.assertLessEqual(now + left, bound + 0.001,
                                     f"seed {seed}: remaining {left:.2f} s, want at most {bound - now:.2f} s; "
                                     f"{[(r['lease'], r['outcome']) for r in recs]}")
            finally:
                client.close()
                fake.close()

    def test_asyncio_tasks_some_cancelled(self) -> None:
        async def one(seed: int) -> None:
            rng = random.Random(seed)
            loop = asyncio.get_running_loop()
            fake = _InOrderFake()
            client = ticketing.AsyncClient(fake.path)
            try:
                lock = client.lock("k", lease=200, wait=0)
                await lock.acquire()
                base = client.requests_sent
                n = rng.randint(2, 6)
                tasks: List[asyncio.Future] = []
                recs: List[Dict[str, Any]] = []
                while (len(tasks) < n or any(not t.done() for t in tasks) or fake.pending
                       or fake.received < client.requests_sent - base):
                    if len(tasks) < n and rng.random() < 0.5:
                        t = asyncio.ensure_future(lock.extend(rng.randint(1, 199)))
                        tasks.append(t)
                        if rng.random() < 0.25:
                            loop.call_later(rng.choice([0, 0.0005, 0.002]), t.cancel)
                    else:
                        r = fake.reply_oldest(_outcome(rng))
                        if r is not None:
                            recs.append(r)
                    await asyncio.sleep(rng.choice([0, 0, 0.0005, 0.002]))
                await asyncio.gather(*tasks, return_exceptions=True)
                now = time.monotonic()
                left, bound = lock.remaining(), _bound(recs)
                self.assertLessEqual(now + left, bound + 0.001,
                                     f"seed {seed}: remaining {left:.2f} s, want at most {bound - now:.2f} s; "
                                     f"{[(r['lease'], r['outcome']) for r in recs]}")
            finally:
                await client.close()
                fake.close()

        for seed in range(1, self.ROUNDS + 1):
            asyncio.run(one(seed))


class ClientReleaseOfALocksKey(unittest.TestCase):
    """client.release(key, token) of a lock object's key and token frees
    the key (the sidecar sends no lost event for a release), but the lock
    object is not told: remaining() stays > 0 and lost is never set, so a
    part of the program holding the lock object goes on believing it holds
    the key. Node's client.release marks such a Lock released."""

    def setUp(self) -> None:
        self.fake = ScriptedSidecar()

    def tearDown(self) -> None:
        self.fake.close()

    def test_sync(self) -> None:
        with ticketing.Client(self.fake.path) as client:
            lock = client.lock("k", lease=60, wait=0)
            token = lock.acquire()
            client.release("k", token)
            self.assertEqual(lock.remaining(), 0.0, "the key is free")

    def test_asyncio(self) -> None:
        async def run() -> float:
            async with ticketing.AsyncClient(self.fake.path) as client:
                lock = client.lock("k", lease=60, wait=0)
                token = await lock.acquire()
                await client.release("k", token)
                return lock.remaining()

        self.assertEqual(asyncio.run(run()), 0.0, "the key is free")


if __name__ == "__main__":
    unittest.main()
