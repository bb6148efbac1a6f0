"""The worker's pool: threads that execute claimed runs, never more than
its size at once.

The worker's loop submits claimed runs and collects the finished ones; it
alone touches `in_flight`, so the map needs no lock. Each pool thread keeps
one database connection from run to run — a new connection per run would
cost more than the run's steps — so a worker holds at most one per pool
thread. A connection that saw an error is closed and opened afresh.
"""

import dataclasses
import queue
import threading

from django.db import connection, connections

from everystep.db import store
from everystep.engine import runner
from everystep.resilience import outage, transient

Status = runner.Status


@dataclasses.dataclass(eq=False)
class Job:
    """One claimed run handed to the pool, and how its attempt ended."""

    claimed: store.ClaimedRun
    status: str | None = None
    error: BaseException | None = None


class Pool:
    """`size` daemon threads running `runner.execute` on submitted runs of
    the worker `worker_name`. `on_done` is called (from a pool thread)
    whenever a run finishes."""

    def __init__(self, size, worker_name, draining, on_done):
        self.size = size
        self.in_flight = {}  # run id → Job
        #: Runs left exactly as a dead process leaves them (a simulated
        #: crash): this worker must not take them back while it lives.
        self.left_for_dead = set()
        self._thread_name = f"everystep-{worker_name}"
        self._draining = draining
        self._on_done = on_done
        self._todo = queue.SimpleQueue()
        self._done = queue.SimpleQueue()

    def start(self):
        for index in range(self.size):
            threading.Thread(
                target=self._work, name=f"{self._thread_name}-{index}", daemon=True
            ).start()

    @property
    def capacity(self):
        return self.size - len(self.in_flight)

    def submit(self, claimed):
        job = Job(claimed)
        self.in_flight[claimed.id] = job
        self._todo.put(job)

    def finished(self):
        """The jobs that finished since the last call, now out of `in_flight`."""
        jobs = []
        while True:
            try:
                job = self._done.get_nowait()
            except queue.Empty:
                return jobs
            self.in_flight.pop(job.claimed.id, None)
            if job.status == Status.RUNNING:
                self.left_for_dead.add(job.claimed.id)
            jobs.append(job)

    def stop(self):
        """Let the threads end once their current run returns. Daemon
        threads: a worker that must exit with a step still running does not
        wait for it."""
        for _ in range(self.size):
            self._todo.put(None)

    def _work(self):
        generation = outage.tracker.generation
        try:
            while (job := self._todo.get()) is not None:
                generation = transient.replace_if_outage(generation)
                try:
                    job.status = runner.execute(job.claimed, draining=self._draining)
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
    if connection.connection is not None and (
        connection.errors_occurred or connection.in_atomic_block or connection.needs_rollback
    ):
        transient.reset_connection()
