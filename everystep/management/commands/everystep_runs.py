"""``everystep_runs``: the newest runs first, filtered as the UI's runs
page filters them (`reads.RunFilter`), as lines or as the JSON of its
``api/runs``. ``everystep runs`` runs this command, so both print the same."""

from django.core.management.base import BaseCommand, CommandError

from everystep.control.arguments import COMMANDS
from everystep.core.serde import readable_json
from everystep.db import reads
from everystep.errors import EverystepError
from everystep.management import selection

COMMAND = COMMANDS["runs"]


class Command(BaseCommand):
    help = COMMAND.help

    def add_arguments(self, parser):
        COMMAND.add_arguments(parser)

    def handle(self, **options):
        try:
            run_filter = selection.run_filter(options)
            rows = reads.runs_page(run_filter, size=options["limit"]).runs
        except EverystepError as exc:
            raise CommandError(str(exc), returncode=2) from None
        if options["json"]:
            self.stdout.write(readable_json(reads.listed(rows), indent=2))
            return
        for run in rows:
            self.stdout.write(
                f"{run.id}  {run.status:<9}  {run.name}  queue {run.queue}  "
                f"created {run.created_at:%Y-%m-%d %H:%M:%S}"
                + (f"  by {run.claimed_by}" if run.claimed_by else "")
                + (f"  waits for {waits}" if (waits := reads.waits_for(run)) else "")
            )
