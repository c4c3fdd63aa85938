"""Argument checks and reply parsing, without a sidecar."""

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
        for wait in (-1, -0.001, 300.001, 301, 0.0005, Decimal("0.0001"), float("inf"), float("nan")):
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

    def test_held(self) -> None:
        self.assertEqual(p.parse_held("HELD 0"), [])
        self.assertEqual(p.parse_held("HELD 3 a:b:7 c:9 c:12"), [("a:b", 7), ("c", 9), ("c", 12)])
        self.assertRaises(ticketing.ProtocolError, p.parse_held, "HELD 2 a:1")
        self.assertRaises(ticketing.ProtocolError, p.parse_held, "HELD 1 a")


if __name__ == "__main__":
    unittest.main()
