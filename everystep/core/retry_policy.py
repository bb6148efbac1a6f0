"""A step's retry policy: ``@step(retries=, backoff=, max_backoff=, retry_on=)``.

A step that raises one of `retry_on` is called again, up to `retries` more
times, after a wait of `backoff` × 2^k seconds (k = 0 for the first retry),
capped at `max_backoff` and jittered down by up to a half so that runs
failing together do not retry together. `Terminal` is never retried, and
neither are the engine's signals (they are not exceptions a step raises).
The runner decides what a wait costs: a short one is slept in place, a
longer one parks the run as a durable sleep would.
"""

import dataclasses
import random

from everystep.errors import EverystepError, Terminal

#: Waits up to this long are slept in the worker; longer ones park the run.
IN_PLACE_SECONDS = 1.0


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How a step is retried; `policy(...)` builds and checks one."""

    retries: int = 0
    backoff: float = 1.0
    max_backoff: float = 300.0
    retry_on: tuple = (Exception,)

    def retries_after(self, error, attempt):
        """Whether the step, having raised `error` on attempt number
        `attempt` (from 1), is called again."""
        return (
            attempt <= self.retries
            and isinstance(error, self.retry_on)
            and not isinstance(error, Terminal)
        )

    def wait(self, attempt):
        """Seconds to wait after attempt number `attempt` failed: capped,
        then jittered down by up to a half."""
        capped = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
        return capped * random.uniform(0.5, 1.0)


def policy(retries=0, backoff=1.0, max_backoff=300.0, retry_on=(Exception,)):
    """A checked `RetryPolicy`, or None for a step that is never retried;
    `EverystepError` naming the bad option otherwise."""
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        raise EverystepError(f"retries must be a whole number >= 0, not {retries!r}")
    for name, value in (("backoff", backoff), ("max_backoff", max_backoff)):
        if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
            raise EverystepError(f"{name} must be a number of seconds >= 0, not {value!r}")
    if max_backoff < backoff:
        raise EverystepError(f"max_backoff ({max_backoff}) is less than backoff ({backoff})")
    classes = retry_on if isinstance(retry_on, tuple) else (retry_on,)
    if not classes or not all(
        isinstance(kind, type) and issubclass(kind, Exception) for kind in classes
    ):
        raise EverystepError(
            f"retry_on must be an exception class or a tuple of them, not {retry_on!r}"
        )
    if retries == 0:
        return None
    return RetryPolicy(retries, float(backoff), float(max_backoff), classes)
