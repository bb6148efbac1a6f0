"""``everystep_prune --older-than 30d``: delete finished runs
(`everystep.control.actions.prune`)."""

from django.core.management.base import BaseCommand, CommandError

from everystep.control import actions
from everystep.control.arguments import COMMANDS
from everystep.core import clock
from everystep.errors import EverystepError

COMMAND = COMMANDS["prune"]


class Command(BaseCommand):
    help = COMMAND.help

    def add_arguments(self, parser):
        COMMAND.add_arguments(parser)

    def handle(self, older_than, status, workflow, dry_run, **options):
        try:
            seconds = clock.parse_duration(older_than)
            statuses = [name.strip() for name in status.split(",")] if status else None
            deleted = actions.prune(seconds, statuses, workflow, dry_run=dry_run)
        except EverystepError as exc:
            raise CommandError(str(exc), returncode=2) from None
        verb = "would be deleted" if dry_run else "deleted"
        self.stdout.write(f"{deleted} run(s) {verb}")
