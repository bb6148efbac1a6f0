"""Deleting finished runs (`everystep.control.actions.prune`): a run goes
with its steps, messages and events, in one transaction, a batch of runs at
a time, so that no transaction holds more than about `batch_rows()` rows and
the claims of the workers running meanwhile are never held up for long."""

import time

from django.db import connection, transaction
from django.db.models import Count

from everystep.models import Event, Message, Step, Workflow

#: Rows a batch deletes at most (a run with more records goes alone): a
#: batch's transaction then lasts some tens of milliseconds, which is as
#: long as a claim may wait for it.
BATCH_ROWS = 500
#: The same on SQLite, where one writer at a time means that every claim
#: and every step record waits for the batch in progress, not only those
#: touching its rows.
SQLITE_BATCH_ROWS = 200
#: Seconds SQLite's writers get between two batches: twice the sleep of its
#: busy handler between two tries once it has waited a batch's time
#: (25 ms), so that a claim waiting for the write lock takes it before the
#: next batch does, even after another writer went first.
SQLITE_PAUSE = 0.05


def batch_rows():
    """How many rows a batch deletes at most on this database."""
    return SQLITE_BATCH_ROWS if connection.vendor == "sqlite" else BATCH_ROWS


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
    steps, messages and events) reach `batch_rows()`. Returns how many runs."""
    skip_locked = connection.features.has_select_for_update_skip_locked
    limit = batch_rows()
    with transaction.atomic():
        # Locked, so that none is retried while it goes (one an operator
        # holds is left for the next batch).
        candidates = list(
            finished_runs(before, statuses, workflow)
            .select_for_update(skip_locked=skip_locked)
            .order_by("completed_at")
            .values_list("id", flat=True)[:limit]
        )
        if not candidates:
            return 0
        records = _records_per_run(candidates)
        chosen, rows = [], 0
        for run_id in candidates:
            weight = 1 + records.get(run_id, 0)
            if chosen and rows + weight > limit:
                break
            chosen.append(run_id)
            rows += weight
        # The runs, and their steps, messages and events: one DELETE each.
        Workflow.objects.filter(id__in=chosen).delete()
    return len(chosen)


def yield_to_writers():
    """Between two batches, on SQLite: copy what the batch wrote from the
    write-ahead log into the database (a passive checkpoint, which holds up
    no writer), so that the claim whose commit fills the log next is not
    the one that pays for the prune's pages; then let the claims that wait
    for the write lock take it. SQLite's one writer at a time is whoever
    retries first, not who waited longest: batches back to back would
    starve them for as long as the prune lasts. The servers queue their
    lock waiters and need neither."""
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA wal_checkpoint(PASSIVE)")
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
