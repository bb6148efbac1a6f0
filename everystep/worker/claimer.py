"""The claim turn: what a worker does each time its loop turns.

A turn makes sure the name is still held, replaces a connection held
through an outage, ends the server sessions that connections cut off left
behind, schedules the cron ticks that have come, and claims up to the
pool's free capacity in one transaction, from the queues it serves and
within their limits (`everystep.db.claims`).

No run is stranded under a live worker: at least every
`TAKE_BACK_INTERVAL` seconds, and after any failed claim (whose reply may
have been lost after the commit), the turn takes back the runs ``running``
under the worker's own name that it is not executing. A worker claims only
runs of the workflows registered in its process; others wait for a worker
that has them. Database outages fail nothing: the turn backs off.
"""

import time

from everystep.core import clock, cron, events, registry
from everystep.db import claims, runs
from everystep.resilience import classify, deadline, local, outage, sessions, transient

TAKE_BACK_INTERVAL = 30.0  # seconds between take-backs of runs parked under this name
#: A busy pool claims the runs left in the queue once this share of it is
#: free (a quarter), or once its first free slot has waited `BATCH_WINDOW`.
BATCH_SHARE = 4
BATCH_WINDOW = 0.005  # seconds
LOOP_ERROR_LOG_INTERVAL = 10.0  # at most one traceback of a loop error this often


class Claimer:
    """The claim turns of the worker named in `options`, for its `pool`,
    while its `guard` holds the name; `presence` is told when a turn runs,
    and `poll()` says how long to wait between polls."""

    def __init__(self, options, pool, guard, presence, poll):
        self._options = options
        self._pool = pool
        self._guard = guard
        self._presence = presence
        self._poll = poll
        #: Whether a claim now may find runs: the last one was not made, or
        #: came back with all it asked for.
        self.may_find_more = True
        self._take_back = options.catchup  # take back parked runs on the next turn
        self._next_take_back = time.monotonic() + TAKE_BACK_INTERVAL
        self._generation = 0  # the outage the loop's connection has lived through
        self._delays = None  # the backoff while the claims fail
        self._error_logged = 0.0
        self._ticker = cron.Ticker(registry.schedules())
        self._batch = max(1, pool.size // BATCH_SHARE)  # the free slots a busy pool waits for
        self._batch_since = None  # when the room a busy pool has began to wait for company

    @property
    def take_back_due(self):
        """Whether the periodic take-back of parked runs is due."""
        return self._take_back or time.monotonic() >= self._next_take_back

    @property
    def catching_up(self):
        """Whether the next turn takes back the runs parked under the name."""
        return self._take_back

    def backlog_in(self):
        """Seconds until the runs the last claim may have left are claimed
        (0: now), or None when it left none. An idle or a full pool claims
        at once (a full one claims nothing). A busy one waits for company:
        it claims once `BATCH_SHARE` of it is free or its first free slot
        has waited `BATCH_WINDOW`, since one claim of several runs costs the
        worker and the database less than several claims of one."""
        if not self.may_find_more:
            self._batch_since = None
            return None
        capacity = self._pool.capacity
        if not self._pool.in_flight or capacity <= 0 or capacity >= self._batch:
            self._batch_since = None
            return 0.0
        now = time.monotonic()
        if self._batch_since is None:
            self._batch_since = now
        return max(0.0, self._batch_since + BATCH_WINDOW - now)

    def turn(self):
        """One turn: returns ``(claimed runs, seconds to wait before the
        next turn)`` — the poll interval, 0 while a take-back may find more,
        or a backoff while the database fails. Raises `NameLost`."""
        self._presence.turn_due_in(0)
        self._batch_since = None
        self.may_find_more = True  # until a claim is made and says otherwise
        if self._guard.lost is not None:
            raise self._guard.lost
        if not self._guard.held:
            return [], self._poll()  # no claim while the name is in doubt
        # A connection held through an outage may be cut off: replace it first.
        self._generation = transient.replace_if_outage(self._generation)
        if sessions.pending() and outage.tracker.since is None:
            self._end_abandoned_sessions()
            self._presence.turn_due_in(0)
        self._schedule_ticks()  # a full pool still lets a tick's run wait its turn
        if self._pool.capacity <= 0:
            return [], self._poll()  # full: nothing learnt of the database
        began_in = outage.generation_of(local.connection())
        try:
            claimed, took_back = self._claim()
        except Exception as exc:  # noqa: BLE001 - told apart in _failed
            return [], self._failed(exc, began_in)
        self._delays = None
        outage.tracker.succeeded()
        if claimed:
            events.announce(
                "claim",
                worker=self._options.name,
                how="resumed parked" if took_back else "claimed",
                count=len(claimed),
                run_list=", ".join(str(run.fence.run_id) for run in claimed),
                run_ids=[run.fence.run_id for run in claimed],
                runs=claimed,
                taken_back=took_back,
            )
        return claimed, 0 if took_back and self._take_back else self._poll()

    def _claim(self):
        """Claim runs up to the free capacity: the ones parked under this name
        first when a take-back is due. Returns (runs, whether taken back)."""
        capacity = self._pool.capacity
        now = time.monotonic()
        if now >= self._next_take_back:
            self._take_back = True
        took_back = self._take_back
        with deadline.guard(local.connection(), "claiming runs"):
            claimed = claims.claim(
                self._options.name,
                capacity,
                registry.names(),
                self._options.queues,
                aging=self._options.priority_aging,
                only_parked=took_back,
                exclude=[*self._pool.in_flight, *self._pool.left_for_dead],
            )
            if not claimed:
                # Idle: read the limited queues again a little before their
                # time is up, rather than in the claim of a run just scheduled.
                claims.limited_queues(max_age=claims.LIMITS_TTL * 0.8)
        if took_back and len(claimed) < capacity:
            self._take_back = False
            self._next_take_back = now + TAKE_BACK_INTERVAL
        # A take-back looks at the parked runs only, not at the queue.
        self.may_find_more = took_back or len(claimed) >= capacity
        return claimed, took_back

    def _schedule_ticks(self):
        """Schedule the run of each cron workflow's latest tick, once per
        tick: an INSERT that the tick's key lets through for one worker. A
        tick that cannot be inserted is tried again next turn; its failure
        never keeps the worker from claiming."""
        for schedule, tick in self._ticker.due(clock.now()):
            try:
                with deadline.guard(local.connection(), "scheduling a cron tick"):
                    runs.insert_tick(schedule.workflow, cron.tick_key(tick), tick)
            except Exception as exc:  # noqa: BLE001 - the claim that follows meets an outage too
                if classify.is_transient(exc):
                    transient.drop_after(exc)
                else:
                    self._log_error(exc)
                return
            self._ticker.scheduled(schedule, tick)

    def _end_abandoned_sessions(self):
        """The database answers: end the sessions that connections cut off
        earlier left on the server, with the row locks they may hold — until
        then the runs they locked are invisible to claims, parked ones
        included, so a take-back follows."""
        try:
            if sessions.end_abandoned(local.connection()):
                self._take_back = True
        except Exception as exc:  # noqa: BLE001 - told apart below
            if classify.is_transient(exc):
                transient.drop_after(exc)  # still remembered: tried again next turn
                return
            # The server will not let them be ended (a privilege, a proxy in
            # between): say so once and leave them to its own timeouts.
            sessions.forget_abandoned()
            self._log_error(exc)

    def _failed(self, exc, began_in):
        """A turn's claim, begun in outage generation `began_in`, failed: an
        outage (announced once) or a bug (logged with its traceback,
        rate-limited). A claim whose reply was lost may have committed, so
        the next turn takes back this name's parked runs. Returns the wait."""
        if classify.is_transient(exc):
            outage.tracker.failed("claiming runs", exc, began_in)
        else:
            self._log_error(exc)
        self._take_back = True
        transient.drop_after(exc)
        if self._delays is None:
            self._delays = transient.backoff_delays(first=self._options.poll)
        return next(self._delays)

    def _log_error(self, exc):
        """Log an error of the turn's that is no outage, with its traceback,
        at most once every `LOOP_ERROR_LOG_INTERVAL` seconds."""
        if time.monotonic() - self._error_logged < LOOP_ERROR_LOG_INTERVAL:
            return
        self._error_logged = time.monotonic()
        events.announce(
            "loop_error",
            exc_info=(type(exc), exc, exc.__traceback__),
            worker=self._options.name,
            error=classify.one_line(exc),
        )
