"""Workers: claim scheduled runs and execute them on a pool of threads.

The loop (every ``poll`` seconds, or as soon as a run finishes): reap the
finished runs, compute the free capacity, claim up to that many scheduled
runs in one transaction, hand them to the pool. Never more than
``pool_size`` runs are in flight, and nothing is claimed while full.

The name is the recovery contract. A worker records its name on every run
it claims and holds a database lock on it while it lives, so only one live
worker has a name. On start it first takes back the runs parked under its
name — left ``running`` by a process that died — and replays them.

Stopping (SIGTERM, SIGINT or `Worker.stop()`) is lossless: no new run is
claimed, each in-flight step finishes and is recorded, and each run is
requeued at its next step boundary so any worker can resume it. After
``drain`` seconds (0: never) whatever is still running is requeued too.
A second signal cuts the wait short. An embedded worker returns from
`run()`; the management command then exits.

Database outages fail nothing: the loop backs off and retries, runners
retry their writes, and a worker that has to exit while the database is
unreachable leaves its runs parked under its name for its next start.
"""

import dataclasses
import logging
import os
import queue
import signal
import socket
import sys
import threading
import time

from django.db import connection, connections

from everystep import retry, runner, store
from everystep.namelock import name_lock

logger = logging.getLogger(__name__)

REQUEUE_GRACE = 5.0  # seconds to keep trying to requeue at exit when the database is down
LOCK_CHECK_INTERVAL = 5.0  # seconds between checks that the name lock is still held


class NameHeld(Exception):
    """Another live worker holds this worker's name."""


def default_name(environ=None):
    """``EVERYSTEP_NAME``, else ``DYNO`` (a Heroku dyno's stable name), else
    the hostname."""
    environ = os.environ if environ is None else environ
    return environ.get("EVERYSTEP_NAME") or environ.get("DYNO") or socket.gethostname()


@dataclasses.dataclass(eq=False)
class _Job:
    """One claimed run handed to the pool, and how its attempt ended."""

    claimed: store.ClaimedRun
    status: str | None = None
    error: BaseException | None = None


class Worker:
    """A worker process's loop; `run()` blocks until it has drained."""

    def __init__(self, pool_size=4, poll=0.2, name=None, drain=30, catchup=True, notify=True):
        if not (isinstance(pool_size, int) and pool_size >= 1):
            raise ValueError(f"pool_size must be a whole number >= 1, not {pool_size!r}")
        if not poll > 0:
            raise ValueError(f"poll must be a positive number of seconds, not {poll!r}")
        if not drain >= 0:
            raise ValueError(f"drain must be >= 0 seconds (0 waits forever), not {drain!r}")
        self.pool_size = pool_size
        self.poll = poll
        self.name = name or default_name()
        self.drain = drain
        self.catchup = catchup
        self.notify = notify
        self.abandoned = False  # runs were left executing when run() returned
        self._stop = threading.Event()  # stop claiming and drain
        self._hurry = threading.Event()  # a second stop: requeue now
        self._wake = threading.Event()  # something to do: a run finished, a stop
        self._draining = threading.Event()  # shared with every runner
        self._done = queue.SimpleQueue()
        self._todo = queue.SimpleQueue()
        self._in_flight = {}
        self._lock = None
        self._parked_left = catchup
        self._outage_since = None
        self._delays = None
        self._lock_checked = 0.0

    def stop(self):
        """Ask the worker to drain and return; a second call cuts the drain short."""
        if self._stop.is_set():
            self._hurry.set()
        self._stop.set()
        self._wake.set()

    def run(self):
        """Hold the name, catch up, loop until stopped, drain, release the name.

        Raises `NameHeld` if another live worker keeps the name beyond the
        drain time.
        """
        restore_signals = self._install_signal_handlers()
        try:
            self._lock = self._acquire_name()
            if self._lock is None:
                return  # stopped while waiting for the name
            listener = self._start_listener()
            try:
                self._start_pool()
                if self.catchup:
                    self._claim(only_parked=True)
                logger.info(
                    "worker %s ready: pool %d, poll %ss, drain %ss, database %s, %s",
                    self.name,
                    self.pool_size,
                    self.poll,
                    self.drain,
                    connection.vendor,
                    "woken by LISTEN/NOTIFY" if listener else "polling",
                    extra={"action": "worker_ready", "worker": self.name},
                )
                self._loop()
                self._drain()
            finally:
                if listener is not None:
                    listener.stop()
                self._lock.release()
                for _ in range(self.pool_size):
                    self._todo.put(None)
        finally:
            restore_signals()
            connection.close()

    # The loop.

    def _loop(self):
        while not self._stop.is_set():
            self._wake.clear()
            self._reap()
            self._wake.wait(self._claim(only_parked=self._parked_left))

    def _claim(self, only_parked=False):
        """Claim up to the free capacity; return how long to wait before the
        next attempt (the poll interval, or a backoff after an error)."""
        capacity = self.pool_size - len(self._in_flight)
        if capacity <= 0:
            return self.poll
        try:
            self._check_name_lock()
            claimed = store.claim(
                self.name, capacity, only_parked=only_parked, exclude=self._in_flight
            )
        except Exception as exc:  # noqa: BLE001 - the loop must survive anything
            return self._database_error(exc)
        self._database_back()
        if only_parked and len(claimed) < capacity:
            self._parked_left = False
        if claimed:
            logger.info(
                "worker %s %s %d run(s): %s",
                self.name,
                "resumed parked" if only_parked else "claimed",
                len(claimed),
                ", ".join(str(run.id) for run in claimed),
                extra={
                    "action": "claim",
                    "worker": self.name,
                    "run_ids": [str(r.id) for r in claimed],
                },
            )
        for run in claimed:
            job = _Job(run)
            self._in_flight[run.id] = job
            self._todo.put(job)
        return 0 if only_parked and claimed and self._parked_left else self.poll

    def _check_name_lock(self):
        """Before claiming after an outage (and every few seconds), make sure
        the name lock is still held; take it again if it was lost."""
        now = time.monotonic()
        if self._outage_since is None and now - self._lock_checked < LOCK_CHECK_INTERVAL:
            return
        if not self._lock.ensure():
            raise NameHeld(f"worker name {self.name!r} was taken by another worker")
        self._lock_checked = now

    def _database_error(self, exc):
        if self._outage_since is None:
            self._outage_since = time.monotonic()
            self._delays = retry.backoff_delays(first=self.poll)
            log = logger.warning if retry.is_transient(exc) else logger.error
            log(
                "worker %s: cannot reach the database, retrying with backoff: %s",
                self.name,
                " ".join(str(exc).split()) or type(exc).__name__,
                exc_info=not retry.is_transient(exc),
                extra={"action": "db_outage", "worker": self.name},
            )
        retry.reset_connection()
        return next(self._delays)

    def _database_back(self):
        if self._outage_since is not None:
            logger.info(
                "worker %s: database reachable again after %.1fs",
                self.name,
                time.monotonic() - self._outage_since,
                extra={"action": "db_recovered", "worker": self.name},
            )
            self._outage_since = None

    # The pool.

    def _start_pool(self):
        for index in range(self.pool_size):
            threading.Thread(
                target=self._pool_thread, name=f"everystep-{self.name}-{index}", daemon=True
            ).start()

    def _start_listener(self):
        """On PostgreSQL, wake the loop as soon as a run is scheduled."""
        if not self.notify or connection.vendor != "postgresql":
            return None
        from everystep.notify import Listener

        listener = Listener(self._wake.set)
        listener.start()
        return listener

    def _pool_thread(self):
        """Execute jobs until told to stop. Daemon threads: a worker that must
        exit with a step still running does not wait for it.

        Each pool thread keeps one connection from run to run — a new
        connection per run would cost more than the run's steps — so a
        worker holds at most one per pool thread, never one per run. A
        connection that saw an error is closed and opened afresh.
        """
        try:
            while (job := self._todo.get()) is not None:
                try:
                    job.status = runner.execute(job.claimed, draining=self._draining)
                except BaseException as exc:  # noqa: BLE001 - reported by the loop
                    job.error = exc
                finally:
                    _close_if_unclean()
                    self._done.put(job)
                    self._wake.set()
        finally:
            connections.close_all()

    def _reap(self):
        """Forget finished runs; fail the ones that died outside the runner."""
        while True:
            try:
                job = self._done.get_nowait()
            except queue.Empty:
                return
            self._in_flight.pop(job.claimed.id, None)
            if job.error is not None:
                self._crashed(job)

    def _crashed(self, job):
        """A run died outside the runner (an engine error): log it, fail it
        with the encoded exception, report it to Sentry; keep going."""
        from everystep import serde
        from everystep.models import Workflow

        run, exc = job.claimed, job.error
        # Report before logging: sentry-sdk's logging integration would turn
        # the log record into an event without our context, and dedupe ours.
        _report_to_sentry(exc, run, self.name)
        logger.error(
            "run %s %s crashed outside its steps; marking it failed",
            run.id,
            run.name,
            exc_info=(type(exc), exc, exc.__traceback__),
            extra={"action": "run_crashed", "worker": self.name, "run_id": str(run.id)},
        )
        try:
            retry.retrying(
                lambda attempt: store.finish_run(
                    run, Workflow.Status.FAILED, error=serde.encode_exception(exc)
                ),
                what=f"failing run {run.id}",
                should_stop=self._stop.is_set,
            )
        except Exception:  # noqa: BLE001 - it stays claimed under this name
            logger.exception("could not mark run %s failed", run.id)

    # Stopping.

    def _drain(self):
        self._draining.set()
        deadline = None if self.drain == 0 else time.monotonic() + self.drain
        if self._in_flight:
            logger.info(
                "worker %s draining %d run(s): each is requeued at its next step boundary%s",
                self.name,
                len(self._in_flight),
                "" if deadline is None else f", or in {self.drain}s at the latest",
                extra={"action": "drain", "worker": self.name},
            )
        while True:
            self._wake.clear()
            self._reap()
            if not self._in_flight or self._hurry.is_set():
                break
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            self._wake.wait(0.5 if remaining is None else min(remaining, 0.5))
        if self._in_flight:
            self._requeue_leftovers()
        logger.info(
            "worker %s stopped", self.name, extra={"action": "worker_stopped", "worker": self.name}
        )

    def _requeue_leftovers(self):
        """Requeue the runs still executing at the deadline; if the database
        is unreachable, say which runs stay parked under this name."""
        self.abandoned = True
        give_up = time.monotonic() + REQUEUE_GRACE
        parked = []
        for job in list(self._in_flight.values()):
            try:
                requeued = retry.retrying(
                    lambda attempt, run=job.claimed: store.requeue_run(run),
                    what=f"requeuing run {job.claimed.id}",
                    should_stop=lambda: time.monotonic() > give_up,
                )
            except Exception:  # noqa: BLE001 - reported below
                parked.append(str(job.claimed.id))
                continue
            if requeued:
                logger.info(
                    "run %s requeued at the drain deadline while its step was still running",
                    job.claimed.id,
                    extra={
                        "action": "run_requeued",
                        "worker": self.name,
                        "run_id": str(job.claimed.id),
                    },
                )
        if parked:
            logger.error(
                "worker %s exits with the database unreachable: run(s) %s stay claimed under "
                "this name and resume when a worker starts as %s (or: requeue --claimed-by %s)",
                self.name,
                ", ".join(parked),
                self.name,
                self.name,
                extra={"action": "runs_parked", "worker": self.name, "run_ids": parked},
            )

    def _acquire_name(self):
        """Take the name lock, waiting up to the drain time for a live holder
        to exit. Returns the lock, or None if stopped while waiting."""
        lock = name_lock(self.name)
        deadline = None if self.drain == 0 else time.monotonic() + self.drain
        warned = False
        while True:
            acquired = retry.retrying(
                lambda attempt: lock.try_acquire(),
                what=f"taking the lock on worker name {self.name}",
                should_stop=self._stop.is_set,
            )
            if acquired:
                return lock
            if not warned:
                logger.warning(
                    "worker name %s is held by a live worker; waiting %s for it to exit",
                    self.name,
                    "indefinitely" if deadline is None else f"up to {self.drain}s",
                    extra={"action": "name_wait", "worker": self.name},
                )
                warned = True
            if deadline is not None and time.monotonic() >= deadline:
                raise NameHeld(
                    f"worker name {self.name!r} is held by another live worker; give each "
                    f"worker a unique name (--name or EVERYSTEP_NAME)"
                )
            if self._stop.wait(0.2):
                return None

    def _install_signal_handlers(self):
        """SIGTERM and SIGINT drain the worker, on the main thread only (an
        embedded worker is stopped with `stop()`). Returns the undo."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None

        def on_signal(signum, frame):
            logger.info(
                "worker %s received %s: %s",
                self.name,
                signal.Signals(signum).name,
                "requeuing now" if self._stop.is_set() else "draining",
                extra={"action": "signal", "worker": self.name},
            )
            self.stop()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        return lambda: [signal.signal(sig, handler) for sig, handler in previous.items()]


def _close_if_unclean():
    """Close this thread's connection if a run left it in doubt."""
    if connection.connection is not None and (
        connection.errors_occurred or connection.in_atomic_block or connection.needs_rollback
    ):
        retry.reset_connection()


def _report_to_sentry(exc, run, worker_name):
    """Send `exc` to Sentry when the application initialized sentry-sdk."""
    sentry_sdk = sys.modules.get("sentry_sdk")
    if sentry_sdk is None or not sentry_sdk.get_client().is_active():
        return
    with sentry_sdk.new_scope() as scope:
        scope.set_context(
            "everystep",
            {"workflow_name": run.name, "workflow_id": str(run.id), "worker": worker_name},
        )
        sentry_sdk.capture_exception(exc)
