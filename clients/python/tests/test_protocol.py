"""The sans-IO core (ticketing._protocol): argument checks, reply parsing,
the connection (Session) and lock-object (LockState) decisions. No sidecar,
no sockets: bytes and lines in, decisions out."""

import unittest
from decimal import Decimal

import ticketing
from ticketing import _protocol as p


class ArgumentChecks(unittest.TestCase):
    def test_acquire_line(self) -> None:
        self.assertEqual(p.acquire_line("seats/42", 30, 5), ("ACQUIRE seats/42 30 5", 5.0))
        self.assertEqual(p.acquire_line("k", 1, 0)[0], "ACQUIRE k 1 0")
        self.assertEqual(p.acquire_line("k", 250, 0.25)[0], "ACQUIRE k 250 0.25")
        self.assertEqual(p.acquire_line("k", 10, 1.005)[0], "ACQUIRE k 10 1.005")
        self.assertEqual(p.acquire_line("k", 10, 0.1)[0], "ACQUIRE k 10 0.1")
        self.assertEqual(p.acquire_line("k", 10, Decimal("2.500"))[0], "ACQUIRE k 10 2.5")
        self.assertEqual(p.acquire_line("k", 10, 300)[0], "ACQUIRE k 10 300")
        self.assertEqual(p.acquire_line("~" * 255, 10, 0)[0], "ACQUIRE " + "~" * 255 + " 10 0")

    def test_bad_lease(self) -> None:
        for lease in (0, 251, -1):
            with self.subTest(lease=lease), self.assertRaises(ValueError):
                p.check_lease(lease)
        for lease in (1.5, 30.0, "30", True, None):
            with self.subTest(lease=lease), self.assertRaises(TypeError):
                p.check_lease(lease)

    def test_bad_wait(self) -> None:
        for wait in (-1, -0.001, 3600.001, 3601, 0.0005, Decimal("0.0001"), float("inf"), float("nan")):
            with self.subTest(wait=wait), self.assertRaises(ValueError):
                p.wait_millis(wait)
        for wait in ("1", None, True):
            with self.subTest(wait=wait), self.assertRaises(TypeError):
                p.wait_millis(wait)

    def test_bad_key(self) -> None:
        for key in ("", "a b", "tab\t", "nl\n", "del\x7f", "métro", "x" * 256):
            with self.subTest(key=key), self.assertRaises(ValueError):
                p.check_key(key)
        with self.assertRaises(TypeError):
            p.check_key(b"bytes")  # type: ignore[arg-type]

    def test_bad_token(self) -> None:
        self.assertEqual(p.release_line("k", 2**64 - 1), f"RELEASE k {2**64 - 1}")
        for token in (0, -1, 2**64):
            with self.subTest(token=token), self.assertRaises(ValueError):
                p.check_token(token)
        for token in ("1", 1.0, True):
            with self.subTest(token=token), self.assertRaises(TypeError):
                p.check_token(token)

    def test_lock_checks_eagerly(self) -> None:
        client = ticketing.Client("/nonexistent/ticketing.sock")
        with self.assertRaises(ValueError):
            client.lock("seats/42", lease=0)
        with self.assertRaises(ValueError):
            client.lock("seats 42")


class ReplyParsing(unittest.TestCase):
    def test_acquire_replies(self) -> None:
        self.assertEqual(p.parse_acquire("OK 18446744073709551615"), 2**64 - 1)
        self.assertRaises(ticketing.BusyError, p.parse_acquire, "BUSY")
        self.assertRaises(ticketing.LockTimeoutError, p.parse_acquire, "TIMEOUT")
        self.assertRaises(TimeoutError, p.parse_acquire, "TIMEOUT")
        self.assertRaises(ticketing.IndeterminateError, p.parse_acquire, "INDETERMINATE")
        self.assertRaises(ticketing.ProtocolError, p.parse_acquire, "OK")
        self.assertRaises(ticketing.ProtocolError, p.parse_acquire, "OK 0")
        self.assertRaises(ticketing.ProtocolError, p.parse_acquire, "OK -3")
        self.assertRaises(ticketing.ProtocolError, p.parse_acquire, "WHAT")
        with self.assertRaises(ticketing.ServerError) as cm:
            p.parse_acquire("ERR invalid_lease lease must be 1..250 seconds")
        self.assertEqual(cm.exception.code, "invalid_lease")
        self.assertEqual(cm.exception.message, "lease must be 1..250 seconds")
        self.assertIsInstance(cm.exception, ticketing.TicketingError)

    def test_release_replies(self) -> None:
        self.assertIsNone(p.parse_release("OK"))
        with self.assertRaises(ticketing.ServerError) as cm:
            p.parse_release("ERR not_held")
        self.assertEqual((cm.exception.code, cm.exception.message), ("not_held", ""))
        self.assertRaises(ticketing.IndeterminateError, p.parse_release, "INDETERMINATE")

    def test_info(self) -> None:
        info = p.parse_info("INFO cluster=dev leader=127.0.0.1:7401 connected=3/3 extra=1")
        self.assertEqual((info.cluster, info.leader, info.connected, info.total), ("dev", "127.0.0.1:7401", 3, 3))
        self.assertEqual(info.fields["extra"], "1")
        self.assertIsNone(p.parse_info("INFO cluster=dev leader=- connected=0/3").leader)
        self.assertRaises(ticketing.ProtocolError, p.parse_info, "INFO connected=x/3")

    def test_info_session_fields(self) -> None:
        # The sidecar's cluster session (unixapi/PROTOCOL.md, INFO): fields
        # this client does not type, kept in Info.fields.
        info = p.parse_info(
            "INFO cluster=dev leader=127.0.0.1:7401 connected=3/3 domain=d members=- protocol=4 sessions=auto "
            "session=5c1e0f7a92b3d4e8 session_state=attached session_timeout_ms=10000 session_resumes=1 "
            "session_opens=1 session_held=0 session_last_resume=outcomes:2,queued:12,void:0,repeated:0"
        )
        self.assertEqual((info.cluster, info.connected, info.total), ("dev", 3, 3))
        self.assertEqual(info.fields["session"], "5c1e0f7a92b3d4e8")
        self.assertEqual(info.fields["session_state"], "attached")
        self.assertEqual(int(info.fields["session_timeout_ms"]), 10000)
        self.assertEqual(info.fields["session_last_resume"], "outcomes:2,queued:12,void:0,repeated:0")

    def test_info_typed_fields(self) -> None:
        # Every field of the protocol is an attribute; "-" is None; a field
        # an older sidecar does not send is None.
        info = p.parse_info(
            "INFO cluster=dev leader=127.0.0.1:7401 connected=3/3 domain=fc59 "
            "members=n1/mr6:voter@127.0.0.1:7401,n2/k3c:learner@- protocol=4 sessions=auto "
            "session=5c1e0f7a92b3d4e8 session_state=attached session_timeout_ms=10000 session_resumes=1 "
            "session_opens=2 session_held=3 session_last_resume=outcomes:2,queued:12,void:0,repeated:0"
        )
        self.assertEqual(info.domain, "fc59")
        self.assertEqual(
            info.members,
            [ticketing.Member("n1/mr6", "voter", "127.0.0.1:7401"), ticketing.Member("n2/k3c", "learner", None)],
        )
        self.assertEqual((info.protocol, info.sessions, info.session, info.session_state), (4, "auto", "5c1e0f7a92b3d4e8", "attached"))
        self.assertEqual((info.session_timeout_ms, info.session_resumes, info.session_opens, info.session_held), (10000, 1, 2, 3))
        self.assertEqual(info.session_last_resume, "outcomes:2,queued:12,void:0,repeated:0")
        old = p.parse_info("INFO cluster=dev leader=- connected=0/3 domain=- members=-")
        self.assertEqual((old.domain, old.members, old.protocol, old.session), (None, None, None, None))
        self.assertRaises(ticketing.ProtocolError, p.parse_info, "INFO connected=1/3 protocol=four")
        self.assertRaises(ticketing.ProtocolError, p.parse_info, "INFO connected=1/3 members=nocolon")

    def test_held(self) -> None:
        self.assertEqual(p.parse_held("HELD 0"), [])
        self.assertEqual(p.parse_held("HELD 3 a:b:7 c:9 c:12"), [("a:b", 7), ("c", 9), ("c", 12)])
        self.assertRaises(ticketing.ProtocolError, p.parse_held, "HELD 2 a:1")
        self.assertRaises(ticketing.ProtocolError, p.parse_held, "HELD 1 a")


def started(hello_reply: "str | None" = None) -> "tuple[p.Session, p.Request]":
    s = p.Session("/x.sock")
    hello, data = s.start(0.0, handle="hello")
    assert data == b"HELLO 9 events\n", data
    if hello_reply is not None:
        s.receive_line(hello_reply)
    return s, hello


class SessionCore(unittest.TestCase):
    """The sans-IO connection: positions, reply matching, event routing,
    HELLO, teardown. No sockets: bytes in, decisions out."""

    def test_positions_count_every_line(self) -> None:
        s, hello = started()
        self.assertEqual(hello.position, 1)
        reqs = [s.send(line, None, 1.0)[0] for line in ("PING", "ACQUIRE a 10 5", "garbage", "HELD")]
        self.assertEqual([r.position for r in reqs], [2, 3, 4, 5])
        self.assertEqual(s.written, 5)
        r, data = s.send("ACQUIRE a b 10 5", 5.0, 2.0, keys=["a", "b"], on_queued=print, handle="h")
        self.assertEqual((r.position, r.keys, r.sent, r.deadline, r.handle), (6, ("a", "b"), 2.0, 7.0, "h"))
        self.assertEqual(data, b"ACQUIRE a b 10 5\n")

    def test_deadline_never_before_the_one_ahead(self) -> None:
        s, _ = started()
        a, _ = s.send("ACQUIRE k 10 30", 40.0, 0.0)
        b, _ = s.send("PING", 10.0, 1.0)
        self.assertEqual((a.deadline, b.deadline), (40.0, 40.0))
        c, _ = s.send("PING", None, 2.0)
        self.assertIsNone(c.deadline)

    def test_replies_in_order_events_skipped(self) -> None:
        s, hello = started()
        ping, _ = s.send("PING", None, 0.0)
        acq, _ = s.send("ACQUIRE k 10 5", None, 0.0, keys=["k"])
        out = s.receive_data(b"HELLO 4 events\n! FOO bar\nPONG\n!\nOK 7\n")
        self.assertEqual(out, [p.Reply(hello, "HELLO 4 events"), p.Reply(ping, "PONG"), p.Reply(acq, "OK 7")])
        self.assertEqual((s.version, s.events), (4, True))

    def test_every_split_gives_the_same_decisions(self) -> None:
        script = (b"HELLO 4 events\r\n! QUEUED 2 k\n! LOST 9 expired k\n! NOTICE x\n"
                  b"OK 12\n! QUEUED 3 a b\nTIMEOUT\nPONG\n")

        def run(cuts: "list[int]") -> "list[object]":
            s, _ = started()
            calls: "list[int]" = []
            a, _ = s.send("ACQUIRE k 10 5", None, 0.0, keys=["k"], on_queued=lambda: calls.append(2))
            b, _ = s.send("ACQUIRE a b 10 5", None, 0.0, keys=["a", "b"], on_queued=lambda: calls.append(3))
            c, _ = s.send("PING", None, 0.0)
            out: "list[object]" = []
            prev = 0
            for cut in cuts + [len(script)]:
                out.extend(s.receive_data(script[prev:cut]))
                prev = cut
            return [(type(d).__name__, getattr(d, "request", None) and d.request.position,
                     getattr(d, "line", None)) for d in out]

        whole = run([])
        self.assertEqual(whole, [
            ("Reply", 1, "HELLO 4 events"),
            ("Queued", 2, None),
            ("Reply", 2, "OK 12"),
            ("Queued", 3, None),
            ("Reply", 3, "TIMEOUT"),
            ("Reply", 4, "PONG"),
        ])
        for i in range(len(script) + 1):
            self.assertEqual(run([i]), whole, f"split at {i}")
        for i in range(0, len(script), 7):
            for j in range(i, len(script) + 1, 5):
                self.assertEqual(run([i, j]), whole, f"split at {i}, {j}")
        self.assertEqual(run(list(range(1, len(script)))), whole, "byte by byte")

    def test_queued_matched_by_position(self) -> None:
        s, _ = started("HELLO 4 events")
        seen: "list[str]" = []
        first, _ = s.send("ACQUIRE k 10 5", None, 0.0, keys=["k"], on_queued=lambda: seen.append("first"))
        second, _ = s.send("ACQUIRE k 10 5", None, 0.0, keys=["k"], on_queued=lambda: seen.append("second"))
        # Two pending ACQUIREs of one key: the position tells them apart.
        self.assertEqual(s.receive_line("! QUEUED 3 k"), [p.Queued(second)])
        self.assertTrue(second.queued)
        self.assertFalse(first.queued)
        self.assertEqual(s.receive_line("! QUEUED 3 k"), [])  # at most once
        self.assertEqual(s.receive_line("! QUEUED 2 other"), [])  # not its keys
        self.assertEqual(s.receive_line("! QUEUED 1 k"), [])  # the HELLO
        self.assertEqual(s.receive_line("! QUEUED 9 k"), [])  # nothing written there
        self.assertEqual(s.receive_line("OK 5"), [p.Reply(first, "OK 5")])
        self.assertEqual(s.receive_line("! QUEUED 2 k"), [])  # its reply came already
        self.assertFalse(first.queued)

    def test_queued_not_for_other_requests_nor_without_hook(self) -> None:
        s, _ = started("HELLO 4 events")
        s.send("RELEASE k 5", None, 0.0)
        quiet, _ = s.send("ACQUIRE k 10 5", None, 0.0, keys=["k"])
        self.assertEqual(s.receive_line("! QUEUED 2 k"), [])
        self.assertEqual(s.receive_line("! QUEUED 3 k"), [])
        self.assertTrue(quiet.queued)

    def test_block_keys_in_order(self) -> None:
        s, _ = started("HELLO 4 events")
        blk, _ = s.send("ACQUIRE a b c 10 5", None, 0.0, keys=["a", "b", "c"], on_queued=lambda: None)
        self.assertEqual(s.receive_line("! QUEUED 2 b a c"), [])
        self.assertEqual(s.receive_line("! QUEUED 2 a b"), [])
        self.assertEqual(s.receive_line("! QUEUED 2 a b c"), [p.Queued(blk)])

    def test_parse_queued(self) -> None:
        self.assertEqual(p.parse_event("! QUEUED 1 k"), p.QueuedEvent(1, ("k",)))
        self.assertEqual(p.parse_event("! QUEUED 12 a b"), p.QueuedEvent(12, ("a", "b")))
        for bad in ("! QUEUED", "! QUEUED 1", "! QUEUED 0 k", "! QUEUED -1 k", "! QUEUED x k", "! QUEUED 1  k",
                    "! QUEUED 1 k ", "! QUEUED +1 k", "! QUEUED 1_0 k", "! QUEUED \u0661 k", "!QUEUED 1 k",
                    "! queued 1 k", "! QUEUED " + "1" * 5000 + " k"):
            with self.subTest(line=bad):
                self.assertIsNone(p.parse_event(bad))

    def test_positions_every_split_and_matched_by_request_and_key(self) -> None:
        # Reports of line 2 (a block of a and b) and line 3 (k) among
        # malformed ones and replies: each reaches its request while it is
        # pending, for one of its keys only, whatever the split.
        script = (b"HELLO 7 events\n! POSITION 2 4 - a\n! POSITION 3 9 12 k\n! POSITION 2 0 1 a\n"
                  b"! POSITION 2 3 - z\n! POSITION 2 2 5 b\n! POSITION 4 1 1 k\n! POSITION 2 1 5 b extra\n"
                  b"! POSITION 3 1 0 k\r\nOK 12\n! POSITION 2 1 0 a\n! POSITION 3 1 - k\nTIMEOUT\n"
                  b"! POSITION 3 1 0 k\nPONG\n")

        def run(cuts: "list[int]") -> "list[object]":
            s, _ = started()
            s.send("ACQUIRE a b 10 5", None, 0.0, keys=["a", "b"], on_position=lambda pos: None)
            s.send("ACQUIRE k 10 5", None, 0.0, keys=["k"], on_position=lambda pos: None)
            s.send("PING", None, 0.0)
            out: "list[object]" = []
            prev = 0
            for cut in cuts + [len(script)]:
                out.extend(s.receive_data(script[prev:cut]))
                prev = cut
            return [(type(d).__name__, getattr(d, "request", None) and d.request.position,
                     getattr(d, "line", None) or getattr(d, "position", None)) for d in out]

        whole = run([])
        self.assertEqual(whole, [
            ("Reply", 1, "HELLO 7 events"),
            ("Positioned", 2, p.Position("a", 4, None)),
            ("Positioned", 3, p.Position("k", 9, 12)),
            ("Positioned", 2, p.Position("b", 2, 5)),
            ("Positioned", 3, p.Position("k", 1, 0)),
            ("Reply", 2, "OK 12"),
            ("Positioned", 3, p.Position("k", 1, None)),
            ("Reply", 3, "TIMEOUT"),
            ("Reply", 4, "PONG"),
        ])
        for i in range(len(script) + 1):
            self.assertEqual(run([i]), whole, f"split at {i}")
        self.assertEqual(run(list(range(1, len(script)))), whole, "byte by byte")

    def test_positions_only_with_a_hook(self) -> None:
        s, _ = started("HELLO 7 events")
        quiet, _ = s.send("ACQUIRE k 10 5", None, 0.0, keys=["k"], on_queued=lambda: None)
        self.assertEqual(s.receive_line("! POSITION 2 1 - k"), [])
        self.assertEqual(s.receive_line("! QUEUED 2 k"), [p.Queued(quiet)])
        self.assertIsNone(p.parse_event("! POSITION 3 " + "1" * 5000 + " - k"))
        self.assertIsNone(p.parse_event("! POSITION 3 1 " + "1" * 5000 + " k"))

    def test_huge_numbers_are_protocol_errors(self) -> None:
        # int() raises ValueError past 4300 digits; a reply must not.
        self.assertRaises(ticketing.ProtocolError, p.parse_acquire, "OK " + "9" * 5000)
        self.assertIsNone(p.parse_event("! LOST " + "1" * 5000 + " expired k"))
        self.assertRaises(ticketing.ProtocolError, p.parse_hello, "HELLO " + "3" * 5000)

    def test_hello_outcomes(self) -> None:
        for reply, version, events in (("HELLO 4 events", 4, True), ("HELLO 3 events", 3, True), ("HELLO 2", 2, False)):
            with self.subTest(reply=reply):
                s, _ = started(reply)
                self.assertEqual((s.version, s.events, s.hello_outcome()), (version, events, version))
        # A version-2 sidecar refuses the events option: ask again, plainly.
        s, _ = started("ERR bad_request unknown option")
        self.assertIsNone(s.hello_outcome())
        self.assertEqual(s.settle_plain_hello("HELLO 2"), 2)
        self.assertEqual((s.version, s.events), (2, False))
        # A version-1 sidecar does not know HELLO.
        s, _ = started('ERR unknown_verb unixapi: unknown verb: "HELLO"')
        self.assertEqual(s.hello_outcome(), 1)
        # A refusal on connect is raised, and names the connection's end.
        s, _ = started("ERR forbidden not in the allowed group")
        with self.assertRaises(ticketing.ServerError) as cm:
            s.hello_outcome()
        self.assertEqual(cm.exception.code, "forbidden")
        self.assertIn("refused the connection: ERR forbidden", str(s.eof().error))

    def test_reply_without_request_ends_the_connection(self) -> None:
        s, hello = started()
        out = s.receive_data(b"HELLO 4 events\nPONG\nPONG\n")
        self.assertEqual(out[0], p.Reply(hello, "HELLO 4 events"))
        self.assertEqual(len(out), 2)
        td = out[1]
        self.assertIsInstance(td, p.Teardown)
        self.assertTrue(td.first)
        self.assertIn("no request pending", str(td.error))
        self.assertFalse(s.alive)
        self.assertEqual(s.receive_data(b"OK\n"), [])
        with self.assertRaises(ticketing.SidecarConnectionError):
            s.send("PING", None, 0.0)

    def test_teardown_fails_pending_and_loses_locks(self) -> None:
        s, hello = started("HELLO 4 events")
        ping, _ = s.send("PING", None, 0.0)
        lock = object()
        self.assertIsNone(s.register(7, lock))
        td = s.eof()
        self.assertEqual((td.requests, td.locks, td.first), ([ping], [lock], True))
        self.assertIn("closed the connection", str(td.error))
        again = s.fail(ticketing.SidecarConnectionError("client closed"))
        self.assertEqual((again.requests, again.locks, again.first), ([], [], False))
        self.assertIs(again.error, td.error)  # the first error sticks
        self.assertEqual(s.register(8, lock), p.Lost(lock, "disconnected", False))

    def test_lost_routing(self) -> None:
        s, _ = started("HELLO 4 events")
        a, b = object(), object()
        self.assertIsNone(s.register(5, a))
        self.assertEqual(s.receive_line("! LOST 5 expired k"), [p.Lost(a, "expired", True)])
        self.assertEqual(s.receive_line("! LOST 5 moved k"), [])  # routed once
        # An event before the lock object registered waits for it.
        self.assertEqual(s.receive_line("! LOST 6 compensated k"), [])
        self.assertEqual(s.register(6, b), p.Lost(b, "compensated", True))
        # Unregistered: events are dropped.
        self.assertIsNone(s.register(7, b))
        s.unregister(7, b)
        self.assertEqual(s.receive_line("! LOST 7 expired k"), [])

    def test_unclaimed_events_are_bounded(self) -> None:
        s, _ = started("HELLO 4 events")
        for t in range(1, p.UNCLAIMED_EVENTS + 2):
            s.receive_line(f"! LOST {t} expired k")
        lock = object()
        self.assertIsNone(s.register(1, lock))  # the oldest was forgotten
        self.assertEqual(s.register(2, lock), p.Lost(lock, "expired", True))


class LockStateCore(unittest.TestCase):
    """The sans-IO lock object: token, deadline, lost decision, extend."""

    def test_used_once_and_deadline(self) -> None:
        st = p.LockState.of_key("k", 10, 5)
        self.assertEqual(st.remaining(0.0), 0.0)
        st.begin_acquire()
        self.assertRaises(RuntimeError, st.begin_acquire)
        deadline = st.granted(42, 100.0)
        self.assertAlmostEqual(deadline, 100.0 + p.validity(10))
        self.assertTrue(st.arm(deadline))
        self.assertFalse(st.due(deadline - 0.001))
        self.assertTrue(st.due(deadline))
        self.assertAlmostEqual(st.remaining(deadline - 1), 1.0)
        self.assertEqual((st.token, st.held_token), (42, 42))

    def test_lose_rules(self) -> None:
        st = p.LockState.of_key("k", 10, 5)
        st.granted(1, 0.0)
        self.assertTrue(st.lose("deadline", False))
        self.assertFalse(st.lose("expired", True))  # fires once...
        self.assertEqual(st.reason, "expired")  # ...but the sidecar's news replaces a local reason
        self.assertFalse(st.lose("moved", True))
        self.assertEqual(st.reason, "expired")
        self.assertFalse(st.arm(50.0))
        self.assertEqual(st.remaining(0.0), 0.0)
        released = p.LockState.of_block(["a", "b"], 10, 5)
        released.granted(2, 0.0)
        self.assertEqual(released.begin_release(), 2)
        released.released = True
        self.assertFalse(released.lose("expired", True))
        self.assertRaises(RuntimeError, released.begin_release)

    def test_extend_caps_the_deadline(self) -> None:
        # Issue 39: an EXTEND to a shorter lease may apply whatever its
        # answer says (INDETERMINATE), and its lease counts from when it
        # did: from its send on, the deadline is at most send + validity.
        st = p.LockState.of_key("k", 60, 5)
        self.assertTrue(st.arm(st.granted(3, 0.0)))  # 0 + validity(60)
        short = st.begin_extend(5, 10.0)
        self.assertAlmostEqual(short.cap, 10.0 + p.validity(5))
        self.assertAlmostEqual(st.capped(short.cap), short.cap)  # shorter: the cap
        longer = st.begin_extend(100, 11.0)
        self.assertAlmostEqual(st.capped(longer.cap), short.cap)  # the earlier in flight
        st.settle_extend(longer)
        st.finish_extend(longer)
        self.assertTrue(st.arm(st.capped(short.cap)))
        st.settle_extend(short)  # INDETERMINATE: the deadline stays capped
        st.finish_extend(short)
        self.assertAlmostEqual(st.deadline, 10.0 + p.validity(5))
        self.assertEqual(st.extends, [])  # nothing under way: nothing kept
        # A longer extend leaves the previous deadline.
        st2 = p.LockState.of_key("k", 60, 5)
        st2.arm(st2.granted(4, 0.0))
        mine = st2.begin_extend(100, 10.0)
        self.assertAlmostEqual(st2.capped(mine.cap), p.validity(60))
        # OK: send time + validity, at most another EXTEND's cap in flight.
        other = st2.begin_extend(2, 12.0)
        st2.settle_extend(mine)  # answered OK
        self.assertAlmostEqual(st2.extended_deadline(mine, 10.5, 100), other.cap)
        st2.finish_extend(mine)
        st2.settle_extend(other)
        st2.finish_extend(other)
        # One begun after the last answered call is over is not bounded by it.
        third = st2.begin_extend(100, 20.0)
        st2.settle_extend(third)
        self.assertAlmostEqual(st2.extended_deadline(third, 20.5, 100), 20.5 + p.validity(100))
        st2.finish_extend(third)

    def test_extend_ok_keeps_the_cap_of_one_answered_meanwhile(self) -> None:
        # The sidecar runs a connection's requests concurrently, so of two
        # EXTENDs under way at once either may apply last. The OK of the
        # first, handled after the second was answered (INDETERMINATE, an
        # OK, or a caller that gave up), stays at most the second's cap:
        # dropping that cap when the second was answered lifted the
        # deadline 95 s past the lease the cluster may hold.
        for outcome in ("indeterminate", "ok", "abandoned"):
            with self.subTest(outcome=outcome):
                st = p.LockState.of_key("k", 60, 5)
                st.arm(st.granted(4, 0.0))
                first = st.begin_extend(100, 10.0)
                second = st.begin_extend(5, 10.1)
                st.arm(st.capped(second.cap))
                if outcome == "abandoned":
                    st.finish_extend(second)  # the caller gave up: not answered yet
                    st.settle_extend(first)
                else:
                    st.settle_extend(first)
                    st.settle_extend(second)
                    st.finish_extend(second)
                self.assertAlmostEqual(st.extended_deadline(first, 10.0, 100), second.cap)
                st.finish_extend(first)
                if outcome == "abandoned":
                    self.assertEqual(st.extends, [second])  # until the sidecar answers it
                    st.settle_extend(second)
                self.assertEqual(st.extends, [])
        # An EXTEND answered before another began does not bound it.
        st = p.LockState.of_key("k", 60, 5)
        st.arm(st.granted(4, 0.0))
        slow = st.begin_extend(5, 10.0)  # keeps a call under way throughout
        early = st.begin_extend(2, 10.1)
        st.settle_extend(early)
        st.finish_extend(early)
        late = st.begin_extend(100, 11.0)
        st.settle_extend(late)
        self.assertAlmostEqual(st.extended_deadline(late, 11.0, 100), slow.cap)  # slow is still in flight
        st.settle_extend(slow)
        self.assertAlmostEqual(st.extended_deadline(late, 11.0, 100), slow.cap)  # answered after late began
        self.assertLess(early.cap, slow.cap)
        self.assertAlmostEqual(st.extended_deadline(slow, 10.0, 5), early.cap)  # early ran beside slow

    def test_extend_decisions(self) -> None:
        st = p.LockState.of_key("k", 10, 5)
        self.assertRaises(RuntimeError, st.extend_line, 10)  # not held
        st.granted(3, 0.0)
        self.assertRaises(ValueError, st.extend_line, 0)
        self.assertEqual(st.extend_line(20), "EXTEND k 3 20")
        self.assertEqual(st.extend_replied("OK"), (None, False))
        self.assertTrue(st.extended(20))
        self.assertEqual(st.lease, 20)
        err, fire = st.extend_replied("INDETERMINATE")
        self.assertIsInstance(err, ticketing.IndeterminateError)
        self.assertFalse(fire)
        err, fire = st.extend_replied("ERR not_held gone")
        self.assertIsInstance(err, ticketing.ServerError)
        self.assertTrue(fire)
        self.assertEqual(st.reason, "moved")
        self.assertFalse(st.extended(30))
        with self.assertRaises(ticketing.LockLostError) as cm:
            st.extend_line(10)  # lost: nothing to send
        self.assertEqual((cm.exception.reason, cm.exception.token), ("moved", 3))

    def test_arguments_checked_now(self) -> None:
        self.assertRaises(ValueError, p.LockState.of_key, "k k", 10, 5)
        self.assertRaises(ValueError, p.LockState.of_block, ["a", "a"], 10, 5)
        self.assertRaises(TypeError, p.LockState.of_key, "k", 10, 5, on_queued="yes")
        client = ticketing.Client("/nonexistent/ticketing.sock")
        with self.assertRaises(TypeError):
            client.acquire("k", 10, 5, on_queued=3)  # type: ignore[arg-type]
        with self.assertRaises(TypeError):
            client.lock("k", 10, 5, on_queued=3)  # type: ignore[arg-type]

    def test_late_grant_release(self) -> None:
        self.assertEqual(p.late_grant_release("k", "OK 9"), "RELEASE k 9")
        for reply in ("TIMEOUT", "BUSY", "ERR x", "INDETERMINATE", "OK"):
            self.assertIsNone(p.late_grant_release("k", reply))


if __name__ == "__main__":
    unittest.main()
