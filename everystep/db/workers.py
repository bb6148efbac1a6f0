"""The workers table: each worker's row, written by the worker itself
(`started`, `heartbeat`), and read by operators (`workers`, `live_workers`):
a worker not stopped whose heartbeat is older than `Worker.LOST_AFTER`
seconds shows as ``lost``.
"""

import dataclasses
import datetime
import json
import os
import socket

from django.db import models
from django.utils import timezone

from everystep.models import Worker, Workflow


def started(name, pool_size, workflows, queues=None):
    """Record the worker `name` as starting in this process (one row per
    name, replaced on each start), with the `queues` it serves (None: all)."""
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
            "queues": None if queues is None else list(queues),
            "started_at": now,
            "heartbeat_at": now,
            "stopped_at": None,
            "recovered_by": None,
            "recovered_at": None,
            "recovered_runs": 0,
        },
    )


def heartbeat(name, state, in_flight, using=None):
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
    #: The queues it serves; None: every queue.
    queues: list | None = None
    #: The live worker that requeued the runs it left claimed, when, how many.
    recovered_by: str | None = None
    recovered_at: datetime.datetime | None = None
    recovered_runs: int = 0

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
            queues=row.queues,
            recovered_by=row.recovered_by,
            recovered_at=row.recovered_at,
            recovered_runs=row.recovered_runs,
        )
        for row in Worker.objects.order_by("name")
    ]
    return sorted(rows, key=lambda row: not row.live)


def live_workers(now=None):
    """The workers not stopped whose heartbeat is recent enough."""
    return Worker.objects.exclude(state=Worker.State.STOPPED).filter(
        heartbeat_at__gte=_lost_before(now or timezone.now())
    )


def holding_runs(asking):
    """``{name: heartbeat_at}`` of the workers other than `asking` that hold
    ``running`` runs: what the orphan recovery watches
    (`everystep.worker.orphans`). One statement, an index probe per worker."""
    holding = Workflow.objects.filter(
        claimed_by=models.OuterRef("name"), status=Workflow.Status.RUNNING
    )
    rows = Worker.objects.exclude(name=asking).filter(models.Exists(holding))
    return dict(rows.values_list("name", "heartbeat_at"))


@dataclasses.dataclass(frozen=True)
class Peers:
    """The ready workers that serve what one worker serves: their `names`,
    sorted, and those of them that had room for more runs (`with_room`) at
    their last heartbeat."""

    names: tuple = ()
    with_room: frozenset = frozenset()


def peers(name, using):
    """The `Peers` of the worker `name`: the ready workers with a recent
    heartbeat that register the same workflows and serve the same queues
    (itself among them once it is ready), the workers a run that `name` can
    claim may as well go to. Read on the connection `using` (a Django
    connection wrapper); none while `name` has no such row."""
    with using.cursor() as cursor:
        cursor.execute(
            "SELECT name, workflows, queues, pool_size, in_flight FROM everystep_worker "
            "WHERE state = %s AND heartbeat_at >= %s",
            [
                Worker.State.READY,
                using.ops.adapt_datetimefield_value(_lost_before(timezone.now())),
            ],
        )
        rows = {
            row[0]: ((_listed(row[1]), _listed(row[2])), row[4] < row[3])
            for row in cursor.fetchall()
        }
    if name not in rows:
        return Peers()
    serves = rows[name][0]
    names = tuple(sorted(peer for peer, (its, _) in rows.items() if its == serves))
    return Peers(names, frozenset(peer for peer in names if rows[peer][1]))


def _listed(value):
    """A JSON list column's value, sorted (None stays None), whichever way
    the driver gave it."""
    if isinstance(value, (str, bytes)):
        value = json.loads(value)
    return None if value is None else sorted(value)


def recovered(name, by, count):
    """Note on the row of the worker `name` that the worker `by` requeued
    `count` more of the runs it left claimed."""
    Worker.objects.filter(name=name).update(
        recovered_by=by,
        recovered_at=timezone.now(),
        recovered_runs=models.F("recovered_runs") + count,
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
