"""What happens to runs and workers, announced in one place.

The runner and the worker call `announce(EVENT, fence, **fields)` at each
transition — a run claimed, finished, requeued; a step recorded; the
database lost and found again — and never log, count or trace on their own.
`announce` calls every subscriber of the event — the metrics
(`everystep.observe.metrics`), the spans (`everystep.observe.tracing`) and the error
reports (`everystep.observe.sentry`) hang off this seam, each subscribing a
mapping of the events it handles to their handlers — and writes the log
record: one message per event, with the same ``extra`` keys every time
(``action`` and the event's fields, run ids as strings; objects meant for
subscribers, such as an exception, kept out). An event about a claimed run
names its `everystep.core.fence.Fence` whole: the run's id, its workflow and
its worker become fields of the event.

A subscriber must be quick and must not raise: it runs on the engine's own
threads. One that raises is logged and skipped, never allowed to fail a run.
"""

import dataclasses
import functools
import logging
import threading
import uuid
from collections.abc import Mapping

logger = logging.getLogger("everystep")

DEBUG, INFO, WARNING, ERROR = logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR

#: How a run's attempt can finish it; each is announced as ``run_<status>``.
FINISHED = ("completed", "failed", "stopped", "blocked", "cancelled")


@dataclasses.dataclass(frozen=True)
class Event:
    """An event's log level and message, formatted with its fields. The
    fields named in `hidden` (objects, for subscribers) are kept out of the
    log record's extras."""

    level: int
    message: str
    hidden: tuple = ()


EVENTS = {
    "worker_ready": Event(
        INFO,
        "worker {worker} ready: pool {pool_size}, poll {poll}s, drain {drain}s, "
        "database {vendor}, {wakeup}",
        hidden=("in_flight",),
    ),
    "name_wait": Event(
        WARNING, "worker name {worker} is held by a live worker; waiting {wait} for it to exit"
    ),
    "name_lock_lost": Event(
        WARNING,
        "worker {worker}: the lock on its name was lost with its connection; taking it again",
    ),
    "claim": Event(INFO, "worker {worker} {how} {count} run(s): {run_list}", hidden=("runs",)),
    "attempt_started": Event(
        DEBUG, "run {run_id} {workflow}: attempt started", hidden=("trace_context",)
    ),
    "step_started": Event(DEBUG, "run {run_id} step {step_id} {step} started"),
    "step_recorded": Event(
        DEBUG,
        "run {run_id} step {step_id} {step} {status} in {seconds:.3f}s",
        hidden=("exception",),
    ),
    "step_retrying": Event(
        WARNING,
        "run {run_id} step {step_id} {step} failed (attempt {attempt} of {attempts}): "
        "{error}; retrying in {seconds:.1f}s",
        hidden=("exception",),
    ),
    "step_unrecorded": Event(
        DEBUG, "run {run_id} step {step_id} ended unrecorded: {exception!r}", hidden=("exception",)
    ),
    "fork_started": Event(DEBUG, "run {run_id} fork {fork_id}: {count} branches"),
    "fork_ended": Event(DEBUG, "run {run_id} fork {fork_id} joined"),
    "attempt_ended": Event(
        DEBUG, "run {run_id} {workflow}: attempt ended {status}", hidden=("exception",)
    ),
    "worker_starting": Event(DEBUG, "worker {worker} starting"),
    "name_unstable_unrecovered": Event(
        WARNING,
        "worker name {worker} is a host name that looks random (a container's id, a pod's "
        "name) and EVERYSTEP_ORPHAN_TIMEOUT is 0: if the worker dies, the runs it held wait "
        "parked under this name. Set EVERYSTEP_NAME (or --name) to a name that survives a "
        "restart, or let other workers recover them (an orphan timeout)",
    ),
    "name_unstable": Event(
        INFO,
        "worker name {worker} is a host name that looks random (a container's id, a pod's "
        "name): if this worker dies, its runs are recovered by another worker once it has "
        "been silent for the orphan timeout. A name that survives a restart (EVERYSTEP_NAME, "
        "--name) resumes them at once instead",
    ),
    "migrations_pending": Event(
        WARNING,
        "{count} migration(s) not applied yet: waiting up to {seconds:g}s for `{migrate}`",
    ),
    "migrations_applied": Event(INFO, "migrations applied: starting"),
    **{
        f"run_{status}": Event(
            INFO if status in ("completed", "cancelled") else WARNING,
            "run {run_id} {workflow} {status} in {millis:.0f} ms{reason}",
            hidden=("exception",),
        )
        for status in FINISHED
    },
    "run_requeued": Event(INFO, "run {run_id} requeued {reason}"),
    "run_sleeping": Event(INFO, "run {run_id} {workflow} sleeps at step {step_id} until {wake_at}"),
    "message_sent": Event(DEBUG, "message on {topic} sent to run {run_id}"),
    "run_waiting": Event(
        INFO, "run {run_id} {workflow} waits at step {step_id} for {waits_for} until {wake_at}"
    ),
    "runs_recovered": Event(
        WARNING,
        "worker {worker} recovered {count} run(s) of worker {silent_worker}, silent for "
        "{silent_for:.0f}s: requeued {run_list}",
    ),
    "run_released": Event(
        WARNING,
        "run {run_id}: workflow {workflow} is not registered in worker {worker}; "
        "released for a worker that has it",
    ),
    "claim_lost": Event(
        WARNING,
        "run {run_id}: this runner lost its claim (requeued or claimed elsewhere); "
        "its late writes were dropped",
    ),
    "run_vanished": Event(WARNING, "run {run_id} vanished while it ran (its row was deleted)"),
    "run_crashed": Event(
        ERROR, "run {run_id} {workflow} crashed outside its steps; failed", hidden=("exception",)
    ),
    "db_outage": Event(
        WARNING, "database unreachable while {what}, retrying with backoff: {error}"
    ),
    "db_recovered": Event(INFO, "database reachable again after {seconds:.1f}s"),
    "db_retry": Event(
        DEBUG,
        "database unavailable while {what} (attempt {attempt}), retrying in {delay:.2f}s: {error}",
    ),
    "peers": Event(
        INFO,
        "worker {worker} is one of {count} ready worker(s) serving the same workflows and "
        "queues: a run notified wakes {responders} of them, and each polls every {poll:g}s",
    ),
    "behind_pooler": Event(
        INFO,
        "the database is reached through a connection pooler: the engine prepares no "
        "statements there (a pooler in transaction mode may run a statement prepared on one "
        "server session on another), sets the claim's settings per transaction, and leaves "
        "ending cut-off sessions to the pooler",
    ),
    "sessions_ended": Event(
        INFO,
        "ended {count} database session(s) left open by connections cut off earlier: "
        "{session_list}",
    ),
    "loop_error": Event(ERROR, "worker {worker}: error in the worker loop, retrying: {error}"),
    "loop_died": Event(
        ERROR, "worker {worker}: its {loop} thread died: {error}; draining and stopping"
    ),
    "drain": Event(
        INFO, "worker {worker} draining {count} run(s): each is requeued at its next step{until}"
    ),
    "runs_parked": Event(
        ERROR,
        "worker {worker} exits with the database unreachable: run(s) {run_list} stay claimed "
        "under this name and resume when a worker starts as {worker} "
        "(or: {requeue} --claimed-by {worker})",
    ),
    "worker_stopped": Event(INFO, "worker {worker} stopped"),
}

_subscribers = []  # in the order they subscribed
_routes = {}  # event name → its handlers, ``handler(fields)``, in that order
_lock = threading.Lock()


def subscribe(subscriber):
    """Subscribe to the announcements (once, however often it is
    subscribed); returns `subscriber`. It is either ``callback(event,
    fields)``, called after each announcement, or a mapping of event names
    to ``handler(fields)``, each called after its event's (read when
    subscribed)."""
    global _subscribers
    with _lock:
        if subscriber not in _subscribers:
            _subscribers = [*_subscribers, subscriber]
            _route()
    return subscriber


def unsubscribe(subscriber):
    """Stop calling `subscriber`; nothing happens if it was not subscribed."""
    global _subscribers
    with _lock:
        _subscribers = [subscribed for subscribed in _subscribers if subscribed != subscriber]
        _route()


def wanted(event):
    """Whether announcing `event` would reach anyone: a subscriber of it, or
    the log at its level. What nobody wants need not be announced."""
    return event in _routes or logger.isEnabledFor(EVENTS[event].level)


def _route():
    """Rebuild the handlers of each event from the subscribers, copy on
    write: `announce` reads a mapping nobody changes."""
    global _routes
    routes = {}
    for subscriber in _subscribers:
        if isinstance(subscriber, Mapping):
            handlers = subscriber.items()
        else:
            handlers = ((event, functools.partial(subscriber, event)) for event in EVENTS)
        for event, handler in handlers:
            routes.setdefault(event, []).append(handler)
    _routes = {event: tuple(handlers) for event, handlers in routes.items()}


def announce(event, fence=None, *, exc_info=None, **fields):
    """Tell the subscribers about `event` and its `fields` (and those of
    `fence`, the run it is about, if any), then log it. Subscribers come
    first: an error reporter hooked to the logging (Sentry's integration)
    then recognizes the record's exception as already reported."""
    handlers = _routes.get(event, ())
    spec = EVENTS[event]
    logged = logger.isEnabledFor(spec.level)
    if not handlers and not logged:
        return  # nobody wants it (a step's own events, mostly): its fields are not even gathered
    if fence is not None:
        fields = {**fence.fields(), **fields}
    for handler in handlers:
        try:
            handler(fields)
        except Exception:  # noqa: BLE001 - a subscriber never fails a run
            logger.exception("an everystep event subscriber failed on %s", event)
    if logged:
        extra = {
            "action": event,
            **{key: _plain(value) for key, value in fields.items() if key not in spec.hidden},
        }
        logger.log(spec.level, spec.message.format(**fields), exc_info=exc_info, extra=extra)


def _plain(value):
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value
