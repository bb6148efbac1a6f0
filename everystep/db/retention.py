"""Deleting finished runs (`everystep.control.actions.prune`): a run goes
with its steps, messages and events, in one transaction, a batch of runs at
a time, so that no transaction holds more than about `batch_rows()` rows and
the claims of the workers running meanwhile are never held up for long."""

import time

from django.db import connection, transaction
from django.db.models import Count, OuterRef, Subquery
from django.db.models.functions import Coalesce

from everystep.db import sql
from everystep.models import Event, Message, Step, Workflow

#: Rows a batch deletes at most (a run with more records goes alone): a
#: batch's transaction then lasts some tens of milliseconds, which is as
#: long as a claim may wait for it.
BATCH_ROWS = 500
#: The same on SQLite, where one writer at a time means that every claim
#: and every step record waits for the batch in progress, not only those
#: touching its rows.
SQLITE_BATCH_ROWS = 200
#: Seconds SQLite's writers get between two batches: twice the longest
#: sleep of its busy handler between two tries in its first 100 ms (25 ms),
#: so that a claim waiting for the write lock takes it before the next
#: batch does, even after another writer went first.
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
    steps, messages and events) reach `batch_rows()`. Returns how many runs.

    The transaction holds what a claim may wait for (on SQLite, the one
    write lock), so it does only this: one statement picks and locks the
    candidates with the count of their records, and one DELETE per table
    takes the chosen runs' rows."""
    limit = batch_rows()
    with transaction.atomic():
        chosen, rows = [], 0
        for run_id, records in _candidates(before, statuses, workflow, limit):
            weight = 1 + records
            if chosen and rows + weight > limit:
                break
            chosen.append(run_id)
            rows += weight
        if chosen:
            _delete_runs(chosen)
    return len(chosen)


def _candidates(before, statuses, workflow, limit):
    """``(run id, steps + messages + events)`` of the first `limit` runs to
    delete, oldest first, their rows locked so that none is retried while
    it goes (one an operator holds is left for the next batch)."""
    skip_locked = connection.features.has_select_for_update_skip_locked
    return list(
        finished_runs(before, statuses, workflow)
        .select_for_update(skip_locked=skip_locked)
        .order_by("completed_at")
        .annotate(records=_count_of(Step) + _count_of(Message) + _count_of(Event))
        .values_list("id", "records")[:limit]
    )


def _count_of(model):
    """The number of `model` rows of the run of the outer query."""
    rows = (
        model.objects.filter(workflow_id=OuterRef("id"))
        .order_by()
        .values("workflow_id")
        .annotate(n=Count("*"))
        .values("n")
    )
    return Coalesce(Subquery(rows), 0)


def _delete_runs(run_ids):
    """Delete the runs `run_ids` and their steps, messages and events: one
    DELETE per table on the ids, adapted once (the ORM's ``__in`` adapts
    each id once per query, which costs more than the statements)."""
    ids = [sql.uuid_param(connection, run_id) for run_id in run_ids]
    marks = ", ".join(["%s"] * len(ids))
    with connection.cursor() as cursor:
        for model in (Step, Message, Event):
            cursor.execute(
                f"DELETE FROM {model._meta.db_table} WHERE workflow_id IN ({marks})", ids
            )
        cursor.execute(f"DELETE FROM {Workflow._meta.db_table} WHERE id IN ({marks})", ids)


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
