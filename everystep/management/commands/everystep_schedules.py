"""``everystep_schedules``: the cron workflows of ``EVERYSTEP_WORKFLOWS`` (or
the project's apps), each with its next tick and its latest tick's run.
``everystep schedules`` runs this command, so both print the same."""

import json

from django.core.management.base import BaseCommand

from everystep.control.arguments import COMMANDS
from everystep.db import reads

EMPTY = "no cron workflows are registered (@workflow(cron=...))"

COMMAND = COMMANDS["schedules"]


class Command(BaseCommand):
    help = COMMAND.help

    def add_arguments(self, parser):
        COMMAND.add_arguments(parser)

    def handle(self, **options):
        rows = reads.schedules()
        if options["json"]:
            self.stdout.write(json.dumps(rows, default=str, indent=2))
        elif not rows:
            self.stdout.write(EMPTY)
        else:
            for row in rows:
                latest = (
                    f"{row['latest_status']} (run {row['latest_run']})"
                    if row["latest_run"]
                    else "not run"
                )
                self.stdout.write(
                    f"{row['workflow']}  {row['cron']!r} {row['timezone']}  "
                    f"next {row['next_tick'].isoformat()}  "
                    f"latest {row['latest_tick'].isoformat()}: {latest}"
                )
