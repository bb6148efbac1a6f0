"""What operators read and do, for every front end: the command line, the
``manage.py`` commands, the web UI and the admin share these queries and
actions, and so the same refusals.

- `recent_runs` and `run_with_steps`: what ``runs`` and ``show`` print.
- `requeue`: put runs parked under a worker name back to ``scheduled``,
  refused while that worker is alive. It holds the worker's name lock
  across its UPDATE, so the worker cannot start and resume them meanwhile.
- `workers`: every worker that has run on this database, what ``workers``
  prints: a worker not stopped whose heartbeat is older than
  `Worker.LOST_AFTER` seconds shows as ``lost``.
- `live_workers` and `unclaimable`: who is running, and which scheduled
  runs wait for a workflow that no live worker has (a deploy in progress,
  or a module missing from ``EVERYSTEP_WORKFLOWS``).
"""

import contextlib
import dataclasses
import datetime
import uuid

from django.db.models import Count
from django.utils import timezone

from everystep import store
from everystep.errors import EverystepError
from everystep.models import Worker, Workflow
from everystep.namelock import name_lock

MAX_LIMIT = 10_000


class WorkerAlive(EverystepError):
    """The action needs a worker to be gone, and it holds its name."""


def parse_run_id(text):
    """A run id from text; `EverystepError` naming it otherwise."""
    try:
        return uuid.UUID(str(text))
    except ValueError:
        raise EverystepError(f"{text!r} is not a run id") from None


def recent_runs(status=None, limit=20):
    """The newest runs first, `limit` of them (1 to `MAX_LIMIT`), optionally
    of one status."""
    if not (isinstance(limit, int) and 1 <= limit <= MAX_LIMIT):
        raise EverystepError(f"the limit must be a whole number from 1 to {MAX_LIMIT}")
    runs = Workflow.objects.order_by("-created_at")
    if status:
        runs = runs.filter(status=status)
    return list(runs[:limit])


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
    if run_ids is not None:
        run_ids = [parse_run_id(run_id) for run_id in run_ids]
        names = set(
            Workflow.objects.filter(id__in=run_ids, status=Workflow.Status.RUNNING)
            .values_list("claimed_by", flat=True)
            .distinct()
        )
    else:
        names = {claimed_by}
    with contextlib.ExitStack() as held:
        for name in sorted(name for name in names if name):
            held.enter_context(_holding_name(name))
        return store.requeue_runs(run_ids, claimed_by=claimed_by)


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
