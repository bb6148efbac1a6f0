"""What operators read, for every front end: the command line, the
``manage.py`` commands, the operator UI and the metrics share these queries.

- `listed` and `run_with_steps`: what ``runs`` and ``show`` print.
- `RunFilter`, `runs_page`, `status_counts` and `step_counts`: the operator
  UI's list of runs, newest first, a page at a time (keyset pagination on
  the id, a UUIDv7), each filter served by an index (migration 0007).
- `run_fields` and `step_fields`: a run and a step as plain fields, for
  JSON output and the UI.
- `schedules`: the cron workflows, their next tick and their latest
  tick's run, what ``schedules`` prints.
- `unclaimable`: which scheduled runs wait for a workflow that no live
  worker has (a deploy in progress, or a module missing from
  ``EVERYSTEP_WORKFLOWS``).
- `queue_state`: the runs not finished, as the queue gauges show them.
"""

import dataclasses
import datetime
import uuid

from django.db import connection
from django.db.models import CharField, Count, F, Func, Max, Q, Sum

from everystep.core import clock
from everystep.core.ids import parse_run_id
from everystep.db import sql, workers
from everystep.errors import EverystepError
from everystep.models import Step, Workflow

STATUSES = tuple(Workflow.Status.values)
#: The statuses of the runs not ended (nor cancelled): few at any time.
QUEUED = (Workflow.Status.SCHEDULED, Workflow.Status.RUNNING, Workflow.Status.BLOCKED)


PAGE_SIZE = 50


COUNT_CAP = 10_000  # counts stop here: a page never reads a million rows to count them


@dataclasses.dataclass(frozen=True)
class RunFilter:
    """Which runs to list: every field is optional and they all apply.

    `search` matches a run id exactly or an idempotency key exactly;
    `created_after` and `created_before` bound the creation time, read from
    the run id (a UUIDv7 carries it), so the primary key serves them.
    """

    status: str | None = None
    workflow: str | None = None
    worker: str | None = None
    queue: str | None = None
    created_after: datetime.datetime | None = None
    created_before: datetime.datetime | None = None
    search: str | None = None
    #: Only the runs parked waiting for a message or another run's end.
    waiting: bool = False

    def __post_init__(self):
        if self.status is not None and self.status not in STATUSES:
            raise EverystepError(f"status {self.status!r} is not one of: {', '.join(STATUSES)}")
        for bound in (self.created_after, self.created_before):
            if bound is not None and bound.tzinfo is None:
                raise EverystepError("a time bound needs a time zone")

    def queryset(self, *, with_status=True, unindexed=()):
        """The matching runs, unordered; without the status filter when
        `with_status` is false (the counts per status). The filters on the
        `unindexed` columns (SQLite only) are compared in a way no index
        serves, so that the planner reads the runs through another."""
        runs = Workflow.objects.all()
        if with_status and self.status:
            runs = runs.filter(status=self.status)
        for column, value in (
            ("name", self.workflow),
            ("claimed_by", self.worker),
            ("queue", self.queue),
        ):
            if value:
                equal = _unindexed_equal if column in unindexed else _equal
                runs = equal(runs, column, value)
        if self.created_after:
            runs = runs.filter(id__gte=_first_id_at(self.created_after))
        if self.created_before:
            runs = runs.filter(id__lt=_first_id_at(self.created_before))
        if self.search:
            runs = runs.filter(_search(self.search.strip()))
        if self.waiting:
            runs = runs.filter(Q(wait_topic__isnull=False) | Q(wait_run__isnull=False))
        return runs


class _Unindexed(Func):
    """SQLite's unary ``+`` on a text column: the same value, through no index."""

    template = "+%(expressions)s"
    output_field = CharField()


def _equal(runs, column, value):
    return runs.filter(**{column: value})


def _unindexed_equal(runs, column, value):
    return runs.alias(**{f"unindexed_{column}": _Unindexed(F(column))}).filter(
        **{f"unindexed_{column}": value}
    )


def _first_id_at(moment):
    """The smallest UUIDv7 created at `moment`: its first 48 bits are the
    Unix time in milliseconds."""
    milliseconds = int(moment.timestamp() * 1000)
    return uuid.UUID(int=max(0, milliseconds) << 80)


def _search(text):
    try:
        return Q(id=uuid.UUID(text)) | Q(idempotency_key=text)
    except ValueError:
        return Q(idempotency_key=text)


@dataclasses.dataclass(frozen=True)
class RunsPage:
    """A page of runs, newest first, and the cursor of the next one (None
    on the last page)."""

    runs: list
    next_cursor: str | None


def runs_page(run_filter=RunFilter(), cursor=None, size=PAGE_SIZE):
    """The `size` newest runs matching `run_filter` created before the run
    `cursor` names (the previous page's `next_cursor`); one query."""
    runs = run_filter.queryset()
    if cursor:
        runs = runs.filter(id__lt=parse_run_id(cursor))
    rows = list(runs.order_by("-id")[: size + 1])
    more = len(rows) > size
    rows = rows[:size]
    return RunsPage(rows, str(rows[-1].id) if more else None)


def status_counts(run_filter=RunFilter(), cap=COUNT_CAP):
    """``{status: count}`` of the runs matching `run_filter` (its own status
    filter aside), each count stopping at `cap` + 1: a count above `cap`
    means "more than `cap`"."""
    by_time = run_filter.created_after or run_filter.created_before

    def count(status):
        runs = run_filter.queryset(with_status=False, unindexed=_hidden_when_counting(status))
        if by_time:
            # Counted in id order, which leads the planners to an index whose
            # id range the time bounds cut short, rather than all of a
            # status's runs. Without time bounds the order would only lead
            # SQLite astray, to the primary key, from the indexes led by the
            # status.
            runs = runs.order_by("id")
        return runs.filter(status=status)[: cap + 1].count()

    return {status: count(status) for status in STATUSES}


def _hidden_when_counting(status):
    """The filters' columns hidden from SQLite's planner when it counts the
    runs of `status`. The runs in the queue (scheduled, running, blocked)
    are few, and each status has an index of its own; the planner, which
    knows the average status only, would rather read every run of the
    workflow or the worker. A queue filter is left to the queue's indexes,
    and a worker filter of the running runs to their index by worker."""
    if connection.vendor != "sqlite" or status not in QUEUED:
        return ()
    return ("name",) if status == Workflow.Status.RUNNING else ("name", "claimed_by")


def listed(runs):
    """`runs` as the runs list shows them, in the UI's API and ``runs
    --json`` alike: each run's fields and its step counts (one query)."""
    counts = step_counts([run.id for run in runs])
    return [{**run_fields(run), "steps": counts[run.id]} for run in runs]


def step_counts(run_ids):
    """``{run id: {"total": n, "done": n, "failed": n}}`` of the recorded
    steps of each run; one query."""
    counts = {run_id: {"total": 0, "done": 0, "failed": 0} for run_id in run_ids}
    rows = (
        Step.objects.filter(workflow_id__in=list(run_ids))
        .values_list("workflow_id", "status")
        .annotate(count=Count("id"))
    )
    for run_id, status, count in rows:
        counts[run_id]["total"] += count
        if status in ("done", "failed"):
            counts[run_id][status] += count
    return counts


def blocked_runs(limit=PAGE_SIZE):
    """The blocked runs, oldest first, each with its uncertain (started)
    steps: ``[(run, [step, ...]), ...]``."""
    runs = list(
        Workflow.objects.filter(status=Workflow.Status.BLOCKED).order_by("created_at")[:limit]
    )
    started = {run.id: [] for run in runs}
    for step in Step.objects.filter(workflow__in=runs, status=Step.Status.STARTED).order_by("id"):
        started[step.workflow_id].append(step)
    return [(run, started[run.id]) for run in runs]


def runs_held(names):
    """``{worker name: [run id, ...]}`` of the running runs claimed under
    each name (what a live worker is running, or a lost one left parked)."""
    held = {name: [] for name in names}
    rows = Workflow.objects.filter(status=Workflow.Status.RUNNING, claimed_by__in=list(names))
    # Sorted here: ordered by id, SQLite would read the primary key, every
    # run, rather than the running runs' index.
    for run_id, name in sorted(rows.values_list("id", "claimed_by")):
        held[name].append(run_id)
    return held


def schedules(now=None):
    """The cron workflows registered in this process, each with its next
    tick and the run of its latest tick if there is one: ``[{"workflow",
    "cron", "timezone", "next_tick", "latest_tick", "latest_run",
    "latest_status"}]``; one query."""
    from everystep.core import clock, cron, registry

    now = now or clock.now()
    rows = []
    for schedule in registry.schedules():
        latest = schedule.latest_tick(now)
        rows.append(
            {
                "workflow": schedule.workflow,
                "cron": schedule.expression,
                "timezone": schedule.timezone,
                "next_tick": schedule.next_tick(now),
                "latest_tick": latest,
                "key": cron.tick_key(latest),
            }
        )
    runs = Workflow.objects.filter(
        name__in=[row["workflow"] for row in rows],
        idempotency_key__in=[row["key"] for row in rows],
    ).values_list("name", "idempotency_key", "id", "status")
    found = {(name, key): (run_id, status) for name, key, run_id, status in runs}
    for row in rows:
        run_id, status = found.get((row["workflow"], row.pop("key")), (None, None))
        row.update(latest_run=run_id, latest_status=status)
    return rows


def run_fields(run):
    """The run's row as plain fields, without its arguments and outcome."""
    return {
        "id": run.id,
        "name": run.name,
        "status": run.status,
        "claimed_by": run.claimed_by,
        "queue": run.queue,
        "priority": run.priority,
        "concurrency_key": run.concurrency_key,
        "idempotency_key": run.idempotency_key,
        "created_at": run.created_at,
        "run_at": run.run_at,
        "claimed_at": run.claimed_at,
        "completed_at": run.completed_at,
        "parent_id": run.parent_id,
        "origin_id": run.origin_id,
        "waits_for": waits_for(run),
    }


def waits_for(run):
    """What the scheduled run `run` waits for before it is due, in words: a
    message, another run's end, or its time (a delayed start, a sleep, a
    retry's wait); None when it is due, or not scheduled."""
    if run.status != Workflow.Status.SCHEDULED:
        return None
    if run.run_at >= clock.FOREVER:
        until = "no deadline"
    else:
        until = f"until {run.run_at:%Y-%m-%d %H:%M:%S}"
    if run.wait_topic is not None:
        return f"a message on {run.wait_topic}, {until}"
    if run.wait_run is not None:
        return f"the end of run {run.wait_run}, {until}"
    if run.run_at > clock.now():
        return f"its time, {run.run_at:%Y-%m-%d %H:%M:%S}"
    return None


MAX_CHILDREN = 200  # children a run's page and `show` list


def children(run_id):
    """The runs the run `run_id` started, oldest first, at most
    `MAX_CHILDREN`: ``[{"id", "name", "status"}]``."""
    rows = Workflow.objects.filter(parent_id=run_id).order_by("id")[:MAX_CHILDREN]
    return list(rows.values("id", "name", "status"))


def forks(run_id):
    """The runs forked from the run `run_id` (`everystep fork`), oldest
    first, at most `MAX_CHILDREN`: ``[{"id", "status"}]``."""
    rows = Workflow.objects.filter(origin_id=run_id).order_by("id")[:MAX_CHILDREN]
    return list(rows.values("id", "status"))


def step_fields(step):
    """A recorded step as plain fields, its values decoded."""
    return {
        "step_id": step.step_id,
        "name": step.name,
        "status": step.status,
        "args": step.args,
        "kwargs": step.kwargs,
        "result": step.result,
        "error": step.error,
        "started_at": step.started_at,
        "finished_at": step.finished_at,
        "attempts": step.attempts,
    }


def run_with_steps(run_id, *, offset=0, limit=None):
    """The run and its recorded steps in the order they were recorded — all
    of them, or `limit` from `offset`; `EverystepError` if there is no such
    run."""
    run = Workflow.objects.filter(id=parse_run_id(run_id)).first()
    if run is None:
        raise EverystepError(f"no run {run_id}")
    steps = run.steps.order_by("id")
    if limit is not None:
        steps = steps[offset : offset + limit]
    return run, list(steps)


def step_count(run_id):
    """How many steps the run has recorded; one query on its index."""
    return Step.objects.filter(workflow_id=run_id).count()


def run_fingerprint(run_id):
    """A cheap token that changes whenever what the run's page shows does:
    the run's own row, and its steps' count, newest record, finished ones
    and calls; two queries, none of which reads a step's values."""
    run_id = parse_run_id(run_id)
    row = (
        Workflow.objects.filter(id=run_id)
        .values_list("status", "claimed_by", "run_at", "completed_at", "cancel_requested_at")
        .first()
    )
    steps = Step.objects.filter(workflow_id=run_id).aggregate(
        count=Count("id"), newest=Max("id"), finished=Count("finished_at"), calls=Sum("attempts")
    )
    return (row, tuple(sorted(steps.items())))


def unclaimable():
    """Scheduled runs of workflows that no live worker has registered, as
    ``{workflow name: count}``."""
    waiting = (
        Workflow.objects.filter(status=Workflow.Status.SCHEDULED)
        .exclude(name__in=workers.registered_workflows())
        .values_list("name")
        .annotate(count=Count("id"))
    )
    return dict(waiting)


@dataclasses.dataclass(frozen=True)
class QueueState:
    """The runs not finished, as the queue gauges show them."""

    pending: int
    running: int
    blocked: int
    oldest_pending_age: float  # seconds; 0 when nothing waits
    pending_by_workflow: dict  # workflow name → scheduled runs
    waiting: dict  # "message" or "run" → runs parked waiting for one


def queue_state():
    """Count the runs not finished: four queries, each on an index that holds
    only the runs in its status (on MariaDB/MySQL, one led by the status),
    so their cost follows the queue, never the history. Pending runs are
    the scheduled ones that are due: those waiting for a later time (a
    delayed start, a sleep, a retry's wait, a wait for a message or a run)
    are counted only as the runs parked in a wait."""
    now = clock.now()
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT name, COUNT(*), MIN(run_at) FROM {_queue_index('scheduled')} "
            "WHERE status = 'scheduled' AND run_at <= %s GROUP BY name",
            [sql.datetime_param(connection, now)],
        )
        scheduled = cursor.fetchall()
        running = _count(cursor, "running", _queue_index("claimed_by"))
        blocked = _count(cursor, "blocked", _queue_index("blocked"))
        # Only the runs waiting now hold what they wait for (they are
        # cleared as a wait ends): each count reads an index of those.
        cursor.execute(
            f"SELECT (SELECT COUNT(*) FROM {_queue_index('wait_topic')} "
            "WHERE wait_topic IS NOT NULL), "
            f"(SELECT COUNT(*) FROM {_queue_index('wait_run')} WHERE wait_run IS NOT NULL)"
        )
        by_message, by_run = cursor.fetchone()
    by_workflow = {name: count for name, count, _ in scheduled}
    oldest = min((sql.aware(due) for _, _, due in scheduled), default=None)
    age = 0.0 if oldest is None else max(0.0, (now - oldest).total_seconds())
    return QueueState(
        pending=sum(by_workflow.values()),
        running=running,
        blocked=blocked,
        oldest_pending_age=age,
        pending_by_workflow=by_workflow,
        waiting={"message": by_message or 0, "run": by_run or 0},
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
