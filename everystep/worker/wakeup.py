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
That answer is of use: the worker's peers (`Responders`).

Every listening worker hears every notification, but a run needs one
worker. Of the peers — the ready workers that serve what this one serves —
the `RESPONDERS` that a notification's payload hashes to answer it; the
others let it pass. So a run scheduled wakes two workers into a claim each,
however many wait idle, and the peers share the polling: each polls
`Responders.spread()` times less often, the group as often as two workers
would. The word is passed on (`everystep.db.claims.pass_on`) to the two
peers after a worker that claimed a full batch when woken from idle, so a
burst spreads over the idle peers in a few hops, and after a worker
woken while full, when another peer had room at its last heartbeat, so a
run does not wait for a poll while its two responders are busy. A word
passed on says how many times it was (``after:PASSES:NAME``); it goes
round the peers once at most.
"""

import heapq
import logging
import math
import threading
import time
import zlib

from django.db import connection, connections

from everystep.core import events
from everystep.db import workers
from everystep.db.claims import NOTIFY_CHANNEL as CHANNEL
from everystep.resilience import deadline, outage, sessions, transient

logger = logging.getLogger(__name__)

PING_INTERVAL = 5.0  # seconds between reads of the peers, which prove the connection alive
RESPONDERS = 2  # workers of a group that answer one notification
PASSED_ON = "after:"  # a notification's payload that a peer passed on: after:PASSES:NAME
HEARD_BY_ALL = math.inf  # the passes of a notification every peer answers: none to pass on
MAX_DUE_TIMES = 10_000  # notified due times a worker keeps; past that it polls for them
MAX_DUE_AHEAD = 86_400.0  # seconds; a run due later than this is found by a poll


class Wakeup:
    """The loop's wait: until the time it is given, a run announced for
    later falls due, or `set()` is called."""

    def __init__(self, options):
        self._options = options
        self._event = threading.Event()
        self._due_times = []  # when notified runs fall due (monotonic; a heap)
        self._due_lock = threading.Lock()  # guards the due times and `_notified`
        self._listener = None
        self._responders = Responders(options.name, options.poll)
        # The fewest passes of the notifications for this worker since the
        # last turn (None: none came).
        self._passes = None

    def set(self):
        """Wake the loop now."""
        self._event.set()

    def clear(self):
        self._event.clear()

    def wait(self, seconds):
        """Wait up to `seconds`, less if a notified run falls due sooner."""
        self._pop_due()
        with self._due_lock:
            if self._due_times:
                seconds = min(seconds, self._due_times[0] - time.monotonic())
        self._event.wait(seconds)

    def _pop_due(self):
        """Forget the due times that have come, noting that they came (the
        loop's `take_notified` tells)."""
        now = time.monotonic()
        with self._due_lock:
            while self._due_times and self._due_times[0] <= now:
                heapq.heappop(self._due_times)
                self._passes = _fewer(self._passes, 0)

    def notified(self, due=None):
        """A run was scheduled, due at `due` (Unix seconds, as text) if
        given: wake now, and again when it falls due, rather than up to a
        poll later — unless the notification is for other peers to answer.
        Without `due` (the listener just connected), always wake."""
        if due is not None and not self._responders.chosen(due):
            return
        passes = HEARD_BY_ALL if due is None else self._responders.passes(due)
        try:
            delay = float(due) - time.time() if due else 0.0
        except ValueError:
            delay = 0.0
        with self._due_lock:
            if delay <= 0:
                self._passes = _fewer(self._passes, passes)  # due now: a claim may find it
            # A run parked in a wait without a deadline is "due" in the year
            # 9999: only what comes due soon is worth a place in the heap.
            elif delay <= MAX_DUE_AHEAD and len(self._due_times) < MAX_DUE_TIMES:
                heapq.heappush(self._due_times, time.monotonic() + delay)
        self._event.set()

    def take_notified(self):
        """None, or the passes of the notification for this worker that came
        since the last call (0: from the database itself, or a run it was
        notified of that fell due; `HEARD_BY_ALL`: every peer heard it), the
        fewest if more than one came."""
        self._pop_due()
        with self._due_lock:  # the listener's thread sets it
            passes, self._passes = self._passes, None
        return passes

    def may_pass_on(self, passes, *, full):
        """Whether to pass on a notification that came after `passes` passes:
        it has not gone round the peers yet, and this worker is not `full`
        or another peer had room at its last heartbeat."""
        return self._responders.may_pass_on(passes) and (
            not full or self._responders.others_have_room()
        )

    @property
    def listening(self):
        return self._listener is not None

    def poll_interval(self):
        """Seconds between polls: the option's, spread over the peers when
        notifications wake this worker."""
        if self._listener is None:
            return self._options.poll
        return self._options.poll * self._responders.spread()

    def listen(self, loops):
        """On PostgreSQL, unless the options turn it off, start the
        `Listener` (as `loops`, `everystep.worker.loops.Loops`). Returns
        whether it listens."""
        if not self._options.notify or connection.vendor != "postgresql":
            return False
        self._listener = Listener(
            self.notified, sessions.session_alias(), on_ping=self._responders.read
        )
        loops.start("listener", self._listener.run)
        return True

    def stop(self):
        if self._listener is not None:
            self._listener.stop()


class Responders:
    """Which notifications this worker answers: of its peers (the ready
    workers serving the same workflows and queues, `read` by the listener),
    the `RESPONDERS` that the notification's payload hashes to, next to
    each other in the peers' sorted names — so when one has died, or is
    busy, the other still claims. While the peers are unknown, or two or
    fewer, every notification is this worker's."""

    def __init__(self, name, poll):
        self.name = name
        self._poll = poll
        self._peers = ()  # their names, replaced whole by the listener's thread
        self._with_room = frozenset()  # of them, those with room at their last heartbeat

    def read(self, wrapper):
        """Read the peers on `wrapper` (the listener's connection); say so
        when their number changed."""
        found = workers.peers(self.name, using=wrapper)
        peers = found.names
        changed = len(peers) != len(self._peers)
        self._peers, self._with_room = peers, found.with_room
        if changed:
            events.announce(
                "peers",
                worker=self.name,
                count=len(peers),
                responders=min(len(peers), RESPONDERS),
                poll=self._poll * self.spread(),
            )

    def chosen(self, payload):
        """Whether this worker answers a notification with `payload`: a
        run's due time, or ``after:NAME`` — passed on by the peer NAME, for
        the peers that follow it. An empty payload (a slot of a limited
        queue freed: whichever peer has room may take the run waiting for
        it) is everyone's."""
        peers = self._peers
        if self._heard_by_all(payload):
            return True
        origin = _passed_on(payload)[1]
        if origin is not None and origin in peers:
            first = peers.index(origin) + 1
        else:
            first = zlib.crc32(payload.encode()) % len(peers)
        return self.name in {peers[(first + k) % len(peers)] for k in range(RESPONDERS)}

    def passes(self, payload):
        """How many times the notification with `payload` was passed on, or
        `HEARD_BY_ALL` when every peer answers it."""
        if self._heard_by_all(payload):
            return HEARD_BY_ALL
        passes = _passed_on(payload)[0]
        return 0 if passes is None else passes

    def may_pass_on(self, passes):
        """Whether a notification passed on `passes` times may be passed
        again: each pass reaches the next `RESPONDERS` peers, so it has gone
        round them all after this many passes."""
        rounds = math.ceil((len(self._peers) - RESPONDERS) / RESPONDERS)
        return passes < rounds

    def others_have_room(self):
        """Whether a peer other than this worker had room for more runs at
        its last heartbeat."""
        return bool(self._with_room - {self.name})

    def _heard_by_all(self, payload):
        peers = self._peers
        return not payload or len(peers) <= RESPONDERS or self.name not in peers

    def spread(self):
        """How many times longer than the poll option each peer waits
        between polls, so that the group polls as two workers would."""
        return max(1.0, len(self._peers) / RESPONDERS)


def _passed_on(payload):
    """``(passes, origin)`` of a notification passed on (``after:PASSES:NAME``,
    or ``after:NAME``, once), ``(None, None)`` of any other."""
    if not payload.startswith(PASSED_ON):
        return None, None
    rest = payload.removeprefix(PASSED_ON)
    passes, colon, origin = rest.partition(":")
    if colon and passes.isdigit():
        return int(passes), origin
    return 1, rest


def _fewer(passes, more):
    """The fewer passes of two, either one None (no notification)."""
    return more if passes is None else min(passes, more)


class Listener:
    """Calls `on_notify(due)`, from its own thread (`run`), whenever a run is
    scheduled: `due` is when it falls due (Unix seconds, as text; migration
    0009), and `on_notify()` alone after (re)connecting. Every
    `PING_INTERVAL` seconds it calls `on_ping(wrapper)` (a read on the
    listening connection), or pings the server."""

    def __init__(self, on_notify, alias, on_ping=None):
        self.on_notify = on_notify
        self.alias = alias
        self.on_ping = on_ping
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
        self._ping(wrapper, raw)
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
                self._ping(wrapper, raw)
                next_ping = time.monotonic() + PING_INTERVAL

    def _ping(self, wrapper, raw):
        with deadline.guard(wrapper, "checking the listening connection"):
            if self.on_ping is not None:
                try:
                    self.on_ping(wrapper)
                    return
                except Exception as exc:  # noqa: BLE001 - the ping below tells a dead connection
                    logger.warning("reading the worker's peers failed: %s", exc)
            raw.execute("SELECT 1")
