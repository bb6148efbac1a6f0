"""The queues table: each queue's limits as the workers declare them, and
what operators read of the queues (`statuses`).

A worker writes the rows of the queues declared in its process as it
starts (`declare`), so the claim of any worker (`everystep.db.claims`)
holds a queue to the same limits. The last declaration wins: a deploy that
changes a limit changes it for every worker once one new worker started.
"""

import dataclasses

from django.db.models import Count
from django.utils import timezone

from everystep.core import queues
from everystep.db import claims, workers
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
    claims.forget_limits()


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
    #: Why its due runs wait: ``concurrency``, ``rate``, ``no_worker``, or None.
    held_by: str | None
    served_by: list

    @property
    def limits(self):
        """Its limits as people say them."""
        return queues.describe(self.concurrency, self.key_concurrency, self.rate)


def statuses(now=None):
    """The default queue, every queue with a declared row, and every queue
    with runs due or running, by name, as `QueueStatus`es. Runs waiting for
    a later time are not read (the claim index's due range, then a count of
    the running ones per queue)."""
    now = now or timezone.now()
    rows = {row.name: row for row in Queue.objects.all()}
    due = _counted(Workflow.objects.filter(status=Workflow.Status.SCHEDULED, run_at__lte=now))
    running = _counted(Workflow.objects.filter(status=Workflow.Status.RUNNING))
    live = list(workers.live_workers().values_list("name", "queues"))
    result = []
    for name in sorted({queues.DEFAULT, *rows, *due, *running}):
        row = rows.get(name)
        served_by = [worker for worker, served in live if served is None or name in served]
        rate = (row.rate_limit, row.rate_seconds) if row and row.rate_limit else None
        held, held_by = _held(row, running.get(name, 0), due.get(name, 0), served_by, rate, now)
        result.append(
            QueueStatus(
                name=name,
                concurrency=row and row.concurrency,
                key_concurrency=row and row.key_concurrency,
                rate=rate,
                running=running.get(name, 0),
                due=due.get(name, 0),
                held=held,
                held_by=held_by,
                served_by=served_by,
            )
        )
    return result


def _counted(runs):
    return dict(runs.values("queue").annotate(n=Count("id")).values_list("queue", "n"))


def _held(row, running, due, served_by, rate, now):
    """How many of the `due` runs wait for a limit or a worker, and why."""
    if not due:
        return 0, None
    if not served_by:
        return due, "no_worker"
    if row is None:
        return 0, None
    if row.concurrency is not None and running >= row.concurrency:
        return due, "concurrency"
    if rate is not None and claims.starts_within(row.name, rate[1], now) >= rate[0]:
        return due, "rate"
    return 0, None


def waiting_for(run, now=None):
    """Why the run `run` (a `Workflow` row), scheduled and due, is not
    running yet, in a sentence; None when nothing holds it (a worker takes
    it at its next turn) or when it is not due and scheduled."""
    now = now or timezone.now()
    if run.status != Workflow.Status.SCHEDULED or run.run_at > now:
        return None
    live = list(workers.live_workers().values_list("queues", "workflows"))
    serving = [workflows for served, workflows in live if served is None or run.queue in served]
    if not serving:
        return f"no live worker serves queue {run.queue}"
    if not any(run.name in workflows for workflows in serving):
        return f"no live worker serving queue {run.queue} has the workflow {run.name}"
    row = Queue.objects.filter(name=run.queue).first()
    if row is None:
        return None
    running = Workflow.objects.filter(status=Workflow.Status.RUNNING, queue=run.queue)
    if row.concurrency is not None and running.count() >= row.concurrency:
        return f"queue {run.queue} at its limit of {row.concurrency} running"
    if (
        row.key_concurrency is not None
        and run.concurrency_key is not None
        and running.filter(concurrency_key=run.concurrency_key).count() >= row.key_concurrency
    ):
        return (
            f"queue {run.queue} at its limit of {row.key_concurrency} running "
            f"for the key {run.concurrency_key}"
        )
    if (
        row.rate_limit is not None
        and run.started_at is None
        and claims.starts_within(run.queue, row.rate_seconds, now) >= row.rate_limit
    ):
        return f"queue {run.queue} at its rate of {row.rate_limit} starts per {row.rate_seconds:g}s"
    return None
