"""Start and stop a real ``ticketing dev`` cluster (3 nodes + sidecar) for tests.

The binary is ``$TICKETING_BIN``; if unset it is built once per process with
``go build -o <tmp>/ticketing ./cmd/ticketing`` from the repository root.
"""

from __future__ import annotations

import atexit
import collections
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Deque, Optional

REPO_ROOT = Path(__file__).resolve().parents[3]
READY_TIMEOUT = 60.0
SIDECAR_TIMEOUT = 15.0

_built: Optional[str] = None


def ticketing_binary() -> str:
    """Path of the ticketing binary: $TICKETING_BIN, else a fresh build."""
    global _built
    env = os.environ.get("TICKETING_BIN")
    if env:
        return env
    if _built is None:
        out = tempfile.mkdtemp(prefix="tk-bin-")
        atexit.register(shutil.rmtree, out, True)
        binary = os.path.join(out, "ticketing")
        subprocess.run(["go", "build", "-o", binary, "./cmd/ticketing"], cwd=REPO_ROOT, check=True)
        _built = binary
    return _built


class DevCluster:
    """A running ``ticketing dev``; :attr:`socket` is the sidecar's path."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="tk-py-")
        self.socket = os.path.join(self.dir, "s.sock")
        self._output: Deque[str] = collections.deque(maxlen=200)
        self._pump: Optional[threading.Thread] = None
        self._stderr = open(os.path.join(self.dir, "dev.stderr"), "w+b")
        self._start()

    def _start(self) -> None:
        self.proc = subprocess.Popen(
            [ticketing_binary(), "dev", "--base-port", "0", "--dir", os.path.join(self.dir, "data"),
             "--socket", self.socket],
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        try:
            self._wait_ready()
            self._wait_sidecar()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        ready = threading.Event()

        def pump() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                line = line.rstrip("\n")
                self._output.append(line)
                if line.strip().startswith("sidecar socket:"):
                    self.socket = line.split(":", 1)[1].strip()
                if "ready" in line:
                    ready.set()
            ready.set()  # exited

        self._pump = threading.Thread(target=pump, daemon=True)
        self._pump.start()
        if not ready.wait(READY_TIMEOUT) or self.proc.poll() is not None:
            raise RuntimeError("ticketing dev did not become ready:\n" + self.log())

    def _wait_sidecar(self) -> None:
        deadline = time.monotonic() + SIDECAR_TIMEOUT
        last: Optional[Exception] = None
        while time.monotonic() < deadline:
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.settimeout(2)
                    s.connect(self.socket)
                    # Ready once it knows a leader (INFO names one).
                    s.sendall(b"INFO\n")
                    reply = s.makefile("rb").readline()
                    if reply.startswith(b"INFO ") and b" leader=- " not in reply:
                        return
            except OSError as e:
                last = e
            time.sleep(0.05)
        raise RuntimeError(
            f"no sidecar answered INFO with a leader on {self.socket} ({last}); does this ticketing build run "
            f"the sidecar in `dev --socket`?\n" + self.log()
        )

    def log(self) -> str:
        """The dev command's recent stdout and stderr, for failure messages."""
        self._stderr.flush()
        self._stderr.seek(0)
        err = self._stderr.read().decode("utf-8", "replace")[-4000:]
        return "--- stdout\n" + "\n".join(self._output) + "\n--- stderr\n" + err

    def restart(self) -> None:
        """Stop the process as Ctrl-C does and start it again on the same
        socket with the same cluster state (``--dir``), as an operator
        restarting the sidecar would; return once it is ready again."""
        self._halt()
        self._start()

    def _halt(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._pump is not None:
            self._pump.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def stop(self) -> None:
        """SIGINT, as Ctrl-C would; kill if it does not stop in time."""
        self._halt()
        self._stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)
