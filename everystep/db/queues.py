"""The queues table: each queue's limits as the workers declare them, and
what operators read of the queues (`statuses`).

A worker writes the rows of the queues declared in its process as it
starts (`declare`), so the claim of any worker (`everystep.db.claims`)
holds a queue to the same limits. The last declaration wins: a deploy that
changes a limit changes it for every worker once one new worker started.
"""

import dataclasses
import datetime

from django.db.models import Count, Q
from django.utils import timezone

from everystep.core import queues
from everystep.db import workers
from everystep.models import Queue, Workflow


def declare(declarations):
    """Write the limits of the `declarations` (`everystep.core.queues.Queue`s)."""
    now = timezone.now()
    for queue in declarations:
        limit, seconds = queue.rate or (None, None)
        Queue.objects.update_or_create(
            name=queue.name,
            defaults={
                "concurrency": queue.concurrency,
                "key_concurrency": queue.key_concurrency,
                "rate_limit": limit,
                "rate_seconds": seconds,
                "declared_at": now,
            },
        )


@dataclasses.dataclass(frozen=True)
class QueueStatus:
    """A queue as operators see it: its limits, its runs running and due,
    how many due runs a limit holds back, and the live workers serving it."""

    name: str
    concurrency: int | None
    key_concurrency: int | None
    rate: tuple | None
    running: int
    due: int
    held: int
    #: Why its due runs wait: ``concurrency``, ``rate``, ``no worker``, or None.
    held_by: str | None
    served_by: list

    @property
    def limits(self):
        """Its limits as people say them."""
        return queues.Queue.describe(self)


def statuses(now=None):
    """Every queue with runs scheduled or running, or a declared limit,
    by name, as `QueueStatus`es."""
    now = now or timezone.now()
    rows = {row.name: row for row in Queue.objects.all()}
    counts = (
        Workflow.objects.filter(status__in=[Workflow.Status.SCHEDULED, Workflow.Status.RUNNING])
        .values("queue")
        .annotate(
            running=Count("id", filter=Q(status=Workflow.Status.RUNNING)),
            due=Count("id", filter=Q(status=Workflow.Status.SCHEDULED, run_at__lte=now)),
        )
    )
    usage = {row["queue"]: (row["running"], row["due"]) for row in counts}
    live = list(workers.live_workers().values_list("name", "queues"))
    result = []
    for name in sorted(set(rows) | set(usage)):
        row = rows.get(name)
        running, due = usage.get(name, (0, 0))
        served_by = [worker for worker, served in live if served is None or name in served]
        rate = (row.rate_limit, row.rate_seconds) if row and row.rate_limit else None
        held, held_by = _held(row, running, due, served_by, rate, name, now)
        result.append(
            QueueStatus(
                name=name,
                concurrency=row and row.concurrency,
                key_concurrency=row and row.key_concurrency,
                rate=rate,
                running=running,
                due=due,
                held=held,
                held_by=held_by,
                served_by=served_by,
            )
        )
    return result


def _held(row, running, due, served_by, rate, name, now):
    """How many of the `due` runs wait for a limit or a worker, and why."""
    if not due:
        return 0, None
    if not served_by:
        return due, "no worker"
    if row is None:
        return 0, None
    if row.concurrency is not None and running >= row.concurrency:
        return due, "concurrency"
    if rate is not None:
        since = now - datetime.timedelta(seconds=rate[1])
        started = Workflow.objects.filter(queue=name, started_at__gt=since).count()
        if started >= rate[0]:
            return due, "rate"
    return 0, None
