"""The claim: which due runs a worker takes, and how limits hold.

Order. Among the due runs of the queues a worker serves, a run due for
longer than the priority aging is claimed first (the oldest first), then
the higher priority, then the earlier due time. The claim index holds the
scheduled runs by (queue, priority, due time): a claim seeks each queue and
priority present and reads only its due runs, so runs of other queues and
runs due later cost it nothing, however many.

Limits. A queue's limits live in its row of ``everystep_queue``. A claim
first locks the rows of the limited queues it serves, in name order; then,
in a later statement of the same transaction (whose snapshot therefore sees
every claim committed before the lock was granted), it counts the queue's
running runs, the running runs of each key and the first starts inside the
rate's window, and takes no more than the limits leave. Two claimers of a
limited queue take turns on its row, so a limit holds at the same instant
across workers. On PostgreSQL the whole transaction is one pipelined round
trip; SQLite's writers already take turns (``BEGIN IMMEDIATE``); MariaDB
locks the rows, then reads and writes in a few statements.

Cost. On PostgreSQL a worker none of whose served queues is limited claims
with one plain statement that leaves out the runs of any queue with a
limit (read in the statement itself), so it can never take one outside its
lock: which queues are limited is read again every `LIMITS_TTL` seconds,
and at once after this process declares queues. A limit declared by
another process is thus applied by this one's claims within that time;
until then they leave the queue's runs alone.
"""

import dataclasses
import datetime
import json
import threading
import time
import uuid

from django.db import connection, transaction
from django.db.models import Count, Exists, OuterRef, Q, Value
from django.db.models.functions import Coalesce

from everystep.core import clock, registry
from everystep.core.fence import Fence
from everystep.db import sql
from everystep.models import Queue, Step, Workflow

RUNNING = Workflow.Status.RUNNING
SCHEDULED = Workflow.Status.SCHEDULED
LIMITED = (
    Q(concurrency__isnull=False) | Q(key_concurrency__isnull=False) | Q(rate_limit__isnull=False)
)


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


def claim(
    worker_name,
    limit,
    workflows=None,
    served=None,
    *,
    aging=300.0,
    only_parked=False,
    exclude=(),
):
    """Claim up to `limit` due runs for `worker_name` in one transaction, in
    the order and within the limits the module describes, and return them
    as `ClaimedRun`s with a fresh claim token.

    Only runs of the `workflows` named (default: those registered in this
    process) in the `served` queues (default: every queue) are taken: a run
    of a workflow this worker does not have waits for one that has it (a
    rolling deploy). With `only_parked` it takes back the ``running`` runs
    already claimed under `worker_name` (the startup catchup after a crash,
    or a claim whose reply was lost), except those in `exclude` (the ones
    in flight). Concurrent claimers never take the same run.
    """
    workflows = registry.names() if workflows is None else list(workflows)
    if limit <= 0 or not workflows:
        return []
    token = uuid.uuid4()
    now = clock.now()
    if only_parked:
        return _take_back(worker_name, limit, workflows, exclude, token, now)
    aged = now - datetime.timedelta(seconds=aging)
    served = None if served is None else list(served)
    if connection.vendor == "postgresql":
        return _claim_in_one_round_trip(worker_name, limit, workflows, served, token, now, aged)
    return _claim_in_steps(worker_name, limit, workflows, served, token, now, aged)


LIMITS_TTL = 5.0  # seconds a process trusts its view of which queues are limited
_limited = {"names": None, "read_at": 0.0}
_limited_lock = threading.Lock()


def limited_queues():
    """The names of the queues with a limit, as read at most `LIMITS_TTL`
    seconds ago."""
    with _limited_lock:
        names, read_at = _limited["names"], _limited["read_at"]
    if names is None or time.monotonic() - read_at > LIMITS_TTL:
        names = set(Queue.objects.filter(LIMITED).values_list("name", flat=True))
        with _limited_lock:
            _limited.update(names=names, read_at=time.monotonic())
    return names


def forget_limits():
    """Read the limited queues again at the next claim (queues were declared)."""
    with _limited_lock:
        _limited["names"] = None


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


def _take_back(worker_name, limit, workflows, exclude, token, now):
    """The runs parked ``running`` under `worker_name` that it is not
    executing, claimed again under a new token (no limit applies: they
    already count as running)."""
    candidates = Workflow.objects.filter(
        status=RUNNING, name__in=workflows, claimed_by=worker_name
    ).exclude(id__in=list(exclude))
    return _lock_and_take(candidates, limit, worker_name, token, now)


def _lock_and_take(candidates, limit, worker_name, token, now):
    """Lock `candidates` (skipping rows locked by another claimer), in due
    order, up to `limit`, and move them to ``running`` under `token`."""
    with transaction.atomic():
        rows = list(_locked(candidates)[:limit])
        _mark_claimed(rows, worker_name, token, now)
    return _claimed(rows, worker_name, token)


#: What a claim reads of each run it takes.
FIELDS = ("id", "name", "args", "run_at", "trace_context", "cancel_requested_at")


def _locked(candidates, *more):
    """The `candidates`' `FIELDS` (and `more`) in due order, each row locked
    as it is read, skipping those another claimer holds."""
    # Whether a run has steps comes with the claim, so a first attempt skips
    # loading them. Not on MariaDB: there a subquery of a locking read locks
    # the step rows it reads, in the way of other runs' writes.
    if connection.vendor != "mysql":
        candidates = candidates.annotate(
            has_steps=Exists(Step.objects.filter(workflow=OuterRef("pk")))
        )
    skip_locked = connection.features.has_select_for_update_skip_locked
    return (
        candidates.select_for_update(skip_locked=skip_locked)
        .order_by("run_at")
        .values(*FIELDS, *more, *(["has_steps"] if connection.vendor != "mysql" else []))
    )


def _mark_claimed(rows, worker_name, token, now):
    """Move the runs read as `rows` to ``running`` under `token`; a run's
    first claim is its start, which a rate limit counts. One UPDATE."""
    if rows:
        Workflow.objects.filter(id__in=[row["id"] for row in rows]).update(
            status=RUNNING,
            claimed_by=worker_name,
            claim_token=token,
            claimed_at=now,
            started_at=Coalesce("started_at", Value(now)),
        )


def _claimed(rows, worker_name, token):
    return [
        ClaimedRun(
            Fence(row["id"], row["name"], token, worker_name),
            row["args"],
            has_steps=row.get("has_steps"),
            due_at=row["run_at"],
            trace_context=row["trace_context"],
            cancel_requested=row["cancel_requested_at"] is not None,
        )
        for row in rows
    ]


# --- SQLite and MariaDB: the limits read, then applied here -----------------


@dataclasses.dataclass
class _Limits:
    """A limited queue's limits and what its runs use of them now."""

    concurrency: int | None
    key_concurrency: int | None
    rate_limit: int | None
    running: int = 0
    started: int = 0
    running_by_key: dict = dataclasses.field(default_factory=dict)

    @property
    def full(self):
        return self.concurrency is not None and self.running >= self.concurrency

    def full_keys(self):
        if self.key_concurrency is None:
            return []
        return [key for key, count in self.running_by_key.items() if count >= self.key_concurrency]

    def admits(self, run):
        """Whether `run` (a candidate row) fits, counting it in if so."""
        key = run["concurrency_key"]
        first_start = run["started_at"] is None
        if self.concurrency is not None and self.running >= self.concurrency:
            return False
        if self.rate_limit is not None and first_start and self.started >= self.rate_limit:
            return False
        if self.key_concurrency is not None and key is not None:
            if self.running_by_key.get(key, 0) >= self.key_concurrency:
                return False
            self.running_by_key[key] = self.running_by_key.get(key, 0) + 1
        self.running += 1
        self.started += first_start
        return True


def _claim_in_steps(worker_name, limit, workflows, served, token, now, aged):
    with transaction.atomic():
        limits = _read_limits(served, now)
        if served is None and not _any_due(now):
            return []  # one seek, where the pairs would take one or two each
        candidates = []
        for queue, priority in _scheduled_pairs(served):
            queue_limits = limits.get(queue)
            if queue_limits is not None and queue_limits.full:
                continue
            full_keys = queue_limits.full_keys() if queue_limits is not None else []
            runs = Workflow.objects.filter(
                status=SCHEDULED,
                queue=queue,
                priority=priority,
                run_at__lte=now,
                name__in=workflows,
            )
            if full_keys:
                runs = runs.exclude(concurrency_key__in=full_keys)
            candidates += _locked(runs, "queue", "priority", "concurrency_key", "started_at")[
                :limit
            ]
        candidates.sort(key=lambda run: (run["run_at"] > aged, -run["priority"], run["run_at"]))
        chosen = []
        for run in candidates:
            queue_limits = limits.get(run["queue"])
            if queue_limits is None or queue_limits.admits(run):
                chosen.append(run)
                if len(chosen) == limit:
                    break
        _mark_claimed(chosen, worker_name, token, now)
    return _claimed(chosen, worker_name, token)


def _any_due(now):
    """Whether any scheduled run is due: the first entry of the due-time
    index's range."""
    return Workflow.objects.filter(status=SCHEDULED, run_at__lte=now).exists()


def _scheduled_pairs(served):
    """The (queue, priority) pairs of the scheduled runs of the `served`
    queues (all if None), skipping through the claim index: two seeks at
    most a pair, however many runs each holds."""
    scheduled = Workflow.objects.filter(status=SCHEDULED).order_by("queue", "priority")
    first = scheduled if served is None else scheduled.filter(queue__in=served)
    pair = first.values_list("queue", "priority").first()
    while pair is not None:
        yield pair
        queue, priority = pair
        pair = (
            scheduled.filter(queue=queue, priority__gt=priority)
            .values_list("queue", "priority")
            .first()
        )
        if pair is None:
            later = scheduled.filter(queue__gt=queue)
            if served is not None:
                later = later.filter(queue__in=served)
            pair = later.values_list("queue", "priority").first()


def _read_limits(served, now):
    """The limits of the limited queues among `served` (all if None), their
    rows locked until the transaction ends, with their current use."""
    rows = Queue.objects.filter(LIMITED)
    if served is not None:
        rows = rows.filter(name__in=served)
    if connection.features.has_select_for_update:
        rows = rows.select_for_update()
    limits = {}
    for row in rows.order_by("name"):
        queue_limits = limits[row.name] = _Limits(
            row.concurrency, row.key_concurrency, row.rate_limit
        )
        running = Workflow.objects.filter(status=RUNNING, queue=row.name)
        if row.concurrency is not None:
            queue_limits.running = running.count()
        if row.key_concurrency is not None:
            queue_limits.running_by_key = dict(
                running.exclude(concurrency_key=None)
                .values("concurrency_key")
                .annotate(n=Count("id"))
                .values_list("concurrency_key", "n")
            )
        if row.rate_limit is not None:
            queue_limits.started = starts_within(row.name, row.rate_seconds, now)
    return limits


def starts_within(queue, seconds, now):
    """How many runs of `queue` first started in the `seconds` before `now`:
    what its rate limit counts."""
    since = now - datetime.timedelta(seconds=seconds)
    return Workflow.objects.filter(queue=queue, started_at__gt=since).count()


# --- PostgreSQL: one round trip ----------------------------------------------

LOCK_LIMITED = """
    SELECT name FROM everystep_queue
     WHERE (concurrency IS NOT NULL OR key_concurrency IS NOT NULL OR rate_limit IS NOT NULL)
       AND (%(every)s OR name = ANY(%(served)s))
     ORDER BY name
       FOR UPDATE
"""
# The scheduled (queue, priority) pairs, found by skipping through the claim
# index one pair at a time: as many seeks as pairs, however many runs each.
PAIRS = """
WITH RECURSIVE pairs(queue, priority) AS (
    (SELECT queue, priority FROM everystep_workflow
      WHERE status = 'scheduled' ORDER BY queue, priority LIMIT 1)
  UNION ALL
    SELECT following.queue, following.priority
      FROM pairs, LATERAL (
           SELECT w.queue, w.priority FROM everystep_workflow w
            WHERE w.status = 'scheduled' AND (w.queue, w.priority) > (pairs.queue, pairs.priority)
            ORDER BY w.queue, w.priority LIMIT 1) following
),
"""
# The runs the statement `chosen`, moved to running under the claim.
TAKE_CHOSEN = """
UPDATE everystep_workflow
   SET status = 'running', claimed_by = %(worker)s, claim_token = %(token)s,
       claimed_at = %(now)s, started_at = COALESCE(started_at, %(now)s)
 WHERE id = ANY(ARRAY(SELECT id FROM chosen))
RETURNING id, name, args, run_at, trace_context, cancel_requested_at IS NOT NULL,
          EXISTS (SELECT 1 FROM everystep_step s WHERE s.workflow_id = everystep_workflow.id)
"""

# The claim under the limited queues' locks: each served (queue, priority)
# pair gives at most `limit` due runs, locked, in due order; the window
# functions count, in claim order, how many of each queue, of its first
# starts and of each key the claim would take, and the limits cut there.
# 'scheduled' is written in, and so is the limit: a generic plan keeps the
# partial index, and a bound LIMIT would be assumed to keep a tenth of the
# candidates.
CLAIM = (
    PAIRS
    + """
limits AS (
    SELECT q.name, q.concurrency, q.key_concurrency, q.rate_limit,
           CASE WHEN q.concurrency IS NOT NULL THEN
               (SELECT count(*) FROM everystep_workflow r
                 WHERE r.status = 'running' AND r.queue = q.name) END AS running,
           CASE WHEN q.rate_limit IS NOT NULL THEN
               (SELECT count(*) FROM everystep_workflow r
                 WHERE r.queue = q.name AND r.started_at IS NOT NULL
                   AND r.started_at > %(now)s - make_interval(secs => q.rate_seconds)) END
               AS started
      FROM everystep_queue q
     WHERE (q.concurrency IS NOT NULL OR q.key_concurrency IS NOT NULL OR q.rate_limit IS NOT NULL)
       AND (%(every)s OR q.name = ANY(%(served)s))
),
candidates AS (
    SELECT c.*, c.run_at <= %(aged)s AS aged
      FROM pairs p
      LEFT JOIN limits l ON l.name = p.queue
     CROSS JOIN LATERAL (
           SELECT w.id, w.queue, w.priority, w.run_at, w.concurrency_key, w.started_at
             FROM everystep_workflow w
            WHERE w.status = 'scheduled' AND w.queue = p.queue AND w.priority = p.priority
              AND w.run_at <= %(now)s AND w.name = ANY(%(workflows)s)
              AND (l.concurrency IS NULL OR l.running < l.concurrency)
              AND (l.rate_limit IS NULL OR w.started_at IS NOT NULL OR l.started < l.rate_limit)
              AND (l.key_concurrency IS NULL OR w.concurrency_key IS NULL
                   OR (SELECT count(*) FROM everystep_workflow k
                        WHERE k.status = 'running' AND k.queue = w.queue
                          AND k.concurrency_key = w.concurrency_key) < l.key_concurrency)
            ORDER BY w.run_at LIMIT {limit:d}
              FOR UPDATE OF w SKIP LOCKED) c
     WHERE %(every)s OR p.queue = ANY(%(served)s)
),
ranked AS (
    SELECT c.id, c.queue, c.concurrency_key, c.started_at, c.aged, c.priority, c.run_at,
           l.concurrency, l.key_concurrency, l.rate_limit, l.running, l.started,
           row_number() OVER in_queue AS nth,
           count(*) FILTER (WHERE c.started_at IS NULL) OVER in_queue AS nth_start,
           row_number() OVER (PARTITION BY c.queue, c.concurrency_key
                              ORDER BY c.aged DESC, c.priority DESC, c.run_at, c.id) AS nth_of_key
      FROM candidates c
      LEFT JOIN limits l ON l.name = c.queue
    WINDOW in_queue AS (PARTITION BY c.queue ORDER BY c.aged DESC, c.priority DESC, c.run_at, c.id)
),
chosen AS (
    SELECT r.id FROM ranked r
     WHERE (r.concurrency IS NULL OR r.nth <= r.concurrency - r.running)
       AND (r.rate_limit IS NULL OR r.started_at IS NOT NULL
            OR r.nth_start <= r.rate_limit - r.started)
       AND (r.key_concurrency IS NULL OR r.concurrency_key IS NULL
            OR r.nth_of_key <= r.key_concurrency
               - (SELECT count(*) FROM everystep_workflow k
                   WHERE k.status = 'running' AND k.queue = r.queue
                     AND k.concurrency_key = r.concurrency_key))
     ORDER BY r.aged DESC, r.priority DESC, r.run_at
     LIMIT {limit:d}
)
"""
    + TAKE_CHOSEN
)


# The claim of a worker whose served queues have no limits: one statement
# (a run of a queue with a limit is left out, whatever this process knows).
CLAIM_UNLIMITED = (
    PAIRS
    + """
chosen AS (
    SELECT c.id FROM pairs p
     CROSS JOIN LATERAL (
           SELECT w.id, w.priority, w.run_at FROM everystep_workflow w
            WHERE w.status = 'scheduled' AND w.queue = p.queue AND w.priority = p.priority
              AND w.run_at <= %(now)s AND w.name = ANY(%(workflows)s)
            ORDER BY w.run_at LIMIT {limit:d}
              FOR UPDATE OF w SKIP LOCKED) c
     WHERE (%(every)s OR p.queue = ANY(%(served)s))
       AND NOT EXISTS (SELECT 1 FROM everystep_queue q
                        WHERE q.name = p.queue
                          AND (q.concurrency IS NOT NULL OR q.key_concurrency IS NOT NULL
                               OR q.rate_limit IS NOT NULL))
     ORDER BY c.run_at <= %(aged)s DESC, c.priority DESC, c.run_at
     LIMIT {limit:d}
)
"""
    + TAKE_CHOSEN
)
# Per connection: the claims' prepared statements keep their generic plan
# (planned for the values at hand, a claim would be planned afresh each
# time, since runs due later make a custom plan look cheaper), and are not
# compiled (their estimated cost can pass the threshold of PostgreSQL's
# JIT, whose compiling takes longer than the claim).
CLAIM_SETTINGS = ("plan_cache_mode = force_generic_plan", "jit = off")


def _claim_in_one_round_trip(worker_name, limit, workflows, served, token, now, aged):
    params = {
        "every": served is None,
        "served": served or [],
        "workflows": workflows,
        "now": now,
        "aged": aged,
        "worker": worker_name,
        "token": token,
    }
    limited = limited_queues()
    locking = bool(limited if served is None else limited.intersection(served))
    if locking:
        statements = [(LOCK_LIMITED, params), (CLAIM.format(limit=int(limit)), params)]
    else:
        statements = [(CLAIM_UNLIMITED.format(limit=int(limit)), params)]
    db = connection
    if db.queries_logged or not db.get_autocommit():
        # Django's cursor: its query log sees the statements (DEBUG, tests),
        # and a caller's transaction holds them (a savepoint).
        with transaction.atomic(), db.cursor() as cursor:
            for statement, statement_params in statements:
                cursor.execute(statement, statement_params)
            rows = cursor.fetchall()
    else:
        _apply_claim_settings(db)
        if locking:
            rows = _pipelined(db, statements)
        else:
            [(statement, statement_params)] = statements
            with db.wrap_database_errors:
                rows = db.connection.execute(statement, statement_params).fetchall()
    claimed = [
        ClaimedRun(
            Fence(id, name, token, worker_name),
            sql.decode_json(args),
            has_steps,
            due_at,
            json.loads(trace_context) if isinstance(trace_context, str) else trace_context,
            cancel_requested,
        )
        for id, name, args, due_at, trace_context, cancel_requested, has_steps in rows
    ]
    return sorted(claimed, key=lambda run: run.fence.run_id)


def _apply_claim_settings(db):
    """Set `CLAIM_SETTINGS` on the connection, once per connection."""
    db.ensure_connection()
    raw = db.connection
    if getattr(db, "_everystep_claim_settings", None) is raw:
        return
    with db.wrap_database_errors:
        for setting in CLAIM_SETTINGS:
            raw.execute(f"SET {setting}")
    db._everystep_claim_settings = raw


def _pipelined(db, statements):
    """Run `statements` in one transaction sent as one pipeline (one round
    trip) on the driver's own connection, and return the last one's rows.
    psycopg's ``transaction()`` would sync inside the pipeline, a round trip
    each, so BEGIN and COMMIT are sent as statements."""
    db.ensure_connection()
    raw = db.connection
    with db.wrap_database_errors:
        try:
            with raw.pipeline():
                raw.execute("BEGIN")
                cursors = [raw.execute(statement, params) for statement, params in statements]
                raw.execute("COMMIT")
            return cursors[-1].fetchall()
        except BaseException:
            if raw.info.transaction_status != 0 and not raw.closed:  # not IDLE
                try:
                    raw.execute("ROLLBACK")
                except Exception:  # noqa: BLE001 - the connection is broken; it is replaced
                    pass
            raise
