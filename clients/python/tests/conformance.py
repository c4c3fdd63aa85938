"""Runner of the shared behavioural suite, clients/conformance/scenarios.json.

The runner is written once with asyncio; :class:`SyncAdapter` drives the
blocking :class:`ticketing.Client` from worker threads (so background steps
really block concurrently) and :class:`AsyncAdapter` drives
:class:`ticketing.AsyncClient`. The format is described in
clients/conformance/README.md.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import signal
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import ticketing

SCENARIOS_FILE = Path(__file__).resolve().parents[2] / "conformance" / "scenarios.json"
AWAIT_LIMIT = 30.0  # seconds; no scenario should ever wait this long
# HANG_GUARD bounds a wait (await_lost, expect_closed) only so that a broken
# library fails instead of hanging: no scenario relies on it for speed.
HANG_GUARD = 30


def load_scenarios() -> List[Dict[str, Any]]:
    with open(SCENARIOS_FILE, encoding="utf-8") as f:
        doc = json.load(f)
    if doc.get("format") != 1:
        raise ValueError(f"{SCENARIOS_FILE}: unsupported format {doc.get('format')!r}")
    return doc["scenarios"]


@dataclass
class Outcome:
    """What a step produced, in the suite's vocabulary."""

    kind: str  # ok busy timeout indeterminate error arg_error lost pong info held reply connection_error
    token: Optional[int] = None
    lock: Any = None  # a lock object (ops lock, lock_block)
    code: Optional[str] = None
    reply: Optional[str] = None
    info: Optional[ticketing.Info] = None
    held: List[Tuple[str, int]] = field(default_factory=list)
    #: held_locks()'s entries, when the held step names labels.
    held_locks: Optional[List[ticketing.HeldLock]] = None
    #: A permit's slot (acquire_permit), else None.
    slot: Optional[int] = None
    detail: str = ""

    def __str__(self) -> str:
        extra = {k: v for k, v in (("token", self.token), ("code", self.code), ("reply", self.reply)) if v is not None}
        return f"{self.kind} {extra or ''} {self.detail}".strip()


def classify_reply(line: str) -> Outcome:
    """Map a raw reply line to an Outcome."""
    if line == "PONG":
        return Outcome("pong", reply=line)
    if line == "OK":
        return Outcome("ok", reply=line)
    m = re.fullmatch(r"OK (\d+)", line)
    if m:
        return Outcome("ok", token=int(m.group(1)), reply=line)
    if line in ("BUSY", "TIMEOUT", "INDETERMINATE"):
        return Outcome(line.lower(), reply=line)
    if line.startswith("ERR"):
        parts = line.split(" ", 2)
        return Outcome("error", code=parts[1] if len(parts) > 1 else "", reply=line)
    if line.startswith("INFO"):
        return Outcome("info", info=ticketing._protocol.parse_info(line), reply=line)
    if line.startswith("HELD"):
        return Outcome("held", held=ticketing._protocol.parse_held(line), reply=line)
    return Outcome("reply", reply=line)


def classify_exception(e: BaseException) -> Outcome:
    """Map a client exception to an Outcome (argument errors first)."""
    if isinstance(e, ticketing.TicketingError):
        if isinstance(e, ticketing.LockLostError):
            return Outcome("lost", detail=str(e))
        if isinstance(e, ticketing.BusyError):
            return Outcome("busy")
        if isinstance(e, ticketing.LockTimeoutError):
            return Outcome("timeout")
        if isinstance(e, ticketing.IndeterminateError):
            return Outcome("indeterminate", detail=str(e))
        if isinstance(e, ticketing.ServerError):
            return Outcome("error", code=e.code, detail=e.message)
        if isinstance(e, ticketing.SidecarConnectionError):
            return Outcome("connection_error", detail=str(e))
        return Outcome("protocol_error", detail=str(e))
    if isinstance(e, (ValueError, TypeError)):
        return Outcome("arg_error", detail=f"{type(e).__name__}: {e}")
    raise e


class SyncAdapter:
    """Drives :class:`ticketing.Client` from threads."""

    name = "sync"

    def __init__(self, path: str) -> None:
        self.path = path
        self.pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="conformance")

    def new(self, path: Optional[str] = None) -> ticketing.Client:
        return ticketing.Client(self.path if path is None else path)

    async def call(self, client: ticketing.Client, method: str, *args: Any, **kwargs: Any) -> Any:
        fn: Callable[..., Any] = getattr(client, method)
        return await asyncio.get_running_loop().run_in_executor(self.pool, lambda: fn(*args, **kwargs))

    def queued_hook(self, event: asyncio.Event) -> Callable[[], None]:
        """An on_queued callback setting *event*: it runs on the client's
        reader thread, so it hands the set to the loop (scheduled before the
        acquire's own completion, which comes later through the executor)."""
        loop = asyncio.get_running_loop()
        return lambda: loop.call_soon_threadsafe(event.set)

    async def close(self, client: ticketing.Client) -> None:
        await asyncio.get_running_loop().run_in_executor(self.pool, client.close)

    async def lock_call(self, lock: ticketing.Lock, method: str, *args: Any) -> Any:
        fn: Callable[..., Any] = getattr(lock, method)
        return await asyncio.get_running_loop().run_in_executor(self.pool, lambda: fn(*args))

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False)


class AsyncAdapter:
    """Drives :class:`ticketing.AsyncClient`."""

    name = "async"

    def __init__(self, path: str) -> None:
        self.path = path

    def new(self, path: Optional[str] = None) -> ticketing.AsyncClient:
        return ticketing.AsyncClient(self.path if path is None else path)

    async def call(self, client: ticketing.AsyncClient, method: str, *args: Any, **kwargs: Any) -> Any:
        return await getattr(client, method)(*args, **kwargs)

    def queued_hook(self, event: asyncio.Event) -> Callable[[], None]:
        """An on_queued callback setting *event* (it runs in the loop)."""
        return event.set

    async def close(self, client: ticketing.AsyncClient) -> None:
        await client.close()

    async def lock_call(self, lock: ticketing.AsyncLock, method: str, *args: Any) -> Any:
        return await getattr(lock, method)(*args)

    def shutdown(self) -> None:
        pass


class ScenarioFailure(AssertionError):
    pass


class Runner:
    """Runs one scenario with one adapter."""

    def __init__(
        self,
        adapter: Any,
        scenario: Dict[str, Any],
        index: int,
        prefix: str,
        restart: Optional[Callable[[], None]] = None,
    ) -> None:
        self.adapter = adapter
        # Restarts the sidecar (op restart_sidecar), blocking until it is ready.
        self.restart = restart
        self.scenario = scenario
        self.namespace = f"{prefix}/{index}/"
        self.key_opts: Dict[str, Dict[str, Any]] = scenario.get("keys", {})
        self.conns: Dict[str, Any] = {}
        self.tokens: Dict[str, int] = {}
        self.slots: Dict[str, Optional[int]] = {}  # the slot of each saved permit (slot_of)
        self.locks: Dict[str, Any] = {}
        # When the call that took or last extended each saved lock began
        # (time.monotonic()): its local deadline counts from a send no
        # earlier than that.
        self.since: Dict[str, float] = {}
        self.background: Dict[str, "asyncio.Task[tuple]"] = {}
        # Set by the on_queued hook of the background acquire of that id.
        self.queued: Dict[str, asyncio.Event] = {}

    # -- resolution ----------------------------------------------------------

    def key(self, name: str) -> str:
        k = self.namespace + name
        pad = self.key_opts.get(name, {}).get("pad_to")
        return k + "x" * (pad - len(k)) if pad else k

    def step_key(self, step: Dict[str, Any]) -> str:
        return step["literal_key"] if "literal_key" in step else self.key(step["key"])

    def step_token(self, step: Dict[str, Any]) -> Any:
        if "literal_token" in step:
            lit = step["literal_token"]
            return int(lit) if re.fullmatch(r"-?\d+", lit) else lit
        return self.tokens[step["token"]]

    def expand(self, line: str) -> str:
        def sub(m: "re.Match[str]") -> str:
            kind, name = m.group(1), m.group(2)
            return self.key(name) if kind == "key" else str(self.tokens[name])

        return re.sub(r"\$\{(key|token):([^}]+)\}", sub, line)

    def conn(self, name: str) -> Any:
        if name not in self.conns:
            self.conns[name] = self.adapter.new()
        return self.conns[name]

    # -- execution -------------------------------------------------------------

    async def perform(self, step: Dict[str, Any], on_queued: Optional[Callable[[], None]] = None) -> Outcome:
        """Run one request step; *on_queued* is attached to an acquire."""
        client = self.conn(step["conn"])
        op = step["op"]
        call = self.adapter.call
        label = step.get("label")  # the owner label option, None: none
        try:
            if op == "acquire":
                token = await call(
                    client, "acquire", self.step_key(step), step["lease"], step["wait"], on_queued=on_queued, label=label
                )
                return Outcome("ok", token=token)
            if op == "acquire_block":
                keys = [self.key(n) for n in step["block"]]
                token = await call(
                    client, "acquire_block", keys, step["lease"], step["wait"], on_queued=on_queued, label=label
                )
                return Outcome("ok", token=token)
            if op == "acquire_permit":
                permit = await call(
                    client, "acquire_permit", self.step_key(step), step["lease"], step["wait"], on_queued=on_queued,
                    label=label,
                )
                if permit.fence_key != ticketing.fence_key(self.step_key(step), permit.slot):
                    raise ScenarioFailure(f"permit {permit}: fence_key {permit.fence_key!r}")
                return Outcome("ok", token=permit.token, slot=permit.slot)
            if op == "set_permits":
                await call(client, "set_permits", self.step_key(step), step["permits"])
                return Outcome("ok")
            if op in ("lock", "lock_block"):
                if op == "lock":
                    lock = client.lock(self.step_key(step), step["lease"], step["wait"], on_queued=on_queued, label=label)
                else:
                    keys = [self.key(n) for n in step["block"]]
                    lock = client.lock_block(keys, step["lease"], step["wait"], on_queued=on_queued, label=label)
                token = await self.adapter.lock_call(lock, "acquire")
                return Outcome("ok", token=token, lock=lock)
            if op == "extend":
                begun = time.monotonic()
                await self.adapter.lock_call(self.locks[step["lock"]], "extend", step["lease"])
                self.since[step["lock"]] = begun
                return Outcome("ok")
            if op == "release":
                await call(client, "release", self.step_key(step), self.step_token(step))
                return Outcome("ok")
            if op == "ping":
                await call(client, "ping")
                return Outcome("pong")
            if op == "info":
                info = await call(client, "info")
                # The raw line, on the same connection, for info_same_as_raw.
                return Outcome("info", info=info, reply=await call(client, "raw", "INFO"))
            if op == "held":
                out = Outcome("held", held=await call(client, "held"))
                if "labels" in step:
                    out.held_locks = await call(client, "held_locks")
                return out
            if op == "raw":
                line = self.expand(step["line"])
                if "pad_to" in step:
                    line += "x" * (step["pad_to"] - len(line))
                return classify_reply(await call(client, "raw", line))
        except Exception as e:  # noqa: BLE001 - classified below
            return classify_exception(e)
        raise ScenarioFailure(f"unknown op {op!r}")

    async def timed(self, step: Dict[str, Any], on_queued: Optional[Callable[[], None]] = None) -> tuple:
        t0 = time.monotonic()
        out = await self.perform(step, on_queued)
        return out, time.monotonic() - t0

    def check(self, step: Dict[str, Any], out: Outcome, elapsed: float) -> None:
        # expect is a kind or a list of kinds; code applies to an error.
        want = step.get("expect")
        wants = want if isinstance(want, list) else [want]
        if want is not None and out.kind not in wants:
            raise ScenarioFailure(f"expected {' or '.join(wants)}, got {out}")
        if "code" in step and out.kind == "error":
            codes = step["code"] if isinstance(step["code"], list) else [step["code"]]
            if out.code not in codes:
                raise ScenarioFailure(f"expected error code {' or '.join(codes)}, got {out}")
        if "reply" in step and out.reply != step["reply"]:
            raise ScenarioFailure(f"expected reply {step['reply']!r}, got {out.reply!r}")
        if "slot" in step and out.slot != step["slot"]:
            raise ScenarioFailure(f"expected slot {step['slot']}, got {out.slot} ({out})")
        if "slot_of" in step and out.slot != self.slots[step["slot_of"]]:
            raise ScenarioFailure(f"expected {step['slot_of']}'s slot {self.slots[step['slot_of']]}, got {out.slot}")
        if "save" in step:
            if out.token is None:
                raise ScenarioFailure(f"no token to save in {out}")
            self.tokens[step["save"]] = out.token
            self.slots[step["save"]] = out.slot
            if out.lock is not None:
                self.locks[step["save"]] = out.lock
                self.since[step["save"]] = time.monotonic() - elapsed
        gt = step.get("expect_token_gt", [])
        for name in [gt] if isinstance(gt, str) else gt:
            if out.token is None or not out.token > self.tokens[name]:
                raise ScenarioFailure(f"expected a token > {name}={self.tokens[name]}, got {out.token}")
        if "min_seconds" in step and elapsed < step["min_seconds"]:
            raise ScenarioFailure(f"took {elapsed:.3f} s, expected at least {step['min_seconds']} s")
        if "max_seconds" in step and elapsed > step["max_seconds"]:
            raise ScenarioFailure(f"took {elapsed:.3f} s, expected at most {step['max_seconds']} s")
        if want == "held":
            keys = sorted(self.key(k) for k in step.get("keys", []))
            if sorted(k for k, _ in out.held) != keys:
                raise ScenarioFailure(f"expected held keys {keys}, got {out.held}")
            for k, t in step.get("tokens", {}).items():
                if (self.key(k), self.tokens[t]) not in out.held:
                    raise ScenarioFailure(f"expected {k} held under {t}={self.tokens[t]}, got {out.held}")
            if "labels" in step:
                self.check_labels(step, out)
        if "lock_label" in step:
            if out.lock is None:
                raise ScenarioFailure(f"lock_label on a step that made no lock: {out}")
            if out.lock.label != step["lock_label"]:
                raise ScenarioFailure(f"expected the lock's label {step['lock_label']!r}, got {out.lock.label!r}")
        if want == "info":
            self.check_info(step, out)

    def check_labels(self, step: Dict[str, Any], out: Outcome) -> None:
        """held_locks() lists what held() did, and each named key's label
        (None for none)."""
        hl = out.held_locks or []
        if [(h.key, h.token) for h in hl] != out.held:
            raise ScenarioFailure(f"held_locks {hl} does not match held {out.held}")
        got = {h.key: h.label for h in hl}
        for k, want in step["labels"].items():
            if self.key(k) not in got or got[self.key(k)] != want:
                raise ScenarioFailure(f"expected {k}'s label {want!r}, got {got}")

    def check_info(self, step: Dict[str, Any], out: Outcome) -> None:
        """The parsed Info is plausible; each field of info_same_as_raw equals
        the raw INFO line's (read right after it; ``-`` is None); each field
        of info_known is known (not None)."""
        info = out.info
        assert info is not None and out.reply is not None
        if not info.cluster or info.total < 1 or not 0 <= info.connected <= info.total:
            raise ScenarioFailure(f"implausible INFO {info}")
        raw: Dict[str, Any] = {}
        for w in out.reply.split(" ")[1:]:
            k, _, v = w.partition("=")
            raw[k] = None if v == "-" else v
        if raw.get("connected"):
            raw["connected"], raw["total"] = (int(x) for x in raw["connected"].split("/"))
        if raw.get("protocol") is not None:
            raw["protocol"] = int(raw["protocol"])
        for name in step.get("info_same_as_raw", []):
            if not hasattr(info, name):
                raise ScenarioFailure(f"Info has no field {name!r}: {info}")
            if getattr(info, name) != raw.get(name):
                raise ScenarioFailure(f"Info.{name} is {getattr(info, name)!r}, the raw INFO line's {raw.get(name)!r}")
        for name in step.get("info_known", []):
            if getattr(info, name, None) in (None, ""):
                raise ScenarioFailure(f"Info.{name} is not known: {info}")

    async def run(self) -> None:
        try:
            for i, step in enumerate(self.scenario["steps"]):
                try:
                    await self.run_step(step)
                except ScenarioFailure as e:
                    raise ScenarioFailure(
                        f"[{self.adapter.name}] {self.scenario['name']} step {i} {json.dumps(step)}: {e}"
                    ) from None
        finally:
            for task in self.background.values():
                task.cancel()
            for client in self.conns.values():
                await self.adapter.close(client)
            await asyncio.gather(*self.background.values(), return_exceptions=True)

    async def run_step(self, step: Dict[str, Any]) -> None:
        op = step["op"]
        if op == "sleep":
            await asyncio.sleep(step["seconds"])
        elif op == "pending":
            if self.background[step["id"]].done():
                out, _ = self.background[step["id"]].result()
                raise ScenarioFailure(f"expected still pending, but finished: {out}")
        elif op == "await":
            t0 = time.monotonic()
            try:
                out, _ = await asyncio.wait_for(asyncio.shield(self.background[step["id"]]), AWAIT_LIMIT)
            except asyncio.TimeoutError:
                raise ScenarioFailure(f"still pending after {AWAIT_LIMIT} s") from None
            self.check(step, out, time.monotonic() - t0)
        elif op == "expect_alive":
            lock = self.locks[step["lock"]]
            left = lock.remaining()
            if lock.lost.is_set():
                raise ScenarioFailure(f"lost ({lock.lost_reason}), expected alive")
            # remaining_min counts from the call that took or last extended
            # the lock, so a slow step in between cannot fail it.
            since = time.monotonic() - self.since[step["lock"]]
            if "remaining_min" in step and left + since < step["remaining_min"]:
                raise ScenarioFailure(
                    f"remaining {left:.3f} s {since:.3f} s after the lock's call began, "
                    f"expected at least {step['remaining_min']} s"
                )
            if "remaining_max" in step and left > step["remaining_max"]:
                raise ScenarioFailure(f"remaining {left:.3f} s, expected at most {step['remaining_max']} s")
        elif op == "await_lost":
            await self.await_lost(step)
        elif op == "await_queued":
            await self.await_queued(step["id"])
        elif op == "stall":
            await self.stall(step["seconds"])
        elif op == "restart_sidecar":
            if self.restart is None:
                raise ScenarioFailure("this runner cannot restart the sidecar")
            await asyncio.get_running_loop().run_in_executor(None, self.restart)
        elif op == "connect_default":
            t0 = time.monotonic()
            out = await self.connect_default(step)
            self.check(step, out, time.monotonic() - t0)
        elif op == "close":
            client = self.conns.pop(step["conn"], None)
            if client is not None:
                await self.adapter.close(client)
        elif op == "expect_closed":
            client = self.conn(step["conn"])
            deadline = time.monotonic() + step.get("within", HANG_GUARD)
            while client.connected:
                if time.monotonic() > deadline:
                    raise ScenarioFailure(f"connection still open after {step.get('within', HANG_GUARD)} s")
                await asyncio.sleep(0.01)
        elif "background" in step:
            # The request must be written before the next step starts. A
            # block's ACQUIRE follows the connection's HELLO: agree the
            # version first, so the next request written is the ACQUIRE.
            client = self.conn(step["conn"])
            if op in ("acquire_block", "acquire_permit"):
                await self.adapter.call(client, "hello")
            # Every background request carries the queued hook (it is
            # called only for an acquire), for a later await_queued.
            queued = self.queued[step["background"]] = asyncio.Event()
            sent = client.requests_sent
            task = asyncio.ensure_future(self.timed(step, self.adapter.queued_hook(queued)))
            self.background[step["background"]] = task
            while client.requests_sent == sent and not task.done():
                await asyncio.sleep(0.001)
        else:
            out, elapsed = await self.timed(step)
            self.check(step, out, elapsed)


    async def connect_default(self, step: Dict[str, Any]) -> Outcome:
        """Open connection ``conn`` with the library's default socket path
        (``Client()``), with $TICKETING_SOCKET set to the sidecar's socket
        (env ``sidecar``), unset, or set to a path with no socket
        (``missing``), from a working directory whose ./ticketing.sock leads
        to the sidecar (``cwd_socket``) or that has none; then PING on it.
        The environment and the working directory are restored after."""
        env_name = ticketing._protocol.SOCKET_ENV
        old_env, old_cwd = os.environ.get(env_name), os.getcwd()
        with tempfile.TemporaryDirectory(prefix="tkc") as d:
            if step.get("cwd_socket"):
                os.symlink(self.adapter.path, os.path.join(d, "ticketing.sock"))
            env = step["env"]
            if env == "sidecar":
                os.environ[env_name] = self.adapter.path
            elif env == "unset":
                os.environ.pop(env_name, None)
            elif env == "missing":
                os.environ[env_name] = os.path.join(d, "missing.sock")
            else:
                raise ScenarioFailure(f"unknown env {env!r}")
            os.chdir(d)
            try:
                old = self.conns.pop(step["conn"], None)
                if old is not None:
                    await self.adapter.close(old)
                client = self.conns[step["conn"]] = self.adapter.new("")
                try:
                    await self.adapter.call(client, "ping")
                    return Outcome("pong")
                except Exception as e:  # noqa: BLE001 - classified
                    return classify_exception(e)
            finally:
                os.chdir(old_cwd)
                if old_env is None:
                    os.environ.pop(env_name, None)
                else:
                    os.environ[env_name] = old_env

    async def await_queued(self, bg: str) -> None:
        """Wait for the ``! QUEUED`` of background request *bg*: fails if
        its reply came without one, or after AWAIT_LIMIT (a hang guard)."""
        queued, task = self.queued[bg], self.background[bg]
        if queued.is_set():
            return
        waiter = asyncio.ensure_future(queued.wait())
        try:
            await asyncio.wait({waiter, task}, timeout=AWAIT_LIMIT, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if queued.is_set():
            return
        if task.done():
            out, _ = task.result()
            raise ScenarioFailure(f"{bg} finished without a QUEUED event: {out}")
        raise ScenarioFailure(f"no QUEUED event for {bg} after {AWAIT_LIMIT} s")

    async def await_lost(self, step: Dict[str, Any]) -> None:
        """Poll the lost signal (the Event is a threading.Event for the
        blocking client): passes once it is set with one of the reasons."""
        lock = self.locks[step["lock"]]
        want = step["reason"] if isinstance(step["reason"], list) else [step["reason"]]
        within = step.get("within", HANG_GUARD)
        t0 = time.monotonic()
        while not (lock.lost.is_set() and lock.lost_reason in want):
            if time.monotonic() - t0 > within:
                state = f"lost ({lock.lost_reason})" if lock.lost.is_set() else "not lost"
                raise ScenarioFailure(f"{state} after {within} s, expected lost with reason {' or '.join(want)}")
            await asyncio.sleep(0.005)
        # The bounds count from the call that took or last extended the lock.
        elapsed = time.monotonic() - self.since[step["lock"]]
        if "min_seconds" in step and elapsed < step["min_seconds"]:
            raise ScenarioFailure(f"lost {elapsed:.3f} s after the lock's call began, expected at least {step['min_seconds']} s")
        if "max_seconds" in step and elapsed > step["max_seconds"]:
            raise ScenarioFailure(f"lost after {elapsed:.3f} s, expected at most {step['max_seconds']} s")

    async def stall(self, seconds: float) -> None:
        """Stop this whole process (every thread, the event loop) with
        SIGSTOP, as a stalled holder would be; a child resumes it."""
        pid = os.getpid()
        child = subprocess.Popen(["sh", "-c", f"sleep {seconds}; kill -CONT {pid}"])
        try:
            os.kill(pid, signal.SIGSTOP)  # returns once SIGCONT came
        finally:
            child.wait()


def restarts(scenario: Dict[str, Any]) -> bool:
    """Whether the scenario restarts the sidecar (op restart_sidecar)."""
    return any(step["op"] == "restart_sidecar" for step in scenario["steps"])


def run_scenario(
    adapter_cls: Any,
    path: str,
    scenario: Dict[str, Any],
    index: int,
    restart: Optional[Callable[[], None]] = None,
) -> None:
    """Run one scenario to completion in a fresh event loop; raise on
    failure. *restart* restarts the sidecar at *path* (op restart_sidecar)."""
    prefix = f"conf-py-{adapter_cls.name}-{secrets.token_hex(4)}"
    adapter = adapter_cls(path)
    try:
        asyncio.run(Runner(adapter, scenario, index, prefix, restart).run())
    finally:
        adapter.shutdown()
