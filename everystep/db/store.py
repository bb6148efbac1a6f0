"""Every read and write the engine makes, each one database round trip.

The runner's writes are *fenced*: they only land while the run is still
``running`` under the claim token the runner was given. A runner that lost
its claim (requeued at a drain deadline, reset by an operator, claimed by
another worker) writes nothing; the caller sees ``False`` and stops. The
fence costs no extra query: it is a condition of the write itself, and the
step-writing statements take a share lock on the run's row so that a
concurrent requeue or claim is ordered before or after them, never between.
"""

import dataclasses
import datetime
import functools
import json
import os
import socket
import uuid

from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, connections, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from everystep.core import clock, registry, serde
from everystep.core.fence import Fence
from everystep.models import Step, Worker, Workflow

RUNNING = Workflow.Status.RUNNING
SCHEDULED = Workflow.Status.SCHEDULED


@dataclasses.dataclass(frozen=True)
class ClaimedRun:
    """A run this process now owns: its `fence`, and what the runner needs
    to execute it."""

    fence: Fence
    args: list
    #: False when the claim saw that the run has no recorded steps (its
    #: first attempt: there is nothing to load); None when it did not look.
    has_steps: bool | None = None
    #: When the run became due (its pickup delay runs from here), if known.
    due_at: datetime.datetime | None = None
    #: The trace context stored by `schedule()`, if any (`everystep.observe.tracing`).
    trace_context: dict | None = None
    #: A cancel was asked of the run while an earlier claim held it.
    cancel_requested: bool = False


def insert_run(name, args, idempotency_key=None, trace_context=None, run_at=None):
    """Insert a scheduled run, due at `run_at` (default: now), in the
    current transaction; one INSERT.

    With an idempotency key the INSERT ignores a conflict on (name, key) and
    the run holding the key is read back, so concurrent callers all get the
    same run and no transaction is aborted.
    """
    now = clock.now()
    run = Workflow(
        name=name,
        args=args,
        idempotency_key=idempotency_key,
        trace_context=trace_context,
        created_at=now,
        run_at=run_at or now,
    )
    if idempotency_key is None:
        run.save(force_insert=True)
        return run
    Workflow.objects.bulk_create([run], ignore_conflicts=True)
    return Workflow.objects.get(name=name, idempotency_key=idempotency_key)


def insert_tick(name, key, tick):
    """Insert the run of a cron workflow's `tick`, due then, unless a run
    already has its idempotency `key`; one INSERT, which the unique key
    lets through for one caller only, however many try at once."""
    Workflow.objects.bulk_create(
        [Workflow(name=name, args=[], idempotency_key=key, created_at=clock.now(), run_at=tick)],
        ignore_conflicts=True,
    )


def claim(worker_name, limit, workflows=None, *, only_parked=False, exclude=()):
    """Claim up to `limit` runs for `worker_name` in one transaction, the
    longest due first, and return them as `ClaimedRun`s with a fresh claim
    token. A scheduled run is not claimed before its ``run_at``.

    Only runs of the `workflows` named (default: those registered in this
    process) are taken: a run of a workflow this worker does not have waits
    for one that has it (a rolling deploy). Normally this takes
    ``scheduled`` runs; with `only_parked` it takes back the ``running``
    runs already claimed under `worker_name` (the startup catchup after a
    crash, or a claim whose reply was lost), except those in `exclude` (the
    ones in flight). Concurrent claimers never take the same run.
    """
    workflows = registry.names() if workflows is None else list(workflows)
    if limit <= 0 or not workflows:
        return []
    token = uuid.uuid4()
    now = clock.now()
    if not only_parked and connection.vendor == "postgresql":
        return _claim_in_one_statement(worker_name, limit, workflows, token, now)
    if only_parked:
        candidates = Workflow.objects.filter(
            status=RUNNING, name__in=workflows, claimed_by=worker_name
        ).exclude(id__in=list(exclude))
    else:
        candidates = Workflow.objects.filter(status=SCHEDULED, name__in=workflows, run_at__lte=now)
    # Whether a run has steps comes with the claim, so a first attempt skips
    # loading them. Not on MariaDB: there a subquery of a locking read locks
    # the step rows it reads, in the way of other runs' writes.
    look = connection.vendor != "mysql"
    if look:
        candidates = candidates.annotate(
            has_steps=Exists(Step.objects.filter(workflow=OuterRef("pk")))
        )
    skip_locked = connection.features.has_select_for_update_skip_locked
    with transaction.atomic():
        rows = list(
            candidates.select_for_update(skip_locked=skip_locked)
            .order_by("run_at")
            .values_list(
                "id",
                "name",
                "args",
                "run_at",
                "trace_context",
                "cancel_requested_at",
                *(["has_steps"] if look else []),
            )[:limit]
        )
        if rows:
            Workflow.objects.filter(id__in=[row[0] for row in rows]).update(
                status=RUNNING, claimed_by=worker_name, claim_token=token, claimed_at=now
            )
    return [
        ClaimedRun(
            Fence(id, name, token, worker_name),
            args,
            has_steps=rest[0] if rest else None,
            due_at=due,
            trace_context=trace_context,
            cancel_requested=cancel_requested_at is not None,
        )
        for id, name, args, due, trace_context, cancel_requested_at, *rest in rows
    ]


def next_due(workflows=None):
    """When the earliest scheduled run of `workflows` (default: those
    registered here) becomes due, or None when none is scheduled."""
    workflows = registry.names() if workflows is None else list(workflows)
    return (
        Workflow.objects.filter(status=SCHEDULED, name__in=workflows)
        .order_by("run_at")
        .values_list("run_at", flat=True)
        .first()
    )


def _claim_in_one_statement(worker_name, limit, workflows, token, now):
    # One statement, prepared once per connection (psycopg prepares it on
    # its fifth run). PostgreSQL keeps running its generic plan only while
    # that costs no more than a plan for the values at hand, so the
    # statement leaves it nothing to guess: 'scheduled' is written in (the
    # partial claim index), and so is the limit (one statement per pool
    # size), since a bound LIMIT is assumed to keep a tenth of the
    # candidates — tens of thousands once many runs wait for a later time —
    # and every claim would be planned again. The locked candidates are one
    # array, collected once, that the UPDATE looks up by primary key: no
    # join to plan, even when a pooler keeps nothing prepared.
    sql = f"""
        UPDATE everystep_workflow
           SET status = %s, claimed_by = %s, claim_token = %s, claimed_at = %s
         WHERE id = ANY(ARRAY(SELECT id FROM everystep_workflow
                               WHERE status = 'scheduled' AND name = ANY(%s) AND run_at <= %s
                               ORDER BY run_at LIMIT {int(limit):d}
                               FOR UPDATE SKIP LOCKED))
     RETURNING id, name, args, run_at, trace_context, cancel_requested_at IS NOT NULL,
               EXISTS (SELECT 1 FROM everystep_step s WHERE s.workflow_id = everystep_workflow.id)
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [RUNNING, worker_name, token, now, workflows, now])
        rows = cursor.fetchall()
    runs = [
        ClaimedRun(
            Fence(id, name, token, worker_name),
            _decode_json(args),
            has_steps,
            due_at,
            json.loads(trace_context) if isinstance(trace_context, str) else trace_context,
            cancel_requested,
        )
        for id, name, args, due_at, trace_context, cancel_requested, has_steps in rows
    ]
    return sorted(runs, key=lambda run: run.fence.run_id)


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


def run_exists(workflow_id):
    """Whether the run's row is still there."""
    return Workflow.objects.filter(id=workflow_id).exists()


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
    db = _thread_connection()
    params = [
        step_id,
        name,
        args,
        kwargs,
        status,
        result,
        error,
        _datetime_param(db, started_at),
        _finished_at_param(db, status),
        attempts,
        *_fence_params(db, fence, despite_cancel),
    ]
    try:
        return _execute(db, _step_statements(db.vendor).insert, params) == 1
    except IntegrityError:
        return None


def update_step(
    fence, step_id, from_status, status, result, error, attempts=1, despite_cancel=False
):
    """Turn a step's row in `from_status` (``started``, or ``retrying``)
    into `status` with `result` and `error` (JSON text, or None) after
    `attempts` calls, in place, fenced. Returns whether it landed."""
    db = _thread_connection()
    params = [
        status,
        result,
        error,
        _finished_at_param(db, status),
        attempts,
        _uuid_param(db, fence.run_id),
        step_id,
        from_status,
        *_fence_params(db, fence, despite_cancel),
    ]
    return _execute(db, _step_statements(db.vendor).update, params) == 1


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


def _fence_params(db, fence, despite_cancel=False):
    return [
        _uuid_param(db, fence.run_id),
        RUNNING,
        _uuid_param(db, fence.claim_token),
        despite_cancel,
    ]


_STEP_COLUMNS = (
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
        types = [Step._meta.get_field(column).db_type(connection) for column in _STEP_COLUMNS]
        placeholders = ", ".join(f"CAST(%s AS {db_type})" for db_type in types)
    else:
        placeholders = ", ".join("%s" for _ in _STEP_COLUMNS)
    insert = (
        f"INSERT INTO everystep_step (workflow_id, {', '.join(_STEP_COLUMNS)}) "
        f"SELECT w.id, {placeholders} FROM everystep_workflow w WHERE {fence}"
    )
    update = (
        "UPDATE everystep_step "
        "SET status = %s, result = %s, error = %s, finished_at = %s, attempts = %s "
        "WHERE workflow_id = %s AND step_id = %s AND status = %s AND EXISTS ("
        f"SELECT 1 FROM everystep_workflow w WHERE {fence})"
    )
    return _StepStatements(insert, update)


def _execute(db, sql, params):
    """Run `sql` on the driver's own cursor of the connection `db` and return
    its row count: the step writes skip Django's cursor layer, which costs a
    step more than the rest of the engine's Python. Errors are still
    Django's, execute wrappers still see the statement, and Django's query
    log (DEBUG, tests) still gets it, through Django's own cursor."""
    if db.queries_logged:
        with db.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.rowcount
    db.ensure_connection()
    raw = db.connection
    cached = getattr(db, "_everystep_cursor", None)
    if cached is None or cached[0] is not raw:
        cached = db._everystep_cursor = (raw, raw.cursor())
    cursor = cached[1]
    if db.vendor == "sqlite":
        sql = _qmark(sql)  # the driver's own placeholders
    execute = _driver_execute
    for wrapper in reversed(db.execute_wrappers):
        execute = functools.partial(wrapper, execute)
    with db.wrap_database_errors:
        execute(sql, params, False, {"connection": db, "cursor": cursor})
    return cursor.rowcount


@functools.cache
def _qmark(sql):
    return sql.replace("%s", "?")


def _driver_execute(sql, params, many, context):
    context["cursor"].execute(sql, params)


def _thread_connection():
    """This thread's connection itself: the step writes use it many times,
    and each use of the `connection` proxy looks it up again."""
    return connections[DEFAULT_DB_ALIAS]


def _datetime_param(db, value):
    return db.ops.adapt_datetimefield_value(value)


def _finished_at_param(db, status):
    """A step row's end time: now, unless it is only ``started``."""
    return _datetime_param(db, None if status == Step.Status.STARTED else timezone.now())


def _uuid_param(db, value):
    if value is None or db.features.has_native_uuid_field:
        return value
    return value.hex


def _decode_json(value):
    if isinstance(value, str | bytes):
        value = json.loads(value)
    return serde.from_json(value)


@dataclasses.dataclass(frozen=True)
class QueueState:
    """The runs not finished, as the queue gauges show them."""

    pending: int
    running: int
    blocked: int
    oldest_pending_age: float  # seconds; 0 when nothing waits
    pending_by_workflow: dict  # workflow name → scheduled runs


def queue_state():
    """Count the runs not finished: three queries, each on an index that holds
    only the runs in its status (on MariaDB/MySQL, one led by the status),
    so their cost follows the queue, never the history. Pending runs are
    the scheduled ones that are due: those waiting for a later time (a
    delayed start, a sleep, a retry's wait) are not read at all."""
    now = clock.now()
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT name, COUNT(*), MIN(run_at) FROM {_queue_index('scheduled')} "
            "WHERE status = 'scheduled' AND run_at <= %s GROUP BY name",
            [_datetime_param(connection, now)],
        )
        scheduled = cursor.fetchall()
        running = _count(cursor, "running", _queue_index("claimed_by"))
        blocked = _count(cursor, "blocked", _queue_index("blocked"))
    by_workflow = {name: count for name, count, _ in scheduled}
    oldest = min((_aware(due) for _, _, due in scheduled), default=None)
    age = 0.0 if oldest is None else max(0.0, (now - oldest).total_seconds())
    return QueueState(
        pending=sum(by_workflow.values()),
        running=running,
        blocked=blocked,
        oldest_pending_age=age,
        pending_by_workflow=by_workflow,
    )


def _count(cursor, status, table):
    cursor.execute(f"SELECT COUNT(*) FROM {table} WHERE status = '{status}'")
    return cursor.fetchone()[0]


def _queue_index(partial_index):
    """The runs table, read on SQLite through the named partial index of the
    queue (migrations 0002, 0003, 0005). SQLite's planner keeps no histogram:
    with statistics gathered while the queue was empty, it would otherwise
    read a whole index of every run, or the table. PostgreSQL and MariaDB
    choose well by themselves."""
    if connection.vendor == "sqlite":
        return f"everystep_workflow INDEXED BY everystep_workflow_{partial_index}"
    return "everystep_workflow"


def _aware(value):
    """A datetime read by raw SQL as an aware one (SQLite returns the
    aggregate as text, MariaDB as a naive UTC time)."""
    if isinstance(value, str):
        value = datetime.datetime.fromisoformat(value)
    return value if timezone.is_aware(value) else value.replace(tzinfo=datetime.UTC)


def worker_started(name, pool_size, workflows):
    """Record the worker `name` as starting in this process (one row per
    name, replaced on each start)."""
    import everystep

    now = timezone.now()
    Worker.objects.update_or_create(
        name=name,
        defaults={
            "hostname": socket.gethostname()[:255],
            "pid": os.getpid(),
            "version": everystep.__version__,
            "pool_size": pool_size,
            "in_flight": 0,
            "state": Worker.State.STARTING,
            "workflows": list(workflows),
            "started_at": now,
            "heartbeat_at": now,
            "stopped_at": None,
        },
    )


def worker_heartbeat(name, state, in_flight, using=None):
    """Refresh the worker's heartbeat, state and number of runs in flight;
    on the connection `using` (the name lock's own) when given."""
    now = timezone.now()
    if using is not None:
        with using.cursor() as cursor:
            cursor.execute(
                "UPDATE everystep_worker SET state = %s, in_flight = %s, heartbeat_at = %s "
                "WHERE name = %s",
                [state, in_flight, using.ops.adapt_datetimefield_value(now), name],
            )
        return
    fields = {"state": state, "in_flight": in_flight, "heartbeat_at": now}
    if state == Worker.State.STOPPED:
        fields["stopped_at"] = now
    Worker.objects.filter(name=name).update(**fields)
