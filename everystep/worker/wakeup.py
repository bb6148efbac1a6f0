"""Wake an idle worker the moment a run is scheduled (PostgreSQL only).

A trigger (migration 0002) notifies ``everystep_scheduled`` in every
transaction that makes a run ``scheduled``; a `Listener` thread holds a
connection that LISTENs on it and calls `on_notify` for each delivery. The
worker still polls: notifications only shorten the wait, so a lost one (a
reconnect, PgBouncer in transaction mode, where LISTEN does not work — turn
it off there) costs at most one poll interval. After a lost connection the
listener reconnects and LISTENs again.

A listening connection only reads, so a database that went silent would
never fail it: every `PING_INTERVAL` seconds the listener asks the server
for an answer, under the engine's deadline, and reconnects if none comes.
"""

import logging
import threading
import time

from django.db import connections

from everystep.resilience import deadline, outage, sessions, transient

logger = logging.getLogger(__name__)

CHANNEL = "everystep_scheduled"
PING_INTERVAL = 10.0


class Listener:
    """A daemon thread that calls `on_notify(due)` whenever a run is
    scheduled: `due` is when it falls due (Unix seconds, as text; migration
    0009), and `on_notify()` alone after (re)connecting."""

    def __init__(self, on_notify, alias="default"):
        self.on_notify = on_notify
        self.alias = alias
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="everystep-listener", daemon=True)

    def start(self):
        self._thread.start()

    def stop(self):
        self._stop.set()

    def _run(self):
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
