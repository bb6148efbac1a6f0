import json

from django.core.management.base import BaseCommand, CommandError

from everystep.control.resolve import resolve_step
from everystep.errors import EverystepError


class Command(BaseCommand):
    help = (
        "Resolve the uncertain step of a blocked run and return the run to scheduled: "
        "record its result, record an error, or discard it so it runs again."
    )

    def add_arguments(self, parser):
        parser.add_argument("run_id", help="the blocked run's id")
        parser.add_argument("step_id", help="the id of its started step, e.g. 3 or fanout.1.charge")
        how = parser.add_mutually_exclusive_group(required=True)
        how.add_argument("--result", help="the step succeeded: its result, as JSON")
        how.add_argument("--error", help="the step failed: this message is recorded")
        how.add_argument(
            "--discard", action="store_true", help="the step never took effect: run it again"
        )

    def handle(self, run_id, step_id, result, error, discard, **options):
        resolution = {"error": error, "discard": discard}
        if result is not None:
            try:
                resolution["result"] = json.loads(result)
            except json.JSONDecodeError as exc:
                raise CommandError(f"--result is not valid JSON: {exc}") from None
        try:
            resolve_step(run_id, step_id, **resolution)
        except (EverystepError, ValueError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"run {run_id}: step {step_id} resolved; the run is scheduled again")
