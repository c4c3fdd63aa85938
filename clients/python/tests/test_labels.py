"""Owner labels (protocol version 5): the ``label`` option of acquire,
acquire_block, lock and lock_block, the lock object's ``label`` and
``held_locks``, against a real ``ticketing dev`` and a fake version-4
sidecar, and the parsing of HELD and LOST lines that carry labels."""

import asyncio
import secrets
import unittest

import ticketing
from ticketing import _protocol as p

from ._dev import DevCluster
from .test_block import FakeSidecar

cluster: "DevCluster | None" = None


def setUpModule() -> None:
    global cluster
    cluster = DevCluster()


def tearDownModule() -> None:
    if cluster is not None:
        cluster.stop()


class LabelParsing(unittest.TestCase):
    def test_grant_line(self) -> None:
        self.assertEqual(p.grant_line(["k"], 30, 0, False, "job-1")[0], "ACQUIRE k 30 0 label=job-1")
        self.assertEqual(p.grant_line(["a", "b"], 30, 5, True, "seats")[0], "ACQUIRE a b 30 5 label=seats")
        self.assertEqual(p.grant_line(["k"], 30, 0, False, "")[0], "ACQUIRE k 30 0")
        for bad in ("a b", "-", "l" * 65, "é"):
            with self.assertRaises(ValueError):
                p.grant_line(["k"], 30, 0, False, bad)
        with self.assertRaises(TypeError):
            p.grant_line(["k"], 30, 0, False, 7)  # type: ignore[arg-type]

    def test_held_and_lost(self) -> None:
        self.assertEqual(p.parse_held("HELD 2 a:7 job b:c:9 -"), [("a", 7), ("b:c", 9)])
        self.assertEqual(p.parse_held("HELD 2 a:7 b:9"), [("a", 7), ("b", 9)])
        self.assertEqual(
            p.parse_held_locks("HELD 2 a:7 job b:c:9 -"),
            [ticketing.HeldLock("a", 7, "job"), ticketing.HeldLock("b:c", 9, None)],
        )
        self.assertEqual(p.parse_held_locks("HELD 1 a:7"), [ticketing.HeldLock("a", 7, None)])
        self.assertEqual(p.parse_held_locks("HELD 0"), [])
        for bad in ("HELD 2 a:7 job", "HELD 1 :7 x", "HELD 1 a:7 -x y"):
            with self.assertRaises(ticketing.ProtocolError):
                p.parse_held_locks(bad)
        ev = p.parse_event("! LOST 7 expired job-1 a b", labelled=True)
        self.assertEqual((ev.token, ev.reason, ev.keys), (7, "expired", ("a", "b")))
        self.assertIsNone(p.parse_event("! LOST 7 expired job-1", labelled=True))
        ev = p.parse_event("! LOST 7 expired a", labelled=False)
        self.assertEqual(ev.keys, ("a",))


def version4(line: str) -> str:
    """A version-4 sidecar: no labels."""
    if line.startswith("HELLO"):
        return "HELLO 4 events"
    return "OK 7" if line.startswith("ACQUIRE ") and "label=" not in line else "ERR invalid_lease x"


class Version4SidecarTest(unittest.TestCase):
    """A labelled acquire is never sent to a sidecar before version 5."""

    def test_sync(self) -> None:
        fake = FakeSidecar(version4)
        try:
            with ticketing.Client(fake.path) as c:
                with self.assertRaises(ticketing.NotSupportedError):
                    c.acquire("k", lease=30, wait=0, label="job")
                with self.assertRaises(ticketing.NotSupportedError):
                    c.lock("k", lease=30, wait=0, label="job").acquire()
                self.assertEqual(c.acquire("k", lease=30, wait=0), 7)
            self.assertEqual(fake.lines, ["HELLO 9 events", "ACQUIRE k 30 0"])
        finally:
            fake.close()


class RealSidecarTest(unittest.TestCase):
    """Against a real sidecar and cluster the label is sent and kept: HELD
    lists it; a bad label is refused before anything is sent."""

    def test_sync_and_async(self) -> None:
        assert cluster is not None
        prefix = f"pyl-{secrets.token_hex(4)}/"
        with ticketing.Client(cluster.socket) as c:
            t1 = c.acquire(prefix + "a", lease=30, wait=0, label="job-1")
            t2 = c.acquire_block([prefix + "b1", prefix + "b2"], lease=30, wait=0, label="seats")
            self.assertEqual(
                c.raw("HELD"), f"HELD 3 {prefix}a:{t1} job-1 {prefix}b1:{t2} seats {prefix}b2:{t2} seats"
            )
            self.assertEqual(c.held(), [(prefix + "a", t1), (prefix + "b1", t2), (prefix + "b2", t2)])
            with self.assertRaises(ValueError):
                c.acquire(prefix + "x", lease=30, wait=0, label="a b")
            with self.assertRaises(ValueError):
                c.lock(prefix + "x", lease=30, wait=0, label="-")  # checked when made
            with self.assertRaises(ValueError):
                c.lock_block([prefix + "x", prefix + "y"], lease=30, wait=0, label="l" * 65)

            with c.lock(prefix + "d", lease=30, wait=0, label="lock-1") as t3:
                self.assertEqual(c.lock(prefix + "q").label, None)
                with c.lock_block([prefix + "e2", prefix + "e1"], lease=30, wait=0, label="blk") as t4:
                    self.assertEqual(
                        c.held_locks(),
                        [
                            ticketing.HeldLock(prefix + "a", t1, "job-1"),
                            ticketing.HeldLock(prefix + "b1", t2, "seats"),
                            ticketing.HeldLock(prefix + "b2", t2, "seats"),
                            ticketing.HeldLock(prefix + "d", t3, "lock-1"),
                            ticketing.HeldLock(prefix + "e1", t4, "blk"),
                            ticketing.HeldLock(prefix + "e2", t4, "blk"),
                        ],
                    )
            lk = c.lock(prefix + "f", lease=30, wait=0, label="obj")
            self.assertEqual(lk.label, "obj")
            with lk as t5:
                self.assertEqual(lk.label, "obj")
                self.assertIn(ticketing.HeldLock(prefix + "f", t5, "obj"), c.held_locks())

        async def run() -> None:
            assert cluster is not None
            ac = await ticketing.AsyncClient(cluster.socket).connect()
            try:
                t = await ac.acquire(prefix + "c", lease=30, wait=0, label="async-job")
                self.assertEqual(await ac.raw("HELD"), f"HELD 1 {prefix}c:{t} async-job")
                lk = ac.lock(prefix + "g", lease=30, wait=0, label="alock")
                async with lk as tg:
                    self.assertEqual(lk.label, "alock")
                    async with ac.lock_block([prefix + "h1", prefix + "h2"], lease=30, wait=0, label="ablk") as th:
                        self.assertEqual(
                            await ac.held_locks(),
                            [
                                ticketing.HeldLock(prefix + "c", t, "async-job"),
                                ticketing.HeldLock(prefix + "g", tg, "alock"),
                                ticketing.HeldLock(prefix + "h1", th, "ablk"),
                                ticketing.HeldLock(prefix + "h2", th, "ablk"),
                            ],
                        )
                    self.assertEqual(await ac.held(), [(prefix + "c", t), (prefix + "g", tg)])
            finally:
                await ac.close()

        asyncio.run(run())


if __name__ == "__main__":
    unittest.main()
