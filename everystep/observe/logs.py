"""How everystep's log lines look, and how a worker shows them when the
project says nothing about logging.

Every line names its time (ISO 8601, with the UTC offset), its level and
its logger, as text (`TextFormatter`) or as one JSON object per line
(`JsonFormatter`). The standalone runtime configures this for everything it
logs (``everystep_config.django.logging_config``); a Django project's
worker command calls `show_by_default`, which adds it for the
``everystep`` logger only when the project configured no handler that
would show its records. Both read ``EVERYSTEP_LOG_LEVEL`` and
``EVERYSTEP_LOG_FORMAT`` the same way (`LEVELS`, `FORMATS`).
"""

import datetime
import logging
import sys

from pythonjsonlogger.json import JsonFormatter as _JsonFormatter

#: The text form of a log line.
TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
#: The levels and formats ``EVERYSTEP_LOG_LEVEL`` and ``_FORMAT`` name.
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMATS = ("text", "json")


class TextFormatter(logging.Formatter):
    """`TEXT_FORMAT`, its time in ISO 8601 to the millisecond with the
    host's UTC offset: ``2026-12-04T12:19:21.123+00:00``."""

    def __init__(self, fmt=TEXT_FORMAT, **kwargs):
        super().__init__(fmt, **kwargs)

    def formatTime(self, record, datefmt=None):  # noqa: N802 - logging's name
        moment = datetime.datetime.fromtimestamp(record.created, _host_zone(record.created))
        return moment.isoformat(timespec="milliseconds")


_zone_of_minute = (None, None)  # (a minute since the epoch, the host's UTC offset in it)


def _host_zone(timestamp):
    """The host's zone (its UTC offset) at `timestamp`, looked up once a
    minute, not once a line: an offset changes only at a minute's start."""
    global _zone_of_minute
    minute = int(timestamp // 60)
    known, zone = _zone_of_minute
    if known != minute:
        zone = datetime.datetime.fromtimestamp(timestamp).astimezone().tzinfo
        _zone_of_minute = (minute, zone)
    return zone


class JsonFormatter(_JsonFormatter):
    """One JSON object per line: ``time`` (ISO 8601, UTC), ``level``,
    ``logger``, ``message``, and each event's fields."""

    def __init__(self, **kwargs):
        super().__init__(
            "%(levelname)s %(name)s %(message)s",
            timestamp="time",
            rename_fields={"levelname": "level", "name": "logger"},
            **kwargs,
        )


FORMATTERS = {"text": TextFormatter, "json": JsonFormatter}


def settings_from(environ):
    """``(level, format)`` as ``EVERYSTEP_LOG_LEVEL`` and
    ``EVERYSTEP_LOG_FORMAT`` set them in `environ` (a mapping), each None
    when unset; `ValueError` naming the variable whose value is not one of
    `LEVELS` or `FORMATS`."""
    found = []
    for variable, choices, normal in (
        ("EVERYSTEP_LOG_LEVEL", LEVELS, str.upper),
        ("EVERYSTEP_LOG_FORMAT", FORMATS, str.lower),
    ):
        value = environ.get(variable) or None
        if value is not None and normal(value) not in choices:
            raise ValueError(f"{variable}={value!r} is not one of: {', '.join(choices)}")
        found.append(value and normal(value))
    return tuple(found)


def show_by_default(level=None, log_format=None, stream=None):
    """Show the ``everystep`` logger's records at `level` (default INFO)
    and above on `stream` (stderr), as the `log_format` (default text)
    writes them — unless the project's logging already has a handler for
    them (on the logger or an ancestor, the root included), in which case
    no handler is added: a project that configures logging keeps its own.
    Returns whether it added the handler.

    A `level` given is set on the logger whatever the project's logging;
    without one, a level the project set on the logger is kept.
    """
    logger = logging.getLogger("everystep")
    if level is not None:
        logger.setLevel(level)
    if logger.hasHandlers():
        return False
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(FORMATTERS[log_format or "text"]())
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    return True
