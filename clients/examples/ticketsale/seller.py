#!/usr/bin/env python3
"""One event server of the ticket-sale example, in Python.

Sells seats of one event through the local Ticketing sidecar until it is sold
out: acquire the event's key -> read the inventory -> allocate seats ->
fenced write (the fence and the seats in one transaction) -> release. Prints
one line per sale on stdout, like the Go seller (see seller.go):
``SOLD <token> <seats>``, ``STALE <token> <seats>``, ``PAUSE <token>``,
``SOLDOUT``; it starts selling when a line (``GO``) arrives on stdin, after
printing ``READY``; after a ``PAUSE`` it goes on at the next line (``CONT``).

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
    """A seat allocated under the lock was sold meanwhile (only possible when
    two stale holders interleave); the sale is rolled back and tried again."""


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
    ap.add_argument("--domain", required=True, help="fencing domain: the cluster id")
    ap.add_argument("--name", default="python")
    ap.add_argument("--lease", type=int, default=3)
    ap.add_argument("--max", type=int, default=3)
    ap.add_argument("--pause-at", type=int, default=0)
    a = ap.parse_args()

    conn, p = connect(a.db)
    key = f"event/{a.event}"
    client = ticketing.Client(a.socket)
    sales = 0
    client.ping()
    # Start together: READY, then wait for the runner's GO on stdin.
    print("READY", flush=True)
    if not sys.stdin.readline():
        raise SystemExit("stdin closed before GO")

    def emit(line: str) -> None:
        print(line, flush=True)

    def read_free(want: int) -> list:
        cur = conn.cursor()
        cur.execute(
            f"SELECT seat FROM ticketsale_seats WHERE event = {p} AND buyer IS NULL ORDER BY seat LIMIT {p}",
            (a.event, want),
        )
        seats = [r[0] for r in cur.fetchall()]
        cur.close()
        if p == "%s":
            conn.rollback()  # end psycopg's implicit read transaction
        return seats

    try:
        while True:
            try:
                token = client.acquire(key, lease=a.lease, wait=30)
            except ticketing.TicketingError as e:
                # Not (known to be) acquired: never enter the critical section.
                # Busy, timeout, indeterminate (the lease ends any holding),
                # and, during a leader change, moved / unavailable / no_quorum
                # (not executed) may be tried again.
                if not isinstance(e, RETRYABLE) and getattr(e, "code", "") not in RETRYABLE_CODES:
                    raise
                print(f"{a.name}: acquire: {e!r}; trying again", file=sys.stderr)
                time.sleep(0.1)
                continue
            try:
                seats = read_free(random.randint(1, a.max))  # read the inventory, allocate
                if not seats:
                    emit("SOLDOUT")
                    return 0
                sales += 1
                if sales == a.pause_at:
                    # Chaos: stall while holding the lock, past the lease.
                    emit(f"PAUSE {token}")
                    os.kill(os.getpid(), signal.SIGSTOP)
                    # Go on only at the runner's CONT: nothing may start
                    # before the stop has really happened.
                    if not sys.stdin.readline():
                        raise SystemExit("stdin closed before CONT")
                buyer = f"{a.name}#{sales}"
                enc = fence.encode_token(token)
                listing = ",".join(map(str, seats))
                try:
                    # The fenced write: fence first, then the seats, one transaction.
                    with fence.fenced(conn, a.domain, key, token) as cur:
                        for seat in seats:
                            cur.execute(
                                f"UPDATE ticketsale_seats SET buyer = {p}, token = {p} "
                                f"WHERE event = {p} AND seat = {p} AND buyer IS NULL",
                                (buyer, enc, a.event, seat),
                            )
                            if cur.rowcount != 1:
                                raise SeatTaken(seat)
                            cur.execute(
                                "INSERT INTO ticketsale_sales (event, seat, buyer, seller, token) "
                                f"VALUES ({p}, {p}, {p}, {p}, {p})",
                                (a.event, seat, buyer, a.name, enc),
                            )
                        cur.execute(
                            f"UPDATE ticketsale_events SET remaining = remaining - {p} WHERE event = {p}",
                            (len(seats), a.event),
                        )
                except fence.StaleTokenError:
                    emit(f"STALE {token} {listing}")
                    continue
                except SeatTaken as e:
                    print(f"{a.name}: token {token}: seat {e} taken meanwhile; selling again", file=sys.stderr)
                    continue
                emit(f"SOLD {token} {listing}")
            finally:
                try:
                    client.release(key, token)
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
