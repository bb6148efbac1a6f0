"""What each view shows, as data: the pages render it, the JSON API returns
it, and the live stream sends it again whenever it changes.

Every function reads through `everystep.db.reads`, the same queries the
command line uses. A run is shown a page of `STEP_PAGE` steps at a time,
and drawn (its graph, its timeline) only up to `MAX_DRAWN` steps: a run of
a hundred thousand steps is a page like any other.
"""

import dataclasses
import hashlib

from django.utils import timezone

from everystep.core import ids
from everystep.core.serde import readable_json
from everystep.db import mailbox, reads
from everystep.db import queues as queue_table
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


STEP_PAGE = 200  # steps shown at a time
MAX_DRAWN = 500  # steps past which a run's graph and timeline are not drawn


def run(run_id, page=1):
    """One run: its fields, decoded values, page `page` (from 1) of its
    steps with their durations, and — when it has few enough steps — its
    graph with live statuses and its timeline. `NotFound` for an unknown
    id or page."""
    try:
        total = reads.step_count(ids.parse_run_id(run_id))
        drawn = total <= MAX_DRAWN
        pages = max(1, -(-total // STEP_PAGE))
        page = _page_number(page, pages)
        offset = (page - 1) * STEP_PAGE
        if drawn:  # every step, for the drawings; the page is a slice of them
            found, recorded = reads.run_with_steps(run_id)
            shown = recorded[offset : offset + STEP_PAGE]
        else:
            found, shown = reads.run_with_steps(run_id, offset=offset, limit=STEP_PAGE)
            recorded = None
    except EverystepError as exc:
        raise NotFound(str(exc)) from None
    if drawn:
        graph = drawing.step_graph(found, recorded)
    else:
        graph = drawing.not_drawn(f"{total:,} steps, more than the {MAX_DRAWN} drawn")
    return {
        **reads.run_fields(found),
        "args": found.args,
        "result": found.result,
        "error": found.error,
        "waiting_for": queue_table.waiting_for(found),
        "children": reads.children(found.id),
        "forks": reads.forks(found.id),
        "messages": mailbox.messages(found.id),
        "events": mailbox.event_values(found.id),
        "steps": [{**reads.step_fields(step), "seconds": _seconds(step)} for step in shown],
        "steps_total": total,
        "steps_page": page,
        "steps_pages": pages,
        "graph": graph.as_dict(),
        "_model": (found, shown, graph, recorded),
    }


def _page_number(page, pages):
    try:
        number = int(page)
    except (TypeError, ValueError):
        raise NotFound(f"page {page!r} is not a page number") from None
    if not 1 <= number <= pages:
        raise NotFound(f"there is no page {number} of steps: pages 1 to {pages}")
    return number


def workers(now=None):
    """Every worker, live ones first, each with the running runs it holds."""
    rows = workers_table.workers(now or timezone.now())
    held = reads.runs_held([row.name for row in rows])
    return {
        "workers": [
            {**dataclasses.asdict(row), "live": row.live, "runs": held[row.name]} for row in rows
        ]
    }


def queues():
    """Every queue: its limits, runs running, due and held back, and who serves it."""
    return {
        "queues": [
            {**dataclasses.asdict(row), "limits": row.limits} for row in queue_table.statuses()
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
