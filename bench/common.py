"""What the measurements share: statistics, bounded waits, statement
counting, worker subprocesses and their memory.

Nothing here imports Django at module level, so the orchestrating process
(which has no database settings) can import it too.
"""

import os
import pathlib
import re
import statistics
import subprocess
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def median(values):
    return statistics.median(values)


def percentile(values, fraction):
    """The nearest-rank percentile of `values` (`fraction` in 0..1)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]


def wait_for(condition, timeout, what, interval=0.01):
    """Call `condition()` every `interval` seconds until it is true; raise
    `TimeoutError` after `timeout` seconds. Returns the true value."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


class RoundTrips:
    """A Django ``execute_wrapper`` that counts every statement the
    connection sends to the server, and the time spent waiting for them in
    the driver (the server's work and the network, without the engine's)."""

    def __init__(self):
        self.count = 0
        self.seconds = 0.0

    def __call__(self, execute, sql, params, many, context):
        self.count += 1
        began = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.seconds += time.perf_counter() - began


def rss_mib(pid):
    """Resident memory of process `pid` in MiB, from /proc (None if gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


TICK = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid):
    """CPU seconds (user + system) process `pid` has used (None if gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK


class MachineCPU:
    """The machine's CPU use between `start()` and `busy()`, from /proc/stat:
    the busy fraction of all CPUs (1.0: every core busy all the time)."""

    @staticmethod
    def _sample():
        with open("/proc/stat") as stat:
            values = [int(v) for v in stat.readline().split()[1:]]
        idle = values[3] + values[4]  # idle + iowait
        return sum(values) - idle, sum(values)

    def start(self):
        self._first = self._sample()
        return self

    def busy(self):
        busy, total = self._sample()
        return (busy - self._first[0]) / max(1, total - self._first[1])


def child_environment(url):
    """The environment of a benchmark subprocess using the database at `url`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVERYSTEP_", "DJANGO_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="bench.settings",
        EVERYSTEP_DATABASE_URL=url,
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    return env


def start_process(command, env, **options):
    """Start `command` from the repository's root with `env`, no stdin and
    its stdout piped as text; `options` go to `subprocess.Popen`."""
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        errors="replace",
        **options,
    )


CLAIM_LINE = re.compile(r" claimed (\d+) run\(s\)")
PEERS_LINE = re.compile(r" is one of (\d+) ready worker")


class WorkerProcess:
    """A real worker process running `command` (see `django_worker`).

    A thread reads its log as it comes (so the pipe never fills), copies it
    to `log_path`, notes when the ``ready`` line arrives and counts the claim
    batches. `stop()` drains it with SIGTERM and kills it (by PID) if it has
    not exited in time.
    """

    def __init__(self, name, command, env, log_path):
        self.name = name
        self.log_path = pathlib.Path(log_path)
        self.claims = 0
        self.claimed = 0
        self.peers = 0  # the ready workers serving the same, as it last counted them
        self.ready_after = None  # seconds from exec to the ready line
        self._ready = threading.Event()
        self._tail = []
        self._terminated = False
        self._began = time.perf_counter()
        self.process = start_process(command, env, stderr=subprocess.STDOUT)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self):
        return self.process.pid

    def _read(self):
        with open(self.log_path, "w") as log:
            for line in self.process.stdout:
                if not self._ready.is_set() and " ready: " in line:
                    self.ready_after = time.perf_counter() - self._began
                    self._ready.set()
                peers = PEERS_LINE.search(line)
                if peers:
                    self.peers = int(peers.group(1))
                claimed = CLAIM_LINE.search(line)
                if claimed:
                    self.claims += 1
                    self.claimed += int(claimed.group(1))
                log.write(line)
                self._tail = [*self._tail[-19:], line]

    def wait_ready(self, timeout=60):
        """Block until the worker logged ``ready``; raise if it exited or
        `timeout` seconds passed."""
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.05):
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"worker {self.name} exited with status {self.process.returncode} before "
                    f"it was ready:\n{''.join(self._tail)}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {self.name} not ready after {timeout}s")
        return self.ready_after

    def rss_mib(self):
        return rss_mib(self.pid)

    def cpu_seconds(self):
        return process_cpu_seconds(self.pid)

    def terminate(self):
        """Send SIGTERM once: the worker drains (a second one would cut the
        drain short)."""
        if self.process.poll() is None and not self._terminated:
            self._terminated = True
            self.process.terminate()

    def stop(self, timeout=30):
        """SIGTERM (a lossless drain), then SIGKILL after `timeout` seconds."""
        if self.process.poll() is None:
            self.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._reader.join(10)


def django_worker(name, flags, url, log_path, env=None):
    """``python -m django everystep_worker --name NAME FLAGS…`` on the
    database at `url`, with the benchmark's settings (and `env` added)."""
    command = [sys.executable, "-m", "django", "everystep_worker", "--name", name, *flags]
    return WorkerProcess(name, command, {**child_environment(url), **(env or {})}, log_path)


class Workers:
    """`count` Django worker processes, stopped together (a context manager)."""

    def __init__(self, count, flags, url, log_dir, prefix="bench", env=None):
        self.all = []
        try:
            for index in range(count):
                name = f"{prefix}-{index}"
                log_path = pathlib.Path(log_dir) / f"{name}.log"
                self.all.append(django_worker(name, flags, url, log_path, env))
        except BaseException:
            self.stop()
            raise

    def wait_ready(self, timeout=60):
        for worker in self.all:
            worker.wait_ready(timeout)

    def stop(self):
        for worker in self.all:
            worker.terminate()
        for worker in self.all:
            worker.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
