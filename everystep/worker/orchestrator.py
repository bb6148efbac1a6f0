"""Workers: claim scheduled runs and execute them on a pool of threads.

The loop (every ``poll`` seconds, or as soon as something wakes it): reap
the finished runs, take a claim turn, hand what it claimed to the pool,
wait. Never more than ``pool_size`` runs are in flight, and nothing is
claimed while full. A worker woken by notifications (`wakeup`) claims only
when a claim may find something: its poll is due, a notification was for
it, or its last claim was not made or came back full — a run that finishes
is no reason to ask an empty queue again. A busy pool claims the runs left
in the queue a few at a time: once a quarter of it is free, or 5 ms after
its first slot freed (`Claimer.backlog_in`).

The name is the recovery contract. A worker records its name on every run
it claims and holds a database lock on it while it lives, so only one live
worker has a name. On start it first takes back the runs parked under its
name — left ``running`` by a process that died — and replays them.

`Worker` only wires its parts and runs the loop; each part holds one job:
the claim turn (`claimer`), the pool that executes and reaps (`pool`), the
wake-ups (`wakeup`), the state it shows (`presence`), the hold on its name
(`nameguard`), the stop and its drain (`shutdown`), its background threads
(`loops`), its recovery of the runs of silent workers (`orphans`), its
pruning of old runs (`retention`) and the setup of its process (`process`).
"""

import dataclasses
import logging
import socket
import time

from django.db import DEFAULT_DB_ALIAS, connection, connections

from everystep.core import events, queues, registry
from everystep.db import claims, schema, workers
from everystep.db import queues as queue_rows
from everystep.db.namelock import NameLost
from everystep.models import Worker as WorkerRow
from everystep.resilience import deadline, outage, sessions, transient
from everystep.worker import process
from everystep.worker.claimer import Claimer
from everystep.worker.endpoint import Endpoint
from everystep.worker.loops import Loops
from everystep.worker.nameguard import NameGuard
from everystep.worker.options import WorkerOptions
from everystep.worker.orphans import OrphanRecovery
from everystep.worker.pool import Pool
from everystep.worker.presence import Presence
from everystep.worker.retention import Pruner
from everystep.worker.shutdown import Shutdown
from everystep.worker.wakeup import Wakeup

logger = logging.getLogger(__name__)


class Worker:
    """A worker process's loop; `run()` blocks until it has drained.

    Give it a `WorkerOptions` or that class's fields as keywords
    (``pool_size``, ``poll``, ``name`` …); a bad value raises
    `everystep.worker.options.OptionError` (a ValueError).
    """

    def __init__(self, options=None, **fields):
        if options is None:
            options = WorkerOptions(**fields)
        elif fields:
            raise TypeError("give a WorkerOptions or its fields, not both")
        self.options = dataclasses.replace(options, name=options.name or socket.gethostname())
        self.name = self.options.name
        self._wakeup = Wakeup(self.options)
        self._shutdown = Shutdown(self.options, self._stop_requested)
        self._loops = Loops(self.name, self._wakeup.set)
        self._pool = Pool(self.options, self._wakeup.set, self._shutdown.requested)
        self._presence = Presence(self.options, self._pool)
        self._guard = NameGuard(self.name, self._presence.heartbeat, self._wakeup.set)
        self._claimer = Claimer(
            self.options, self._pool, self._guard, self._presence, self._wakeup.poll_interval
        )
        retention, timeout = self.options.retention, self.options.orphan_timeout
        # The background chores this worker does for all: started after the
        # name is held, stopped at the drain's end.
        chores = (
            Pruner(retention) if retention is not None else None,
            OrphanRecovery(self.name, timeout, self._wakeup.set) if timeout else None,
        )
        self._chores = [chore for chore in chores if chore is not None]

    @property
    def abandoned(self):
        """Whether runs were left executing when `run()` returned."""
        return self._shutdown.abandoned

    def stop(self):
        """Ask the worker to drain and return; a second call cuts the drain
        short. From the moment it returns no new step starts: each run in
        flight is requeued at its next step boundary."""
        self._shutdown.request()

    def _stop_requested(self):
        """On each stop request (`stop()`, a signal): stop new steps at once,
        rather than when the loop next turns (it may be in a claim), and wake
        the loop to drain."""
        self._pool.draining.set()
        self._wakeup.set()

    def health(self):
        """``(alive, ready, reason)``, what the probes answer."""
        return self._presence.health(self._guard.held)

    def run(self):
        """Hold the name, catch up, loop until stopped, drain, release the name.

        Raises `NameHeld` if another live worker keeps the name beyond the
        drain time, `NameLost` if another process took it while this worker
        ran, `LoopDied` if one of its threads died (both after draining), and
        `ConfigurationError` if the database settings cannot work.
        """
        process.prepare(self.options)
        events.announce("worker_starting", worker=self.name, started_at=time.time())
        endpoint = self._start_endpoint()
        restore_signals = self._shutdown.install_signal_handlers(self._pool)
        try:
            requested = self._shutdown.requested
            if not schema.wait_for_migrations(self.options.wait_for_migrations, requested):
                self._shutdown.announce_stopped()  # while waiting for the migrations
            elif self._guard.acquire(self.options.drain, requested):
                self._run_holding_the_name()
        finally:
            restore_signals()
            if endpoint is not None:
                endpoint.stop()
            sessions.release_prepared(connection)  # if it stopped before looking for a pooler
            connection.close()
            if self._shutdown.drained:
                self._shutdown.announce_stopped()

    def _run_holding_the_name(self):
        lost = None
        try:
            transient.retrying(
                self._register,
                what=f"registering worker {self.name}",
                should_stop=self._shutdown.requested.is_set,
            )
            listening = self._wakeup.listen(self._loops)
            self._pool.start(self._loops)
            self._guard.start(self._loops)
            for chore in self._chores:
                chore.start(self._loops)
            if self._claimer.catching_up:
                self._turn()  # the loop's first turn follows at once, not a poll later
            # Ready means notified of what is scheduled from now on; a poll
            # finds it anyway, so no longer than one.
            self._wakeup.wait_listening(self.options.poll, self._shutdown.requested)
            self._presence.ready = True
            self._announce_ready(listening)
            try:
                self._loop()
            except NameLost as exc:
                logger.error("worker %s: %s", self.name, exc, extra={"action": "name_lost"})
                lost = exc
            self._shutdown.drain(self._pool, self._presence, self._wakeup)
        finally:
            self._wakeup.stop()
            for chore in self._chores:  # each ends at its next step, releasing its lock
                chore.stop(timeout=self.options.db_deadline + 1)
            self._presence.report(WorkerRow.State.STOPPED)
            # During an outage the guard may be blocked on the lock's
            # connection: do not wait for it (the session ends with the
            # process, or the guard releases it once unblocked).
            in_outage = outage.tracker.since is not None
            self._guard.stop(timeout=1.0 if in_outage else self.options.db_deadline + 1)
            self._pool.stop()
        if lost or self._loops.died:
            raise lost or self._loops.died

    def _loop(self):
        next_turn = time.monotonic()
        while not self._shutdown.requested.is_set() and self._loops.died is None:
            self._wakeup.clear()
            self._pool.reap()
            word = self._wakeup.take_notified()
            backlog_in = self._claimer.backlog_in()
            if self._turn_now(word is not None, next_turn, backlog_in):
                idle, full = not self._pool.in_flight, self._pool.capacity <= 0
                wait = self._turn()
                if word is not None and self._to_pass_on(word, idle, full):
                    self._pass_on(word)
                next_turn = time.monotonic() + wait
                backlog_in = None
            wake_at = next_turn
            if backlog_in is not None:
                wake_at = min(next_turn, time.monotonic() + backlog_in)
            self._wait(max(0.0, wake_at - time.monotonic()))

    def _turn_now(self, notified, next_turn, backlog_in):
        """Whether the loop claims now: when its poll is due, a notification
        was for it, the runs its last claim may have left are due
        (`backlog_in`, `Claimer.backlog_in`), the take-back of its parked
        runs is due, or its name was lost; polling alone, also whenever
        something woke it, unless it waits for company for the runs left."""
        return (
            (not self._wakeup.listening and not backlog_in)
            or notified
            or backlog_in == 0
            or self._claimer.take_back_due
            or self._guard.lost is not None
            or time.monotonic() >= next_turn
        )

    def _to_pass_on(self, word, idle, full):
        """Whether to pass on `word`, the notification that woke this worker:
        woken from idle, its claim took all it could, so more runs may wait
        than it takes; or, `full`, it could take none, which a peer with
        room may."""
        if idle:
            taken_all = self._pool.in_flight and self._claimer.may_find_more
            return bool(taken_all) and self._wakeup.should_pass_on(word, full=False)
        return full and self._wakeup.should_pass_on(word, full=True)

    def _pass_on(self, word):
        """Pass `word` on to the next two peers of its ranking (best effort:
        the others' polls find the runs anyway)."""
        try:
            with deadline.guard(connections[DEFAULT_DB_ALIAS], "waking more workers"):
                claims.pass_on(int(word.passes) + 1, word.key)
        except Exception as exc:  # noqa: BLE001 - a poll finds the runs
            transient.drop_after(exc)

    def _turn(self):
        claimed, wait = self._claimer.turn()
        for run in claimed:
            self._pool.submit(run)
        return wait

    def _wait(self, seconds):
        self._presence.turn_due_in(seconds)
        self._wakeup.wait(seconds)

    def _register(self, attempt):
        """Record this worker in the workers table, and note which server it
        talks to (`everystep.resilience.sessions` ends sessions on that server only)."""
        workers.started(self.name, self.options.pool_size, registry.names(), self.options.queues)
        queue_rows.declare(queues.declared().values())
        sessions.note_server(connections[DEFAULT_DB_ALIAS])

    def _announce_ready(self, listening):
        events.announce(
            "worker_ready",
            worker=self.name,
            pool_size=self.options.pool_size,
            poll=self.options.poll,
            drain=self.options.drain,
            vendor=connection.vendor,
            wakeup="woken by LISTEN/NOTIFY" if listening else "polling",
            in_flight=self._pool.in_flight.__len__,
        )
        self._presence.report(WorkerRow.State.READY)

    def _start_endpoint(self):
        """Serve the metrics and the probes when a metrics port is set."""
        if self.options.metrics_port is None:
            return None
        endpoint = Endpoint(self.options.metrics_bind, self.options.metrics_port, self.health)
        endpoint.start(self._loops)
        return endpoint
