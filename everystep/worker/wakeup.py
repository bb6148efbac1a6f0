"""What wakes the worker's loop before its next poll: a run that finished,
a stop, a change of the name guard, a run just scheduled, or one announced
for later falling due.

`Wakeup` is the loop's one wait. On PostgreSQL its `Listener` wakes it the
moment a run is scheduled. A trigger (migration 0002) notifies ``everystep_scheduled`` in every
transaction that makes a run ``scheduled``; a `Listener` thread holds a
connection that LISTENs on it and calls `on_notify` for each delivery. The
worker still polls: notifications only shorten the wait, so a lost one (a
reconnect) costs at most one poll interval. After a lost connection the
listener reconnects and LISTENs again. It listens on the database alias of
the engine's session-level work
(`everystep.resilience.sessions.session_alias`), as the name lock does: a
pooler in transaction mode would deliver nothing.

A listening connection only reads, so a database that went silent would
never fail it: every `PING_INTERVAL` seconds the listener asks the server
for an answer, under the engine's deadline, and reconnects if none comes.
"""

import heapq
import logging
import threading
import time

from django.db import connection, connections

from everystep.resilience import deadline, outage, sessions, transient

logger = logging.getLogger(__name__)

CHANNEL = "everystep_scheduled"
PING_INTERVAL = 10.0
MAX_DUE_TIMES = 10_000  # notified due times a worker keeps; past that it polls for them
MAX_DUE_AHEAD = 86_400.0  # seconds; a run due later than this is found by a poll


class Wakeup:
    """The loop's wait: until the time it is given, a run announced for
    later falls due, or `set()` is called."""

    def __init__(self, options):
        self._options = options
        self._event = threading.Event()
        self._due_times = []  # when notified runs fall due (monotonic; a heap)
        self._due_lock = threading.Lock()
        self._listener = None

    def set(self):
        """Wake the loop now."""
        self._event.set()

    def clear(self):
        self._event.clear()

    def wait(self, seconds):
        """Wait up to `seconds`, less if a notified run falls due sooner."""
        now = time.monotonic()
        with self._due_lock:
            while self._due_times and self._due_times[0] <= now:
                heapq.heappop(self._due_times)
            if self._due_times:
                seconds = min(seconds, self._due_times[0] - now)
        self._event.wait(seconds)

    def notified(self, due=None):
        """A run was scheduled, due at `due` (Unix seconds, as text) if
        given: wake now, and again when it falls due, rather than up to a
        poll later."""
        try:
            delay = float(due) - time.time() if due else 0.0
        except ValueError:
            delay = 0.0
        # A run parked in a wait without a deadline is "due" in the year
        # 9999: only what comes due soon is worth a place in the heap.
        if 0 < delay <= MAX_DUE_AHEAD:
            with self._due_lock:
                if len(self._due_times) < MAX_DUE_TIMES:
                    heapq.heappush(self._due_times, time.monotonic() + delay)
        self._event.set()

    def listen(self, loops):
        """On PostgreSQL, unless the options turn it off, start the
        `Listener` (as `loops`, `everystep.worker.loops.Loops`). Returns
        whether it listens."""
        if not self._options.notify or connection.vendor != "postgresql":
            return False
        self._listener = Listener(self.notified, sessions.session_alias())
        loops.start("listener", self._listener.run)
        return True

    def stop(self):
        if self._listener is not None:
            self._listener.stop()


class Listener:
    """Calls `on_notify(due)`, from its own thread (`run`), whenever a run is
    scheduled: `due` is when it falls due (Unix seconds, as text; migration
    0009), and `on_notify()` alone after (re)connecting."""

    def __init__(self, on_notify, alias):
        self.on_notify = on_notify
        self.alias = alias
        self._stop = threading.Event()

    def stop(self):
        self._stop.set()

    def run(self):
        """Listen until stopped, reconnecting after a lost connection."""
        delays = transient.backoff_delays(first=0.1)
        while not self._stop.is_set():
            wrapper = connections.create_connection(self.alias)
            try:
                self._listen(wrapper)
                delays = transient.backoff_delays(first=0.1)
            except Exception as exc:  # noqa: BLE001 - reconnect and listen again
                logger.debug("listener connection lost (%s); reconnecting", exc)
                sessions.abandon(wrapper)
                self._stop.wait(next(delays))
            finally:
                try:
                    wrapper.close()
                except Exception:  # noqa: BLE001 - already broken
                    pass

    def _listen(self, wrapper):
        with deadline.guard(wrapper, "starting to listen for new runs"):
            wrapper.ensure_connection()
            raw = wrapper.connection
            raw.autocommit = True
            raw.execute(f"LISTEN {CHANNEL}")
        self.on_notify()  # anything scheduled while not listening is claimed now
        next_ping = time.monotonic() + PING_INTERVAL
        generation = outage.tracker.generation
        while not self._stop.is_set():
            for notification in raw.notifies(timeout=0.5):
                self.on_notify(notification.payload)
            if outage.tracker.generation != generation:
                sessions.abandon(wrapper)
                return  # held through an outage: listen again on a new connection
            if time.monotonic() >= next_ping:
                with deadline.guard(wrapper, "checking the listening connection"):
                    raw.execute("SELECT 1")
                next_ping = time.monotonic() + PING_INTERVAL
