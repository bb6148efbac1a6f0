"""``everystep_queues``: the queues (`queues.statuses`), as a table or as
JSON. ``everystep queues`` runs this command, so both print the same."""

import json

from django.core.management.base import BaseCommand

from everystep.control.arguments import COMMANDS
from everystep.db import queues
from everystep.management.table import aligned

EMPTY = "no queue has runs scheduled or running, and none declares limits"
COLUMNS = ("queue", "limits", "running", "due", "held", "why", "served by")
NUMBERS = {"running", "due", "held"}

COMMAND = COMMANDS["queues"]


class Command(BaseCommand):
    help = COMMAND.help

    def add_arguments(self, parser):
        COMMAND.add_arguments(parser)

    def handle(self, **options):
        rows = queues.statuses()
        if options["json"]:
            self.stdout.write(json.dumps([_fields(row) for row in rows], indent=2))
        elif not rows:
            self.stdout.write(EMPTY)
        else:
            self.stdout.write(aligned(COLUMNS, [_cells(row) for row in rows], NUMBERS))


def _fields(row):
    return {
        "name": row.name,
        "concurrency": row.concurrency,
        "key_concurrency": row.key_concurrency,
        "rate": None if row.rate is None else {"limit": row.rate[0], "seconds": row.rate[1]},
        "running": row.running,
        "due": row.due,
        "held": row.held,
        "held_by": row.held_by,
        "served_by": row.served_by,
    }


def _cells(row):
    served = ", ".join(row.served_by) if row.served_by else "nobody"
    return (
        row.name,
        row.limits,
        str(row.running),
        str(row.due),
        str(row.held),
        row.held_by or "-",
        served,
    )
