"""A revoked lock (protocol version 9) against a scripted fake sidecar (no
cluster; the real sidecar's side of version 9 is built apart): the
``! REVOKED <token> <by>[ <why>]`` line before ``! LOST <token> revoked``
gives the loss its who and why (``revoked_by``, ``revoke_reason``, on the
lock and on ``LockLostError``); a ``LOST revoked`` without it (an older
sidecar) is ``revoked`` with both None; a ``REVOKED`` for a token the
connection does not hold is ignored; ``REVOKED`` is never a reply."""

from __future__ import annotations

import asyncio
import sys
import unittest
from typing import List

import ticketing
from ticketing import _protocol as p

from .test_lost import WAIT, ScriptedSidecar, wait_until
from .test_protocol import started

# Not a REVOKED this client takes: ignored, never a reply.
MALFORMED_REVOKED = [
    "! REVOKED",
    "! REVOKED ",
    "! REVOKED 5",
    "! REVOKED 5 ",
    "! REVOKED x alice",
    "! REVOKED 0 alice",
    "! REVOKED -5 alice",
    f"! REVOKED {2**64} alice",
    "! REVOKED 5  alice",  # a double space: an empty by
    "! REVOKED 5 alice ",  # a why omitted keeps no space
    "! REVOKED 5 alice  maintenance",  # a why never starts with a space
    "! REVOKED 5 alice maintenance ",  # nor ends with one
    "! REVOKED 5 " + "a" * 129,  # by: 1..128
    "! REVOKED 5 alice " + "w" * 129,  # why: 0..128
    "! REVOKED 5 al\tice",
    "! REVOKED 5 alice main\ttenance",
    "! REVOKED 5 \u00e9lise",
    "! REVOKED 5 alice d\u00e9j\u00e0",
    "! REVOKED \u0665 alice",
    "!REVOKED 5 alice",
    "! revoked 5 alice",
]


class Parsing(unittest.TestCase):
    def test_revoked_event(self) -> None:
        self.assertEqual(p.parse_event("! REVOKED 7 alice"), p.RevokedEvent(7, "alice", None))
        self.assertEqual(p.parse_event("! REVOKED 7 alice disk full, moving k"),
                         p.RevokedEvent(7, "alice", "disk full, moving k"))
        self.assertEqual(p.parse_event(f"! REVOKED {2**64 - 1} ops@host-1 x"), p.RevokedEvent(2**64 - 1, "ops@host-1", "x"))
        by, why = "b" * 128, "w " * 63 + "ww"
        self.assertEqual(p.parse_event(f"! REVOKED 3 {by} {why}"), p.RevokedEvent(3, by, why))
        self.assertEqual(p.parse_event("! REVOKED 3 a ~!"), p.RevokedEvent(3, "a", "~!"))
        # The labelled form (version 5 on) changes only LOST lines.
        self.assertEqual(p.parse_event("! REVOKED 7 alice why not", True), p.RevokedEvent(7, "alice", "why not"))
        self.assertEqual(p.parse_event("! LOST 7 revoked nightly a b", True), p.LostEvent(7, "revoked", ("a", "b")))
        self.assertEqual(p.parse_event("! LOST 7 revoked a"), p.LostEvent(7, "revoked", ("a",)))

    def test_malformed_ignored(self) -> None:
        for line in MALFORMED_REVOKED:
            with self.subTest(line=line):
                self.assertTrue(p.is_event(line))
                self.assertIsNone(p.parse_event(line, True))

    def test_lost_error_message(self) -> None:
        e = ticketing.LockLostError("revoked", 7, ("k",), revoked_by="alice", revoke_reason="maintenance")
        self.assertEqual((e.reason, e.revoked_by, e.revoke_reason), ("revoked", "alice", "maintenance"))
        self.assertEqual(str(e), "lock k (token 7) lost: revoked by alice: maintenance")
        e = ticketing.LockLostError("revoked", 7, ("a", "b"), revoked_by="alice")
        self.assertEqual(str(e), "lock a b (token 7) lost: revoked by alice")
        e = ticketing.LockLostError("revoked", 7, ("k",))
        self.assertEqual((e.revoked_by, e.revoke_reason, str(e)), (None, None, "lock k (token 7) lost: revoked"))
        self.assertEqual(str(ticketing.LockLostError("expired", 7, ("k",))), "lock k (token 7) lost: expired")


class SessionRouting(unittest.TestCase):
    """The sans-IO session: bytes in, decisions out."""

    def test_hello_sent(self) -> None:
        self.assertEqual(p.PROTOCOL_VERSION, 9)
        self.assertEqual(p.HELLO_EVENTS_LINE, "HELLO 9 events")
        s, _ = started("HELLO 9 events")
        self.assertEqual((s.version, s.events), (9, True))

    def test_revoked_then_lost(self) -> None:
        s, _ = started("HELLO 9 events")
        lock, other = object(), object()
        s.register(5, lock)
        s.register(6, other)
        ping, _ = s.send("PING", None, 0.0)
        out = s.receive_data(b"! REVOKED 5 alice rotating the disk\n! LOST 5 revoked job-1 k\nPONG\n")
        self.assertEqual(out, [p.Lost(lock, "revoked", True, "alice", "rotating the disk"), p.Reply(ping, "PONG")])
        # Without a why; and the REVOKED of 5 was used up by its LOST.
        self.assertEqual(s.receive_data(b"! REVOKED 6 bob\r\n! LOST 6 revoked - k2\n"), [p.Lost(other, "revoked", True, "bob", None)])

    def test_lost_revoked_without_revoked_line(self) -> None:
        # A sidecar of version 5..8: LOST revoked alone (labelled).
        s, _ = started("HELLO 8 events")
        lock = object()
        s.register(5, lock)
        self.assertEqual(s.receive_line("! LOST 5 revoked - k"), [p.Lost(lock, "revoked", True, None, None)])
        # Version 3/4: no label.
        s, _ = started("HELLO 4 events")
        s.register(5, lock)
        self.assertEqual(s.receive_line("! LOST 5 revoked k"), [p.Lost(lock, "revoked", True, None, None)])

    def test_revoked_of_unknown_token_ignored(self) -> None:
        s, _ = started("HELLO 9 events")
        lock = object()
        s.register(5, lock)
        ping, _ = s.send("PING", None, 0.0)
        self.assertEqual(s.receive_line("! REVOKED 99 mallory not yours"), [])
        self.assertEqual(s.receive_line("PONG"), [p.Reply(ping, "PONG")])  # never a reply
        # The lock's own revoke, told without a REVOKED: who is not known,
        # and 99's REVOKED is not taken for it.
        self.assertEqual(s.receive_line("! LOST 5 revoked - k"), [p.Lost(lock, "revoked", True, None, None)])

    def test_revoked_then_other_reason(self) -> None:
        # A REVOKED gives who and why only to a revoked loss of its token.
        s, _ = started("HELLO 9 events")
        lock = object()
        s.register(5, lock)
        s.receive_line("! REVOKED 5 alice")
        self.assertEqual(s.receive_line("! LOST 5 expired - k"), [p.Lost(lock, "expired", True, None, None)])

    def test_revoked_before_the_lock_registered(self) -> None:
        # The events may be read with the grant, before the lock registers.
        s, _ = started("HELLO 9 events")
        acq, _ = s.send("ACQUIRE k 30 0", None, 0.0, keys=("k",))
        out = s.receive_data(b"OK 5\n! REVOKED 5 alice now\n! LOST 5 revoked - k\n")
        self.assertEqual(out, [p.Reply(acq, "OK 5")])
        lock = object()
        self.assertEqual(s.register(5, lock), p.Lost(lock, "revoked", True, "alice", "now"))

    def test_revoked_lines_are_bounded(self) -> None:
        s, _ = started("HELLO 9 events")
        for t in range(1, p.UNCLAIMED_EVENTS + 10):
            s.receive_line(f"! REVOKED {t} x")
        self.assertEqual(len(s._revoked), p.UNCLAIMED_EVENTS)

    def test_position_and_revoked_between_replies(self) -> None:
        # Everything a version-9 sidecar may write before an ACQUIRE's
        # reply is an event: only the reply settles the ACQUIRE.
        s, _ = started("HELLO 9 events")
        held = object()
        s.register(3, held)
        seen: List[p.Position] = []
        acq, _ = s.send("ACQUIRE k 30 5", None, 0.0, keys=("k",), on_queued=lambda: None, on_position=seen.append)
        out = s.receive_data(b"! QUEUED 2 k\n! POSITION 2 1 - k\n! REVOKED 3 ops\n! LOST 3 revoked - h\n"
                             b"! NEWS 1 2 3\nOK 7\n")
        self.assertEqual(out, [p.Queued(acq), p.Positioned(acq, p.Position("k", 1, None)),
                               p.Lost(held, "revoked", True, "ops", None), p.Reply(acq, "OK 7")])


class V9Sidecar(ScriptedSidecar):
    """Answers the HELLO as a version-9 sidecar (LOST lines labelled)."""

    version = 9

    def answer(self, line: str) -> str:
        if line == p.HELLO_EVENTS_LINE:
            return f"HELLO {self.version} events"
        if line == "HELD":
            return "HELD 0"
        return super().answer(line)


class SyncRevoke(unittest.TestCase):
    def setUp(self) -> None:
        self.fake = V9Sidecar()
        self.client = ticketing.Client(self.fake.path)

    def tearDown(self) -> None:
        self.client.close()
        self.fake.close()

    def test_hello_9_sent(self) -> None:
        self.assertEqual(self.client.hello(), 9)
        self.assertEqual(self.fake.lines[0], "HELLO 9 events")

    def test_revoked_with_who_and_why(self) -> None:
        self.fake.replies["RELEASE"] = "ERR not_held gone"
        lock = self.client.lock_block(["a", "b"], lease=30, wait=0, label="job-1")
        with self.assertRaises(ticketing.LockLostError) as cm:
            with lock as token:
                self.fake.push(f"! REVOKED {token} alice moving the seats to db-2")
                self.fake.push(f"! LOST {token} revoked job-1 a b")
                self.assertTrue(lock.lost.wait(WAIT))
                with self.assertRaises(ticketing.LockLostError) as cm2:
                    lock.extend(30)  # refused at once, with who and why
                self.assertEqual(cm2.exception.revoked_by, "alice")
        self.assertEqual((lock.lost_reason, lock.revoked_by, lock.revoke_reason),
                         ("revoked", "alice", "moving the seats to db-2"))
        e = cm.exception
        self.assertEqual((e.reason, e.token, e.keys, e.revoked_by, e.revoke_reason),
                         ("revoked", token, ("a", "b"), "alice", "moving the seats to db-2"))
        self.assertIn("revoked by alice: moving the seats to db-2", str(e))
        self.assertEqual(self.fake.sent("EXTEND"), [])

    def test_body_exception_note_names_who(self) -> None:
        lock = self.client.lock("k", lease=30, wait=0)
        with self.assertRaises(KeyError) as cm:
            with lock as token:
                self.fake.push(f"! REVOKED {token} alice")
                self.fake.push(f"! LOST {token} revoked - k")
                self.assertTrue(lock.lost.wait(WAIT))
                raise KeyError("boom")
        if sys.version_info >= (3, 11):
            self.assertIn("was lost: revoked by alice", " ".join(cm.exception.__notes__))

    def test_older_sidecar_revoked_without_who(self) -> None:
        self.fake.version = 8
        lock = self.client.lock("k", lease=30, wait=0)
        token = lock.acquire()
        self.assertEqual(self.client.hello(), 8)
        self.fake.push(f"! LOST {token} revoked - k")
        self.assertTrue(lock.lost.wait(WAIT))
        self.assertEqual((lock.lost_reason, lock.revoked_by, lock.revoke_reason), ("revoked", None, None))
        with self.assertRaises(ticketing.LockLostError) as cm:
            lock.extend(30)
        self.assertEqual((cm.exception.reason, cm.exception.revoked_by, cm.exception.revoke_reason), ("revoked", None, None))

    def test_revoked_of_unknown_token_ignored(self) -> None:
        lock = self.client.lock("k", lease=30, wait=0)
        token = lock.acquire()
        self.fake.push(f"! REVOKED {token + 1000} mallory not yours")
        self.client.ping()  # read after the REVOKED, and taken for no reply
        self.assertFalse(lock.lost.is_set())
        self.assertIsNone(lock.revoked_by)
        self.assertEqual(self.client.held(), [])  # the fake's HELD: the connection works on
        lock.release()
        self.assertFalse(lock.lost.is_set())

    def test_deadline_then_revoke_replaces_reason(self) -> None:
        lock = self.client.lock("k", lease=1, wait=0)
        token = lock.acquire()
        self.assertTrue(lock.lost.wait(WAIT))
        self.assertEqual((lock.lost_reason, lock.revoked_by), ("deadline", None))
        self.fake.push(f"! REVOKED {token} alice late news")
        self.fake.push(f"! LOST {token} revoked - k")
        self.assertTrue(wait_until(lambda: lock.lost_reason == "revoked"))
        self.assertEqual((lock.revoked_by, lock.revoke_reason), ("alice", "late news"))


class AsyncRevoke(unittest.TestCase):
    def setUp(self) -> None:
        self.fake = V9Sidecar()

    def tearDown(self) -> None:
        self.fake.close()

    def test_revoked_with_who_and_why(self) -> None:
        async def body() -> None:
            async with ticketing.AsyncClient(self.fake.path) as client:
                self.assertEqual(await client.hello(), 9)
                self.assertEqual(self.fake.lines[0], "HELLO 9 events")
                lock = client.lock("k", lease=30, wait=0)
                with self.assertRaises(ticketing.LockLostError) as cm:
                    async with lock as token:
                        self.fake.push(f"! REVOKED {token} alice why not")
                        self.fake.push(f"! LOST {token} revoked - k")
                        await asyncio.wait_for(lock.lost.wait(), WAIT)
                self.assertEqual((lock.lost_reason, lock.revoked_by, lock.revoke_reason), ("revoked", "alice", "why not"))
                self.assertEqual((cm.exception.revoked_by, cm.exception.revoke_reason), ("alice", "why not"))

                # A REVOKED for a token of no lock of ours: ignored.
                other = client.lock("k2", lease=30, wait=0)
                t2 = await other.acquire()
                self.fake.push(f"! REVOKED {t2 + 1} mallory")
                await client.ping()
                self.assertFalse(other.lost.is_set())
                # Its own revoke without a REVOKED line: who is not known.
                self.fake.push(f"! LOST {t2} revoked - k2")
                await asyncio.wait_for(other.lost.wait(), WAIT)
                self.assertEqual((other.lost_reason, other.revoked_by, other.revoke_reason), ("revoked", None, None))

        asyncio.run(body())


if __name__ == "__main__":
    unittest.main()
