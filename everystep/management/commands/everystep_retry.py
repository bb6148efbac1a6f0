from django.core.management.base import BaseCommand, CommandError

from everystep.control import actions
from everystep.control.arguments import COMMANDS
from everystep.errors import EverystepError
from everystep.management import bulk

COMMAND = COMMANDS["retry"]


class Command(BaseCommand):
    help = COMMAND.help

    def add_arguments(self, parser):
        COMMAND.add_arguments(parser)

    def handle(self, run_id, **options):
        run_filter = bulk.selected({"run_id": run_id, **options})
        try:
            if run_filter is not None:
                done = actions.retry_matching(run_filter, dry_run=options["dry_run"])
                bulk.report(self, done, options["dry_run"], "scheduled again")
                return
            actions.retry(run_id)
        except EverystepError as exc:
            raise CommandError(str(exc), returncode=2) from None
        self.stdout.write(f"run {run_id} scheduled again")
