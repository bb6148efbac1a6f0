"""The worker's hold on its name, kept by a thread of its own.

`NameGuard.acquire` takes the name lock, waiting up to the drain time for a
live holder to exit (a restart that overlaps the old process's drain then
just works). Once the worker runs, the guard's thread checks the lock every
`CHECK_INTERVAL` seconds and refreshes the worker's heartbeat with the same
check — never per step. The worker loop claims only while the guard says
the name is `held`: a lock lost with its connection is taken again before
any further claim, and a lock another process took (`lost`) stops the
worker. A check blocked by a silent database holds up only this thread,
never the claims of the loop.
"""

import threading
import time

from django.db import connections

from everystep.core import events
from everystep.db.namelock import NameLost, name_lock
from everystep.errors import ConfigurationError
from everystep.resilience import classify, outage, transient

CHECK_INTERVAL = 5.0  # seconds between checks of a held lock
RETRY_INTERVAL = 0.5  # seconds between attempts to take a lost lock again


class NameHeld(Exception):
    """Another live worker holds this worker's name."""


class NameGuard:
    """The lock on `name` and the thread that keeps it.

    `heartbeat(connection)` is called after each successful check, with the
    lock's own database connection (None for a file lock); `on_change()`
    whenever `held` or `lost` changes, so the loop wakes up.
    """

    def __init__(self, name, heartbeat, on_change):
        self.name = name
        self.lock = name_lock(name)
        self.lost = None  # the NameLost that ended the guard, if any
        self._heartbeat = heartbeat
        self._on_change = on_change
        self._held = threading.Event()
        self._stop = threading.Event()
        self._thread = None

    @property
    def held(self):
        return self._held.is_set()

    def acquire(self, wait, stopped):
        """Take the lock, waiting up to `wait` seconds (0: forever) for a live
        holder to exit. Returns False if `stopped` (an Event) is set while
        waiting; raises `NameHeld`, or `ConfigurationError` when the database
        refuses the settings."""
        deadline_at = None if wait == 0 else time.monotonic() + wait
        warned = False
        while True:
            try:
                acquired = transient.first_contact(
                    lambda attempt: self.lock.try_acquire(),
                    what=f"taking the lock on worker name {self.name}",
                    should_stop=stopped.is_set,
                )
            except ConfigurationError:
                raise
            except Exception:
                if stopped.is_set():
                    return False
                raise
            if acquired:
                self._held.set()
                return True
            if not warned:
                events.announce(
                    "name_wait",
                    worker=self.name,
                    wait="indefinitely" if deadline_at is None else f"up to {wait}s",
                )
                warned = True
            if deadline_at is not None and time.monotonic() >= deadline_at:
                raise NameHeld(
                    f"worker name {self.name!r} is held by another live worker; give each "
                    f"worker a unique name (--name or EVERYSTEP_NAME)"
                )
            if stopped.wait(0.2):
                return False

    def start(self, loops):
        """Start keeping the acquired lock on the guard's own thread, as
        `loops` (`everystep.worker.loops.Loops`)."""
        self._thread = loops.start("name", self._run)

    def stop(self, timeout):
        """Stop checking and release the lock (on the guard's thread, which
        owns its connection); wait up to `timeout` seconds for that."""
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout)
        else:
            self.lock.release()

    def _run(self):
        generation = outage.tracker.generation
        try:
            while not self._stop.wait(CHECK_INTERVAL if self.held else RETRY_INTERVAL):
                # A connection that lived through an outage may be cut off
                # silently: take the lock again on a new one.
                reconnect = outage.tracker.generation != generation
                generation = outage.tracker.generation
                self._set_held(self._check(reconnect))
                if self.lost is not None:
                    return
        finally:
            self.lock.release()
            connections.close_all()  # this thread's own, used by a file lock's heartbeat

    def _check(self, reconnect):
        began_in = outage.tracker.generation  # on a connection no older: see _run
        try:
            if not self.lock.ensure(reconnect=reconnect):
                return False
            self._heartbeat(self.lock.connection)
        except NameLost as exc:
            self.lost = exc
            return False
        except Exception as exc:  # noqa: BLE001 - the database is away; try again soon
            if classify.is_transient(exc):
                outage.tracker.failed("checking the name lock", exc, began_in)
            return False
        return True

    def _set_held(self, held):
        if held == self.held and self.lost is None:
            return
        if held:
            self._held.set()
        else:
            self._held.clear()
        self._on_change()
