"""What each view shows, as data: the pages render it, the JSON API returns
it, and the live stream sends it again whenever it changes.

Every function reads through `everystep.db.operations`, the same queries the
command line uses.
"""

import dataclasses
import hashlib

from django.utils import timezone

from everystep.core.serde import readable_json
from everystep.db import reads
from everystep.db import workers as workers_table
from everystep.errors import EverystepError
from everystep.models import Workflow
from everystep.ui import drawing, filters


class NotFound(EverystepError):
    """The run, or the page, asked for does not exist."""


def runs(query):
    """The runs page of `query`'s filters and cursor: the runs with their
    step counts, the next page's cursor and the counts per status."""
    run_filter = filters.run_filter(query)
    page = reads.runs_page(run_filter, filters.cursor(query))
    return {
        "runs": reads.listed(page.runs),
        "next_cursor": page.next_cursor,
        "counts": reads.status_counts(run_filter),
        "count_cap": reads.COUNT_CAP,
    }


def run(run_id, now=None):
    """One run: its fields, decoded values, steps with their durations, and
    its graph with live statuses. `NotFound` for an unknown id."""
    try:
        found, steps = reads.run_with_steps(run_id)
    except EverystepError as exc:
        raise NotFound(str(exc)) from None
    graph = drawing.step_graph(found, steps)
    return {
        **reads.run_fields(found),
        "args": found.args,
        "result": found.result,
        "error": found.error,
        "steps": [{**reads.step_fields(step), "seconds": _seconds(step)} for step in steps],
        "graph": graph.as_dict(),
        "_model": (found, steps, graph),
    }


def workers(now=None):
    """Every worker, live ones first, each with the running runs it holds."""
    rows = workers_table.workers(now or timezone.now())
    held = reads.runs_held([row.name for row in rows])
    return {
        "workers": [
            {**dataclasses.asdict(row), "live": row.live, "runs": held[row.name]} for row in rows
        ]
    }


def blocked():
    """The blocked runs, oldest first, each with its uncertain steps."""
    return {
        "runs": [
            {
                **reads.run_fields(run),
                "uncertain_steps": [reads.step_fields(step) for step in started],
            }
            for run, started in reads.blocked_runs()
        ],
        "count": Workflow.objects.filter(status=Workflow.Status.BLOCKED).count(),
    }


def public(data):
    """`data` without the keys kept for the templates (those starting with _)."""
    return {key: value for key, value in data.items() if not key.startswith("_")}


#: Fields that change with the clock alone: left out of the digest, so that
#: a page is not sent the same workers again every second.
CLOCK_FIELDS = {"heartbeat_age"}


def encoded(data):
    """`data` (public) as the stream sends it, and its digest: the event id,
    which a page also carries, so that its stream sends only what is newer."""
    shown = public(data)
    stable = _without_clock_fields(shown)
    stable_text = readable_json(stable)
    # Encoded twice only where the data holds clock fields (the workers).
    text = stable_text if stable == shown else readable_json(shown)
    return text, hashlib.sha256(stable_text.encode()).hexdigest()[:20]


def _without_clock_fields(value):
    if isinstance(value, dict):
        return {k: _without_clock_fields(v) for k, v in value.items() if k not in CLOCK_FIELDS}
    if isinstance(value, list):
        return [_without_clock_fields(item) for item in value]
    return value


def _seconds(step):
    if step.finished_at is None:
        return None
    return max(0.0, (step.finished_at - step.started_at).total_seconds())
