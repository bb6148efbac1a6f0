"""What operators read and do, for every front end: the command line, the
``manage.py`` commands, the web UI and the admin share these queries and
actions, and so the same refusals.

- `listed` and `run_with_steps`: what ``runs`` and ``show`` print.
- `RunFilter`, `runs_page`, `status_counts` and `step_counts`: the operator
  UI's list of runs, newest first, a page at a time (keyset pagination on
  the id, a UUIDv7), each filter served by an index (migration 0007).
- `run_fields` and `step_fields`: a run and a step as plain fields, for
  JSON output and the UI.
- `requeue`: put runs parked under a worker name back to ``scheduled``,
  refused while that worker is alive. It holds the worker's name lock
  across its UPDATE, so the worker cannot start and resume them meanwhile.
- `workers`: every worker that has run on this database, what ``workers``
  prints: a worker not stopped whose heartbeat is older than
  `Worker.LOST_AFTER` seconds shows as ``lost``.
- `schedules`: the cron workflows, their next tick and their latest
  tick's run, what ``schedules`` prints.
- `live_workers` and `unclaimable`: who is running, and which scheduled
  runs wait for a workflow that no live worker has (a deploy in progress,
  or a module missing from ``EVERYSTEP_WORKFLOWS``).
"""

import contextlib
import dataclasses
import datetime
import uuid

from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from everystep.core import command_names
from everystep.db import store
from everystep.db.namelock import name_lock
from everystep.errors import EverystepError
from everystep.models import Step, Worker, Workflow

MAX_LIMIT = 10_000


class WorkerAlive(EverystepError):
    """The action needs a worker to be gone, and it holds its name."""


def parse_run_id(text):
    """A run id from text; `EverystepError` naming it otherwise."""
    try:
        return uuid.UUID(str(text))
    except ValueError:
        raise EverystepError(f"{text!r} is not a run id") from None


STATUSES = tuple(Workflow.Status.values)
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
    created_after: datetime.datetime | None = None
    created_before: datetime.datetime | None = None
    search: str | None = None

    def __post_init__(self):
        if self.status is not None and self.status not in STATUSES:
            raise EverystepError(f"status {self.status!r} is not one of: {', '.join(STATUSES)}")
        for bound in (self.created_after, self.created_before):
            if bound is not None and bound.tzinfo is None:
                raise EverystepError("a time bound needs a time zone")

    def queryset(self, *, with_status=True):
        """The matching runs, unordered; without the status filter when
        `with_status` is false (the counts per status)."""
        runs = Workflow.objects.all()
        if with_status and self.status:
            runs = runs.filter(status=self.status)
        if self.workflow:
            runs = runs.filter(name=self.workflow)
        if self.worker:
            runs = runs.filter(claimed_by=self.worker)
        if self.created_after:
            runs = runs.filter(id__gte=_first_id_at(self.created_after))
        if self.created_before:
            runs = runs.filter(id__lt=_first_id_at(self.created_before))
        if self.search:
            runs = runs.filter(_search(self.search.strip()))
        return runs


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
    runs = run_filter.queryset(with_status=False)
    if run_filter.created_after or run_filter.created_before:
        # Counted in id order, which leads the planners to an index whose
        # id range the time bounds cut short, rather than all of a status's
        # runs. Without time bounds the order would only lead SQLite astray,
        # to the primary key, from the indexes led by the status.
        runs = runs.order_by("id")
    return {status: runs.filter(status=status)[: cap + 1].count() for status in STATUSES}


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
        "idempotency_key": run.idempotency_key,
        "created_at": run.created_at,
        "run_at": run.run_at,
        "claimed_at": run.claimed_at,
        "completed_at": run.completed_at,
    }


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


def run_with_steps(run_id):
    """The run and its recorded steps in the order they were recorded;
    `EverystepError` if there is no such run."""
    run = Workflow.objects.filter(id=parse_run_id(run_id)).first()
    if run is None:
        raise EverystepError(f"no run {run_id}")
    return run, list(run.steps.order_by("id"))


def requeue(run_ids=None, *, claimed_by=None):
    """Put ``running`` runs — these ids, or every one parked under the worker
    name `claimed_by` — back to ``scheduled``; returns the ids requeued.

    Refused with `WorkerAlive` when a worker holding one of their names is
    alive: it resumes its own runs. Each name's lock is held across the
    UPDATE, so no worker can start under it and resume them meanwhile.
    """
    if (run_ids is None) == (claimed_by is None):
        raise EverystepError("give run ids or a worker name, not both")
    if run_ids is None:
        names = {claimed_by}
    else:
        run_ids = [parse_run_id(run_id) for run_id in run_ids]
        found = store.run_holders(run_ids)
        _refuse_unless_running(run_ids, found)
        names = {worker for _, worker in found.values()}
    with contextlib.ExitStack() as held:
        for name in sorted(name for name in names if name):
            held.enter_context(_holding_name(name))
        with transaction.atomic():
            if run_ids is not None:
                # Read again under the names' locks, the rows locked too: a
                # run requeued and claimed by a live worker meanwhile is
                # refused, not taken from it.
                _refuse_unless_running(run_ids, store.run_holders(run_ids, lock=True), names)
            return store.requeue_runs(run_ids, claimed_by=claimed_by)


def _refuse_unless_running(run_ids, found, names=None):
    """`EverystepError` naming each of `run_ids` that does not exist, is
    not ``running`` or (given the `names` locked) is held by another worker;
    `found` maps id → (status, worker). Requeue changes nothing unless it
    can requeue every run asked."""
    problems = []
    for run_id in run_ids:
        status, worker = found.get(run_id, (None, None))
        if status is None:
            problems.append(f"no run {run_id}")
        elif status != Workflow.Status.RUNNING:
            problems.append(f"run {run_id} {_why_not_running(status)}")
        elif names is not None and worker not in names:
            problems.append(f"run {run_id} is now held by worker {worker}")
    if problems:
        raise EverystepError("; ".join(problems) + " (only running runs are requeued)")


def _why_not_running(status):
    """Why a run in `status` is not requeued, and what to do instead."""
    if status == Workflow.Status.SCHEDULED:
        return "is scheduled: a worker will claim it"
    if status == Workflow.Status.FAILED:
        return f"failed: run it again with {command_names.command('retry')}"
    if status == Workflow.Status.BLOCKED:
        return f"is blocked: resolve its step with {command_names.command('resolve-step')}"
    return f"is {status}: it has ended"


@contextlib.contextmanager
def _holding_name(name):
    lock = name_lock(name)
    if not lock.try_acquire():
        lock.release()
        raise WorkerAlive(
            f"worker {name!r} is alive (it holds its name): stop it, or let it resume its own runs"
        )
    try:
        yield
    finally:
        lock.release()


LOST = "lost"  # the state a worker shows once its heartbeat is too old


@dataclasses.dataclass(frozen=True)
class WorkerStatus:
    """A worker as operators see it: its row, with `state` derived (`LOST`
    for a worker not stopped whose heartbeat is too old) and the age of its
    heartbeat in seconds (0 for a heartbeat from a clock ahead of ours)."""

    name: str
    state: str
    hostname: str
    pid: int
    version: str
    pool_size: int
    in_flight: int
    started_at: datetime.datetime
    heartbeat_at: datetime.datetime
    heartbeat_age: float
    stopped_at: datetime.datetime | None

    @property
    def live(self):
        return self.state not in (LOST, Worker.State.STOPPED)


def workers(now=None):
    """Every worker that has run on this database, as `WorkerStatus`es:
    the live ones first, each group by name."""
    now = now or timezone.now()
    cutoff = _lost_before(now)
    rows = [
        WorkerStatus(
            name=row.name,
            state=LOST if _lost(row, cutoff) else row.state,
            hostname=row.hostname,
            pid=row.pid,
            version=row.version,
            pool_size=row.pool_size,
            in_flight=row.in_flight,
            started_at=row.started_at,
            heartbeat_at=row.heartbeat_at,
            heartbeat_age=max(0.0, (now - row.heartbeat_at).total_seconds()),
            stopped_at=row.stopped_at,
        )
        for row in Worker.objects.order_by("name")
    ]
    return sorted(rows, key=lambda row: not row.live)


def live_workers(now=None):
    """The workers not stopped whose heartbeat is recent enough."""
    return Worker.objects.exclude(state=Worker.State.STOPPED).filter(
        heartbeat_at__gte=_lost_before(now or timezone.now())
    )


def _lost(row, cutoff):
    return row.state != Worker.State.STOPPED and row.heartbeat_at < cutoff


def _lost_before(now):
    """The heartbeat a worker not stopped must have renewed since to be live."""
    return now - datetime.timedelta(seconds=Worker.LOST_AFTER)


def registered_workflows():
    """The names of the workflows some live worker has registered."""
    known = set()
    for workflows in live_workers().values_list("workflows", flat=True):
        known.update(workflows)
    return known


def unclaimable():
    """Scheduled runs of workflows that no live worker has registered, as
    ``{workflow name: count}``."""
    waiting = (
        Workflow.objects.filter(status=Workflow.Status.SCHEDULED)
        .exclude(name__in=registered_workflows())
        .values_list("name")
        .annotate(count=Count("id"))
    )
    return dict(waiting)
