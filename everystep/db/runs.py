"""The engine's reads and writes of runs: scheduling, claiming, and every
status change, each one database round trip.

A claim makes a run's `everystep.core.fence.Fence`; the runner's moves of
its run are fenced on it: they land only while the run is still
``running`` under that claim token. A runner that lost its claim (requeued
at a drain deadline, reset by an operator, claimed by another worker)
writes nothing; the caller sees ``False`` and stops. `TRANSITIONS` is the
one place that says how a run may move.
"""

from django.db import transaction
from django.utils import timezone

from everystep.core import clock, registry
from everystep.errors import EverystepError
from everystep.models import Workflow

RUNNING = Workflow.Status.RUNNING
SCHEDULED = Workflow.Status.SCHEDULED


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
):
    """Insert a scheduled run, due at `run_at` (default: now), in `queue`
    at `priority` (default: the workflow's, `registry.placement`), in the
    current transaction; one INSERT.

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
    """
    if (from_status, to_status) not in TRANSITIONS:
        raise ValueError(f"a run does not go from {from_status} to {to_status}")
    if from_status == RUNNING and to_status == SCHEDULED:
        fields = {"claimed_by": None, "claimed_at": None, **fields}
    if to_status in Workflow.TERMINAL:
        fields.setdefault("completed_at", timezone.now())
    run_ids = list(run_ids)
    one = len(run_ids) == 1  # the runner's own moves: a plain lookup compiles faster
    runs = Workflow.objects.filter(
        status=from_status, **({"id": run_ids[0]} if one else {"id__in": run_ids})
    )
    if fenced_on is not None:
        runs = runs.filter(claim_token=fenced_on)
    return runs.update(status=to_status, **fields)


def move_claimed(fence, to_status, **fields):
    """Move the claimed run out of ``running``, fenced on `fence`.
    Returns whether it landed."""
    moved = transition([fence.run_id], RUNNING, to_status, fenced_on=fence.claim_token, **fields)
    return moved == 1


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


def ask_to_cancel(run_id, error):
    """Ask the running run `run_id` to stop at its next step boundary,
    keeping `error` (an encoded `Cancelled`) as its error."""
    Workflow.objects.filter(id=run_id, status=RUNNING).update(
        cancel_requested_at=clock.now(), error=error
    )
