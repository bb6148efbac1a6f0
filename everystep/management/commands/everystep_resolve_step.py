import json

from django.core.management.base import BaseCommand, CommandError

from everystep.control.actions import resolve_step
from everystep.control.arguments import COMMANDS
from everystep.errors import EverystepError

COMMAND = COMMANDS["resolve-step"]


class Command(BaseCommand):
    help = COMMAND.help

    def add_arguments(self, parser):
        COMMAND.add_arguments(parser)

    def handle(self, run_id, step_id, result, error, discard, **options):
        resolution = {"error": error, "discard": discard}
        if result is not None:
            try:
                resolution["result"] = json.loads(result)
            except (ValueError, RecursionError) as exc:  # a JSONDecodeError is a ValueError
                raise CommandError(f"--result is not valid JSON: {exc}", returncode=2) from None
        try:
            resolve_step(run_id, step_id, **resolution)
        except (EverystepError, ValueError) as exc:
            raise CommandError(str(exc), returncode=2) from None
        self.stdout.write(f"run {run_id}: step {step_id} resolved; the run is scheduled again")
