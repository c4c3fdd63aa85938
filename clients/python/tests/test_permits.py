"""Semaphores (protocol version 8): ``acquire_permit``, ``lock_permit`` and
``set_permits`` of both clients, on a scripted fake sidecar (lines, grants,
error classes, an older sidecar) and against a real ``ticketing dev``
(distinct slots, FIFO hand-off of a freed slot, a raised n granting a
waiter, lock objects released on exit)."""

from __future__ import annotations

import asyncio
import os
import secrets
import sqlite3
import tempfile
import threading
import unittest

import ticketing
from ticketing import _protocol as p
from ticketing import fence
from ticketing.aio import AsyncClient

from ._dev import DevCluster
from .test_lost import WAIT, ScriptedSidecar

cluster: "DevCluster | None" = None


def setUpModule() -> None:
    global cluster
    cluster = DevCluster()


def tearDownModule() -> None:
    if cluster is not None:
        cluster.stop()


class PermitSidecar(ScriptedSidecar):
    """A version-8 sidecar: PERMIT grants slot 3 (or the reply set in
    ``replies``), PERMITS answers OK."""

    version = 8

    def answer(self, line: str) -> str:
        verb = line.split(" ", 1)[0]
        if verb in self.replies:
            return self.replies[verb]
        if line == p.HELLO_EVENTS_LINE:
            return f"HELLO {self.version} events"
        if verb == "PERMIT" and self.version >= 8:
            self.next_token += 1
            return f"OK {self.next_token} 3"
        if verb == "PERMITS" and self.version >= 8:
            return "OK"
        return super().answer(line)


class Protocol(unittest.TestCase):
    def test_lines_and_replies(self) -> None:
        self.assertEqual(p.HELLO_EVENTS_LINE, "HELLO 9 events")
        self.assertEqual(p.permit_line("k", 30, 1.5, "job")[0], "PERMIT k 30 1.5 label=job")
        self.assertEqual(p.parse_permit("OK 12 0"), (12, 0))
        for bad in ("OK 12", "OK 12 x", "OK 0 1", "OK 12 100000", "OK 12 1 2"):
            with self.assertRaises(ticketing.ProtocolError, msg=bad):
                p.parse_permit(bad)
        self.assertEqual(p.permits_line("k", 0), "PERMITS k 0")
        for n in (-1, 100001):
            with self.assertRaises(ValueError):
                p.permits_line("k", n)
        with self.assertRaises(TypeError):
            p.permits_line("k", True)  # type: ignore[arg-type]
        for reply, cls in (("ERR is_semaphore x", ticketing.IsSemaphoreError),
                           ("ERR not_semaphore x", ticketing.NotSemaphoreError),
                           ("ERR invalid_permits x", ticketing.InvalidPermitsError),
                           ("ERR in_use x", ticketing.InUseError),
                           ("ERR unknown_verb x", ticketing.NotSupportedError)):
            with self.assertRaises(cls):
                p.parse_permits(reply)
        # The new codes stay ServerErrors, with their code.
        with self.assertRaises(ticketing.ServerError) as cm:
            p.parse_acquire("ERR is_semaphore k is a semaphore")
        self.assertIsInstance(cm.exception, ticketing.IsSemaphoreError)
        self.assertEqual(cm.exception.code, "is_semaphore")
        # A permit's late grant is released by its token.
        self.assertEqual(p.late_grant_release("k", "OK 12 3"), "RELEASE k 12")
        self.assertEqual(ticketing.Permit("k", 12, 3).fence_key, "k 3")
        # A space joins them: no key holds one, so no lock key is a slot's
        # fence key (the lock "checkout#0" was slot 0 of "checkout"'s).
        for key in ("checkout", "checkout#0", "#", "a" * 255):
            for slot in (0, 1, 10, ticketing.MAX_PERMITS - 1):
                fk = ticketing.fence_key(key, slot)
                self.assertNotEqual(fk, "checkout#0")
                with self.assertRaises(ValueError):
                    p.check_key(fk)


class SyncFake(unittest.TestCase):
    def setUp(self) -> None:
        self.fake = PermitSidecar()
        self.client = ticketing.Client(self.fake.path)

    def tearDown(self) -> None:
        self.client.close()
        self.fake.close()

    def test_acquire_permit_and_set_permits(self) -> None:
        self.client.set_permits("room", 2)
        got = self.client.acquire_permit("room", lease=30, wait=0, label="job")
        self.assertEqual(got, ticketing.Permit("room", 101, 3))
        self.assertEqual(self.fake.lines[1:], ["PERMITS room 2", "PERMIT room 30 0 label=job"])

    def test_lock_permit_releases_on_exit(self) -> None:
        queued = []
        lk = self.client.lock_permit("room", lease=30, wait=5, on_queued=lambda: queued.append(1))
        with lk as token:
            self.assertEqual((token, lk.slot, lk.permit, lk.fence_key), (101, 3, True, "room 3"))
            self.assertIsNone(self.fake.sent("RELEASE") or None)
        self.assertEqual(self.fake.sent("RELEASE"), ["RELEASE room 101"])
        self.assertEqual(lk.slot, 3)  # kept after release

    def test_queued_and_positions(self) -> None:
        # A waiting permit gets on_queued and on_position, as an acquire:
        # the PERMIT is the connection's second line (after the HELLO).
        self.fake.before_reply = lambda line: (
            ["! QUEUED 2 room", "! POSITION 2 3 - room", "! POSITION 2 1 4 room"] if line.startswith("PERMIT ") else []
        )
        queued, positions = [], []
        lk = self.client.lock_permit("room", lease=30, wait=5, on_queued=lambda: queued.append(1),
                                     on_position=positions.append)
        with lk:
            self.assertEqual(lk.slot, 3)
        self.assertEqual(queued, [1])
        self.assertEqual(positions, [ticketing.Position("room", 3, None), ticketing.Position("room", 1, 4)])

    def test_errors(self) -> None:
        self.fake.replies["PERMIT"] = "ERR not_semaphore room is no semaphore"
        with self.assertRaises(ticketing.NotSemaphoreError):
            self.client.acquire_permit("room", wait=0)
        with self.assertRaises(ticketing.NotSemaphoreError):
            with self.client.lock_permit("room", wait=0):
                self.fail("entered")
        self.fake.replies["PERMIT"] = "OK 5"  # a lock's grant: no slot
        with self.assertRaises(ticketing.ProtocolError):
            self.client.acquire_permit("room", wait=0)
        self.fake.replies["PERMITS"] = "ERR in_use room is held as a lock"
        with self.assertRaises(ticketing.InUseError):
            self.client.set_permits("room", 2)
        self.fake.replies["PERMITS"] = "INDETERMINATE"
        with self.assertRaises(ticketing.IndeterminateError):
            self.client.set_permits("room", 2)

    def test_version_7_sidecar(self) -> None:
        self.fake.version = 7
        with self.assertRaises(ticketing.NotSupportedError):
            self.client.acquire_permit("room", wait=0)
        with self.assertRaises(ticketing.NotSupportedError):
            self.client.set_permits("room", 1)
        self.assertEqual(self.fake.sent("PERMIT") + self.fake.sent("PERMITS"), [])


class AsyncFake(unittest.TestCase):
    def test_async(self) -> None:
        fake = PermitSidecar()

        async def body() -> None:
            async with AsyncClient(fake.path) as c:
                await c.set_permits("room", 2)
                self.assertEqual(await c.acquire_permit("room", wait=0), ticketing.Permit("room", 101, 3))
                lk = c.lock_permit("room", lease=30, wait=0)
                async with lk as token:
                    self.assertEqual((token, lk.slot, lk.fence_key), (102, 3, "room 3"))
                self.assertEqual(fake.sent("RELEASE"), ["RELEASE room 102"])
                fake.replies["PERMIT"] = "ERR not_semaphore x"
                with self.assertRaises(ticketing.NotSemaphoreError):
                    await c.acquire_permit("room", wait=0)

        try:
            asyncio.run(body())
        finally:
            fake.close()


class Real(unittest.TestCase):
    def setUp(self) -> None:
        assert cluster is not None
        self.key = f"py-{secrets.token_hex(4)}/room"
        self.clients: "list[ticketing.Client]" = []

    def tearDown(self) -> None:
        for c in self.clients:
            c.close()

    def client(self) -> ticketing.Client:
        assert cluster is not None
        c = ticketing.Client(cluster.socket)
        self.clients.append(c)
        return c

    def test_slots_hand_off_and_raise(self) -> None:
        k = self.key
        admin = self.client()
        admin.set_permits(k, 2)
        admin.set_permits(k, 2)  # idempotent
        a = self.client().acquire_permit(k, lease=30, wait=0)
        b_lock = self.client().lock_permit(k, lease=30, wait=0)
        b_token = b_lock.acquire()
        self.assertEqual({a.slot, b_lock.slot}, {0, 1})
        self.assertNotEqual(a.token, b_token)
        with self.assertRaises(ticketing.BusyError):
            self.client().acquire_permit(k, lease=30, wait=0)

        # The third waits; once queued, a's release hands it a's slot.
        queued = threading.Event()
        third = self.client().lock_permit(k, lease=30, wait=20, on_queued=queued.set)
        out: list = []
        t = threading.Thread(target=lambda: out.append(third.acquire()))
        t.start()
        self.assertTrue(queued.wait(WAIT * 4))
        self.clients[1].release(k, a.token)
        t.join(WAIT * 4)
        self.assertEqual(third.slot, a.slot)
        self.assertGreater(out[0], b_token)

        # A fourth waits until n is raised to 3: slot 2.
        queued4 = threading.Event()
        res: list = []
        c4 = self.client()
        t4 = threading.Thread(target=lambda: res.append(c4.acquire_permit(k, lease=30, wait=20, on_queued=queued4.set)))
        t4.start()
        self.assertTrue(queued4.wait(WAIT * 4))
        admin.set_permits(k, 3)
        t4.join(WAIT * 4)
        self.assertEqual(res[0].slot, 2)

        # Mismatches.
        with self.assertRaises(ticketing.IsSemaphoreError):
            admin.acquire(k, lease=30, wait=0)
        plain = k + "-plain"
        with self.assertRaises(ticketing.NotSemaphoreError):
            admin.acquire_permit(plain, wait=0)
        admin.acquire(plain, lease=30, wait=0)
        with self.assertRaises(ticketing.InUseError):
            admin.set_permits(plain, 2)
        with self.assertRaises(ticketing.InUseError):
            admin.set_permits(k, 0)
        b_lock.release()
        third.release()
        c4.release(k, res[0].token)
        admin.set_permits(k, 0)
        with self.assertRaises(ticketing.NotSemaphoreError):
            admin.acquire_permit(k, wait=0)

    def test_lock_permit_releases_on_exit(self) -> None:
        k = self.key
        self.client().set_permits(k, 1)
        c = self.client()
        lk = c.lock_permit(k, lease=30, wait=0)
        with lk:
            self.assertEqual(lk.slot, 0)
            with self.assertRaises(ticketing.BusyError):
                self.client().acquire_permit(k, wait=0)
        self.assertEqual(self.client().acquire_permit(k, wait=0).slot, 0)

    def test_permit_and_lock_named_like_its_slot_fence_apart(self) -> None:
        # The lock "<k>#0" and slot 0 of the semaphore <k> are independent
        # holdings with their own tokens; each writes through the fence
        # helpers on SQLite, the newer token first, and neither live holder
        # is refused (under "<key>#<slot>" they shared one fence row).
        k = self.key
        c = self.client()
        c.set_permits(k, 2)
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        conn = sqlite3.connect(os.path.join(tmp.name, "fence.db"), isolation_level=None)
        self.addCleanup(conn.close)
        schema = os.path.join(os.path.dirname(__file__), "..", "..", "schema", "fence.sqlite.sql")
        with open(schema) as fh:
            conn.executescript(fh.read())
        permit, lock = c.lock_permit(k, lease=30, wait=0), c.lock(k + "#0", lease=30, wait=0)
        with permit as permit_token, lock as lock_token:
            self.assertEqual(permit.slot, 0)
            # The newer token writes first: on one shared row the older
            # live holder would be refused.
            order = sorted([(permit_token, permit), (lock_token, lock)], key=lambda w: -w[0])
            for token, lk in order:
                if lk is permit:
                    cm = fence.fenced_permit(conn, c, permit)
                else:
                    cm = fence.fenced(conn, c, lk.fence_key, token)
                with cm:
                    pass
            f = fence.Fence.for_connection(conn)
            cur = conn.cursor()
            domain = c.domain()
            self.assertEqual(f.high_water(cur, domain, k + " 0"), permit_token)
            self.assertEqual(f.high_water(cur, domain, k + "#0"), lock_token)
            self.assertEqual((permit.fence_key, lock.fence_key), (k + " 0", k + "#0"))

    def test_async_real(self) -> None:
        assert cluster is not None
        k = self.key
        sock = cluster.socket

        async def body() -> None:
            async with AsyncClient(sock) as admin, AsyncClient(sock) as c:
                await admin.set_permits(k, 2)
                lk = c.lock_permit(k, lease=30, wait=0)
                async with lk:
                    other = await admin.acquire_permit(k, wait=0)
                    self.assertEqual({lk.slot, other.slot}, {0, 1})
                    with self.assertRaises(ticketing.BusyError):
                        await admin.acquire_permit(k, wait=0)
                # Released on exit: its slot is free again.
                self.assertEqual((await c.acquire_permit(k, wait=0)).slot, lk.slot)

        asyncio.run(body())


if __name__ == "__main__":
    unittest.main()
