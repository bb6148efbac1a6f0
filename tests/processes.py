"""Server processes that the tests start, wait for and stop by PID.

A `ServerProcess` is what the test servers (`tests.servers`,
`tests.prometheus`, `tests.netns`) have in common. `launch(command)` starts
the command with stdin from /dev/null and its output appended to the
server's `log_path`, in a session of its own (a Ctrl-C of the test run
reaches only the tests, which then stop their servers in order), and polls
`ready()` until it is true; if the process exits first, or `start_timeout`
passes, it is stopped and `error` raised with the end of its log. `stop()`
sends `stop_signal`, waits up to `stop_timeout`, then SIGKILLs the
process's group (`stop_process`). Only the process that made the object
stops the server: a forked child inherits the object, not the server.

Nothing is ever stopped by name: a process is signalled by PID while it is
still unreaped, so that its PID cannot have been reused.

This module imports nothing from Django: `tests.servers` uses it before
Django is configured.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


class ServerProcess:
    """A server process that this process starts, waits for and stops by PID.

    A subclass names its `log_path` and what it is (`where`, for messages),
    says when the server answers (`ready()`) and may change the class
    attributes below.
    """

    start_timeout = 30.0
    stop_timeout = 10.0
    poll_interval = 0.1
    stop_signal = signal.SIGTERM
    error = RuntimeError  # raised when the server exits or is not ready in time

    log_path: Path
    where = "server"

    def __init__(self):
        self.process: subprocess.Popen | None = None
        self._owner_pid = os.getpid()

    @property
    def pid(self) -> int | None:
        """PID of the running server process, None when it is stopped."""
        if self.process is None or self.process.poll() is not None:
            return None
        return self.process.pid

    def owned_here(self) -> bool:
        """Whether this process made the server (a forked child did not)."""
        return os.getpid() == self._owner_pid

    def ready(self) -> bool:
        """Whether the server answers; asked while it runs."""
        raise NotImplementedError

    def launch(self, command, **popen) -> None:
        """Start command (unless the server runs) and return once `ready()`
        is true. `popen` adds to or overrides Popen's arguments."""
        if self.pid is not None:
            return
        with open(self.log_path, "ab") as log:
            options = {
                "stdin": subprocess.DEVNULL,
                "stdout": log,
                "stderr": log,
                "start_new_session": True,
                **popen,
            }
            self.process = subprocess.Popen([str(c) for c in command], **options)
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the server by PID: `stop_signal`, wait up to `stop_timeout`,
        then SIGKILL its group. Idempotent."""
        if self.process is None or not self.owned_here():
            return
        stop_process(self.process, self.stop_signal, self.stop_timeout)
        self.process = None

    def check_alive(self) -> None:
        """Raise `error` if the server process has exited (or never started)."""
        status = self.process.poll() if self.process is not None else "never started"
        if status is not None:
            raise self.error(self.failure(f"exited with status {status}"))

    def failure(self, what: str) -> str:
        """A message saying that the server did `what`, with the end of its log."""
        return f"{self.where} {what}; log {self.log_path}:\n{tail(self.log_path)}"

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            self.check_alive()
            # Alive after the answer too: what answered was this server, not another on its port.
            if self.ready() and self.process.poll() is None:
                return
            time.sleep(self.poll_interval)
        raise self.error(self.failure(f"not ready after {self.start_timeout:.0f} s"))


def stop_process(process: subprocess.Popen, sig=signal.SIGTERM, timeout: float = 10.0) -> None:
    """Send sig to process by PID; after timeout seconds SIGKILL its group
    (the whole group, so that no child keeps its files busy), while it is
    still unreaped."""
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_group(process.pid)
            process.wait()


def kill_group(pid: int) -> None:
    """SIGKILL the process group that pid leads; pid alone if it leads none."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def tail(path: Path, lines: int = 20) -> str:
    """The last lines of a log file, or "(no log)"."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
