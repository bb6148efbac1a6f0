"""The worker's pool: threads that execute claimed runs, never more than
its size at once, and the reaping of the runs they finished.

The worker's loop submits claimed runs and reaps the finished ones; it
alone touches `in_flight`, so the map needs no lock. Each pool thread keeps
one database connection from run to run — a new connection per run would
cost more than the run's steps — so a worker holds at most one per pool
thread. A connection that saw an error is closed and opened afresh.
"""

import dataclasses
import logging
import queue
import threading

from django.db import connections

from everystep.db import claims
from everystep.engine import runner
from everystep.resilience import local, outage, transient

logger = logging.getLogger(__name__)

Status = runner.Status


@dataclasses.dataclass(eq=False)
class Job:
    """One claimed run handed to the pool, and how its attempt ended."""

    claimed: claims.ClaimedRun
    status: str | None = None
    error: BaseException | None = None


class Pool:
    """``options.pool_size`` threads running `runner.execute` on submitted
    runs. `draining` is set to stop new steps (every runner reads it);
    `stopping` (an Event) gives up retries of a crashed run's write;
    `on_done` is called (from a pool thread) whenever a run finishes."""

    def __init__(self, options, on_done, stopping):
        self.size = options.pool_size
        self.in_flight = {}  # run id → Job
        #: Runs left exactly as a dead process leaves them (a simulated
        #: crash): this worker must not take them back while it lives.
        self.left_for_dead = set()
        self.draining = threading.Event()
        self._on_done = on_done
        self._stopping = stopping
        self._todo = queue.SimpleQueue()
        self._done = queue.SimpleQueue()

    def start(self, loops):
        """Start the threads, as `loops` (`everystep.worker.loops.Loops`)."""
        for index in range(self.size):
            loops.start(f"pool-{index}", self._work)

    @property
    def capacity(self):
        return self.size - len(self.in_flight)

    def submit(self, claimed):
        job = Job(claimed)
        self.in_flight[claimed.fence.run_id] = job
        self._todo.put(job)

    def reap(self):
        """Forget the runs finished since the last call; fail the ones that
        died outside the runner (an error of the engine's own)."""
        while True:
            try:
                job = self._done.get_nowait()
            except queue.Empty:
                return
            run_id = job.claimed.fence.run_id
            self.in_flight.pop(run_id, None)
            if job.status == Status.RUNNING:
                self.left_for_dead.add(run_id)
            if job.error is not None:
                self._fail(job)

    def stop(self):
        """Let the threads end once their current run returns. Daemon
        threads: a worker that must exit with a step still running does not
        wait for it."""
        for _ in range(self.size):
            self._todo.put(None)

    def _fail(self, job):
        """Fail a run that died outside the runner with the encoded exception
        (announced, so reported); the worker goes on."""
        try:
            runner.fail_crashed(job.claimed, job.error, should_stop=self._stopping.is_set)
        except Exception:  # noqa: BLE001 - it stays claimed under this name
            logger.exception("could not mark run %s failed", job.claimed.fence.run_id)

    def _work(self):
        generation = outage.tracker.generation
        try:
            while (job := self._todo.get()) is not None:
                generation = transient.replace_if_outage(generation)
                try:
                    job.status = runner.execute(job.claimed, draining=self.draining)
                except BaseException as exc:  # noqa: BLE001 - the worker fails the run
                    job.error = exc
                finally:
                    _close_if_unclean()
                    self._done.put(job)
                    self._on_done()
        finally:
            connections.close_all()


def _close_if_unclean():
    """Close this thread's connection if a run left it in doubt."""
    db = local.connection()
    if db.connection is not None and (
        db.errors_occurred or db.in_atomic_block or db.needs_rollback or not db.get_autocommit()
    ):
        transient.reset_connection()
