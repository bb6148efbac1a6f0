"""Time as the engine reads it: now, durations and due times.

A delayed start, a durable sleep and a retry's wait all come down to one
moment, the run's ``run_at``: a scheduled run is not claimed before it.
This module turns what users write — an aware datetime, a `timedelta` or a
number of seconds, ``90s`` on the command line — into that moment, and
refuses anything else in one clear sentence (`EverystepError`).

`now()` is the engine's clock. Tests that must move time (cron ticks) set
`override` instead of waiting.
"""

import datetime
import math
import re

from everystep.errors import EverystepError

#: Test hook, None in production: a function returning the current aware
#: datetime, read by `now()` instead of the system clock.
override = None

#: The deadline of a wait without a timeout: later than any run is due.
FOREVER = datetime.datetime(9999, 1, 1, tzinfo=datetime.UTC)

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def now():
    """The current time, aware, in UTC."""
    if override is not None:
        return override()
    return datetime.datetime.now(datetime.UTC)


def seconds(duration, what="the duration"):
    """`duration` — a `timedelta` or a number of seconds, not negative — in
    seconds; `EverystepError` naming `what` otherwise."""
    if isinstance(duration, datetime.timedelta):
        value = duration.total_seconds()
    elif isinstance(duration, int | float) and not isinstance(duration, bool):
        value = float(duration)
    else:
        raise EverystepError(
            f"{what} must be a timedelta or a number of seconds, not {type(duration).__name__}"
        )
    if not math.isfinite(value):
        raise EverystepError(f"{what} must be a finite number of seconds, not {duration!r}")
    if value < 0:
        raise EverystepError(f"{what} must not be negative: {duration!r}")
    return value


def aware(moment, what="the time"):
    """`moment` if it is an aware datetime; `EverystepError` otherwise (a
    naive one could mean any time zone)."""
    if not isinstance(moment, datetime.datetime):
        raise EverystepError(f"{what} must be a datetime, not {type(moment).__name__}")
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise EverystepError(
            f"{what} must be an aware datetime (with a time zone), not the naive {moment}"
        )
    return moment


def due_time(run_at=None, delay=None):
    """When a run scheduled now with `run_at` (an aware datetime) or `delay`
    (a `timedelta` or seconds) becomes due: now when neither is given."""
    if run_at is not None and delay is not None:
        raise EverystepError("give run_at or delay, not both")
    if run_at is not None:
        return aware(run_at, "run_at")
    moment = now()
    if delay is not None:
        moment += datetime.timedelta(seconds=seconds(delay, "delay"))
    return moment


def parse_duration(text):
    """A duration written as ``90s``, ``15m``, ``2h``, ``1d``, ``250ms`` or a
    sum of them (``1h30m``), or a plain number of seconds; in seconds.
    `EverystepError` otherwise."""
    cleaned = text.strip().lower()
    try:
        return seconds(float(cleaned), f"duration {text!r}")
    except ValueError:
        pass
    parts = _DURATION.findall(cleaned)
    if not parts or "".join(number + unit for number, unit in parts) != cleaned:
        raise EverystepError(f"{text!r} is not a duration: write it as 90s, 15m, 2h, 1d or 1h30m")
    return sum(float(number) * _UNITS[unit] for number, unit in parts)


def parse_moment(text):
    """An ISO 8601 time with its zone (``2026-12-24T18:00+01:00``, or ``Z``
    for UTC); `EverystepError` for anything else, a naive time included."""
    try:
        moment = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise EverystepError(
            f"{text!r} is not a time: use ISO 8601 with its zone, such as 2026-12-24T18:00Z"
        ) from None
    return aware(moment, f"the time {text!r}")
