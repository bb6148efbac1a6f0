"""Workers: claim scheduled runs and execute them on a pool of threads.

The loop (every ``poll`` seconds, or as soon as a run finishes): reap the
finished runs, compute the free capacity, claim up to that many scheduled
runs in one transaction, hand them to the pool. Never more than
``pool_size`` runs are in flight, and nothing is claimed while full.

The name is the recovery contract. A worker records its name on every run
it claims and holds a database lock on it while it lives, so only one live
worker has a name. On start it first takes back the runs parked under its
name — left ``running`` by a process that died — and replays them.

Stopping (SIGTERM, SIGINT or `Worker.stop()`) is lossless: no new run is
claimed, each in-flight step finishes and is recorded, and each run is
requeued at its next step boundary so any worker can resume it. After
``drain`` seconds (0: never) whatever is still running is requeued too.
A second signal cuts the wait short. An embedded worker returns from
`run()`; the management command then exits.

Database outages fail nothing: the loop backs off and retries, runners
retry their writes, and a worker that has to exit while the database is
unreachable leaves its runs parked under its name for its next start. A
database that goes silent is noticed by the deadline on every operation
(`everystep.resilience.deadline`), and stopping never hangs on it (`everystep.worker.shutdown`).
The sessions that connections cut off left on the server, with the row
locks they hold, are ended once it answers again (`everystep.resilience.sessions`).

No run is stranded under a live worker: at least every `TAKE_BACK_INTERVAL`
seconds, and after any failed claim (whose reply may have been lost after
the commit), the worker takes back the runs ``running`` under its own name
that it is not executing. A worker claims only runs of the workflows
registered in its process; others wait for a worker that has them.

The worker is an orchestrator over its parts: the options
(`everystep.worker.options`), the name guard (`everystep.worker.nameguard`), the pool
(`everystep.worker.pool`), the shutdown (`everystep.worker.shutdown`) and the outage
tracking shared with the runners (`everystep.resilience.transient`).
"""

import heapq
import logging
import os
import socket
import sys
import threading
import time

from django.db import DEFAULT_DB_ALIAS, connection, connections

from everystep.core import clock, command_names, cron, events, registry
from everystep.db import schema, store
from everystep.db.namelock import NameLost
from everystep.engine import runner
from everystep.models import Worker as WorkerRow
from everystep.observe import metrics, sentry, tracing
from everystep.resilience import classify, deadline, outage, sessions, timeouts, transient
from everystep.worker.endpoint import Endpoint
from everystep.worker.nameguard import NameGuard, NameHeld
from everystep.worker.options import WorkerOptions
from everystep.worker.pool import Pool
from everystep.worker.shutdown import Shutdown

logger = logging.getLogger(__name__)

REQUEUE_GRACE = 5.0  # seconds to keep trying to requeue at exit when the database is down
TAKE_BACK_INTERVAL = 30.0  # seconds between take-backs of runs parked under this name
LOOP_ERROR_LOG_INTERVAL = 10.0  # at most one traceback of a loop error this often
MAX_DUE_TIMES = 10_000  # notified due times a worker keeps; past that it polls for them

__all__ = ["NameHeld", "NameLost", "Worker"]


class Worker:
    """A worker process's loop; `run()` blocks until it has drained.

    Options as `everystep.worker.options.WorkerOptions` (``pool_size``, ``poll``,
    ``name``, ``drain``, ``catchup``, ``notify``, ``db_deadline``); a bad
    value raises `everystep.worker.options.OptionError` (a ValueError).
    """

    def __init__(self, pool_size=4, poll=0.2, name=None, drain=30, **options):
        self.options = WorkerOptions(
            pool_size=pool_size, poll=poll, name=name, drain=drain, **options
        )
        self.pool_size = self.options.pool_size
        self.poll = self.options.poll
        self.drain = self.options.drain
        self.name = self.options.name or socket.gethostname()
        self.abandoned = False  # runs were left executing when run() returned
        self._wake = threading.Event()  # something to do: a run finished, a stop
        self._draining = threading.Event()  # shared with every runner
        self._shutdown = Shutdown(self.name, self._wake.set)
        self._pool = Pool(self.pool_size, self.name, self._draining, self._wake.set)
        self._guard = NameGuard(self.name, self._heartbeat, self._wake.set)
        self._take_back = self.options.catchup  # take back parked runs on the next turn
        self._next_take_back = time.monotonic() + TAKE_BACK_INTERVAL
        self._generation = 0  # the outage the loop's connection has lived through
        self._drained = False  # announced stopped once the rest is let go
        self._stopped_announced = False
        self._delays = None  # the loop's backoff while its database calls fail
        self._error_logged = 0.0
        self._ready = False  # caught up and looping
        self._next_turn_at = None  # when the loop's next turn is due (monotonic)
        # When notified runs fall due (monotonic; a heap), for a turn then.
        self._due_times = []
        self._ticker = cron.Ticker(registry.schedules())
        self._due_lock = threading.Lock()

    def stop(self):
        """Ask the worker to drain and return; a second call cuts the drain short."""
        self._shutdown.request()

    def run(self):
        """Hold the name, catch up, loop until stopped, drain, release the name.

        Raises `NameHeld` if another live worker keeps the name beyond the
        drain time, `NameLost` if another process took it while this worker
        ran (after draining), and `ConfigurationError` if the database
        settings cannot work (a wrong password, an unknown database or host).
        """
        deadline.seconds = self.options.db_deadline
        timeouts.harden(connections[DEFAULT_DB_ALIAS].settings_dict)
        metrics.install()
        sentry.install()
        tracing.install()
        started_at = time.time()
        events.announce("worker_starting", worker=self.name, started_at=started_at)
        endpoint = self._start_endpoint()
        restore_signals = self._shutdown.install_signal_handlers(self.drain, self._exit_now)
        try:
            if not schema.wait_for_migrations(
                self.options.wait_for_migrations, self._shutdown.requested
            ):
                self._announce_stopped()  # while waiting for the migrations
                return
            if not self._guard.acquire(self.drain, self._shutdown.requested):
                return  # stopped while waiting for the name
            listener = None
            lost = None
            try:
                transient.retrying(
                    self._register,
                    what=f"registering worker {self.name}",
                    should_stop=self._shutdown.requested.is_set,
                )
                listener = self._start_listener()
                self._pool.start()
                self._guard.start()
                if self._take_back:
                    self._wait(self._turn())
                self._ready = True
                events.announce(
                    "worker_ready",
                    worker=self.name,
                    pool_size=self.pool_size,
                    poll=self.poll,
                    drain=self.drain,
                    vendor=connection.vendor,
                    wakeup="woken by LISTEN/NOTIFY" if listener else "polling",
                )
                self._report(WorkerRow.State.READY)
                try:
                    self._loop()
                except NameLost as exc:
                    logger.error("worker %s: %s", self.name, exc, extra={"action": "name_lost"})
                    lost = exc
                self._drain()
            finally:
                if listener is not None:
                    listener.stop()
                self._report(WorkerRow.State.STOPPED)
                # During an outage the guard may be blocked on the lock's
                # connection: do not wait for it (the session ends with the
                # process, or the guard releases it once unblocked).
                in_outage = outage.tracker.since is not None
                self._guard.stop(timeout=1.0 if in_outage else self.options.db_deadline + 1)
                self._pool.stop()
            if lost is not None:
                raise lost
        finally:
            restore_signals()
            if endpoint is not None:
                endpoint.stop()
            connection.close()
            if self._drained:
                self._announce_stopped()

    def _register(self, attempt):
        """Record this worker in the workers table, and note which server it
        talks to (`everystep.resilience.sessions` ends sessions on that server only)."""
        store.worker_started(self.name, self.pool_size, registry.names())
        sessions.note_server(connections[DEFAULT_DB_ALIAS])

    # The loop.

    def _loop(self):
        while not self._shutdown.requested.is_set():
            self._wake.clear()
            self._reap()
            self._wait(self._turn())

    def _wait(self, seconds):
        """Sleep until the next turn is due, a run announced for later falls
        due, or something wakes the loop."""
        now = time.monotonic()
        with self._due_lock:
            while self._due_times and self._due_times[0] <= now:
                heapq.heappop(self._due_times)
            if self._due_times:
                seconds = min(seconds, self._due_times[0] - now)
        self._next_turn_at = now + seconds
        self._wake.wait(seconds)

    def _notified(self, due=None):
        """A run was scheduled (PostgreSQL's notification), due at `due`
        (Unix seconds, as text) if given: take a turn now, and another when
        it falls due, rather than up to a poll later."""
        try:
            delay = float(due) - time.time() if due else 0.0
        except ValueError:
            delay = 0.0
        if delay > 0:
            with self._due_lock:
                if len(self._due_times) < MAX_DUE_TIMES:
                    heapq.heappush(self._due_times, time.monotonic() + delay)
        self._wake.set()

    def _turn(self):
        """One turn of the loop: make sure the name is still held, then claim
        up to the free capacity. Returns how long to wait before the next
        turn: the poll interval, or a backoff while the database fails.
        Raises `NameLost`."""
        self._next_turn_at = time.monotonic()
        if self._guard.lost is not None:
            raise self._guard.lost
        if not self._guard.held:
            return self.poll  # no claim while the name is in doubt
        # A connection held through an outage may be cut off: replace it first.
        self._generation = transient.replace_if_outage(self._generation)
        if sessions.pending() and outage.tracker.since is None:
            self._end_abandoned_sessions()
            self._next_turn_at = time.monotonic()
        self._schedule_ticks()  # a full pool still lets a tick's run wait its turn
        if self._pool.capacity <= 0:
            return self.poll  # full: nothing to claim, and nothing learnt of the database
        began_in = outage.generation_of(connections[DEFAULT_DB_ALIAS])
        try:
            claimed, took_back = self._claim()
        except Exception as exc:  # noqa: BLE001 - told apart in _loop_failed
            return self._loop_failed(exc, began_in)
        self._delays = None
        outage.tracker.succeeded()
        if claimed:
            events.announce(
                "claim",
                worker=self.name,
                how="resumed parked" if took_back else "claimed",
                count=len(claimed),
                run_list=", ".join(str(run.id) for run in claimed),
                run_ids=[run.id for run in claimed],
                runs=claimed,
                taken_back=took_back,
            )
        for run in claimed:
            self._pool.submit(run)
        return 0 if took_back and self._take_back else self.poll

    def _schedule_ticks(self):
        """Schedule the run of each cron workflow's latest tick, once per
        tick: an INSERT that the tick's key lets through for one worker. A
        tick that cannot be inserted is tried again next turn; its failure
        never keeps the worker from claiming."""
        for schedule, tick in self._ticker.due(clock.now()):
            try:
                with deadline.guard(connections[DEFAULT_DB_ALIAS], "scheduling a cron tick"):
                    store.insert_tick(schedule.workflow, cron.tick_key(tick), tick)
            except Exception as exc:  # noqa: BLE001 - the claim that follows meets an outage too
                if classify.is_transient(exc):
                    transient.drop_after(exc)
                else:
                    self._log_loop_error(exc)
                return
            self._ticker.scheduled(schedule, tick)

    def _claim(self):
        """Claim runs up to the free capacity: the ones parked under this name
        first when a take-back is due. Returns (runs, whether taken back)."""
        capacity = self._pool.capacity
        now = time.monotonic()
        if now >= self._next_take_back:
            self._take_back = True
        took_back = self._take_back
        with deadline.guard(connections[DEFAULT_DB_ALIAS], "claiming runs"):
            claimed = store.claim(
                self.name,
                capacity,
                registry.names(),
                only_parked=took_back,
                exclude=[*self._pool.in_flight, *self._pool.left_for_dead],
            )
        if took_back and len(claimed) < capacity:
            self._take_back = False
            self._next_take_back = now + TAKE_BACK_INTERVAL
        return claimed, took_back

    def _end_abandoned_sessions(self):
        """The database answers: end the sessions that connections cut off
        earlier left on the server, with the row locks they may hold — until
        then the runs they locked are invisible to claims, parked ones
        included, so a take-back follows."""
        try:
            if sessions.end_abandoned(connections[DEFAULT_DB_ALIAS]):
                self._take_back = True
        except Exception as exc:  # noqa: BLE001 - told apart below
            if classify.is_transient(exc):
                transient.drop_after(exc)  # still remembered: tried again next turn
                return
            # The server will not let them be ended (a privilege, a proxy in
            # between): say so once and leave them to its own timeouts.
            sessions.forget_abandoned()
            self._log_loop_error(exc)

    def _heartbeat(self, lock_connection):
        """Called by the name guard after each check of the lock, with the
        lock's own connection (None for a file lock)."""
        state = self._state()
        db = lock_connection or connections[DEFAULT_DB_ALIAS]
        with deadline.guard(db, "refreshing the heartbeat"):
            store.worker_heartbeat(
                self.name, state, len(self._pool.in_flight), using=lock_connection
            )

    def _state(self):
        """The state the workers table shows for this worker now."""
        if self._draining.is_set():
            return WorkerRow.State.DRAINING
        if not self._ready:
            return WorkerRow.State.STARTING
        if outage.tracker.since is not None:
            return WorkerRow.State.OUTAGE
        return WorkerRow.State.READY

    def _report(self, state):
        """Best effort: record the worker's state now, unless the database is
        known to be away (the heartbeat catches up later)."""
        if outage.tracker.since is not None:
            return
        try:
            with deadline.guard(connections[DEFAULT_DB_ALIAS], f"recording state {state}"):
                store.worker_heartbeat(self.name, state, len(self._pool.in_flight))
        except Exception as exc:  # noqa: BLE001 - only the workers list shows it
            transient.drop_after(exc)

    def _loop_failed(self, exc, began_in):
        """A turn's claim, begun in outage generation `began_in`, failed: an
        outage (announced once) or a bug (logged with its traceback,
        rate-limited). A claim whose reply was lost may have committed, so
        the next turn takes back this name's parked runs."""
        if classify.is_transient(exc):
            outage.tracker.failed("claiming runs", exc, began_in)
        else:
            self._log_loop_error(exc)
        self._take_back = True
        transient.drop_after(exc)
        if self._delays is None:
            self._delays = transient.backoff_delays(first=self.poll)
        return next(self._delays)

    def health(self):
        """``(alive, ready, reason)`` for the probes (`everystep.worker.endpoint`):
        alive while the loop turns (a wedged one is late for its next turn,
        backoff included, by more than 3 polls plus the database deadline);
        ready once caught up, while the
        database answers, the name is held and the worker is not draining."""
        due = self._next_turn_at
        if due is not None:
            late = time.monotonic() - due
            if late > 3 * self.poll + self.options.db_deadline:
                return False, False, f"the worker loop is {late:.0f}s late for its next turn"
        if self._draining.is_set():
            return True, False, "draining"
        if not self._ready:
            return True, False, "starting"
        if outage.tracker.since is not None:
            return True, False, "database unreachable"
        if not self._guard.held:
            return True, False, "the lock on the worker name is being taken again"
        return True, True, "ready"

    def _start_endpoint(self):
        """Serve the metrics and the probes when a metrics port is set."""
        if self.options.metrics_port is None:
            return None
        endpoint = Endpoint(self.options.metrics_bind, self.options.metrics_port, self.health)
        endpoint.start()
        return endpoint

    def _log_loop_error(self, exc):
        """Log an error of the loop's that is no outage, with its traceback,
        at most once every `LOOP_ERROR_LOG_INTERVAL` seconds."""
        if time.monotonic() - self._error_logged < LOOP_ERROR_LOG_INTERVAL:
            return
        self._error_logged = time.monotonic()
        events.announce(
            "loop_error",
            exc_info=(type(exc), exc, exc.__traceback__),
            worker=self.name,
            error=classify.one_line(exc),
        )

    def _start_listener(self):
        """On PostgreSQL, wake the loop as soon as a run is scheduled."""
        if not self.options.notify or connection.vendor != "postgresql":
            return None
        from everystep.worker.wakeup import Listener

        listener = Listener(self._notified)
        listener.start()
        return listener

    def _reap(self):
        """Forget finished runs; fail the ones that died outside the runner."""
        for job in self._pool.finished():
            if job.error is not None:
                self._crashed(job)

    def _crashed(self, job):
        """A run died outside the runner (an engine error): fail it with the
        encoded exception (announced, so reported); keep going."""
        try:
            runner.fail_crashed(job.claimed, job.error, should_stop=self._shutdown.requested.is_set)
        except Exception:  # noqa: BLE001 - it stays claimed under this name
            logger.exception("could not mark run %s failed", job.claimed.id)

    # Stopping.

    def _drain(self):
        self._draining.set()
        self._report(WorkerRow.State.DRAINING)
        deadline_at = None if self.drain == 0 else time.monotonic() + self.drain
        if self._pool.in_flight:
            events.announce(
                "drain",
                worker=self.name,
                count=len(self._pool.in_flight),
                until="" if deadline_at is None else f", or in {self.drain}s at the latest",
            )
        while True:
            self._next_turn_at = time.monotonic() + 0.5
            self._wake.clear()
            self._reap()
            if not self._pool.in_flight or self._shutdown.hurried.is_set():
                break
            remaining = None if deadline_at is None else deadline_at - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            self._wake.wait(0.5 if remaining is None else min(remaining, 0.5))
        if self._pool.in_flight:
            self._requeue_leftovers()
        self._drained = True

    def _requeue_leftovers(self):
        """Requeue the runs still executing at the deadline; if the database
        is unreachable, say which runs stay parked under this name."""
        self.abandoned = True
        give_up = time.monotonic() + REQUEUE_GRACE
        parked = []
        for job in list(self._pool.in_flight.values()):
            if outage.tracker.since is not None or time.monotonic() > give_up:
                parked.append(job.claimed.id)
                continue
            try:
                runner.requeue_claimed(job.claimed, should_stop=lambda: time.monotonic() > give_up)
            except Exception:  # noqa: BLE001 - reported below
                parked.append(job.claimed.id)
        if parked:
            self._announce_parked(parked)

    def _announce_parked(self, run_ids):
        events.announce(
            "runs_parked",
            worker=self.name,
            requeue=command_names.command("requeue"),
            run_list=", ".join(str(run_id) for run_id in run_ids),
            run_ids=list(run_ids),
        )

    def _announce_stopped(self):
        if not self._stopped_announced:
            self._stopped_announced = True
            events.announce("worker_stopped", worker=self.name)

    def _exit_now(self):
        """The last-resort deadline of a standalone worker: a database call
        still blocks the drain. Name the runs left parked and exit."""
        if not self._stopped_announced:
            parked = [] if self._drained else list(self._pool.in_flight.copy())
            if parked:
                self._announce_parked(parked)
            self._announce_stopped()
        for handler in logging.getLogger().handlers + logging.getLogger("everystep").handlers:
            handler.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
