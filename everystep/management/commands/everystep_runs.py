"""``everystep_runs``: the newest runs first, filtered as the UI's runs
page filters them (`reads.RunFilter`), as lines or as the JSON of its
``api/runs``. ``everystep runs`` runs this command, so both print the same."""

import datetime

from django.core.management.base import BaseCommand, CommandError

from everystep.control.arguments import COMMANDS
from everystep.core import clock, registry
from everystep.core.serde import readable_json
from everystep.db import reads
from everystep.errors import EverystepError
from everystep.ui import filters

COMMAND = COMMANDS["runs"]


class Command(BaseCommand):
    help = COMMAND.help

    def add_arguments(self, parser):
        COMMAND.add_arguments(parser)

    def handle(self, **options):
        try:
            run_filter = reads.RunFilter(
                status=options["status"],
                workflow=_workflow_name(options["workflow"]),
                worker=options["worker"],
                queue=options["queue"],
                created_after=_since(options["since"]) if options["since"] else None,
                waiting=options["waiting"],
            )
            rows = reads.runs_page(run_filter, size=options["limit"]).runs
        except EverystepError as exc:
            raise CommandError(str(exc), returncode=2) from None
        if options["json"]:
            self.stdout.write(readable_json(reads.listed(rows), indent=2))
            return
        for run in rows:
            self.stdout.write(
                f"{run.id}  {run.status:<9}  {run.name}  queue {run.queue}  "
                f"created {run.created_at:%Y-%m-%d %H:%M:%S}"
                + (f"  by {run.claimed_by}" if run.claimed_by else "")
                + (f"  waits for {waits}" if (waits := reads.waits_for(run)) else "")
            )


def _workflow_name(name):
    """``--workflow``: a qualified name as given (a workflow no longer
    deployed has runs too), or a function name as `schedule` takes it."""
    if name is None or "." in name:
        return name
    try:
        return registry.find(name)
    except LookupError as exc:
        raise EverystepError(
            f"--workflow {name!r}: {exc}; give the qualified name, module.function, of a "
            f"workflow not registered here"
        ) from None


def _since(text):
    """``--since``: an ISO 8601 time (UTC without a zone), as the UI's
    filters read one, or a duration back from now (``90m``, ``2h``)."""
    try:
        return filters.moment("--since", text)
    except EverystepError:
        pass
    try:
        return clock.now() - datetime.timedelta(seconds=clock.parse_duration(text))
    except EverystepError:
        raise EverystepError(
            f"--since {text!r} is neither a time (2026-12-03T14:30, UTC unless it gives a zone) "
            f"nor a duration back from now (90m, 2h, 1d)"
        ) from None
