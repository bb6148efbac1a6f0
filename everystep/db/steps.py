"""The engine's reads and writes of step records, fenced on the run's claim.

A step's write lands only while its run is still ``running`` under the
claim the runner was given (its `everystep.core.fence.Fence`); the fence
costs no extra query: it is a condition of the write itself, and the
statement takes a share lock on the run's row so that a concurrent requeue
or claim is ordered before or after it, never between. These statements
run once per step: they are built once per backend and sent on the
driver's own cursor.
"""

import dataclasses
import functools

from django.db import IntegrityError, connection
from django.utils import timezone

from everystep.db import sql
from everystep.errors import EverystepError
from everystep.models import Step, Workflow
from everystep.resilience import local

RUNNING = Workflow.Status.RUNNING


def load_outcomes(workflow_id):
    """The recorded steps of a run, values decoded, in one query: the
    outcome store (step id → ``{"name", "status", "result", "error"}``) and
    the calls made of each step called more than once (step id → count)."""
    rows = Step.objects.filter(workflow_id=workflow_id).values_list(
        "step_id", "name", "status", "result", "error", "attempts"
    )
    outcomes, attempts = {}, {}
    for step_id, name, status, result, error, calls in rows:
        outcomes[step_id] = {"name": name, "status": status, "result": result, "error": error}
        if calls > 1 or status == Step.Status.RETRYING:
            attempts[step_id] = calls
    return outcomes, attempts


def record_step(
    fence,
    step_id,
    name,
    args,
    kwargs,
    status,
    result,
    error,
    started_at,
    attempts=1,
    despite_cancel=False,
):
    """Insert a step's outcome (`args`, `kwargs`, `result`, `error` already
    JSON text, or None) after `attempts` calls, fenced on `fence`.

    Returns True when it landed, False when the fence refused it, and None
    when a row is already at this id: either this very write landed before
    its connection was lost, or another runner owns the run.
    """
    db = local.connection()
    params = [
        step_id,
        name,
        args,
        kwargs,
        status,
        result,
        error,
        sql.datetime_param(db, started_at),
        _finished_at_param(db, status),
        attempts,
        *_fence_params(db, fence, despite_cancel),
    ]
    try:
        return sql.execute(db, _step_statements(db.vendor).insert, params) == 1
    except IntegrityError:
        return None


def update_step(
    fence, step_id, from_status, status, result, error, attempts=1, despite_cancel=False
):
    """Turn a step's row in `from_status` (``started``, or ``retrying``)
    into `status` with `result` and `error` (JSON text, or None) after
    `attempts` calls, in place, fenced. Returns whether it landed."""
    db = local.connection()
    params = [
        status,
        result,
        error,
        _finished_at_param(db, status),
        attempts,
        sql.uuid_param(db, fence.run_id),
        step_id,
        from_status,
        *_fence_params(db, fence, despite_cancel),
    ]
    return sql.execute(db, _step_statements(db.vendor).update, params) == 1


def step_recorded(fence, step_id, status):
    """Whether the step `step_id` is recorded with `status` while the run
    is still held under `fence`: a lost reply's write had landed."""
    return Step.objects.filter(
        workflow_id=fence.run_id,
        step_id=step_id,
        status=status,
        workflow__status=RUNNING,
        workflow__claim_token=fence.claim_token,
    ).exists()


def _fence_params(db, fence, despite_cancel=False):
    return [
        sql.uuid_param(db, fence.run_id),
        RUNNING,
        sql.uuid_param(db, fence.claim_token),
        despite_cancel,
    ]


#: A step's own columns, beside its run: what its INSERT writes and a fork copies.
STEP_COLUMNS = (
    "step_id",
    "name",
    "args",
    "kwargs",
    "status",
    "result",
    "error",
    "started_at",
    "finished_at",
    "attempts",
)


@dataclasses.dataclass(frozen=True)
class _StepStatements:
    insert: str
    update: str


@functools.cache
def _step_statements(vendor):
    """The fenced step statements for a backend, built once. The fence
    subquery share-locks the run's row (SQLite has one writer at a time
    already); PostgreSQL needs the parameters of an INSERT … SELECT typed."""
    lock = {"postgresql": "FOR SHARE", "mysql": "LOCK IN SHARE MODE"}.get(vendor, "")
    # A run asked to cancel refuses its steps' writes, unless the write says
    # it lands despite the cancel (the outcome of the step in flight).
    despite = "CAST(%s AS boolean)" if vendor == "postgresql" else "%s"
    fence = (
        f"w.id = %s AND w.status = %s AND w.claim_token = %s "
        f"AND (w.cancel_requested_at IS NULL OR {despite}) {lock}"
    )
    if vendor == "postgresql":
        types = [Step._meta.get_field(column).db_type(connection) for column in STEP_COLUMNS]
        placeholders = ", ".join(f"CAST(%s AS {db_type})" for db_type in types)
    else:
        placeholders = ", ".join("%s" for _ in STEP_COLUMNS)
    insert = (
        f"INSERT INTO everystep_step (workflow_id, {', '.join(STEP_COLUMNS)}) "
        f"SELECT w.id, {placeholders} FROM everystep_workflow w WHERE {fence}"
    )
    update = (
        "UPDATE everystep_step "
        "SET status = %s, result = %s, error = %s, finished_at = %s, attempts = %s "
        "WHERE workflow_id = %s AND step_id = %s AND status = %s AND EXISTS ("
        f"SELECT 1 FROM everystep_workflow w WHERE {fence})"
    )
    return _StepStatements(insert, update)


def _finished_at_param(db, status):
    """A step row's end time: now, unless it is only ``started``."""
    return sql.datetime_param(db, None if status == Step.Status.STARTED else timezone.now())


def forget_failed(run_id):
    """Remove the run's ``failed`` and ``retrying`` step records, so those
    steps run again; a ``started`` record stays (its effect is unknown)."""
    Step.objects.filter(
        workflow_id=run_id, status__in=[Step.Status.FAILED, Step.Status.RETRYING]
    ).delete()


def started(run_id, step_id):
    """The record of the step `step_id` of the run, if it is ``started``;
    `EverystepError` saying what it is otherwise."""
    step = Step.objects.filter(workflow_id=run_id, step_id=step_id).first()
    if step is None or step.status != Step.Status.STARTED:
        state = "not recorded" if step is None else step.status
        raise EverystepError(
            f"step {step_id} of run {run_id} is {state}, not started: "
            f"only the started step of a blocked run can be resolved"
        )
    return step


def settle(step, status, result=None, error=None):
    """Record the outcome an operator found for the started `step`."""
    step.status = status
    step.result = result
    step.error = error
    step.finished_at = timezone.now()
    step.save(update_fields=["status", "result", "error", "finished_at"])


def discard(step):
    """Remove the started `step`'s record: it never took effect, and runs again."""
    step.delete()
