"""Prometheus metrics, fed by the engine's events (`everystep.core.events`).

Every collector lives in `prometheus_client`'s default registry, so the
process that runs a worker serves them wherever it serves that registry:
the worker's own endpoint (`--metrics-port`, `everystep.worker.endpoint`), a
Django view (`everystep.views.metrics_view`) or the host application's own
exporter. Labels are names from code (workflows, steps, workers), never run
ids, so the number of series stays bounded.

The counters and histograms are updated by the handlers in `on_event`,
subscribed to the engine's announcements; nothing in the runner or the
worker touches a metric. The queue gauges (pending, running, blocked, the
oldest pending run's age, unclaimable runs, runs parked in a wait) are read
from the database when
scraped, by `QueueCollector`, at most once every `QUEUE_CACHE_SECONDS`, on
indexes that hold only the runs not finished (`reads.queue_state`).
"""

import threading
import time

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

from everystep.core import events
from everystep.resilience import outage

QUEUE_CACHE_SECONDS = 5.0

# The reference's metrics: same names, types and labels.
WORKFLOW_RUNS = Counter(
    "everystep_workflow_runs",
    "Run attempts that ended, by workflow and final status.",
    ["workflow", "status"],
)
WORKFLOW_DURATION = Histogram(
    "everystep_workflow_duration_seconds",
    "How long a run's last attempt took, by workflow and final status.",
    ["workflow", "status"],
)
STEP_RUNS = Counter(
    "everystep_step_runs",
    "Steps executed and recorded (not replayed), by workflow, step and status.",
    ["workflow", "step", "status"],
)
STEP_DURATION = Histogram(
    "everystep_step_duration_seconds",
    "How long an executed step's function took, by workflow and step.",
    ["workflow", "step"],
)
POOL_SIZE = Gauge("everystep_worker_pool_size", "Runs a worker executes at once.", ["runner"])
IN_FLIGHT = Gauge("everystep_worker_inflight", "Runs a worker is executing now.", ["runner"])
CLAIMS = Counter("everystep_worker_claims", "Runs claimed (or taken back) by a worker.", ["runner"])
REQUEUED = Counter("everystep_worker_requeued", "Runs a worker put back to scheduled.", ["runner"])
STARTED_AT = Gauge(
    "everystep_worker_started_at_seconds", "When a worker started (Unix time).", ["runner"]
)

# Ours.
PICKUP_DELAY = Histogram(
    "everystep_pickup_delay_seconds",
    "From the moment a run is due to its claim, by workflow.",
    ["workflow"],
)
DB_RETRIES = Counter(
    "everystep_db_retries",
    "The engine's database operations retried after a transient error.",
    ["runner"],
)
MESSAGES_SENT = Counter(
    "everystep_messages_sent",
    "Messages sent to runs from this process (`everystep.send`), by topic.",
    ["topic"],
)
RUNS_RECOVERED = Counter(
    "everystep_runs_recovered",
    "Runs of silent workers that a worker requeued (orphan recovery), by recovering worker.",
    ["runner"],
)
DB_OUTAGE = Gauge(
    "everystep_worker_db_outage",
    "1 while this process finds the database unreachable, else 0.",
    ["runner"],
)


_installed = False
_install_lock = threading.Lock()
# The name of the worker in this process, for the metrics of what is shared
# by its threads (database retries and outages). Empty outside a worker.
_runner = ""


def install():
    """Subscribe the metrics to the engine's events and register the queue
    gauges; idempotent. Called by every worker, and by `metrics_view`."""
    global _installed
    with _install_lock:
        if _installed:
            return
        events.subscribe(on_event)
        REGISTRY.register(QueueCollector())
        _installed = True


def _run_finished(fields):
    workflow, status = fields["workflow"], fields["status"]
    WORKFLOW_RUNS.labels(workflow, status).inc()
    WORKFLOW_DURATION.labels(workflow, status).observe(fields["millis"] / 1000)


def _run_crashed(fields):
    """A run the engine failed after an error of its own: failed, too."""
    WORKFLOW_RUNS.labels(fields["workflow"], "failed").inc()


def _step_recorded(fields):
    key = (fields["workflow"], fields["step"], fields["status"])
    children = _step_children.get(key)
    if children is None:  # labels() takes a lock and builds a key: once per step kind
        workflow, step, status = key
        children = STEP_RUNS.labels(workflow, step, status), STEP_DURATION.labels(workflow, step)
        _step_children[key] = children
    runs, duration = children
    runs.inc()
    duration.observe(fields["seconds"])


_step_children = {}  # (workflow, step, status) → the step metrics' labelled children


def _step_retrying(fields):
    """A failed call that its retry policy calls again: counted as
    ``retrying``, apart from the step's final outcome."""
    STEP_RUNS.labels(fields["workflow"], fields["step"], "retrying").inc()


def _claim(fields):
    runner = fields["worker"]
    CLAIMS.labels(runner).inc(fields["count"])
    if fields["taken_back"]:
        return  # parked long ago: no pickup delay
    now = time.time()
    for run in fields["runs"]:
        if run.due_at is not None:
            PICKUP_DELAY.labels(run.fence.workflow).observe(max(0.0, now - run.due_at.timestamp()))


def _requeued(fields):
    REQUEUED.labels(fields["worker"]).inc()


def _worker_starting(fields):
    global _runner
    _runner = runner = fields["worker"]
    STARTED_AT.labels(runner).set(fields["started_at"])
    DB_OUTAGE.labels(runner).set(0 if outage.tracker.since is None else 1)
    for zero_until_counted in (IN_FLIGHT, CLAIMS, REQUEUED, DB_RETRIES, RUNS_RECOVERED):
        zero_until_counted.labels(runner)


def _worker_ready(fields):
    POOL_SIZE.labels(fields["worker"]).set(fields["pool_size"])
    # Read when scraped: exact, and no cost to a run.
    IN_FLIGHT.labels(fields["worker"]).set_function(fields["in_flight"])


def _message_sent(fields):
    MESSAGES_SENT.labels(fields["topic"]).inc()


def _runs_recovered(fields):
    RUNS_RECOVERED.labels(fields["worker"]).inc(fields["count"])


def _db_retry(fields):
    DB_RETRIES.labels(_runner).inc()


def _db_outage(fields):
    DB_OUTAGE.labels(_runner).set(1)


def _db_recovered(fields):
    DB_OUTAGE.labels(_runner).set(0)


#: How each event the metrics concern updates them: event name → handler(fields).
on_event = {
    **{f"run_{status}": _run_finished for status in events.FINISHED},
    "run_crashed": _run_crashed,
    "step_recorded": _step_recorded,
    "step_retrying": _step_retrying,
    "claim": _claim,
    "run_requeued": _requeued,
    "worker_starting": _worker_starting,
    "worker_ready": _worker_ready,
    "message_sent": _message_sent,
    "runs_recovered": _runs_recovered,
    "db_retry": _db_retry,
    "db_outage": _db_outage,
    "db_recovered": _db_recovered,
}


class QueueCollector:
    """The queue as the database holds it, read when scraped and cached for
    `QUEUE_CACHE_SECONDS` however often it is scraped (`reads.queue_state`).
    A scrape while the database is unreachable serves nothing rather than
    failing the whole scrape."""

    def __init__(self):
        self._lock = threading.Lock()
        self._read_at = None
        self._families = []

    def describe(self):
        return []  # read at collect time only: registering must not query

    def collect(self):
        """The cached gauges, read again first when they are older than
        `QUEUE_CACHE_SECONDS` — by one scrape: the others meanwhile get the
        cached ones rather than queue up behind a slow database."""
        with self._lock:
            now = time.monotonic()
            due = self._read_at is None or now - self._read_at >= QUEUE_CACHE_SECONDS
            if due:
                self._read_at = now  # claims the read
        if due:
            self._families = self._read()
        return list(self._families)

    def _read(self):
        from django.db import DEFAULT_DB_ALIAS, connections

        from everystep.db import queues, reads, workers
        from everystep.resilience import deadline

        try:
            with deadline.guard(connections[DEFAULT_DB_ALIAS], "reading the queue gauges"):
                queue = reads.queue_state()
                known = workers.registered_workflows()
                by_queue = queues.statuses()
        except Exception:  # noqa: BLE001 - an unreachable database: no queue gauges
            return []
        families = [
            *_queue_families(by_queue),
            _gauge("everystep_workflows_running", "Runs claimed by a worker.", queue.running),
            _gauge(
                "everystep_workflows_blocked", "Runs blocked on an uncertain step.", queue.blocked
            ),
            _gauge(
                "everystep_workflows_oldest_pending_age_seconds",
                "How long the oldest scheduled run has waited (0 when none waits).",
                queue.oldest_pending_age,
            ),
        ]
        waiting = GaugeMetricFamily(
            "everystep_runs_waiting",
            "Runs parked for a message (reason message) or another run's end (reason run).",
            labels=["reason"],
        )
        for reason in ("message", "run"):
            waiting.add_metric([reason], queue.waiting.get(reason, 0))
        families.append(waiting)
        unclaimable = GaugeMetricFamily(
            "everystep_workflows_unclaimable",
            "Scheduled runs of a workflow that no live worker has registered.",
            labels=["workflow"],
        )
        for workflow, count in sorted(queue.pending_by_workflow.items()):
            if workflow not in known:
                unclaimable.add_metric([workflow], count)
        return [*families, unclaimable]


def _queue_families(statuses):
    """The gauges of each queue (`everystep.db.queues.statuses`)."""
    pending = GaugeMetricFamily(
        "everystep_workflows_pending", "Runs scheduled, due and not claimed.", labels=["queue"]
    )
    running = GaugeMetricFamily(
        "everystep_queue_running", "Runs of the queue claimed by a worker.", labels=["queue"]
    )
    limit = GaugeMetricFamily(
        "everystep_queue_limit",
        "A queue's declared limit: concurrency, key_concurrency, or rate (starts per window).",
        labels=["queue", "kind"],
    )
    held = GaugeMetricFamily(
        "everystep_queue_held",
        "Due runs of the queue held back: by its concurrency, its rate, or no live worker "
        "serving it.",
        labels=["queue", "reason"],
    )
    for queue in statuses:
        pending.add_metric([queue.name], queue.due)
        running.add_metric([queue.name], queue.running)
        for kind, value in (
            ("concurrency", queue.concurrency),
            ("key_concurrency", queue.key_concurrency),
            ("rate", queue.rate and queue.rate[0]),
        ):
            if value is not None:
                limit.add_metric([queue.name, kind], value)
        if queue.held_by is not None:
            held.add_metric([queue.name, queue.held_by], queue.held)
    return [pending, running, limit, held]


def _gauge(name, documentation, value):
    return GaugeMetricFamily(name, documentation, value=value)
