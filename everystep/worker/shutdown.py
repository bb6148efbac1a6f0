"""How a worker is asked to stop, how it drains, and the promise that
stopping never hangs.

Stopping is lossless: no new run is claimed, each in-flight step finishes
and is recorded, and each run is requeued at its next step boundary so any
worker can resume it. After ``drain`` seconds (0: never) whatever is still
running is requeued too; a worker that exits while the database is out of
reach leaves its runs parked under its name for its next start, and says
which.

The first SIGTERM or SIGINT (or `Worker.stop()`) asks for a drain, and from
that moment no new step starts; a second one hurries it. A standalone worker
(one whose loop owns the main thread, so it installed the signal handlers)
also gets a last-resort deadline: ``drain`` + `EXIT_GRACE` seconds after the
first signal, if the worker has still not returned — a database that went
silent under a blocked call — `on_deadline` runs (it names the runs left
parked) and the process exits.
"""

import logging
import os
import signal
import sys
import threading
import time

from everystep.core import command_names, events
from everystep.engine import runner
from everystep.models import Worker as WorkerRow
from everystep.resilience import outage

logger = logging.getLogger(__name__)

EXIT_GRACE = 8.0  # seconds past the drain time before a standalone worker exits regardless
REQUEUE_GRACE = 5.0  # seconds to keep trying to requeue at exit when the database is down
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _leave_to_the_thread(signum, frame):
    """The Python handler of a stop signal: none (see `install_signal_handlers`)."""


class Shutdown:
    """The stop and hurry requests of the worker of `options`, and its
    drain; `wake` is called on each request."""

    def __init__(self, options, wake):
        self.worker_name = options.name
        self._drain_seconds = options.drain
        self.requested = threading.Event()
        self.hurried = threading.Event()
        self.abandoned = False  # runs were left executing when the drain ended
        self.drained = False
        self._wake = wake
        self._deadline = None  # (seconds, on_deadline) once armed
        self._timer = None
        self._stopped_announced = False
        self._pool = None  # the pool whose runs an exit at the deadline names

    def request(self):
        """Ask for a drain; a second request hurries it."""
        if self.requested.is_set():
            self.hurried.set()
        self.requested.set()
        if self._deadline is not None and self._timer is None:
            seconds, on_deadline = self._deadline
            self._timer = threading.Timer(seconds, on_deadline)
            self._timer.daemon = True
            self._timer.start()
        self._wake()

    def install_signal_handlers(self, pool):
        """On the main thread only, make SIGTERM and SIGINT call `request`
        and arm the exit deadline (none when the drain time is 0: wait
        forever), at which the runs of `pool` still in flight are named.
        Returns the undo, which also disarms the deadline.

        A Python signal handler runs on the main thread between two of its
        bytecodes, perhaps while that thread holds a lock — an Event's, as
        it waits for the next turn — which the handler would then wait for
        forever. So the handler does nothing: the signal's number reaches a
        thread of its own through `signal.set_wakeup_fd`, and it answers."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        self._pool = pool
        if self._drain_seconds:
            self._deadline = (self._drain_seconds + EXIT_GRACE, self._exit_now)
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)  # as set_wakeup_fd requires
        previous = {sig: signal.signal(sig, _leave_to_the_thread) for sig in STOP_SIGNALS}
        previous_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        answering = threading.Thread(
            target=self._answer_signals, args=(read_end,), name="everystep-signals", daemon=True
        )
        answering.start()

        def undo():
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            signal.set_wakeup_fd(previous_fd)
            os.close(write_end)  # the answering thread reads the end of the pipe and returns
            answering.join()
            os.close(read_end)
            if self._timer is not None:
                self._timer.cancel()
            self._deadline = None

        return undo

    def _answer_signals(self, read_end):
        """Answer each stop signal written to `read_end`, until it is closed."""
        while received := os.read(read_end, 64):
            for signum in received:
                if signum in STOP_SIGNALS:
                    logger.info(
                        "worker %s received %s: %s",
                        self.worker_name,
                        signal.Signals(signum).name,
                        "requeuing now" if self.requested.is_set() else "draining",
                        extra={"action": "signal", "worker": self.worker_name},
                    )
                    self.request()

    def drain(self, pool, presence, wakeup):
        """Stop new steps, wait for the runs of `pool` to end at their next
        step boundary (or the drain time), then requeue what is left."""
        pool.draining.set()
        presence.report(WorkerRow.State.DRAINING)
        seconds = self._drain_seconds
        deadline_at = None if seconds == 0 else time.monotonic() + seconds
        if pool.in_flight:
            events.announce(
                "drain",
                worker=self.worker_name,
                count=len(pool.in_flight),
                until="" if deadline_at is None else f", or in {seconds}s at the latest",
            )
        while True:
            presence.turn_due_in(0.5)
            wakeup.clear()
            pool.reap()
            if not pool.in_flight or self.hurried.is_set():
                break
            remaining = None if deadline_at is None else deadline_at - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            wakeup.wait(0.5 if remaining is None else min(remaining, 0.5))
        if pool.in_flight:
            self._requeue_leftovers(pool)
        self.drained = True

    def announce_stopped(self):
        """Say once that the worker stopped."""
        if not self._stopped_announced:
            self._stopped_announced = True
            events.announce("worker_stopped", worker=self.worker_name)

    def _requeue_leftovers(self, pool):
        """Requeue the runs still executing at the deadline; if the database
        is unreachable, say which runs stay parked under this name."""
        self.abandoned = True
        give_up = time.monotonic() + REQUEUE_GRACE
        parked = []
        for job in list(pool.in_flight.values()):
            run_id = job.claimed.fence.run_id
            if outage.tracker.since is not None or time.monotonic() > give_up:
                parked.append(run_id)
                continue
            try:
                runner.requeue_claimed(job.claimed, should_stop=lambda: time.monotonic() > give_up)
            except Exception:  # noqa: BLE001 - reported below
                parked.append(run_id)
        if parked:
            self._announce_parked(parked)

    def _announce_parked(self, run_ids):
        events.announce(
            "runs_parked",
            worker=self.worker_name,
            requeue=command_names.command("requeue"),
            run_list=", ".join(str(run_id) for run_id in run_ids),
            run_ids=list(run_ids),
        )

    def _exit_now(self):
        """The last-resort deadline of a standalone worker: a database call
        still blocks the drain. Name the runs left parked and exit."""
        if not self._stopped_announced:
            parked = [] if self.drained else list(self._pool.in_flight.copy())
            if parked:
                self._announce_parked(parked)
            self.announce_stopped()
        for handler in logging.getLogger().handlers + logging.getLogger("everystep").handlers:
            handler.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
