from django.core.management.base import BaseCommand, CommandError

from everystep.db import operations
from everystep.errors import EverystepError


class Command(BaseCommand):
    help = (
        "Put running runs parked under a worker that will not come back back to scheduled, "
        "so any worker resumes them. Refused while that worker is alive (it holds its name)."
    )

    def add_arguments(self, parser):
        parser.add_argument("run_ids", nargs="*", metavar="RUN_ID", help="the runs to requeue")
        parser.add_argument(
            "--claimed-by", metavar="NAME", help="every run parked under this worker name"
        )

    def handle(self, run_ids, claimed_by, **options):
        if bool(run_ids) == bool(claimed_by):
            raise CommandError("give run ids or --claimed-by NAME, not both", returncode=2)
        try:
            requeued = operations.requeue(run_ids or None, claimed_by=claimed_by)
        except EverystepError as exc:
            raise CommandError(str(exc), returncode=2) from None
        for run_id in requeued:
            self.stdout.write(str(run_id))
        self.stderr.write(f"{len(requeued)} run(s) requeued")
