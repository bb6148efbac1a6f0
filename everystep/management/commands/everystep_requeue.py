from django.core.management.base import BaseCommand, CommandError

from everystep.control import actions
from everystep.control.arguments import COMMANDS
from everystep.errors import EverystepError

COMMAND = COMMANDS["requeue"]


class Command(BaseCommand):
    help = COMMAND.help

    def add_arguments(self, parser):
        COMMAND.add_arguments(parser)

    def handle(self, run_ids, claimed_by, **options):
        if bool(run_ids) == bool(claimed_by):
            raise CommandError("give run ids or --claimed-by NAME, not both", returncode=2)
        try:
            requeued = actions.requeue(run_ids or None, claimed_by=claimed_by)
        except EverystepError as exc:
            raise CommandError(str(exc), returncode=2) from None
        for run_id in requeued:
            self.stdout.write(str(run_id))
        self.stderr.write(f"{len(requeued)} run(s) requeued")
