"""Queues: where a run waits, and the limits on how many of a queue's runs
run at once or start in a window.

``Queue("emails", concurrency=5, key_concurrency=1, rate="100/m")`` declared
at module level in a workflow module registers the queue in this process,
as ``@workflow`` registers a workflow. A run names its queue (`DEFAULT`
unless told) and keeps it; the claim (`everystep.db.claims`) reads the
limits from the queue's row, which every worker writes as it starts, so
all workers hold a queue to the same limits.

Every rule that refuses a queue, a rate or a priority is here, so that
``@workflow``, `schedule()`, the worker's ``--queue`` and the Tasks backend
refuse the same input with the same sentence (`EverystepError`).
"""

import dataclasses
import re

from everystep.errors import EverystepError

DEFAULT = "default"
MAX_NAME_LENGTH = 64
MAX_KEY_LENGTH = 255
#: Django's range of task priorities, and everystep's.
MIN_PRIORITY, MAX_PRIORITY = -100, 100
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_RATE = re.compile(r"\s*(\d+)\s*/\s*(s|m|h)\s*")
_PERIODS = {"s": 1, "m": 60, "h": 3600}
#: The queues declared in this process, by name.
_declared = {}
#: Queue names another part of the process accepts as known without
#: declaring limits (the Tasks backend's ``QUEUES``).
_accepted = set()


def check_name(name, what="a queue name"):
    """`name` if it is a queue name (1–64 letters, digits, ``_``, ``-``,
    ``.``); `EverystepError` otherwise."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise EverystepError(
            f"{what} must be 1 to {MAX_NAME_LENGTH} letters, digits, '_', '-' or '.', not {name!r}"
        )
    return name


def check_priority(priority):
    """`priority` if it is a whole number from -100 to 100; `EverystepError`
    otherwise."""
    if (
        not isinstance(priority, int)
        or isinstance(priority, bool)
        or not MIN_PRIORITY <= priority <= MAX_PRIORITY
    ):
        raise EverystepError(
            f"a priority must be a whole number from {MIN_PRIORITY} to {MAX_PRIORITY}, "
            f"not {priority!r}"
        )
    return priority


def check_key(key):
    """`key` if it is a concurrency key (a non-empty string of at most 255
    characters) or None; `EverystepError` otherwise."""
    if key is not None and not (isinstance(key, str) and 0 < len(key) <= MAX_KEY_LENGTH):
        raise EverystepError(
            f"concurrency_key must be a non-empty string of at most {MAX_KEY_LENGTH} "
            f"characters, not {key!r}"
        )
    return key


def parse_rate(rate):
    """A rate limit as ``(limit, seconds)``: from ``"100/m"`` (``/s``, ``/m``,
    ``/h``) or a ``(limit, seconds)`` pair; None stays None."""
    if rate is None:
        return None
    if isinstance(rate, str):
        match = _RATE.fullmatch(rate)
        if match:
            limit, seconds = int(match[1]), _PERIODS[match[2]]
        else:
            limit = seconds = None
    elif isinstance(rate, tuple | list) and len(rate) == 2:
        limit, seconds = rate
    else:
        limit = seconds = None
    if (
        not isinstance(limit, int)
        or isinstance(limit, bool)
        or limit < 1
        or not isinstance(seconds, int | float)
        or isinstance(seconds, bool)
        or not 0 < seconds <= 86400
    ):
        raise EverystepError(
            f"a rate must be like '100/m' (per s, m or h) or (limit, seconds) with a limit of "
            f"at least 1 and a window of up to a day, not {rate!r}"
        )
    return limit, float(seconds)


def _positive(value, what):
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise EverystepError(f"{what} must be a whole number of at least 1, not {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class Queue:
    """A queue and its limits, registered when created:

    - `concurrency`: at most this many of its runs ``running`` at once,
      across all workers;
    - `key_concurrency`: at most this many running at once with the same
      ``concurrency_key`` (runs scheduled without a key are not held);
    - `rate`: at most this many first starts in any window of its length
      (``"100/m"``, ``"10/s"``, ``"500/h"`` or ``(limit, seconds)``).

    Declaring a name again with the same limits is harmless (a module
    imported twice); with other limits it raises `EverystepError`.
    """

    name: str
    concurrency: int | None = None
    key_concurrency: int | None = None
    rate: object = None

    def __post_init__(self):
        check_name(self.name)
        _positive(self.concurrency, "concurrency")
        _positive(self.key_concurrency, "key_concurrency")
        object.__setattr__(self, "rate", parse_rate(self.rate))
        earlier = _declared.get(self.name)
        if earlier is not None and earlier != self:
            raise EverystepError(
                f"queue {self.name!r} is declared twice with different limits: "
                f"{earlier.describe()} and {self.describe()}"
            )
        _declared[self.name] = self

    def describe(self):
        """Its limits as people say them (`describe`)."""
        return describe(self.concurrency, self.key_concurrency, self.rate)


def describe(concurrency, key_concurrency, rate):
    """Limits as people say them: ``concurrency 5, rate 100 per 60s``."""
    parts = []
    if concurrency is not None:
        parts.append(f"concurrency {concurrency}")
    if key_concurrency is not None:
        parts.append(f"key concurrency {key_concurrency}")
    if rate is not None:
        parts.append(f"rate {rate[0]} per {rate[1]:g}s")
    return ", ".join(parts) or "no limits"


def declared():
    """The queues declared in this process, by name."""
    return dict(_declared)


def declared_queue(name):
    """The queue `name` as declared in this process, or None."""
    return _declared.get(name)


def accept(names):
    """Accept `names` as known queues of this process without limits (the
    Tasks backend's ``QUEUES``)."""
    _accepted.update(check_name(name) for name in names)


def known():
    """Every queue name this process knows: the default, the declared and
    the accepted ones."""
    return {DEFAULT, *_declared, *_accepted}
