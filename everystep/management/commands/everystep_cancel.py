from django.core.management.base import BaseCommand, CommandError

from everystep.control import actions
from everystep.errors import EverystepError
from everystep.models import Workflow


class Command(BaseCommand):
    help = (
        "Cancel a run: a scheduled or blocked one at once, a running one at its next step "
        "boundary (the step in flight is recorded, no further step starts)."
    )

    def add_arguments(self, parser):
        parser.add_argument("run_id", metavar="RUN_ID")
        parser.add_argument("--reason", help="why, kept as the run's error")

    def handle(self, run_id, reason, **options):
        try:
            status = actions.cancel(run_id, reason)
        except EverystepError as exc:
            raise CommandError(str(exc), returncode=2) from None
        self.stdout.write(cancelled_message(run_id, status))


def cancelled_message(run_id, status):
    """What a cancel says it did, for both command lines."""
    if status == Workflow.Status.RUNNING:
        return f"run {run_id} is running: it is cancelled at its next step boundary"
    return f"run {run_id} cancelled"
