from django.core.management.base import BaseCommand, CommandError

from everystep.control import actions
from everystep.control.arguments import COMMANDS
from everystep.errors import EverystepError
from everystep.management import bulk
from everystep.models import Workflow

COMMAND = COMMANDS["cancel"]


class Command(BaseCommand):
    help = COMMAND.help

    def add_arguments(self, parser):
        COMMAND.add_arguments(parser)

    def handle(self, run_id, reason, **options):
        run_filter = bulk.selected({"run_id": run_id, **options})
        try:
            if run_filter is not None:
                done = actions.cancel_matching(run_filter, reason, dry_run=options["dry_run"])
                bulk.report(self, done, options["dry_run"], "cancelled or asked to stop")
                return
            status = actions.cancel(run_id, reason)
        except EverystepError as exc:
            raise CommandError(str(exc), returncode=2) from None
        self.stdout.write(cancelled_message(run_id, status))


def cancelled_message(run_id, status):
    """What a cancel says it did, for both command lines."""
    if status == Workflow.Status.RUNNING:
        return f"run {run_id} is running: it is cancelled at its next step boundary"
    return f"run {run_id} cancelled"
