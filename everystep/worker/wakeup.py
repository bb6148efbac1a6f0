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
worker. The peers — the ready workers that serve what this one serves —
rank themselves for each notification by rendezvous hashing (a hash of the
peer's name and the payload, highest first), and the first `RESPONDERS`
answer it; the others let it pass. So a run scheduled wakes two workers
into a claim each, however many wait idle, and a peer that joins or leaves
changes the responders of only the notifications it ranks first for: while
the peers' lists disagree, a notification has a responder more or one
less, not none. The peers share the polling too: each polls
`Responders.spread()` times less often, the group as often as two workers
would.

The word is passed on (`everystep.db.claims.pass_on`) to the next two in
the ranking by a worker that claimed a full batch when woken from idle, so
a burst spreads over the idle peers in a few hops, and by a worker woken
while full, when another peer had room at its last heartbeat, so a run
does not wait for a poll while its two responders are busy. A word passed
on says how many times it was, and the payload it began as
(``after:PASSES:PAYLOAD``); it goes round the peers once at most.
"""

import collections
import dataclasses
import hashlib
import heapq
import logging
import math
import threading
import time

from django.db import connection, connections

from everystep.core import events
from everystep.db import workers
from everystep.db.claims import NOTIFY_CHANNEL as CHANNEL
from everystep.resilience import deadline, outage, sessions, timeouts, transient

logger = logging.getLogger(__name__)

PING_INTERVAL = 5.0  # seconds between reads of the peers, which prove the connection alive
RESPONDERS = 2  # workers of a group that answer one notification
PASSED_ON = "after:"  # a notification's payload that a peer passed on: after:PASSES:PAYLOAD
HEARD_BY_ALL = math.inf  # the passes of a notification every peer answers: none to pass on
MAX_DUE_TIMES = 10_000  # notified due times a worker keeps; past that it polls for them
MAX_DUE_AHEAD = 86_400.0  # seconds; a run due later than this is found by a poll
PASSED_MEMORY = 2.0  # seconds a worker remembers the words it passed on, so as not to again
MAX_PASSED = 1_000  # words remembered at most


@dataclasses.dataclass(frozen=True, order=True)  # ordered: heap entries tie on time
class Word:
    """A notification for this worker: the payload it began as (`key`), and
    how many times peers passed it on (`HEARD_BY_ALL`: every peer heard it)."""

    passes: float
    key: str = ""

    def fewer(self, other):
        """Of this word and `other` (or None), the one passed on less."""
        return self if other is None or self.passes <= other.passes else other


class Wakeup:
    """The loop's wait: until the time it is given, a run announced for
    later falls due, or `set()` is called."""

    def __init__(self, options):
        self._options = options
        self._event = threading.Event()
        self._due_times = []  # when notified runs fall due (monotonic), and their words: a heap
        self._due_lock = threading.Lock()  # guards the due times and `_notified`
        self._listener = None
        self._responders = Responders(options.name, options.poll)
        self._word = None  # the least passed on of the words since the last turn
        # The keys of the words this worker passed on lately → when (monotonic).
        self._passed = collections.OrderedDict()

    def set(self):
        """Wake the loop now."""
        self._event.set()

    def clear(self):
        self._event.clear()

    def wait(self, seconds):
        """Wait up to `seconds`, less if a notified run falls due sooner, and
        not at all if one fell due since the loop last looked (while it
        claimed): its turn is now, not a poll later."""
        self._pop_due()
        with self._due_lock:
            if self._word is not None:
                return
            if self._due_times:
                seconds = min(seconds, self._due_times[0][0] - time.monotonic())
        self._event.wait(seconds)

    def _pop_due(self):
        """Forget the due times that have come, noting that they came (the
        loop's `take_notified` tells)."""
        now = time.monotonic()
        with self._due_lock:
            while self._due_times and self._due_times[0][0] <= now:
                _, word = heapq.heappop(self._due_times)
                self._word = word.fewer(self._word)

    def notified(self, due=None):
        """A run was scheduled, due at `due` (Unix seconds, as text) if
        given: wake now, and again when it falls due, rather than up to a
        poll later — unless the notification is for other peers to answer.
        Without `due` (the listener just connected), always wake."""
        word = self._responders.chosen(due or "")
        if word is None:
            return
        try:
            delay = float(due) - time.time() if due else 0.0
        except ValueError:
            delay = 0.0  # a word passed on, or a freed slot: now
        with self._due_lock:
            if delay <= 0:
                self._word = word.fewer(self._word)  # due now: a claim may find it
            # A run parked in a wait without a deadline is "due" in the year
            # 9999: only what comes due soon is worth a place in the heap.
            elif delay <= MAX_DUE_AHEAD and len(self._due_times) < MAX_DUE_TIMES:
                heapq.heappush(self._due_times, (time.monotonic() + delay, word))
        self._event.set()

    def take_notified(self):
        """The `Word` for this worker that came since the last call (or a run
        it was notified of that fell due), the least passed on if more than
        one came; None if none did."""
        self._pop_due()
        with self._due_lock:  # the listener's thread sets it
            word, self._word = self._word, None
        return word

    def should_pass_on(self, word, *, full):
        """Whether to pass `word` on — and if so, remember it is passed: it
        has not gone round the peers yet, this worker has not passed its key
        on in the last `PASSED_MEMORY` seconds (the responders of one pass
        both pass it on: each of the next hears it twice), and this worker
        is not `full`, or a peer that the word has yet to reach had room at
        its last heartbeat. Called from the loop's thread only."""
        if not self._responders.may_pass_on(word.passes):
            return False
        if full and not self._responders.room_ahead(word):
            return False
        now = time.monotonic()
        if now - self._passed.get(word.key, -math.inf) < PASSED_MEMORY:
            return False
        self._passed[word.key] = now
        self._passed.move_to_end(word.key)  # the oldest first
        if len(self._passed) > MAX_PASSED:
            self._passed.popitem(last=False)
        return True

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

    def wait_listening(self, seconds, stopping):
        """Wait up to `seconds` until the listener's first LISTEN is in
        place (at once when there is no listener), or `stopping` (an
        Event) is set: a run scheduled before it would not be notified,
        and one due later would wait for a poll."""
        if self._listener is None:
            return
        deadline = time.monotonic() + seconds
        while not stopping.is_set() and time.monotonic() < deadline:
            if self._listener.listening.wait(0.05):
                return

    def stop(self):
        if self._listener is not None:
            self._listener.stop()


class Responders:
    """Which notifications this worker answers: of its peers (the ready
    workers serving the same workflows and queues, `read` by the listener),
    the `RESPONDERS` that rank first for the notification's payload — two,
    so that when one has died, or is busy, the other still claims. While
    the peers are unknown, or two or fewer, every notification is this
    worker's."""

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
        """The `Word` of a notification with `payload` if this worker answers
        it, else None: a run's due time, answered by the first `RESPONDERS`
        peers of its ranking, or ``after:PASSES:PAYLOAD``, passed on, by the
        next ones. An empty payload (a slot of a limited queue freed:
        whichever peer has room may take the run waiting for it) is
        everyone's, as is every payload while the peers are few or unknown."""
        peers = self._peers
        if not payload or len(peers) <= RESPONDERS or self.name not in peers:
            return Word(HEARD_BY_ALL)
        word = _word(payload)
        first = RESPONDERS * int(word.passes)
        return word if first <= self._rank(word.key) < first + RESPONDERS else None

    def may_pass_on(self, passes):
        """Whether a notification passed on `passes` times may be passed
        again: each pass reaches the next `RESPONDERS` peers, so it has gone
        round them all after this many passes."""
        rounds = math.ceil((len(self._peers) - RESPONDERS) / RESPONDERS)
        return passes < rounds

    def room_ahead(self, word):
        """Whether a peer that `word` has yet to reach (ranked at `RESPONDERS`
        × (passes + 1) or after, for its key) had room for more runs at its
        last heartbeat."""
        ahead = self._ranking(word.key)[RESPONDERS * (int(word.passes) + 1) :]
        return any(peer in self._with_room for peer in ahead if peer != self.name)

    def _rank(self, key):
        """This worker's place (0: first) among its peers for `key`."""
        return self._ranking(key).index(self.name)

    def _ranking(self, key):
        """The peers in their order for `key`, by rendezvous hashing: highest
        score first, ties by name."""
        return sorted(self._peers, key=lambda peer: (_score(peer, key), peer), reverse=True)

    def spread(self):
        """How many times longer than the poll option each peer waits
        between polls, so that the group polls as two workers would."""
        return max(1.0, len(self._peers) / RESPONDERS)


def _word(payload):
    """The `Word` of a notification's payload: passed on
    (``after:PASSES:PAYLOAD``), or as the database sent it."""
    if payload.startswith(PASSED_ON):
        passes, _, key = payload.removeprefix(PASSED_ON).partition(":")
        if passes.isascii() and passes.isdigit():
            return Word(int(passes), key)
    return Word(0, payload)


def _score(peer, key):
    """A peer's rendezvous score for `key`: the same in every process."""
    digest = hashlib.blake2b(f"{key}\0{peer}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


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
        #: Set once the first LISTEN is in place: from then on no run scheduled goes unnoticed.
        self.listening = threading.Event()
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
            # Cut off, the session would keep the notification queue's tail.
            timeouts.keep_own_session(wrapper)
            raw.execute(f"LISTEN {CHANNEL}")
        self.listening.set()
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
