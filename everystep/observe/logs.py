"""How everystep's log lines look, and how a worker shows them when the
project says nothing about logging.

Every line names its time (ISO 8601, with the UTC offset), its level and
its logger. The standalone runtime configures this for everything it logs
(`everystep_config.django.logging_config`); a Django project's worker
command calls `show_by_default`, which adds it for the ``everystep`` logger
only when the project configured no handler that would show its records.
"""

import datetime
import logging
import sys

#: The text form of a log line.
TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


class TextFormatter(logging.Formatter):
    """`TEXT_FORMAT`, its time in ISO 8601 to the millisecond with the
    host's UTC offset: ``2026-12-04T12:19:21.123+00:00``."""

    def __init__(self, fmt=TEXT_FORMAT, **kwargs):
        super().__init__(fmt, **kwargs)

    def formatTime(self, record, datefmt=None):  # noqa: N802 - logging's name
        moment = datetime.datetime.fromtimestamp(record.created).astimezone()
        return moment.isoformat(timespec="milliseconds")


def show_by_default(level=logging.INFO, stream=None):
    """Show the ``everystep`` logger's records at `level` and above on
    `stream` (stderr), as `TextFormatter` writes them — unless the project's
    logging already has a handler for them (on the logger or an ancestor,
    the root included), in which case nothing changes: a project that
    configures logging keeps its own. Returns whether it added the handler.

    A level the project set on the logger is kept.
    """
    logger = logging.getLogger("everystep")
    if logger.hasHandlers():
        return False
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(TextFormatter())
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(level)
    return True
