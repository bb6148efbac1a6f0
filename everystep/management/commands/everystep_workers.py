"""``everystep_workers``: the workers table (`workers.workers`), as a
table or as JSON. ``everystep workers`` runs this command, so both print
the same."""

import json

from django.core.management.base import BaseCommand

from everystep.control.arguments import COMMANDS
from everystep.db import workers
from everystep.management.table import aligned

EMPTY = "no workers have run on this database"
COLUMNS = (
    "name",
    "state",
    "hostname",
    "pid",
    "version",
    "pool_size",
    "in_flight",
    "started_at",
    "heartbeat",
    "stopped_at",
    "recovered",
)
NUMBERS = {"pid", "pool_size", "in_flight"}  # right-aligned

COMMAND = COMMANDS["workers"]


class Command(BaseCommand):
    help = COMMAND.help

    def add_arguments(self, parser):
        COMMAND.add_arguments(parser)

    def handle(self, **options):
        rows = workers.workers()
        self.stdout.write(as_json(rows) if options["json"] else table(rows))


def as_json(rows):
    """A JSON array of the rows: ISO 8601 timestamps, and the heartbeat's
    age as ``heartbeat_age_seconds``."""
    return json.dumps([_fields(row) for row in rows], indent=2)


def table(rows):
    """The rows in aligned columns under a header, or a line saying there
    are none."""
    if not rows:
        return EMPTY
    return aligned(COLUMNS, [_cells(row) for row in rows], NUMBERS)


def _fields(row):
    return {
        "name": row.name,
        "state": row.state,
        "hostname": row.hostname,
        "pid": row.pid,
        "version": row.version,
        "pool_size": row.pool_size,
        "in_flight": row.in_flight,
        "started_at": row.started_at.isoformat(),
        "heartbeat_at": row.heartbeat_at.isoformat(),
        "heartbeat_age_seconds": round(row.heartbeat_age, 1),
        "stopped_at": row.stopped_at and row.stopped_at.isoformat(),
        "recovered_by": row.recovered_by,
        "recovered_at": row.recovered_at and row.recovered_at.isoformat(),
        "recovered_runs": row.recovered_runs,
    }


def _cells(row):
    return (
        row.name,
        row.state,
        row.hostname,
        str(row.pid),
        row.version,
        str(row.pool_size),
        str(row.in_flight),
        _when(row.started_at),
        _ago(row.heartbeat_age),
        _when(row.stopped_at),
        _recovered(row),
    )


def _recovered(row):
    """Which worker requeued the runs this one left claimed: ``3 by w-2``."""
    return f"{row.recovered_runs} by {row.recovered_by}" if row.recovered_by else "-"


def _when(moment):
    return f"{moment:%Y-%m-%d %H:%M:%S}" if moment else "-"


def _ago(seconds):
    """An age as people say it: ``3s ago``, ``5m ago``, ``2h ago``, ``4d ago``."""
    seconds = int(seconds)
    for unit, size, up_to in (("s", 1, 120), ("m", 60, 120 * 60), ("h", 3600, 48 * 3600)):
        if seconds < up_to:
            return f"{seconds // size}{unit} ago"
    return f"{seconds // 86400}d ago"
