"""Deleting finished runs (`everystep.control.actions.prune`): a run goes
with its steps, messages and events, in one transaction, a batch of runs at
a time, so that no transaction holds more than about `BATCH_ROWS` rows and
the claims of the workers running meanwhile are never held up for long."""

import time

from django.db import connection, transaction
from django.db.models import Count

from everystep.models import Event, Message, Step, Workflow

#: Rows a batch deletes at most (a run with more records goes alone): a
#: batch's transaction then lasts some tens of milliseconds, which is as
#: long as a claim may wait for it.
BATCH_ROWS = 500
#: Seconds SQLite's writers get between two batches: longer than the sleep
#: of its busy handler between two tries once it has waited a batch's time
#: (25 ms), so that a claim waiting for the write lock takes it before the
#: next batch does.
SQLITE_PAUSE = 0.04


def finished_runs(before, statuses, workflow=None):
    """The runs in one of `statuses` that ended before `before` (of the
    workflow `workflow`, if given)."""
    runs = Workflow.objects.filter(status__in=statuses, completed_at__lt=before)
    if workflow is not None:
        runs = runs.filter(name=workflow)
    return runs


def count(before, statuses, workflow=None):
    """How many runs `delete_batch` would delete, in all."""
    return finished_runs(before, statuses, workflow).count()


def delete_batch(before, statuses, workflow=None):
    """Delete the next batch of those runs with their records, in one
    transaction: runs, oldest first, until their rows (the run and its
    steps, messages and events) reach `BATCH_ROWS`. Returns how many runs."""
    skip_locked = connection.features.has_select_for_update_skip_locked
    with transaction.atomic():
        # Locked, so that none is retried while it goes (one an operator
        # holds is left for the next batch).
        candidates = list(
            finished_runs(before, statuses, workflow)
            .select_for_update(skip_locked=skip_locked)
            .order_by("completed_at")
            .values_list("id", flat=True)[:BATCH_ROWS]
        )
        if not candidates:
            return 0
        records = _records_per_run(candidates)
        chosen, rows = [], 0
        for run_id in candidates:
            weight = 1 + records.get(run_id, 0)
            if chosen and rows + weight > BATCH_ROWS:
                break
            chosen.append(run_id)
            rows += weight
        # The runs, and their steps, messages and events: one DELETE each.
        Workflow.objects.filter(id__in=chosen).delete()
    return len(chosen)


def yield_to_writers():
    """Between two batches: on SQLite, whose one writer at a time is chosen
    by whoever retries first, not by who waited longest, let the claims
    that wait for the write lock take it; batches back to back would starve
    them for as long as the prune lasts. The servers queue their lock
    waiters and need no pause."""
    if connection.vendor == "sqlite":
        time.sleep(SQLITE_PAUSE)


def _records_per_run(run_ids):
    """``{run id: steps + messages + events}`` of the runs that have any."""
    counts = {}
    for model in (Step, Message, Event):
        rows = (
            model.objects.filter(workflow_id__in=run_ids)
            .values_list("workflow_id")
            .annotate(n=Count("id"))
        )
        for run_id, n in rows:
            counts[run_id] = counts.get(run_id, 0) + n
    return counts
