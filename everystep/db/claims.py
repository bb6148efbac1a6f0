"""The claim: which due runs a worker takes, and how limits hold.

Order. Among the due runs of the queues a worker serves, a run due for
longer than the priority aging is claimed first (the oldest first), then
the higher priority, then the earlier due time. The claim index holds the
scheduled runs by (queue, priority, due time), so the due runs of one queue
and priority (a pair) are one short range of it, however many runs of
other queues are due and however many wait for a later time.

Pairs. On PostgreSQL the claim finds the scheduled pairs in its own
statement, skipping through the index one pair at a time (a recursive
query). SQLite and MariaDB would read the whole index that way (MariaDB
plans the recursion's seeks as scans), so there a process keeps the pairs
its claims have seen (`_known`): a claim reads the due runs of each known
pair of the served queues and, in the same statement, seeks the first pair
and each known pair's successor. Every pair there is is the first or the
successor of another, so when each pair found is known, the known pairs
are all there are and the runs read are the claim's candidates; when a new
one is found, the claim reads again knowing it. Either way a claim reads
its candidates in one statement, whatever the number of pairs, and a new
priority or queue is seen by the very claim that follows its first run.

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

Cost. Which queues are limited is read again every `LIMITS_TTL` seconds,
and at once after this process declares queues. A claim none of whose
served queues it knows as limited locks and counts nothing; it leaves out
the runs of any queue that has a limit, read in the claim's own statement,
so it never takes one outside the lock. A limit declared by another process
is thus applied by this one's claims at once: they leave the queue's runs
alone until this process reads the limits again (within `LIMITS_TTL`; on
SQLite and MariaDB at the next claim, whose statement says which queues
turned out limited).
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
from everystep.resilience import local, sessions

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
    if limit <= 0 or not workflows or served is not None and not served:
        return []
    token = uuid.uuid4()
    now = clock.now()
    if only_parked:
        return _take_back(worker_name, limit, workflows, exclude, token, now)
    aged = now - datetime.timedelta(seconds=aging)
    served = None if served is None else list(served)
    if local.connection().vendor == "postgresql":
        return _claim_in_one_round_trip(worker_name, limit, workflows, served, token, now, aged)
    return _claim_in_steps(worker_name, limit, workflows, served, token, now, aged)


LIMITS_TTL = 5.0  # seconds a process trusts its view of which queues are limited
_limited = {"names": None, "read_at": 0.0}
_limited_lock = threading.Lock()


def limited_queues(max_age=LIMITS_TTL):
    """The names of the queues with a limit, as read at most `max_age`
    seconds ago."""
    with _limited_lock:
        names, read_at = _limited["names"], _limited["read_at"]
    if names is None or time.monotonic() - read_at > max_age:
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


def _locked(candidates):
    """The `candidates`' `FIELDS` in due order, each row locked as it is
    read, skipping those another claimer holds."""
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
        .values(*FIELDS, *(["has_steps"] if connection.vendor != "mysql" else []))
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
            wait_topic=None,  # a wait that timed out is over
            wait_run=None,
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
        if self.full:
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
        limited = limited_queues()
        limits = _read_limits(sorted(limited.intersection(served or limited)), now)
        for _ in range(MAX_ROUNDS):
            due = _read_due(served, limits, workflows, now, limit)
            if due.pairs_complete:
                break
        if due.newly_limited:
            forget_limits()  # and leave their runs to a claim that locks them
        candidates = [run for run in due.runs if run["queue"] not in due.newly_limited]
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


# The scheduled (queue, priority) pairs this process's claims have seen (the
# module's "Pairs"), and how many times a claim reads again on finding new ones.
_known = {"pairs": frozenset()}
_known_lock = threading.Lock()
MAX_ROUNDS = 16


def _known_pairs():
    with _known_lock:
        return _known["pairs"]


@dataclasses.dataclass
class _Due:
    """What one read of the due runs found."""

    runs: list
    pairs_complete: bool
    #: Queues read as unlimited that have a limit now (declared by another
    #: process since this one last read which queues are limited).
    newly_limited: set


# The columns each part of the read gives, in order (a part gives NULL for
# those it has no use for).
COLUMNS = (
    "kind",
    "chain",
    "id",
    "name",
    "args",
    "run_at",
    "trace_context",
    "cancel_requested_at",
    "has_steps",
    "queue",
    "priority",
    "concurrency_key",
    "started_at",
)


def _read_due(served, limits, workflows, now, limit):
    """One statement: the due runs of the known pairs of the `served`
    queues that their `limits` leave room for (up to `limit` each, locked on
    MariaDB, in due order), the pair seeks that check the known pairs, and
    which of the queues read as unlimited have a limit after all."""
    chains = _chains(served)
    members = {chain: _members(_known_pairs(), chain) for chain in chains}
    statement = due_statement(chains, members, limits, workflows, now, limit)
    runs, seen, newly_limited = [], {chain: set() for chain in chains}, set()
    for row in sql.fetch(connection, *statement):
        row = dict(zip(COLUMNS, row, strict=True))
        if row["kind"] == "pair":
            seen[chains[row["chain"]]].add((row["queue"], row["priority"]))
        elif row["kind"] == "limited":
            newly_limited.add(row["queue"])
        else:
            runs.append(_decoded(row))
    complete = _learn(members, seen)
    return _Due(runs, complete, newly_limited)


def due_statement(chains, members, limits, workflows, now, limit):
    """`_read_due`'s statement and its parameters: for each chain (every
    queue, or one served queue) and its `members` (the known pairs), its
    pair seeks and its pairs' due runs."""
    statement = _DueStatement(connection.vendor)
    for number, chain in enumerate(chains):
        statement.seek_first(number, chain)
        for pair in sorted(members[chain]):
            statement.seek_after(number, pair, next_queue=chain is None)
    unlimited = set()
    for chain in chains:
        for queue, priority in sorted(members[chain]):
            queue_limits = limits.get(queue)
            if queue_limits is None:
                unlimited.add(queue)
            elif queue_limits.full:
                continue
            full_keys = queue_limits.full_keys() if queue_limits is not None else []
            statement.runs(queue, priority, workflows, now, limit, full_keys)
    statement.limited_among(sorted(unlimited))
    return statement.sql()


def _chains(served):
    """The chains of pairs a claim checks: every queue's, or each served
    queue's."""
    return [None] if served is None else list(dict.fromkeys(served))


def _learn(members, seen):
    """Update the known pairs with the pairs each chain's seeks found
    (`seen`) where the chain knew `members`; whether every pair found was
    known (then the found ones are exactly the chain's pairs)."""
    complete = True
    with _known_lock:
        pairs = _known["pairs"]
        for chain, found in seen.items():
            if found <= members[chain]:
                pairs = (pairs - members[chain]) | found
            else:
                pairs |= found
                complete = False
        _known["pairs"] = pairs
    return complete


def _members(pairs, chain):
    """The `pairs` a chain holds: all of them, or those of its queue."""
    return frozenset(pair for pair in pairs if chain is None or pair[0] == chain)


def _decoded(row):
    """A run read by raw SQL, as the ORM would give it."""
    row["id"] = uuid.UUID(str(row["id"]))
    row["args"] = sql.decode_json(row["args"])
    row["run_at"] = sql.aware(row["run_at"])
    if isinstance(row["trace_context"], str):
        row["trace_context"] = json.loads(row["trace_context"])
    if row["has_steps"] is not None:
        row["has_steps"] = bool(row["has_steps"])
    return row


class _DueStatement:
    """The parts of `_read_due`'s statement, each a read of the claim index
    that stops after a few rows, joined by UNION ALL."""

    def __init__(self, vendor):
        self.vendor = vendor
        self.parts = []
        self.params = []

    def _pair_seek(self, number, condition, params):
        self._add(
            f"SELECT 'pair', {number:d}, {_nulls(7)}, w.queue, w.priority, NULL, NULL "
            f"FROM everystep_workflow w WHERE w.status = 'scheduled'{condition} "
            "ORDER BY w.queue, w.priority LIMIT 1",
            params,
        )

    def seek_first(self, number, queue):
        """The first pair of chain `number`: of every queue, or of `queue`."""
        if queue is None:
            self._pair_seek(number, "", [])
        else:
            self._pair_seek(number, " AND w.queue = %s", [queue])

    def seek_after(self, number, pair, next_queue):
        """The pair after `pair` in its queue, and with `next_queue`, the
        first pair of the next queue."""
        queue, priority = pair
        self._pair_seek(number, " AND w.queue = %s AND w.priority > %s", [queue, priority])
        if next_queue:
            self._pair_seek(number, " AND w.queue > %s", [queue])

    def runs(self, queue, priority, workflows, now, limit, full_keys):
        """Up to `limit` due runs of the pair, in due order, but those of
        the `full_keys`."""
        has_steps = (
            "EXISTS (SELECT 1 FROM everystep_step s WHERE s.workflow_id = w.id)"
            if self.vendor != "mysql"  # see `_locked`
            else "NULL"
        )
        keys = ""
        if full_keys:
            keys = (
                " AND (w.concurrency_key IS NULL OR w.concurrency_key NOT IN "
                f"({_placeholders(full_keys)}))"
            )
        # MariaDB may otherwise take the due-time index, and skip through
        # other pairs' due runs.
        index = " FORCE INDEX (everystep_workflow_claim)" if self.vendor == "mysql" else ""
        lock = " FOR UPDATE SKIP LOCKED" if self.vendor == "mysql" else ""
        self._add(
            f"SELECT 'run', NULL, w.id, w.name, w.args, w.run_at, w.trace_context, "
            f"w.cancel_requested_at, {has_steps}, w.queue, w.priority, w.concurrency_key, "
            f"w.started_at FROM everystep_workflow w{index} "
            "WHERE w.status = 'scheduled' AND w.queue = %s AND w.priority = %s "
            f"AND w.run_at <= %s AND w.name IN ({_placeholders(workflows)}){keys} "
            f"ORDER BY w.run_at LIMIT {int(limit):d}{lock}",
            [queue, priority, sql.datetime_param(connection, now), *workflows, *full_keys],
        )

    def limited_among(self, queues):
        """Which of `queues` have a limit."""
        if queues:
            self._add(
                f"SELECT 'limited', NULL, {_nulls(7)}, q.name, NULL, NULL, NULL "
                f"FROM everystep_queue q WHERE q.name IN ({_placeholders(queues)}) "
                "AND (q.concurrency IS NOT NULL OR q.key_concurrency IS NOT NULL "
                "OR q.rate_limit IS NOT NULL)",
                queues,
            )

    def _add(self, part, params):
        # A part with its own ORDER BY and LIMIT is a subquery on SQLite and
        # in parentheses on MariaDB.
        self.parts.append(f"SELECT * FROM ({part})" if self.vendor == "sqlite" else f"({part})")
        self.params += params

    def sql(self):
        return " UNION ALL ".join(self.parts), self.params


def _nulls(count):
    return ", ".join(["NULL"] * count)


def _placeholders(values):
    return ", ".join(["%s"] * len(values))


def _read_limits(queues, now):
    """The limits of those of `queues` that are limited, their rows locked
    until the transaction ends, with their current use: the running runs of
    all of them counted in one query, by queue and key."""
    if not queues:
        return {}
    rows = Queue.objects.filter(LIMITED, name__in=queues)
    if connection.features.has_select_for_update:
        rows = rows.select_for_update()
    rows = list(rows.order_by("name"))
    limits = {
        row.name: _Limits(row.concurrency, row.key_concurrency, row.rate_limit) for row in rows
    }
    running = (
        Workflow.objects.filter(status=RUNNING, queue__in=list(limits))
        .values_list("queue", "concurrency_key")
        .annotate(n=Count("id"))
        .order_by()
    )
    folded = {name.casefold(): queue_limits for name, queue_limits in limits.items()}
    for queue, key, count in running:
        # MariaDB compares names without case, and groups under either spelling.
        queue_limits = limits.get(queue) or folded[queue.casefold()]
        queue_limits.running += count
        if key is not None:
            queue_limits.running_by_key[key] = count
    for row in rows:
        if row.rate_limit is not None:
            limits[row.name].started = starts_within(row.name, row.rate_seconds, now)
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
#
# When the claim's transaction is its own, its commit does not wait for the
# WAL to reach the disk (`set_config`, local to the transaction): the wait
# is most of a claim's time, and the claim needs no durability of its own.
# A claim that a server crash loses leaves its runs scheduled, to be claimed
# again, and its runner's first fenced write is refused; and every durable
# write after it flushes the WAL up to itself, so a step recorded under the
# claim makes the claim durable too. In a caller's transaction, the
# caller's commit is left as it is.
#
# The chosen runs are joined by primary key, which lets the planner look
# them up by it (the unlimited claim does so even on a table never
# analyzed, where the old `id = ANY(…)` form was planned as a scan), and
# `set_config` is a subquery of no row, run once per claim rather than for
# every row a scan reads. It runs when no run is chosen too: such a commit
# holds no write that needs durability.
TAKE_CHOSEN = """
UPDATE everystep_workflow
   SET status = 'running', claimed_by = %(worker)s, claim_token = %(token)s,
       claimed_at = %(now)s, started_at = COALESCE(started_at, %(now)s),
       wait_topic = NULL, wait_run = NULL
  FROM chosen
 WHERE everystep_workflow.id = chosen.id
   AND (SELECT CASE WHEN %(own_commit)s
                    THEN set_config('synchronous_commit', 'off', true) = 'off'
                    ELSE true END)
RETURNING everystep_workflow.id, name, args, run_at, trace_context,
          cancel_requested_at IS NOT NULL,
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
NOTIFY_CHANNEL = "everystep_scheduled"  # the channel the triggers notify (migration 0002)
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
    locking = bool(limited.intersection(served or limited))
    if locking:
        statements = [(LOCK_LIMITED, params), (CLAIM.format(limit=int(limit)), params)]
    else:
        statements = [(CLAIM_UNLIMITED.format(limit=int(limit)), params)]
    db = local.connection()
    params["own_commit"] = own_commit = db.get_autocommit()
    if db.queries_logged or not own_commit:
        # Django's cursor: its query log sees the statements (DEBUG, tests),
        # and a caller's transaction holds them (a savepoint).
        with transaction.atomic(), db.cursor() as cursor:
            for statement, statement_params in statements:
                cursor.execute(statement, statement_params)
            rows = cursor.fetchall()
    elif sessions.pooled():
        # Through a pooler each transaction may meet another server session:
        # the settings travel with the claim's own transaction.
        settings = [(f"SET LOCAL {setting}", None) for setting in CLAIM_SETTINGS]
        rows = _pipelined(db, [*settings, *statements])
    else:
        _apply_claim_settings(db)
        if locking:
            rows = _pipelined(db, statements)
        else:
            [(statement, statement_params)] = statements
            rows = sql.fetch(db, statement, statement_params)
    return claimed_from_returning(rows, worker_name, token)


def claimed_from_returning(rows, worker_name, token):
    """The `ClaimedRun`s of the rows `TAKE_CHOSEN` returned, by run id."""
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


def pass_on(passes, key):
    """Wake more workers (PostgreSQL): the notification that began with the
    payload `key`, passed on for the `passes`-th time (``after:PASSES:KEY``),
    which the next peers in its ranking answer
    (`everystep.worker.wakeup.Responders`)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, f"after:{passes}:{key}"])


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
