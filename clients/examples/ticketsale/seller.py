#!/usr/bin/env python3
"""One event server of the ticket-sale example, in Python.

Sells blocks of 1-4 adjacent seats of one event through the local Ticketing
sidecar until it is sold out: an unlocked read of the inventory -> pick a run
of adjacent free seats -> acquire them as one block (one key per seat, one
token) -> fenced write of the whole block (every seat key's fence and the
seats in one transaction) -> release. Prints one line per sale attempt on
stdout, like the Go seller (see seller.go): ``SOLD <token> <sale> <seats>``,
``STALE ...``, ``ABORTED ...``, ``TAKEN ...`` (a seat was sold meanwhile:
picking again), ``PAUSE ...``, ``SOLDOUT``; it starts selling when a line (``GO``) arrives on
stdin, after printing ``READY``; after a ``PAUSE`` it goes on at the next line
(``CONT``).

The block's lock object tells when the lock is lost (the sidecar's ``! LOST``
event, or the local validity deadline: send time + lease − margin): a sale
whose lock is lost before the fenced write is aborted without writing and
reported ``ABORTED``, with the reason on stderr. The fence still guards the
window between that check and the write (``STALE``); ``--ignore-lost`` makes
the chaos pause skip the check on purpose, so that the fence has to.

Needs ``clients/python`` on PYTHONPATH. The database is an SQLite file
(sqlite3, WAL, busy timeout) or a postgres:// URL (psycopg or psycopg2).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sqlite3
import sys
import time

import ticketing
from ticketing import fence


RETRYABLE = (ticketing.LockTimeoutError, ticketing.BusyError, ticketing.IndeterminateError)
RETRYABLE_CODES = ("moved", "unavailable", "no_quorum")


class SeatTaken(Exception):
    """A seat of the block was sold meanwhile, between the unlocked inventory
    read and the lock, by an earlier holder; the sale is rolled back and
    another block picked."""


def seat_key(event: str, seat: int) -> str:
    """The lock key (and fence key) of one seat."""
    return f"seat/{event}/{seat}"


def pick_block(free: list, want: int) -> list:
    """A run of *want* adjacent seats among *free* (ascending), or of fewer
    when no run is that long, chosen at random among all that fit."""
    for k in range(min(want, len(free)), 1, -1):
        starts = [i for i in range(len(free) - k + 1) if free[i + k - 1] - free[i] == k - 1]
        if starts:
            i = random.choice(starts)
            return free[i : i + k]
    return [random.choice(free)]


def connect(db: str):
    if db.startswith(("postgres://", "postgresql://")):
        try:
            import psycopg as driver  # type: ignore
        except ImportError:
            import psycopg2 as driver  # type: ignore
        return driver.connect(db), "%s"
    conn = sqlite3.connect(db.removeprefix("sqlite:"), timeout=10, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn, "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", default=os.environ.get("TICKETING_SOCKET"))
    ap.add_argument("--db", required=True)
    ap.add_argument("--event", required=True)
    ap.add_argument("--domain", required=True, help="fencing domain: the sidecar's INFO domain= (not its cluster id)")
    ap.add_argument("--name", default="python")
    ap.add_argument("--lease", type=int, default=3)
    ap.add_argument("--max", type=int, default=4)
    ap.add_argument("--pause-at", type=int, default=0)
    ap.add_argument("--ignore-lost", action="store_true",
                    help="chaos: after the pause, write without checking the lost signal, so that the fence has to reject it")
    a = ap.parse_args()

    conn, p = connect(a.db)
    client = ticketing.Client(a.socket)
    attempts = 0
    paused = False
    client.ping()
    # Start together: READY, then wait for the runner's GO on stdin.
    print("READY", flush=True)
    if not sys.stdin.readline():
        raise SystemExit("stdin closed before GO")

    def emit(line: str) -> None:
        print(line, flush=True)

    def query(sql: str, args: tuple) -> list:
        cur = conn.cursor()
        cur.execute(sql, args)
        rows = cur.fetchall()
        cur.close()
        if p == "%s":
            conn.rollback()  # end psycopg's implicit read transaction
        return rows

    def free_seats() -> list:
        # The unlocked read of the inventory.
        return [r[0] for r in query(f"SELECT seat FROM ticketsale_seats WHERE event = {p} AND buyer IS NULL ORDER BY seat", (a.event,))]

    def all_free(seats: list) -> bool:
        return all(
            query(f"SELECT count(*) FROM ticketsale_seats WHERE event = {p} AND seat = {p} AND buyer IS NULL", (a.event, s))[0][0] == 1
            for s in seats
        )

    try:
        while True:
            free = free_seats()
            if not free:
                emit("SOLDOUT")
                return 0
            seats = pick_block(free, random.randint(1, a.max))
            keys = [seat_key(a.event, s) for s in seats]
            lock = client.lock_block(keys, lease=a.lease, wait=30)  # one seat: a plain acquire
            try:
                token = lock.acquire()
            except ticketing.TicketingError as e:
                # Not (known to be) acquired: never enter the critical section.
                # Busy, timeout, indeterminate (the lease ends any holding),
                # and, during a leader change, moved / unavailable / no_quorum
                # (not executed) may be tried again.
                if not isinstance(e, RETRYABLE) and getattr(e, "code", "") not in RETRYABLE_CODES:
                    raise
                if not isinstance(e, ticketing.LockTimeoutError):
                    print(f"{a.name}: acquire: {e!r}; trying again", file=sys.stderr)
                time.sleep(0.1)
                continue
            try:
                attempts += 1
                sale = f"{a.name}#{attempts}"
                line = f"{token} {sale} {','.join(map(str, seats))}"
                paused_now = False
                if a.pause_at and not paused and attempts >= a.pause_at and all_free(seats):
                    # Chaos: stall holding the block, past the lease, with its
                    # seats still free (checked under the lock): the runner
                    # takes them over once the lease has run out.
                    paused = paused_now = True
                    emit(f"PAUSE {line}")
                    os.kill(os.getpid(), signal.SIGSTOP)
                    # Go on only at the runner's CONT: nothing may start
                    # before the stop has really happened.
                    if not sys.stdin.readline():
                        raise SystemExit("stdin closed before CONT")
                # A chaos seller told to ignore the signal skips this check
                # after its pause, on purpose: it stands for one that stalls
                # right after the check, which only the fence can stop.
                ignore = paused_now and a.ignore_lost
                if not ignore and (lock.lost.is_set() or lock.remaining() == 0):
                    # The lost signal: abort before the fence has to. (After
                    # a stall the timer may not have run yet; remaining()
                    # sees the passed deadline and fires the signal.)
                    print(f"{a.name}: {sale}: lock lost ({lock.lost_reason}) before the fenced write; sale aborted",
                          file=sys.stderr)
                    emit(f"ABORTED {line}")
                    continue
                enc = fence.encode_token(token)
                try:
                    # The fenced write: every seat key's fence first (sorted,
                    # one token), then the seats, one transaction.
                    with fence.fenced_block(conn, a.domain, keys, token) as cur:
                        for seat in seats:
                            cur.execute(
                                f"UPDATE ticketsale_seats SET buyer = {p}, token = {p} "
                                f"WHERE event = {p} AND seat = {p} AND buyer IS NULL",
                                (sale, enc, a.event, seat),
                            )
                            if cur.rowcount != 1:
                                raise SeatTaken(seat)
                            cur.execute(
                                "INSERT INTO ticketsale_ledger (event, sale, seat, size, seller, token) "
                                f"VALUES ({p}, {p}, {p}, {p}, {p}, {p})",
                                (a.event, sale, seat, len(seats), a.name, enc),
                            )
                        cur.execute(
                            f"UPDATE ticketsale_events SET remaining = remaining - {p} WHERE event = {p}",
                            (len(seats), a.event),
                        )
                except fence.StaleTokenError:
                    emit(f"STALE {line}")
                    continue
                except SeatTaken:
                    emit(f"TAKEN {line}")
                    continue
                emit(f"SOLD {line}")
            finally:
                try:
                    lock.release()  # any key releases the whole block; sent even after a loss
                except ticketing.TicketingError as e:
                    # not_held / token_mismatch after a stale write: expected.
                    # Otherwise the lease is the safety net; keep selling.
                    if e.code not in ("not_held", "token_mismatch"):
                        print(f"{a.name}: release {token}: {e!r}", file=sys.stderr)
    finally:
        client.close()
        conn.close()


if __name__ == "__main__":
    sys.exit(main())
