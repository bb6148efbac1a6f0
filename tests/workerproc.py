"""Worker subprocesses for the tests: `python -m django everystep_worker`,
configured like a user's, on the test database, with its log captured."""

import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests import postmortem, servers
from tests.helpers import database_url, session_url, wait_until

REPO = pathlib.Path(__file__).resolve().parent.parent


class WorkerProcess:
    """One ``everystep_worker`` process; its stderr goes to a log file."""

    def __init__(self, name, command, log_path, env, cwd=REPO, **popen):
        self.name = name
        self.log_path = log_path
        # A hang's stacks: see `dump_stacks`.
        env = {**env, "PYTHONFAULTHANDLER": "1"}
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                command,
                cwd=cwd,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                **popen,
            )
        self.pid = self.process.pid

    def log(self):
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, text, timeout=60.0):
        """Wait until the log contains `text`; fail early if the process exits."""

        def seen():
            if text in self.log():
                return True
            if self.process.poll() is not None:
                pytest.fail(
                    f"worker {self.name} exited ({self.process.returncode}) before logging "
                    f"{text!r}:\n{self.log()}"
                )
            return False

        wait_until(seen, timeout, message=f"{text!r} in the log of worker {self.name}")

    def wait_ready(self, timeout=60.0):
        self.wait_for_log("ready", timeout)
        return self

    def send(self, sig):
        self.process.send_signal(sig)

    def wait(self, timeout=60.0):
        """Wait for the process to exit and return its exit status."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            # The report shows its stacks and log (`tests.postmortem`).
            pytest.fail(f"worker {self.name} still running after {timeout}s")

    def dump_stacks(self):
        """End a process that hangs with SIGABRT, so that its log shows where
        each of its threads was (every process here runs with
        PYTHONFAULTHANDLER set; a shell that execs the worker passes it on)."""
        if self.alive():
            self.process.send_signal(signal.SIGABRT)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                pass

    def alive(self):
        return self.process.poll() is None

    def kill(self):
        if self.alive():
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)


def manage_py_environment(extra=None):
    """The environment of a ``manage.py everystep_worker`` on the test database."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVERYSTEP_")}
    for keep in ("EVERYSTEP_TEST_DB", *servers.ENV_VARS.values()):
        if keep in os.environ:
            env[keep] = os.environ[keep]
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        EVERYSTEP_DATABASE_URL=database_url(),
        PYTHONPATH=str(REPO),
        PYTHONUNBUFFERED="1",
    )
    if session_url():
        env["EVERYSTEP_SESSION_URL"] = session_url()
    env.update(extra or {})
    return env


@pytest.fixture
def spawn_process(tmp_path, request):
    """Start long-running processes (workers) with their output logged:
    ``spawn_process(name, command, env=..., cwd=...)``. Every one still
    alive at the end of the test is killed by its PID; a failed test's
    report shows their logs (`tests.postmortem`)."""
    started = request.node.stash[postmortem.STARTED] = []

    def spawn(name, command, *, env, cwd=REPO, **popen):
        log = tmp_path / f"process-{name}-{len(started)}.log"
        process = WorkerProcess(name, command, log, env, cwd, **popen)
        started.append(process)
        return process

    yield spawn
    for process in started:
        process.kill()


@pytest.fixture
def spawn_worker(spawn_process):
    """Start ``manage.py everystep_worker`` subprocesses on the test
    database: ``spawn_worker("w1", "--pool", "2")``."""

    def spawn(name, *args, env=None):
        command = [sys.executable, "-m", "django", "everystep_worker", "--name", name, *args]
        return spawn_process(name, command, env=manage_py_environment(env))

    return spawn


@pytest.fixture
def embedded_worker():
    """Start `Worker`s on threads of the test process:
    ``embedded_worker(name="a", pool_size=2)``; the worker gets a `thread`
    attribute. Every one is stopped and joined at the end of the test."""
    from everystep.worker.orchestrator import Worker

    started = []

    def start(**options):
        worker = Worker(**{"poll": 0.05, **options})
        worker.thread = threading.Thread(target=worker.run, daemon=True)
        worker.thread.start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        stop_embedded(worker)


def stop_embedded(worker, timeout=30.0):
    """Stop an embedded worker and wait for `run()` to return."""
    worker.stop()
    worker.thread.join(timeout)
    assert not worker.thread.is_alive(), f"worker {worker.name} did not stop in {timeout}s"


def timed_wait(worker, timeout):
    """Wait for `worker` to exit; return (exit status, seconds it took)."""
    began = time.monotonic()
    code = worker.wait(timeout)
    return code, time.monotonic() - began
