"""A bulk ``cancel`` or ``retry``: a run id, or the runs the flags select
(`selection`), never everything unless said with ``--all``."""

from django.core.management.base import CommandError

from everystep.errors import EverystepError
from everystep.management import selection

FILTERS = ("status", "workflow", "queue", "since", "until")


def selected(options):
    """The `reads.RunFilter` of a bulk action's flags, or None when a run
    id is given; `CommandError` (status 2) for neither or both, or for no
    filter without ``--all``."""
    filtered = any(options.get(flag) for flag in FILTERS)
    if options.get("run_id"):
        if filtered or options.get("all") or options.get("dry_run"):
            raise CommandError(
                "give a run id, or filters (or --all) for many runs, not both", returncode=2
            )
        return None
    if not filtered and not options.get("all"):
        raise CommandError(
            "give a run id, or filters such as --workflow or --status; to act on every run, "
            "say --all",
            returncode=2,
        )
    try:
        return selection.run_filter(options)
    except EverystepError as exc:
        raise CommandError(str(exc), returncode=2) from None


def report(command, done, dry_run, verb):
    """Print each run acted on (or that would be), then the count."""
    for run_id, status in done:
        command.stdout.write(f"{run_id}  {status}")
    what = f"would be {verb}" if dry_run else verb
    command.stderr.write(f"{len(done)} run(s) {what}")
