"""A worker's options, each defined once: its flag, its environment
variable, its default, its validation and its help.

`Worker` validates with `WorkerOptions`; ``manage.py everystep_worker`` and
the ``everystep worker`` command add the same flags with `add_arguments` and
resolve them with `resolve`, a flag winning over its variable and the
variable over the default. The library reads no environment itself: the
caller hands `from_environment` the environment it read (a mapping), and
`resolve` what that gives.
"""

import argparse
import dataclasses
import math
import re
import socket

#: The longest worker name the ``claimed_by`` column holds.
MAX_NAME_LENGTH = 255
#: The most runs one worker keeps in flight: one thread and one database
#: connection each.
MAX_POOL = 1000
HOUR = 3600
DAY = 86400


class OptionError(ValueError):
    """An option's value cannot be used; the message names the flag or the
    variable it came from and what is wrong with it."""


def _number(kind, minimum, maximum, *, above=False):
    """A parser of numbers of `kind` from `minimum` (excluded when `above`)
    to `maximum`: every time a worker waits for is one the platform's clock
    can count, and a pool one its threads can hold."""
    noun = "whole number" if kind is int else "number"

    def parse(value):
        try:
            number = kind(value)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"is not a {noun}") from None
        if kind is float and not math.isfinite(number):
            raise ValueError("is not a finite number")
        if number < minimum or (above and number == minimum):
            raise ValueError(f"must be {'>' if above else '>='} {minimum}")
        if number > maximum:
            raise ValueError(f"must be at most {maximum}")
        return number

    return parse


def _boolean(value):
    if isinstance(value, bool):
        return value
    lowered = str(value).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("is not a boolean: use true or false")


def _seconds_of(value, examples):
    """`value` (a number, or a duration such as ``30d`` or ``90m``) in
    seconds; `ValueError` naming `examples` otherwise."""
    from everystep.core import clock
    from everystep.errors import EverystepError

    try:
        return float(value if isinstance(value, int | float) else clock.parse_duration(str(value)))
    except EverystepError:
        raise ValueError(f"is not a duration: write it as {examples}") from None


def _retention(value):
    """A retention: a duration (``30d``, ``12h``, or seconds), more than 0."""
    seconds = _seconds_of(value, "30d, 12h or 90m")
    if not seconds > 0:
        raise ValueError("must be more than 0")
    return seconds


#: The shortest orphan timeout: two heartbeats (every 5 s). A shorter one
#: would find every live worker silent between two of its heartbeats.
MIN_ORPHAN_TIMEOUT = 10.0


def _orphan_timeout(value):
    """An orphan timeout: a duration (``60s``, ``2m``, or seconds) from
    `MIN_ORPHAN_TIMEOUT` to a day; 0 turns the recovery off."""
    seconds = _seconds_of(value, "60s, 2m or 90 (0 turns it off)")
    if seconds != 0 and not MIN_ORPHAN_TIMEOUT <= seconds <= DAY:
        raise ValueError(f"must be 0 (off) or from {MIN_ORPHAN_TIMEOUT:g}s (two heartbeats) to 1d")
    return seconds


def port_number(value):
    """`value` as a TCP port number (None stays None); `ValueError` saying
    what is wrong otherwise. Every port option and variable reads it."""
    if value is None:
        return None
    try:
        port = int(value)
    except (TypeError, ValueError):
        raise ValueError("is not a port number") from None
    if not 1 <= port <= 65535:
        raise ValueError("must be a port number from 1 to 65535")
    return port


def _queue_names(value):
    """Queue names from a comma-separated text, or a list of such texts
    (``--queue`` given several times); None when empty: every queue."""
    from everystep.core import queues
    from everystep.errors import EverystepError

    texts = [value] if isinstance(value, str) else list(value or ())
    names = [name.strip() for text in texts for name in str(text).split(",") if name.strip()]
    try:
        checked = tuple(dict.fromkeys(queues.check_name(name, "a queue") for name in names))
    except EverystepError as exc:
        raise ValueError(str(exc).removeprefix("a queue ")) from None
    return checked or None


def check_queues(worker_options):
    """Refuse, as an `OptionError`, a served queue this process does not
    know (no workflow module declares it, no workflow or task uses it):
    a misspelt ``--queue`` would serve nothing, silently."""
    from everystep.core import queues, registry

    if worker_options.queues is None:
        return
    known = queues.known() | {registry.placement(name)[0] for name in registry.names()}
    unknown = [name for name in worker_options.queues if name not in known]
    if unknown:
        raise OptionError(
            f"--queue/EVERYSTEP_QUEUES names unknown queue {', '.join(map(repr, unknown))} "
            f"(known: {', '.join(sorted(known))})"
        )


def _host(value):
    if not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value):
        raise ValueError("must be an address or a host name to listen on")
    return value


def _name(value):
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError("must be a non-empty name")
    if len(value) > MAX_NAME_LENGTH:
        raise ValueError(f"is {len(value)} characters long; a worker name has at most 255")
    return value


@dataclasses.dataclass(frozen=True)
class Option:
    """One worker option: `field` of `WorkerOptions`, its `flag` and
    `variable`, how to `parse` a value (raising ValueError with the reason),
    and its `help`. A `negation` flag (``--no-catchup``) sets it false."""

    field: str
    flag: str
    variable: str
    parse: object
    help: str
    negation: str | None = None
    #: The flag may be given several times (its values are collected).
    repeatable: bool = False


OPTIONS = (
    Option(
        "pool_size", "--pool", "EVERYSTEP_POOL", _number(int, 1, MAX_POOL), "runs in flight at most"
    ),
    Option(
        "poll",
        "--poll",
        "EVERYSTEP_POLL",
        _number(float, 0, HOUR, above=True),
        "seconds between claims when idle",
    ),
    Option(
        "name",
        "--name",
        "EVERYSTEP_NAME",
        _name,
        "unique, stable worker name (default: DYNO, then the hostname)",
    ),
    Option(
        "queues",
        "--queue",
        "EVERYSTEP_QUEUES",
        _queue_names,
        "serve only this queue; repeat it, or separate names with commas (default: every queue)",
        repeatable=True,
    ),
    Option(
        "priority_aging",
        "--priority-aging",
        "EVERYSTEP_PRIORITY_AGING",
        _number(float, 0, DAY, above=True),
        "seconds after which a due run is claimed as if at the top priority",
    ),
    Option(
        "drain",
        "--drain",
        "EVERYSTEP_DRAIN",
        _number(float, 0, DAY),
        "seconds to finish in-flight steps on SIGTERM; 0 waits forever",
    ),
    Option(
        "catchup",
        "--catchup",
        "EVERYSTEP_CATCHUP",
        _boolean,
        "resume the runs a crashed process left parked under this name",
        negation="--no-catchup",
    ),
    Option(
        "notify",
        "--notify",
        "EVERYSTEP_NOTIFY",
        _boolean,
        "on PostgreSQL, wake with LISTEN/NOTIFY (behind a pooler, on EVERYSTEP_SESSION_URL)",
        negation="--no-notify",
    ),
    Option(
        "db_deadline",
        "--db-deadline",
        "EVERYSTEP_DB_DEADLINE",
        _number(float, 1, HOUR),
        "seconds any one of the worker's own database operations may take before its "
        "connection is given up as silent",
    ),
    Option(
        "wait_for_migrations",
        "--wait-for-migrations",
        "EVERYSTEP_WAIT_FOR_MIGRATIONS",
        _number(float, 0, DAY),
        "seconds to wait at start for the database's migrations (a release process started "
        "beside the worker); 0 refuses to start while any is pending",
    ),
    Option(
        "retention",
        "--retention",
        "EVERYSTEP_RETENTION",
        _retention,
        "delete the runs that ended longer ago than this (30d), once an hour, one worker at a "
        "time (off when unset)",
    ),
    Option(
        "orphan_timeout",
        "--orphan-timeout",
        "EVERYSTEP_ORPHAN_TIMEOUT",
        _orphan_timeout,
        "requeue the runs of a worker silent for this long whose name no live process holds "
        "(0: never; its runs then wait for a worker under its name, or `requeue`)",
    ),
    Option(
        "metrics_port",
        "--metrics-port",
        "EVERYSTEP_METRICS_PORT",
        port_number,
        "serve /metrics, /healthz and /readyz on this port (off when unset)",
    ),
    Option(
        "metrics_bind",
        "--metrics-bind",
        "EVERYSTEP_METRICS_BIND",
        _host,
        "the address the metrics port listens on",
    ),
)


@dataclasses.dataclass(frozen=True)
class WorkerOptions:
    """A worker's validated options; raises `OptionError` on a bad value."""

    pool_size: int = 4
    poll: float = 0.2
    name: str | None = None
    queues: tuple | None = None
    priority_aging: float = 300.0
    drain: float = 30.0
    catchup: bool = True
    notify: bool = True
    db_deadline: float = 10.0
    wait_for_migrations: float = 0.0
    retention: float | None = None
    orphan_timeout: float = 60.0
    metrics_port: int | None = None
    metrics_bind: str = "0.0.0.0"

    def __post_init__(self):
        for option in OPTIONS:
            value = getattr(self, option.field)
            if value is None:
                continue
            try:
                option.parse(value)
            except ValueError as exc:
                raise OptionError(f"{option.field}={value!r} {exc}") from None


DEFAULTS = WorkerOptions()


def add_arguments(parser):
    """Add every option's flag to an argparse `parser`, naming its variable
    and default in the help. Flags default to None: `resolve` fills them in."""
    for option in OPTIONS:
        default = getattr(DEFAULTS, option.field)
        shown = f"{option.variable}, default {default}" if default is not None else option.variable
        if option.negation is not None:
            parser.add_argument(
                option.flag,
                dest=option.field,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=f"{option.help} ({shown})",
            )
        else:
            parser.add_argument(
                option.flag,
                dest=option.field,
                type=str,
                default=None,
                action="append" if option.repeatable else "store",
                metavar=option.variable.removeprefix("EVERYSTEP_"),
                help=f"{option.help} ({shown})",
            )


def resolve(flags, variables):
    """The `WorkerOptions` from `flags` (field → value or None, as parsed by
    `add_arguments`) over `variables` (variable name → text, the environment
    the caller read) over the defaults. Raises `OptionError` naming the flag
    or variable whose value is bad."""
    values = {}
    for option in OPTIONS:
        flag_value = flags.get(option.field)
        if flag_value is not None:
            source, value = option.flag, flag_value
        elif variables.get(option.variable) not in (None, ""):
            source, value = option.variable, variables[option.variable]
        else:
            continue
        try:
            values[option.field] = option.parse(value)
        except ValueError as exc:
            raise OptionError(_describe(option, source, value, exc)) from None
    return WorkerOptions(**values)


def _describe(option, source, value, reason):
    if isinstance(value, list):  # a repeatable flag's values
        value = ",".join(value)
    if source == option.variable:
        return f"{source}={value!r} {reason}"
    return f"{source} {value!r} {reason}"


# Kubernetes' alphabet for generated names: no vowels, no look-alikes.
_KUBERNETES = "[bcdfghjklmnpqrstvwxz2456789]"
# Host names that change with every container or pod: Docker's and Podman's
# default (the container id's first 12 hex digits), and a Kubernetes
# Deployment's pod (its ReplicaSet's hash, then 5 random characters).
_RANDOM_HOSTNAMES = (
    re.compile(r"[0-9a-f]{12}"),
    re.compile(rf".+-{_KUBERNETES}{{6,10}}-{_KUBERNETES}{{5}}"),
)


def from_environment(environ):
    """The worker options' variables set in `environ` (a mapping), with the
    default name filled in: ``EVERYSTEP_NAME``, else ``DYNO`` (a Heroku dyno's
    stable name), else the hostname."""
    found = {
        option.variable: environ[option.variable]
        for option in OPTIONS
        if environ.get(option.variable, "") != ""
    }
    found.setdefault("EVERYSTEP_NAME", environ.get("DYNO") or socket.gethostname())
    return found


def unstable_name(environ):
    """The default name the worker would take from `environ`, if it is a
    host name that looks random (a container's id, a Deployment's pod): a
    worker restarted under a new name leaves the runs it held parked under
    the old one. None when the name is set or stable."""
    if environ.get("EVERYSTEP_NAME") or environ.get("DYNO"):
        return None
    hostname = socket.gethostname()
    if any(pattern.fullmatch(hostname) for pattern in _RANDOM_HOSTNAMES):
        return hostname
    return None
