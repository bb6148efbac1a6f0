"""What happens to runs and workers, announced in one place.

The runner and the worker call `announce(EVENT, **fields)` at each
transition — a run claimed, finished, requeued; a step recorded; the
database lost and found again — and never log, count or trace on their own.
`announce` writes the log record (one message per event, with the same
``extra`` keys every time: ``action`` and the event's fields, run ids as
strings) and then calls every subscriber with the event's name and fields,
so metrics, traces and error reporting hang off the same seam.

A subscriber must be quick and must not raise: it runs on the engine's own
threads. One that raises is logged and skipped, never allowed to fail a run.
"""

import dataclasses
import logging
import uuid

logger = logging.getLogger("everystep")

DEBUG, INFO, WARNING, ERROR = logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR


@dataclasses.dataclass(frozen=True)
class Event:
    """An event's log level and message, formatted with its fields."""

    level: int
    message: str


EVENTS = {
    "worker_ready": Event(
        INFO,
        "worker {worker} ready: pool {pool_size}, poll {poll}s, drain {drain}s, "
        "database {vendor}, {wakeup}",
    ),
    "name_wait": Event(
        WARNING, "worker name {worker} is held by a live worker; waiting {wait} for it to exit"
    ),
    "name_lock_lost": Event(
        WARNING,
        "worker {worker}: the lock on its name was lost with its connection; taking it again",
    ),
    "claim": Event(INFO, "worker {worker} {how} {count} run(s): {run_list}"),
    "step_recorded": Event(DEBUG, "run {run_id} step {step_id} {status}"),
    **{
        f"run_{status}": Event(
            INFO if status == "completed" else WARNING,
            "run {run_id} {workflow} {status} in {millis:.0f} ms{reason}",
        )
        for status in ("completed", "failed", "stopped", "blocked")
    },
    "run_requeued": Event(INFO, "run {run_id} requeued {reason}"),
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
    "run_crashed": Event(ERROR, "run {run_id} {workflow} crashed outside its steps; failed"),
    "db_outage": Event(
        WARNING, "database unreachable while {what}, retrying with backoff: {error}"
    ),
    "db_recovered": Event(INFO, "database reachable again after {seconds:.1f}s"),
    "sessions_ended": Event(
        INFO,
        "ended {count} database session(s) left open by connections cut off earlier: "
        "{session_list}",
    ),
    "loop_error": Event(ERROR, "worker {worker}: error in the worker loop, retrying: {error}"),
    "drain": Event(
        INFO, "worker {worker} draining {count} run(s): each is requeued at its next step{until}"
    ),
    "runs_parked": Event(
        ERROR,
        "worker {worker} exits with the database unreachable: run(s) {run_list} stay claimed "
        "under this name and resume when a worker starts as {worker} "
        "(or: everystep requeue --claimed-by {worker})",
    ),
    "worker_stopped": Event(INFO, "worker {worker} stopped"),
}

_subscribers = []


def subscribe(callback):
    """Call ``callback(event, fields)`` after each announcement; returns it."""
    _subscribers.append(callback)
    return callback


def unsubscribe(callback):
    _subscribers.remove(callback)


def announce(event, exc_info=None, **fields):
    """Log `event` with `fields` and tell the subscribers."""
    spec = EVENTS[event]
    level = spec.level
    if logger.isEnabledFor(level):
        extra = {"action": event, **{key: _plain(value) for key, value in fields.items()}}
        logger.log(level, spec.message.format(**fields), exc_info=exc_info, extra=extra)
    for callback in _subscribers:
        try:
            callback(event, fields)
        except Exception:  # noqa: BLE001 - a subscriber never fails a run
            logger.exception("an everystep event subscriber failed on %s", event)


def _plain(value):
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value
