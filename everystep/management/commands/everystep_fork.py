"""``everystep_fork RUN_ID --from-step STEP_ID``: a new run resuming a
finished one from that step (`everystep.control.actions.fork`)."""

from django.core.management.base import BaseCommand, CommandError

from everystep.control import actions
from everystep.control.arguments import COMMANDS
from everystep.errors import EverystepError

COMMAND = COMMANDS["fork"]


class Command(BaseCommand):
    help = COMMAND.help

    def add_arguments(self, parser):
        COMMAND.add_arguments(parser)

    def handle(self, run_id, from_step, **options):
        try:
            forked = actions.fork(run_id, from_step)
        except EverystepError as exc:
            raise CommandError(str(exc), returncode=2) from None
        self.stdout.write(str(forked))
