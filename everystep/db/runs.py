"""The engine's reads and writes of runs: scheduling, claiming, and every
status change, each one database round trip.

A claim makes a run's `everystep.core.fence.Fence`; the runner's moves of
its run are fenced on it: they land only while the run is still
``running`` under that claim token. A runner that lost its claim (requeued
at a drain deadline, reset by an operator, claimed by another worker)
writes nothing; the caller sees ``False`` and stops. `TRANSITIONS` is the
one place that says how a run may move.
"""

from django.db import connection, transaction
from django.db.models import DateTimeField, Value
from django.db.models.functions import Least
from django.utils import timezone

from everystep.core import clock, registry, serde
from everystep.db import mailbox, sql, steps
from everystep.errors import Cancelled, EverystepError
from everystep.models import Step, Workflow
from everystep.resilience import local

RUNNING = Workflow.Status.RUNNING
SCHEDULED = Workflow.Status.SCHEDULED
COMPLETED = Workflow.Status.COMPLETED
#: A run holds what it waits for only while it waits: every move clears it.
NOT_WAITING = {"wait_topic": None, "wait_run": None}


def insert_run(
    name,
    args,
    idempotency_key=None,
    trace_context=None,
    run_at=None,
    *,
    queue=None,
    priority=None,
    concurrency_key=None,
    parent_id=None,
    origin_id=None,
):
    """Insert a scheduled run, due at `run_at` (default: now), in `queue`
    at `priority` (default: the workflow's, `registry.placement`), started
    by the run `parent_id` (forked from the run `origin_id`) if given, in
    the current transaction; one INSERT.

    With an idempotency key the INSERT ignores a conflict on (name, key) and
    the run holding the key is read back, so concurrent callers all get the
    same run and no transaction is aborted.
    """
    now = clock.now()
    default_queue, default_priority = registry.placement(name)
    run = Workflow(
        name=name,
        args=args,
        idempotency_key=idempotency_key,
        trace_context=trace_context,
        created_at=now,
        run_at=run_at or now,
        queue=default_queue if queue is None else queue,
        priority=default_priority if priority is None else priority,
        concurrency_key=concurrency_key,
        parent_id=parent_id,
        origin_id=origin_id,
    )
    if idempotency_key is None:
        run.save(force_insert=True)
        return run
    Workflow.objects.bulk_create([run], ignore_conflicts=True)
    return Workflow.objects.get(name=name, idempotency_key=idempotency_key)


def insert_tick(name, key, tick):
    """Insert the run of a cron workflow's `tick`, due then, in the
    workflow's queue at its priority, unless a run already has its
    idempotency `key`; one INSERT, which the unique key lets through for
    one caller only, however many try at once."""
    queue, priority = registry.placement(name)
    Workflow.objects.bulk_create(
        [
            Workflow(
                name=name,
                args=[],
                idempotency_key=key,
                created_at=clock.now(),
                run_at=tick,
                queue=queue,
                priority=priority,
            )
        ],
        ignore_conflicts=True,
    )


def run_exists(workflow_id):
    """Whether the run's row is still there."""
    return Workflow.objects.filter(id=workflow_id).exists()


# Every status change there is, as (from, to): the one place that says
# how a run may move. A fenced change also needs the mover's claim token.
TRANSITIONS = {
    (RUNNING, Workflow.Status.COMPLETED): "the runner finished the run",
    (RUNNING, Workflow.Status.FAILED): "the run failed",
    (RUNNING, Workflow.Status.STOPPED): "a step raised Terminal",
    (RUNNING, Workflow.Status.BLOCKED): "an unsafe step's outcome is uncertain",
    (RUNNING, SCHEDULED): "requeued: drained, released or recovered by an operator",
    (Workflow.Status.BLOCKED, SCHEDULED): "an operator resolved its uncertain step",
    (SCHEDULED, Workflow.Status.CANCELLED): "cancelled before it ran, or while it waited",
    (Workflow.Status.BLOCKED, Workflow.Status.CANCELLED): "cancelled instead of resolved",
    (RUNNING, Workflow.Status.CANCELLED): "its runner honoured a cancel at a step boundary",
    (Workflow.Status.FAILED, SCHEDULED): "an operator retried the failed run",
}


def transition(run_ids, from_status, to_status, *, fenced_on=None, **fields):
    """Move the runs `run_ids` from `from_status` to `to_status`, setting
    `fields` too, in one guarded UPDATE; with `fenced_on` (a claim token),
    only while the run is still held under that claim. Returns how many moved.

    Leaving ``running`` releases the claim (``claimed_by``, ``claimed_at``)
    but keeps the token, so a retried write can tell that it had landed.
    What the run waited for is cleared, unless `fields` set it (a park).
    Runs that end make the runs waiting for them due (`_wake_waiters`).
    """
    fields = _moved_fields(from_status, to_status, fields)
    run_ids = list(run_ids)
    one = len(run_ids) == 1  # the runner's own moves: a plain lookup compiles faster
    runs = Workflow.objects.filter(
        status=from_status, **({"id": run_ids[0]} if one else {"id__in": run_ids})
    )
    if fenced_on is not None:
        runs = runs.filter(claim_token=fenced_on)
    if to_status not in Workflow.ENDED or connection.vendor != "mysql":
        return runs.update(status=to_status, **fields)
    with transaction.atomic(savepoint=False):
        moved = runs.update(status=to_status, **fields)
        _wake_waiters(run_ids)
    return moved


def _moved_fields(from_status, to_status, fields):
    """What a move from `from_status` to `to_status` writes besides
    `fields`; `ValueError` for a move a run never makes (`TRANSITIONS`)."""
    if (from_status, to_status) not in TRANSITIONS:
        raise ValueError(f"a run does not go from {from_status} to {to_status}")
    if from_status == RUNNING and to_status == SCHEDULED:
        fields = {"claimed_by": None, "claimed_at": None, **fields}
    fields = {**NOT_WAITING, **fields}
    if to_status in Workflow.TERMINAL:
        fields.setdefault("completed_at", timezone.now())
    return fields


def move_claimed(fence, to_status, **fields):
    """Move the claimed run out of ``running`` (as `transition` does),
    fenced on `fence`; returns whether it landed. The runner's last write
    for every run, so one UPDATE below the ORM, whose compiling cost it as
    much CPU as a step's write. On MariaDB a run that ends also makes the
    runs waiting for it due in the same statement (a join of the table with
    itself), as the trigger does in the same round trip elsewhere."""
    fields = {"status": to_status, **_moved_fields(RUNNING, to_status, fields)}
    db = local.connection()
    wake = to_status in Workflow.ENDED and db.vendor == "mysql"
    prefix = "r." if wake else ""
    assignments, params = [], []
    for name, value in fields.items():
        field = Workflow._meta.get_field(name)
        assignments.append(f"{prefix}{field.column} = %s")
        params.append(field.get_db_prep_save(value, db))
    fenced = [sql.uuid_param(db, fence.run_id), sql.uuid_param(db, fence.claim_token)]
    if not wake:
        statement = (
            f"UPDATE everystep_workflow SET {', '.join(assignments)} "
            "WHERE id = %s AND status = 'running' AND claim_token = %s"
        )
        return sql.execute(db, statement, params + fenced) == 1
    statement = (
        "UPDATE everystep_workflow r LEFT JOIN everystep_workflow w "
        "ON w.wait_run = r.id AND w.status = 'scheduled' "
        f"SET {', '.join(assignments)}, w.run_at = LEAST(w.run_at, %s), w.wait_run = NULL "
        "WHERE r.id = %s AND r.status = 'running' AND r.claim_token = %s"
    )
    now = sql.datetime_param(db, clock.now())
    # A row for the run, and one for each run woken.
    return sql.execute(db, statement, [*params, now, *fenced]) >= 1


def _wake_waiters(run_ids):
    """Make the runs parked waiting for one of `run_ids` due now. On
    PostgreSQL and SQLite a trigger does it as the runs end (migration 0013);
    MariaDB's triggers cannot write the table they fire on."""
    now = Value(clock.now(), output_field=DateTimeField())
    Workflow.objects.filter(wait_run__in=run_ids, status=SCHEDULED).update(
        run_at=Least("run_at", now), wait_run=None
    )


def park(fence, until, *, topic=None, awaited=None):
    """Take the claimed run out of ``running`` to wait, until `until` at the
    latest, for a message on `topic` or the end of the run `awaited`:
    ``scheduled``, due then, fenced on `fence`. Returns whether it landed.

    A wake-up cannot slip between the look and the park. For a run, its row
    is share-locked first and read: a run that has ended makes the park due
    at once, and one that ends later finds this run parked (the locks are
    taken in the order its end takes them: that run, then this one). For a
    topic, this run's row is written first — a sender locks it too — and
    only then is the mailbox read: a message already there makes it due.
    """
    now = clock.now()
    with transaction.atomic():
        if awaited is not None and ended_status(awaited, lock=True) is not None:
            until, awaited = now, None  # it has ended: due at once, waiting for nothing
        moved = transition(
            [fence.run_id],
            RUNNING,
            SCHEDULED,
            fenced_on=fence.claim_token,
            run_at=until,
            wait_topic=topic,
            wait_run=awaited,
        )
        if moved and topic is not None and until > now:
            if mailbox.has_unconsumed(fence.run_id, topic):
                Workflow.objects.filter(id=fence.run_id).update(run_at=now, wait_topic=None)
    return moved == 1


_SHARE_LOCK = {"postgresql": " FOR SHARE", "mysql": " LOCK IN SHARE MODE"}


def ended_status(run_id, *, lock=False):
    """The run's status if it has ended (`Workflow.ENDED`), else None; with
    `lock`, its row share-locked until the transaction ends."""
    db = local.connection()
    statement = "SELECT status FROM everystep_workflow WHERE id = %s"
    if lock:
        statement += _SHARE_LOCK.get(db.vendor, "")
    rows = sql.fetch(db, statement, [sql.uuid_param(db, run_id)])
    status = rows[0][0] if rows else None
    return status if status in Workflow.ENDED else None


def has_moved(fence, to_status):
    """Whether a fenced move of the run to `to_status` is what the store
    shows: after a write whose reply was lost, it tells whether it landed."""
    return Workflow.objects.filter(
        id=fence.run_id, status=to_status, claim_token=fence.claim_token
    ).exists()


def cancel_asked(fence):
    """Whether the run is still held under `fence` with a cancel asked of
    it: why a step's fenced write was refused, if it was not a lost claim."""
    return Workflow.objects.filter(
        id=fence.run_id,
        status=RUNNING,
        claim_token=fence.claim_token,
        cancel_requested_at__isnull=False,
    ).exists()


def run_holders(run_ids, *, lock=False):
    """``{run id: (status, claimed_by)}`` of the runs `run_ids` that exist;
    with `lock`, their rows locked until the transaction ends."""
    runs = Workflow.objects.filter(id__in=list(run_ids))
    if lock:
        runs = runs.select_for_update()
    return {
        run_id: (status, worker)
        for run_id, status, worker in runs.values_list("id", "status", "claimed_by")
    }


def requeue_runs(run_ids=None, *, claimed_by=None):
    """Operator recovery: put ``running`` runs (by id, or every one claimed
    under a worker name) back to ``scheduled``. Returns the ids requeued."""
    runs = Workflow.objects.filter(status=RUNNING)
    if run_ids is not None:
        runs = runs.filter(id__in=run_ids)
    if claimed_by is not None:
        runs = runs.filter(claimed_by=claimed_by)
    with transaction.atomic():
        ids = list(runs.select_for_update().values_list("id", flat=True))
        transition(ids, RUNNING, SCHEDULED)
    return ids


def reschedule(run_id, from_status, **fields):
    """An operator's return of a finished or blocked run to ``scheduled``:
    its error, end time, claim and any cancel asked of it are cleared (a
    retried or resolved run is asked to go on), with `fields` set too."""
    cleared = {
        "error": None,
        "completed_at": None,
        "claimed_by": None,
        "claimed_at": None,
        "cancel_requested_at": None,
    }
    return transition([run_id], from_status, SCHEDULED, **cleared, **fields)


def locked(run_id):
    """The run `run_id` (a UUID), its row locked until the transaction
    ends; `EverystepError` when there is no such run."""
    run = Workflow.objects.select_for_update().filter(id=run_id).first()
    if run is None:
        raise EverystepError(f"no run {run_id}")
    return run


def cancel_descendants(run_id):
    """Cancel the unfinished runs the run `run_id` started (`everystep.start`),
    and theirs, each keeping a `Cancelled` that names its parent: a waiting
    or blocked one at once, a running one asked to stop. Returns their ids."""
    cancelled, parents = [], [run_id]
    with transaction.atomic():
        while parents:
            children = list(
                Workflow.objects.select_for_update()
                .filter(parent_id__in=parents)
                .exclude(status__in=Workflow.ENDED)
                .values_list("id", "parent_id", "status")
            )
            for child, parent, status in children:
                error = serde.encode_exception(Cancelled(f"its parent run {parent} was cancelled"))
                if status == RUNNING:
                    ask_to_cancel(child, error)
                else:
                    transition([child], status, Workflow.Status.CANCELLED, error=error)
            parents = [child for child, _, _ in children]
            cancelled += parents
    return cancelled


def ask_to_cancel(run_id, error):
    """Ask the running run `run_id` to stop at its next step boundary,
    keeping `error` (an encoded `Cancelled`) as its error."""
    Workflow.objects.filter(id=run_id, status=RUNNING).update(
        cancel_requested_at=clock.now(), error=error
    )


def outcome(run_id):
    """``(status, result, error)`` of the run, None if there is no such
    run. The `error` of a cancelled run that kept none is a `Cancelled`, as
    a wait for it raises it."""
    row = Workflow.objects.filter(id=run_id).values_list("status", "result", "error").first()
    if row is None:
        return None
    status, result, error = row
    if status == Workflow.Status.CANCELLED and error is None:
        error = serde.encode_exception(Cancelled(f"run {run_id} was cancelled"))
    return status, result, error


def fork(run, from_step):
    """A copy of the run `run` (a locked `Workflow` row), scheduled now,
    with the done and failed records of the steps recorded before
    `from_step`; its id. `EverystepError` listing the recorded step ids
    when `from_step` is not one of them."""
    recorded = list(Step.objects.filter(workflow_id=run.id).order_by("id"))
    ids = [step.step_id for step in recorded]
    if from_step not in ids:
        listed = ", ".join(ids) if ids else "none"
        raise EverystepError(
            f"run {run.id} never recorded step {from_step}: its recorded steps are {listed}"
        )
    copy = insert_run(
        run.name,
        run.args,
        trace_context=run.trace_context,
        queue=run.queue,
        priority=run.priority,
        concurrency_key=run.concurrency_key,
        origin_id=run.id,
    )
    kept = (Step.Status.DONE, Step.Status.FAILED)
    Step.objects.bulk_create(
        Step(
            workflow_id=copy.id,
            **{field: getattr(step, field) for field in steps.STEP_COLUMNS},
        )
        for step in recorded[: ids.index(from_step)]
        if step.status in kept
    )
    return copy.id
