"""The workers' own pruning (``EVERYSTEP_RETENTION``, ``--retention``):
once at start and then once an hour, a worker deletes the runs that ended
longer ago than the retention (`everystep.control.actions.prune`, its
defaults: completed, stopped and cancelled runs). One worker at a time:
each round is taken under a database lock that a worker holding it makes
the others skip. Pruning goes a batch of at most 500 rows at a time, so
the claims of the workers never wait long for it, and a worker that stops
ends its round at the next batch."""

import logging
import threading

from django.db import connections

from everystep.control import actions
from everystep.db.namelock import name_lock

logger = logging.getLogger(__name__)

INTERVAL = 3600.0  # seconds between two rounds of one worker
LOCK_NAME = "everystep:retention"


class Pruner:
    """Prunes the runs older than `retention` seconds, every `interval`."""

    def __init__(self, retention, interval=INTERVAL):
        self.retention = retention
        self.interval = interval
        self._stop = threading.Event()
        self._thread = None

    def start(self, loops):
        """Prune on a thread of `loops` (`everystep.worker.loops.Loops`)."""
        self._thread = loops.start("pruner", self.run)

    def run(self):
        while not self._stop.is_set():
            try:
                self.round()
            except Exception as exc:  # noqa: BLE001 - the next round tries again
                logger.warning("pruning failed: %s", exc, extra={"action": "prune_failed"})
            finally:
                connections.close_all()  # not held idle for an hour
            self._stop.wait(self.interval)

    def round(self):
        """Prune once, unless another worker is pruning. Returns how many
        runs were deleted, or None when the round was left to another."""
        lock = name_lock(LOCK_NAME)
        try:
            if not lock.try_acquire():
                return None
            deleted = actions.prune(self.retention, should_stop=self._stop.is_set)
        finally:
            lock.release()
        if deleted:
            logger.info(
                "pruned %d run(s) that ended more than %gs ago",
                deleted,
                self.retention,
                extra={"action": "pruned", "count": deleted},
            )
        return deleted

    def stop(self, timeout):
        """Stop at the next batch, which releases the lock; wait up to
        `timeout` seconds for that."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
