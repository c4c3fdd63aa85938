"""Lock objects and the lost signal against a scripted fake sidecar: event
lines interleaved with replies (seeded fuzz), the rules of ``lost``,
``remaining()``, ``extend()`` and ``LockLostError``. No cluster needed."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import sys
import tempfile
import threading
import time
import unittest
from typing import Callable, Dict, List, Optional

import ticketing
from ticketing import _protocol as p

WAIT = 5.0  # seconds; generous bound for anything awaited here


class ScriptedSidecar:
    """A unix socket speaking enough of the protocol for lock objects.

    ``answer(line)`` returns the lines to write for a request (events and
    the reply); the default answers HELLO, ACQUIRE (increasing tokens),
    RELEASE, EXTEND, PING and ``ECHO <n>`` (→ ``R <n>``). Writes are split
    into random chunks so that lines straddle reads. :meth:`push` writes an
    event line to the newest connection.
    """

    def __init__(self, seed: int = 1) -> None:
        self.dir = tempfile.mkdtemp(prefix="tk-lost-")
        self.path = os.path.join(self.dir, "s.sock")
        self.lines: List[str] = []
        self.rng = random.Random(seed)
        self.next_token = 100
        self.replies: Dict[str, str] = {}  # verb -> reply override
        self.before_reply: Optional[Callable[[str], List[str]]] = None
        #: Called when a connection's client side closed (the sidecar would
        #: release that session's locks now).
        self.on_eof: Optional[Callable[[], None]] = None
        self.conns: List[socket.socket] = []
        self._wlock = threading.Lock()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._conn, args=(conn,), daemon=True).start()

    def answer(self, line: str) -> str:
        verb = line.split(" ", 1)[0]
        if verb in self.replies:
            return self.replies[verb]
        if line == p.HELLO_EVENTS_LINE:
            return "HELLO 4 events"  # a version-4 sidecar: LOST lines without labels
        if verb == "ACQUIRE":
            self.next_token += 1
            return f"OK {self.next_token}"
        if verb in ("RELEASE", "EXTEND"):
            return "OK"
        if verb == "PING":
            return "PONG"
        if verb == "ECHO":
            return "R " + line.split(" ", 1)[1]
        return "ERR unknown_verb"

    def _conn(self, conn: socket.socket) -> None:
        try:
            with conn.makefile("rb") as f:
                for raw in f:
                    line = raw.decode().rstrip("\n")
                    self.lines.append(line)
                    out = list(self.before_reply(line)) if self.before_reply else []
                    out.append(self.answer(line))
                    self._write(conn, "".join(x + "\n" for x in out))
        except OSError:
            pass
        if self.on_eof is not None:
            self.on_eof()

    def _write(self, conn: socket.socket, data: str) -> None:
        b = data.encode()
        with self._wlock:
            while b:
                n = self.rng.randint(1, max(1, len(b)))
                conn.sendall(b[:n])
                b = b[n:]

    def push(self, line: str) -> None:
        self._write(self.conns[-1], line + "\n")

    def drop(self) -> None:
        """Close every connection (the sidecar going away)."""
        for c in self.conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def sent(self, verb: str) -> List[str]:
        return [x for x in self.lines if x.split(" ", 1)[0] == verb]

    def close(self) -> None:
        self.drop()
        self.sock.close()
        os.unlink(self.path)
        os.rmdir(self.dir)


def wait_until(cond: Callable[[], bool], timeout: float = WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


MALFORMED_EVENTS = [
    "!",
    "! ",
    "! LOST",
    "! LOST 5",
    "! LOST 5 expired",
    "! LOST abc expired k",
    "! LOST -5 expired k",
    "! LOST 0 expired k",
    f"! LOST {2**64} expired k",
    "! LOST 5  expired k",
    "! LOST 5 expired k ",
    "!LOST 5 expired k",
    "! lost 5 expired k",
    "!! LOST 5 expired k",
]
UNKNOWN_EVENTS = ["! FOO", "! FOO 1 2 3", "! GAINED 5 expired k", "! NOTICE the sky is falling"]


class EventParsing(unittest.TestCase):
    def test_lost_event(self) -> None:
        self.assertEqual(p.parse_event("! LOST 7 expired a"), p.LostEvent(7, "expired", ("a",)))
        self.assertEqual(p.parse_event("! LOST 7 moved a b c"), p.LostEvent(7, "moved", ("a", "b", "c")))
        # An unknown reason is a loss all the same.
        self.assertEqual(p.parse_event("! LOST 9 vanished k").reason, "vanished")  # type: ignore[union-attr]

    def test_malformed_and_unknown_ignored(self) -> None:
        for line in MALFORMED_EVENTS + UNKNOWN_EVENTS:
            with self.subTest(line=line):
                self.assertTrue(p.is_event(line))
                self.assertIsNone(p.parse_event(line))

    def test_random_bang_lines_never_raise(self) -> None:
        rng = random.Random(19)
        alphabet = "! LOST0123456789expiredk\t:x"
        for _ in range(5000):
            line = "!" + "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
            ev = p.parse_event(line)
            if ev is not None:
                self.assertTrue(line.startswith("! LOST "))
                self.assertTrue(1 <= ev.token <= p.MAX_TOKEN and ev.keys and ev.reason)

    def test_no_reply_is_an_event(self) -> None:
        for reply in ("OK", "OK 5", "PONG", "BUSY", "TIMEOUT", "INDETERMINATE", "ERR not_held x", "HELD 0",
                      "INFO cluster=dev", "HELLO 3 events", "HELLO 4 events"):
            self.assertFalse(p.is_event(reply))

    def test_margin(self) -> None:
        self.assertAlmostEqual(p.lease_margin(1), 0.26)
        self.assertAlmostEqual(p.lease_margin(250), 2.75)
        self.assertAlmostEqual(p.validity(30), 29.45)


def _interleaving(rng: random.Random, tokens: List[int], lost: Dict[int, str]) -> Callable[[str], List[str]]:
    """Events to write before each ECHO reply: LOSTs of the locks (each
    token's first one is what counts), of unknown tokens, unknown and
    malformed events."""

    def before(line: str) -> List[str]:
        if not line.startswith("ECHO "):
            return []
        out = []
        for _ in range(rng.choice((0, 0, 1, 1, 2, 4))):
            kind = rng.random()
            if kind < 0.35 and tokens:
                tok = rng.choice(tokens)
                reason = rng.choice(("expired", "moved", "compensated", "novel_reason"))
                lost.setdefault(tok, reason)
                out.append(f"! LOST {tok} {reason} " + " ".join(f"k{tok}/{i}" for i in range(rng.randint(1, 3))))
            elif kind < 0.5:
                out.append(f"! LOST {rng.randint(1, 99)} expired other")  # a token no lock has
            elif kind < 0.7:
                out.append(rng.choice(UNKNOWN_EVENTS))
            else:
                out.append(rng.choice(MALFORMED_EVENTS))
        return out

    return before


class InterleavedEventsFuzz(unittest.TestCase):
    """Random interleavings of replies and event lines: replies are matched
    by position, LOST events reach their locks, the rest is ignored."""

    ITERATIONS = 150
    LOCKS = 3
    REQUESTS = 12

    def setUp(self) -> None:
        self.fake = ScriptedSidecar(seed=1919)

    def tearDown(self) -> None:
        self.fake.close()

    def test_sync(self) -> None:
        rng = random.Random(42)
        with ticketing.Client(self.fake.path) as client:
            for it in range(self.ITERATIONS):
                self.fake.before_reply = None
                locks = [client.lock(f"it{it}/k{j}", lease=250, wait=0) for j in range(self.LOCKS)]
                for lk in locks:
                    lk.acquire()
                lost: Dict[int, str] = {}
                self.fake.before_reply = _interleaving(rng, [lk.held_token for lk in locks], lost)  # type: ignore[misc]
                conn = client._connection()
                n = rng.randint(1, self.REQUESTS)
                futs = [conn.submit(f"ECHO {it}.{i}", None)[0] for i in range(n)]
                self.assertEqual([f.result(WAIT) for f in futs], [f"R {it}.{i}" for i in range(n)])
                client.ping()  # every event written before its reply has been read
                for lk in locks:
                    want = lost.get(lk.held_token)  # type: ignore[arg-type]
                    self.assertEqual(lk.lost.is_set(), want is not None, f"iteration {it}")
                    self.assertEqual(lk.lost_reason, want, f"iteration {it}")
                for lk in locks:
                    lk.release()

    def test_async(self) -> None:
        rng = random.Random(43)

        async def body() -> None:
            async with ticketing.AsyncClient(self.fake.path) as client:
                for it in range(self.ITERATIONS):
                    self.fake.before_reply = None
                    locks = [client.lock(f"it{it}/k{j}", lease=250, wait=0) for j in range(self.LOCKS)]
                    for lk in locks:
                        await lk.acquire()
                    lost: Dict[int, str] = {}
                    self.fake.before_reply = _interleaving(rng, [lk.held_token for lk in locks], lost)  # type: ignore[misc]
                    conn = await client._connection()
                    n = rng.randint(1, self.REQUESTS)
                    futs = [conn.submit(f"ECHO {it}.{i}", None)[0] for i in range(n)]
                    await conn.drain()
                    got = await asyncio.wait_for(asyncio.gather(*futs), WAIT)
                    self.assertEqual(got, [f"R {it}.{i}" for i in range(n)])
                    await client.ping()
                    for lk in locks:
                        want = lost.get(lk.held_token)  # type: ignore[arg-type]
                        self.assertEqual(lk.lost.is_set(), want is not None, f"iteration {it}")
                        self.assertEqual(lk.lost_reason, want, f"iteration {it}")
                    for lk in locks:
                        await lk.release()

        asyncio.run(body())


class SyncFakeCase(unittest.TestCase):
    """A sync Client of a fresh ScriptedSidecar, both closed after the test."""

    def setUp(self) -> None:
        self.fake = ScriptedSidecar()
        self.client = ticketing.Client(self.fake.path)

    def tearDown(self) -> None:
        self.client.close()
        self.fake.close()


class SyncLockLost(SyncFakeCase):

    def test_hello_first_and_events_on(self) -> None:
        self.client.ping()
        self.assertEqual(self.fake.lines[0], "HELLO 9 events")
        self.assertEqual(self.client.hello(), 4)
        self.assertTrue(self.client._conn.events)  # type: ignore[union-attr]
        self.assertEqual(self.client.requests_sent, 1)  # the HELLO is not counted

    def test_exit_raises_when_lost(self) -> None:
        self.fake.replies["RELEASE"] = "ERR not_held gone"
        lock = self.client.lock_block(["a", "b"], lease=30, wait=0)
        with self.assertRaises(ticketing.LockLostError) as cm:
            with lock as token:
                self.fake.push(f"! LOST {token} expired a b")
                self.assertTrue(lock.lost.wait(WAIT))
                self.assertEqual(lock.remaining(), 0.0)
        e = cm.exception
        self.assertEqual((e.reason, e.token, e.keys, e.code), ("expired", token, ("a", "b"), "lost"))
        self.assertIsInstance(e, ticketing.TicketingError)
        self.assertIsInstance(e.__cause__, ticketing.ServerError)  # the release's not_held
        self.assertEqual(self.fake.sent("RELEASE"), [f"RELEASE a {token}"])  # sent even after the loss

    def test_body_exception_not_masked(self) -> None:
        lock = self.client.lock("k", lease=30, wait=0)
        with self.assertRaises(KeyError) as cm:
            with lock as token:
                self.fake.push(f"! LOST {token} moved k")
                self.assertTrue(lock.lost.wait(WAIT))
                raise KeyError("boom")
        self.assertEqual(lock.lost_reason, "moved")
        if sys.version_info >= (3, 11):
            self.assertIn("was lost: moved", " ".join(cm.exception.__notes__))

    def test_clean_exit_when_not_lost(self) -> None:
        lock = self.client.lock("k", lease=30, wait=0)
        with lock:
            pass
        self.assertFalse(lock.lost.is_set())
        self.assertIsNone(lock.lost_reason)

    def test_remaining_decreases(self) -> None:
        lock = self.client.lock("k", lease=30, wait=0)
        self.assertEqual(lock.remaining(), 0.0)  # not acquired yet
        with lock:
            r1 = lock.remaining()
            self.assertLessEqual(r1, p.validity(30))
            self.assertGreater(r1, 0)
            time.sleep(0.02)
            r2 = lock.remaining()
            self.assertLess(r2, r1)
        self.assertEqual(lock.remaining(), 0.0)  # released

    def test_extend_after_loss_sends_nothing(self) -> None:
        lock = self.client.lock("k", lease=30, wait=0)
        token = lock.acquire()
        self.fake.push(f"! LOST {token} expired k")
        self.assertTrue(lock.lost.wait(WAIT))
        n = len(self.fake.lines)
        with self.assertRaises(ticketing.LockLostError) as cm:
            lock.extend(30)
        self.assertEqual(cm.exception.reason, "expired")
        self.client.ping()
        self.assertEqual(self.fake.lines[n:], ["PING"])
        self.assertEqual(self.fake.sent("EXTEND"), [])

    def test_extend_arguments_checked_first(self) -> None:
        lock = self.client.lock("k", lease=30, wait=0)
        lock.acquire()
        for bad, exc in ((0, ValueError), (251, ValueError), (True, TypeError), (1.5, TypeError), ("3", TypeError)):
            with self.subTest(lease=bad), self.assertRaises(exc):
                lock.extend(bad)  # type: ignore[arg-type]
        self.assertEqual(self.fake.sent("EXTEND"), [])

    def test_extend_rearms_the_deadline(self) -> None:
        lock = self.client.lock("k", lease=2, wait=0)
        token = lock.acquire()
        self.assertLessEqual(lock.remaining(), p.validity(2))
        lock.extend(100)
        self.assertEqual(self.fake.sent("EXTEND"), [f"EXTEND k {token} 100"])
        self.assertGreater(lock.remaining(), p.validity(2))
        self.assertLessEqual(lock.remaining(), p.validity(100))
        self.assertEqual(lock.lease, 100)

    def test_extend_refused_as_not_held_is_a_loss(self) -> None:
        self.fake.replies["EXTEND"] = "ERR not_held gone"
        lock = self.client.lock("k", lease=30, wait=0)
        lock.acquire()
        with self.assertRaises(ticketing.ServerError) as cm:
            lock.extend(30)
        self.assertEqual(cm.exception.code, "not_held")
        self.assertEqual(lock.lost_reason, "moved")

    def test_extend_indeterminate_keeps_the_deadline(self) -> None:
        self.fake.replies["EXTEND"] = "INDETERMINATE"
        lock = self.client.lock("k", lease=30, wait=0)
        lock.acquire()
        before = lock.remaining()
        with self.assertRaises(ticketing.IndeterminateError):
            lock.extend(200)
        self.assertLessEqual(lock.remaining(), before)
        self.assertFalse(lock.lost.is_set())

    def test_extend_indeterminate_shorter_counts_on_the_earlier_end(self) -> None:
        # Issue 39: a shorter EXTEND may have applied: from its send on,
        # and after INDETERMINATE, the deadline is at most send + validity.
        self.fake.replies["EXTEND"] = "INDETERMINATE"
        in_flight: List[float] = []
        lock = self.client.lock("k", lease=60, wait=0)
        lock.acquire()
        self.fake.before_reply = lambda line: (in_flight.append(lock.remaining()) or []) if line.startswith("EXTEND") else []
        with self.assertRaises(ticketing.IndeterminateError):
            lock.extend(5)
        self.assertEqual(len(in_flight), 1)
        self.assertLessEqual(in_flight[0], p.validity(5))
        self.assertGreater(in_flight[0], 0)
        self.assertLessEqual(lock.remaining(), p.validity(5))
        self.assertGreater(lock.remaining(), 0)
        self.assertFalse(lock.lost.is_set())
        # A longer one leaves that deadline; OK then moves it.
        with self.assertRaises(ticketing.IndeterminateError):
            lock.extend(100)
        self.assertLessEqual(lock.remaining(), p.validity(5))
        del self.fake.replies["EXTEND"]
        lock.extend(100)
        self.assertGreater(lock.remaining(), p.validity(60))

    def test_close_fires_lost_before_the_sidecar_sees_the_close(self) -> None:
        # Issue 39: the sidecar releases a closed session's locks and hands
        # their keys on; the holder must be told before that.
        lock = self.client.lock("k", lease=30, wait=0)
        lock.acquire()
        at_eof: List[bool] = []
        seen = threading.Event()

        def eof() -> None:
            at_eof.append(lock.lost.is_set())
            seen.set()

        self.fake.on_eof = eof
        self.client.close()
        self.assertTrue(seen.wait(WAIT))
        self.assertEqual(at_eof, [True])
        self.assertEqual(lock.lost_reason, "disconnected")

    def test_extend_shorter_indeterminate_fires_at_the_earlier_end(self) -> None:
        self.fake.replies["EXTEND"] = "INDETERMINATE"
        lock = self.client.lock("k", lease=60, wait=0)
        lock.acquire()
        with self.assertRaises(ticketing.IndeterminateError):
            lock.extend(1)  # validity(1) = 0.74 s
        self.assertTrue(lock.lost.wait(WAIT))
        self.assertEqual(lock.lost_reason, "deadline")

    def test_deadline_then_event_replaces_reason(self) -> None:
        lock = self.client.lock("k", lease=1, wait=0)
        token = lock.acquire()
        self.assertTrue(lock.lost.wait(WAIT))
        self.assertEqual(lock.lost_reason, "deadline")
        self.fake.push(f"! LOST {token} expired k")
        self.assertTrue(wait_until(lambda: lock.lost_reason == "expired"))

    def test_event_replaces_nothing_after_an_event(self) -> None:
        lock = self.client.lock("k", lease=30, wait=0)
        token = lock.acquire()
        self.fake.push(f"! LOST {token} compensated k")
        self.assertTrue(lock.lost.wait(WAIT))
        self.fake.push(f"! LOST {token} expired k")
        self.client.ping()
        self.assertEqual(lock.lost_reason, "compensated")

    def test_event_with_the_grant(self) -> None:
        # The event comes right behind the grant, possibly before the lock
        # object registered: it is kept for it.
        self.fake.before_reply = None
        orig = self.fake.answer

        def answer(line: str) -> str:
            r = orig(line)
            if line.startswith("ACQUIRE"):
                return f"{r}\n! LOST {r.split()[1]} expired k"
            return r

        self.fake.answer = answer  # type: ignore[method-assign]
        lock = self.client.lock("k", lease=30, wait=0)
        lock.acquire()
        self.assertTrue(lock.lost.wait(WAIT))
        self.assertEqual(lock.lost_reason, "expired")

    def test_disconnected(self) -> None:
        lock = self.client.lock("k", lease=30, wait=0)
        lock.acquire()
        self.fake.drop()
        self.assertTrue(lock.lost.wait(WAIT))
        self.assertEqual(lock.lost_reason, "disconnected")
        with self.assertRaises(ticketing.LockLostError):
            lock.extend(10)

    def test_released_lock_never_fires(self) -> None:
        lock = self.client.lock("k", lease=1, wait=0)
        token = lock.acquire()
        lock.release()
        self.fake.push(f"! LOST {token} expired k")
        time.sleep(p.validity(1) + 0.1)
        self.client.ping()
        self.assertFalse(lock.lost.is_set())
        self.assertIsNone(lock.lost_reason)

    def test_one_timer_thread_per_connection(self) -> None:
        before = {t.name for t in threading.enumerate()}
        locks = [self.client.lock(f"k{i}", lease=30, wait=0) for i in range(20)]
        for lk in locks:
            lk.acquire()
        timers = [t for t in threading.enumerate() if t.name.startswith("ticketing-timers") and t.name not in before]
        self.assertEqual(len(timers), 1)
        for lk in locks:
            lk.release()


class AsyncLockLost(unittest.TestCase):
    def setUp(self) -> None:
        self.fake = ScriptedSidecar()

    def tearDown(self) -> None:
        self.fake.close()

    def run_async(self, body: Callable[[ticketing.AsyncClient], "asyncio.Future[None]"]) -> None:
        async def main() -> None:
            async with ticketing.AsyncClient(self.fake.path) as client:
                await body(client)

        asyncio.run(main())

    def test_exit_raises_when_lost(self) -> None:
        async def body(client: ticketing.AsyncClient) -> None:
            lock = client.lock("k", lease=30, wait=0)
            self.assertIsInstance(lock.lost, asyncio.Event)
            with self.assertRaises(ticketing.LockLostError) as cm:
                async with lock as token:
                    self.fake.push(f"! LOST {token} expired k")
                    await asyncio.wait_for(lock.lost.wait(), WAIT)
            self.assertEqual((cm.exception.reason, cm.exception.token, cm.exception.keys), ("expired", token, ("k",)))
            self.assertEqual(self.fake.sent("RELEASE"), [f"RELEASE k {token}"])

        self.run_async(body)

    def test_body_exception_not_masked(self) -> None:
        async def body(client: ticketing.AsyncClient) -> None:
            lock = client.lock("k", lease=30, wait=0)
            with self.assertRaises(KeyError):
                async with lock as token:
                    self.fake.push(f"! LOST {token} expired k")
                    await asyncio.wait_for(lock.lost.wait(), WAIT)
                    raise KeyError("boom")

        self.run_async(body)

    def test_remaining_extend_and_loss(self) -> None:
        async def body(client: ticketing.AsyncClient) -> None:
            lock = client.lock("k", lease=1, wait=0)
            token = await lock.acquire()
            r1 = lock.remaining()
            self.assertLessEqual(r1, p.validity(1))
            await asyncio.sleep(0.02)
            self.assertLess(lock.remaining(), r1)
            await lock.extend(50)
            self.assertGreater(lock.remaining(), p.validity(1))
            self.assertEqual(self.fake.sent("EXTEND"), [f"EXTEND k {token} 50"])
            lock2 = client.lock("k2", lease=1, wait=0)
            t2 = await lock2.acquire()
            await asyncio.wait_for(lock2.lost.wait(), WAIT)
            self.assertEqual(lock2.lost_reason, "deadline")
            self.assertFalse(lock.lost.is_set())  # extended
            with self.assertRaises(ticketing.LockLostError):
                await lock2.extend(10)
            self.assertEqual(len(self.fake.sent("EXTEND")), 1)
            self.fake.push(f"! LOST {t2} expired k2")
            await client.ping()
            self.assertEqual(lock2.lost_reason, "expired")

        self.run_async(body)

    def test_extend_indeterminate_shorter_counts_on_the_earlier_end(self) -> None:
        async def body(client: ticketing.AsyncClient) -> None:
            self.fake.replies["EXTEND"] = "INDETERMINATE"
            lock = client.lock("k", lease=60, wait=0)
            await lock.acquire()
            task = asyncio.ensure_future(lock.extend(5))
            await asyncio.sleep(0)  # sent, not answered
            self.assertLessEqual(lock.remaining(), p.validity(5))
            with self.assertRaises(ticketing.IndeterminateError):
                await task
            self.assertLessEqual(lock.remaining(), p.validity(5))
            self.assertGreater(lock.remaining(), 0)
            self.assertFalse(lock.lost.is_set())
            del self.fake.replies["EXTEND"]
            await lock.extend(100)
            self.assertGreater(lock.remaining(), p.validity(60))

        self.run_async(body)

    def test_disconnected(self) -> None:
        async def body(client: ticketing.AsyncClient) -> None:
            lock = client.lock("k", lease=30, wait=0)
            await lock.acquire()
            self.fake.drop()
            await asyncio.wait_for(lock.lost.wait(), WAIT)
            self.assertEqual(lock.lost_reason, "disconnected")

        self.run_async(body)


if __name__ == "__main__":
    unittest.main()
