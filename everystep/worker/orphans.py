"""Orphans recover by themselves (SPEC §16): a live worker requeues the runs
of a worker that went silent.

A worker that dies without draining (SIGKILL, a lost node, a pod deleted)
leaves its runs ``running`` under its name. When it comes back under that
name it takes them back at once (its catchup). But a name may never come
back — a Deployment's pod, an autoscaled dyno, a container without a
name — so every worker, every `interval` seconds, reads the heartbeats of
the workers that hold runs: one indexed statement, no lock, no round trip
per run.

A worker is silent once its heartbeat (refreshed every few seconds) has not
changed for the orphan timeout, as this worker saw it: silence is measured
on this worker's own clock between its own reads, never from the
timestamps of another host's clock, and what it saw is forgotten whenever
its own reads fail — so a database restart, which stops every heartbeat at
once, makes nobody silent: each worker's heartbeat moves again as soon as
it reconnects.

One worker at a time recovers the silent workers' runs, under the database
lock `LOCK_NAME` that makes the others skip the round. For each silent
worker it then takes that worker's own name lock, as a worker starting
under the name would: taken, no live process holds the name and none can
start under it while the runs are requeued; refused, the holder is alive
and keeps its runs. On SQLite, whose name lock is a file lock the kernel
keeps for a stopped process, a holder the kernel has stopped counts as
silent too.

The requeue is fenced like an operator's: the dead worker's late writes
(a stopped process continued, a partition healed) land on nothing, and a
step in flight that was unsafe to repeat leaves the run ``blocked`` when it
is claimed again, as after any crash.
"""

import logging
import random
import threading
import time

from django.db import DEFAULT_DB_ALIAS, connections, transaction

from everystep.core import events
from everystep.db import runs, workers
from everystep.db.namelock import name_lock
from everystep.resilience import classify, deadline, outage, transient

logger = logging.getLogger(__name__)

LOCK_NAME = "everystep:orphans"
LONGEST_INTERVAL = 15.0  # seconds: the longest wait between two looks


def interval(timeout):
    """Seconds between two looks for silent workers: a quarter of the
    timeout, at least 1 s and at most `LONGEST_INTERVAL`."""
    return max(1.0, min(timeout / 4, LONGEST_INTERVAL))


class OrphanRecovery:
    """The worker `worker`'s watch, every `interval(timeout)` seconds, for
    the runs of workers silent for more than `timeout` seconds;
    `on_recovered()` is called after runs were requeued, so the worker
    claims at once."""

    def __init__(self, worker, timeout, on_recovered):
        self.worker = worker
        self.timeout = timeout
        self.interval = interval(timeout)
        self._on_recovered = on_recovered
        self._stop = threading.Event()
        # name → (the heartbeat last read, when it was first read: monotonic)
        self._heard = {}
        self._generation = outage.tracker.generation
        self._thread = None

    def start(self, loops):
        """Watch on a thread of `loops` (`everystep.worker.loops.Loops`)."""
        self._thread = loops.start("orphans", self.run)

    def run(self):
        # Workers started together would look together: spread them out.
        while not self._stop.wait(self.interval * random.uniform(0.75, 1.0)):
            try:
                if self.round():
                    self._on_recovered()
            except Exception as exc:  # noqa: BLE001 - the next look tries again
                self._heard.clear()  # what went unseen meanwhile is not silence
                if not classify.is_transient(exc):  # an outage is announced by the loop
                    logger.warning(
                        "looking for orphaned runs failed: %s",
                        classify.one_line(exc),
                        extra={"action": "orphans_failed"},
                    )
                transient.drop_after(exc)
            finally:
                connections[DEFAULT_DB_ALIAS].close()  # not held between two reads

    def round(self):
        """Read the heartbeats once; requeue the runs of the workers silent
        for the timeout, unless another worker is recovering them. Returns
        how many runs this worker requeued."""
        connection = connections[DEFAULT_DB_ALIAS]
        with deadline.guard(connection, "looking for orphaned runs"):
            heartbeats = workers.holding_runs(self.worker)
        silent = self._silent(heartbeats)
        if not silent:
            return 0
        lock = name_lock(LOCK_NAME)
        try:
            if not lock.try_acquire():
                return 0  # another worker is recovering them
            return sum(self._recover(name, seconds) for name, seconds in silent.items())
        finally:
            lock.release()

    def _silent(self, heartbeats):
        """``{name: seconds}`` of the workers whose heartbeat in `heartbeats`
        is the one this worker has read, unchanged, for `timeout` seconds."""
        now = time.monotonic()
        if outage.tracker.generation != self._generation:  # an outage of this worker's own
            self._generation = outage.tracker.generation
            self._heard.clear()
        heard = {}
        for name, heartbeat in heartbeats.items():
            last, since = self._heard.get(name, (None, now))
            heard[name] = (heartbeat, since if last == heartbeat else now)
        self._heard = heard
        return {
            name: now - since for name, (_, since) in heard.items() if now - since >= self.timeout
        }

    def _recover(self, name, silent_for):
        """Requeue the runs of the silent worker `name`, holding its name
        lock so that no worker starts under it meanwhile; 0 if a live
        process holds the name."""
        name_held = name_lock(name)
        try:
            taken = name_held.try_acquire()
            if not taken and not name_held.held_by_stopped_process():
                return 0
            requeued = self._requeue(name, name_held if taken else None)
        finally:
            name_held.release()
        if requeued:
            events.announce(
                "runs_recovered",
                worker=self.worker,
                silent_worker=name,
                silent_for=silent_for,
                count=len(requeued),
                run_list=", ".join(str(run_id) for run_id in requeued),
                run_ids=requeued,
            )
        return len(requeued)

    def _requeue(self, name, name_held):
        """Requeue the runs held under `name` in one transaction, bounded by
        the worker's database deadline, and commit it only while the name's
        lock (`name_held`, when one was taken) is still held: a lock whose
        session ended while the requeue waited (for rows a cut-off
        transaction still locks) may have gone to a worker restarted under
        the name, whose runs these now are. Returns the ids requeued."""
        connection = connections[DEFAULT_DB_ALIAS]
        with deadline.guard(connection, f"requeueing the runs of worker {name}"):
            with transaction.atomic():
                requeued = runs.requeue_runs(claimed_by=name)
                if name_held is not None and not name_held.still_held():
                    transaction.set_rollback(True)
                    return []
                if requeued:
                    workers.recovered(name, self.worker, len(requeued))
        return requeued

    def stop(self, timeout):
        """Stop watching; wait up to `timeout` seconds for a recovery under
        way to end and release its locks."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
