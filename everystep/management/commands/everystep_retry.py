from django.core.management.base import BaseCommand, CommandError

from everystep.control import actions
from everystep.errors import EverystepError


class Command(BaseCommand):
    help = (
        "Retry a failed run: it is scheduled again; its done steps are served from the "
        "record and its failed steps run again."
    )

    def add_arguments(self, parser):
        parser.add_argument("run_id", metavar="RUN_ID")

    def handle(self, run_id, **options):
        try:
            actions.retry(run_id)
        except EverystepError as exc:
            raise CommandError(str(exc), returncode=2) from None
        self.stdout.write(f"run {run_id} scheduled again")
