from django.core.management.base import BaseCommand, CommandError

from everystep.control import actions
from everystep.control.arguments import COMMANDS
from everystep.errors import EverystepError

COMMAND = COMMANDS["retry"]


class Command(BaseCommand):
    help = COMMAND.help

    def add_arguments(self, parser):
        COMMAND.add_arguments(parser)

    def handle(self, run_id, **options):
        try:
            actions.retry(run_id)
        except EverystepError as exc:
            raise CommandError(str(exc), returncode=2) from None
        self.stdout.write(f"run {run_id} scheduled again")
