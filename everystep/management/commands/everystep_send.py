"""``everystep_send RUN_ID TOPIC [JSON]``: send a run a message
(`everystep.control.actions.send`)."""

import json

from django.core.management.base import BaseCommand, CommandError

from everystep.control import actions
from everystep.control.arguments import COMMANDS
from everystep.errors import EverystepError

COMMAND = COMMANDS["send"]


class Command(BaseCommand):
    help = COMMAND.help

    def add_arguments(self, parser):
        COMMAND.add_arguments(parser)

    def handle(self, run_id, topic, payload, idempotency_key, **options):
        try:
            value = json.loads(payload)
        except ValueError as exc:
            reason = getattr(exc, "msg", str(exc))
            raise CommandError(
                f"the payload is not valid JSON ({reason}): {payload[:60]!r}", returncode=2
            ) from None
        try:
            actions.send(run_id, topic, value, idempotency_key)
        except EverystepError as exc:
            raise CommandError(str(exc), returncode=2) from None
        self.stdout.write(f"message on {topic} sent to run {run_id}")
