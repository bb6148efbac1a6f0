"""Retrying the engine's own database operations through transient errors.

A lost connection, a server restart, a deadlock, a serialization failure or a
lock-wait timeout says nothing about the run: the engine retries the write
with backoff instead of failing the run. Anything else (a data error, a
missing table, a bug) is not transient and propagates.

Which errors are transient is `everystep.resilience.classify`'s to say.
Each attempt runs under the engine's deadline (`everystep.resilience.deadline`),
so a database that went silent fails the attempt instead of hanging it, and
the outage it reveals is tracked once for the process
(`everystep.resilience.outage`).
"""

import random
import time

from everystep.core import events
from everystep.errors import ConfigurationError
from everystep.resilience import classify, deadline, local, outage, sessions

MAX_BACKOFF = 5.0


def replace_if_outage(seen):
    """Reset this thread's connection if an outage began since generation
    `seen` (it may be cut off silently); returns the generation now."""
    if outage.tracker.generation != seen:
        reset_connection(cut_off=True)
    return outage.tracker.generation


def reset_connection(cut_off=False):
    """Drop this thread's connection so the next query opens a fresh one.
    `cut_off`: it may have been cut off without the server's knowledge, so
    its session is remembered to be ended later (`everystep.resilience.sessions`)."""
    wrapper = local.connection()
    if cut_off:
        sessions.abandon(wrapper)
    else:
        sessions.forget(wrapper)
    try:
        wrapper.close()
    except Exception:  # noqa: BLE001 - the connection is already broken
        pass


def drop_after(exc):
    """Drop this thread's connection after the database error `exc`; a
    connection error (not contention: the server answered) may have cut it off."""
    reset_connection(cut_off=classify.is_transient(exc) and not classify.is_contention(exc))


def backoff_delays(first=0.05, cap=MAX_BACKOFF):
    """Exponential delays with jitter, capped: 0.05, 0.1, 0.2 … `cap` seconds."""
    delay = first
    while True:
        yield delay * random.uniform(0.5, 1.0)
        delay = min(delay * 2, cap)


def retrying(operation, *, what, should_stop=None, fatal=None):
    """Call ``operation(attempt)`` until it returns, retrying transient
    database errors with backoff; `attempt` counts from 1. Each attempt is
    under the engine's deadline on this thread's connection.

    `what` names the operation in the log. `should_stop`, when given, is
    asked before each retry: if it returns true the last error is raised;
    so is an error for which `fatal(error)` is true.
    """
    delays = None  # made at the first failure: most operations succeed at once
    attempt = 1
    while True:
        wrapper = local.connection()
        began_in = outage.generation_of(wrapper)
        try:
            with deadline.guard(wrapper, what):
                result = operation(attempt)
        except Exception as exc:
            if (
                not classify.is_transient(exc)
                or (fatal is not None and fatal(exc))
                or (should_stop is not None and should_stop())
            ):
                raise
            outage.tracker.failed(what, exc, began_in)
            delays = delays or backoff_delays()
            delay = next(delays)
            events.announce(
                "db_retry", what=what, attempt=attempt, delay=delay, error=classify.one_line(exc)
            )
            drop_after(exc)
            time.sleep(delay)
            attempt += 1
        else:
            outage.tracker.succeeded()
            return result


def first_contact(operation, *, what, should_stop=None):
    """`retrying` for a process's first operations on the database: an error
    saying the settings cannot work (`is_configuration_error`) raises
    `ConfigurationError` at once instead of being retried as an outage."""
    try:
        return retrying(
            operation, what=what, should_stop=should_stop, fatal=classify.is_configuration_error
        )
    except Exception as exc:
        if classify.is_configuration_error(exc):
            raise ConfigurationError(
                f"the database refuses these settings: {classify.one_line(exc)}"
            ) from None
        raise
