"""What the run-selecting flags of the commands mean (``runs``, and a bulk
``cancel`` or ``retry``), read once for all of them."""

import datetime

from everystep.core import clock, registry
from everystep.db import reads
from everystep.errors import EverystepError
from everystep.ui import filters


def run_filter(options, status=None):
    """The `reads.RunFilter` of the flags in `options` (``--workflow``,
    ``--worker``, ``--queue``, ``--since``, ``--until``, ``--waiting``), with
    `status` (default: ``--status``)."""
    return reads.RunFilter(
        status=options.get("status") if status is None else status,
        workflow=workflow_name(options.get("workflow")),
        worker=options.get("worker"),
        queue=options.get("queue"),
        created_after=moment("--since", options["since"]) if options.get("since") else None,
        created_before=moment("--until", options["until"]) if options.get("until") else None,
        waiting=bool(options.get("waiting")),
    )


def workflow_name(name):
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


def moment(flag, text):
    """``--since`` / ``--until``: an ISO 8601 time (UTC without a zone), as
    the UI's filters read one, or a duration back from now (``90m``, ``2h``)."""
    try:
        return filters.moment(flag, text)
    except EverystepError:
        pass
    try:
        return clock.now() - datetime.timedelta(seconds=clock.parse_duration(text))
    except EverystepError:
        raise EverystepError(
            f"{flag} {text!r} is neither a time (2026-12-03T14:30, UTC unless it gives a zone) "
            f"nor a duration back from now (90m, 2h, 1d)"
        ) from None
