"""Metrics and probes (§11): a real worker subprocess serves them on its
metrics port, a real Prometheus scrapes them, a Django view serves them."""

import signal
import socket
import time
import urllib.error
import urllib.request

import pytest
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families

from everystep import schedule
from everystep.db import reads
from everystep.models import Workflow
from everystep.observe import metrics
from tests import workflows
from tests.helpers import database_url, opened, started, statuses, wait_until
from tests.prometheus import PrometheusServer, prometheus_server  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)

QUICK = workflows.quick.__everystep_workflow__
FAILING = workflows.failing_body.__everystep_workflow__


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(port, path):
    """(status, body) of GET http://127.0.0.1:port/path."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def samples(text):
    """{(name, sorted label items): value} of a Prometheus text exposition."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(scraped, name, **labels):
    return scraped.get((name, tuple(sorted(labels.items()))))


def metrics_worker(spawn_worker, name, *args, env=None):
    port = free_port()
    worker = spawn_worker(
        name,
        "--poll",
        "0.05",
        "--metrics-bind",
        "127.0.0.1",
        "--metrics-port",
        str(port),
        *args,
        env=env,
    )
    worker.metrics_port = port
    return worker


def test_a_worker_serves_the_reference_metrics_and_ours(spawn_worker):
    worker = metrics_worker(spawn_worker, "counted", "--pool", "3").wait_ready()
    runs = [schedule(workflows.quick, n).id for n in range(3)]
    failed = schedule(workflows.failing_body).id
    wait_until(lambda: statuses([*runs, failed]) == {"completed": 3, "failed": 1})
    # Runs of a workflow no live worker has: pending, and unclaimable.
    for n in range(2):
        Workflow.objects.create(name="elsewhere.workflow", args=[n])

    def scraped_after_the_queue_read():
        status, text = get(worker.metrics_port, "/metrics")
        assert status == 200
        scraped = samples(text)
        unclaimable = value(
            scraped, "everystep_workflows_unclaimable", workflow="elsewhere.workflow"
        )
        return scraped if unclaimable == 2 else None

    scraped = wait_until(scraped_after_the_queue_read, timeout=30, message="the queue gauges")
    runs_total = "everystep_workflow_runs_total"
    assert value(scraped, runs_total, workflow=QUICK, status="completed") == 3
    assert value(scraped, runs_total, workflow=FAILING, status="failed") == 1
    duration = "everystep_workflow_duration_seconds_count"
    assert value(scraped, duration, workflow=QUICK, status="completed") == 3
    steps = "everystep_step_runs_total"
    assert value(scraped, steps, workflow=QUICK, step="tests.workflows.echo", status="done") == 3
    assert value(scraped, steps, workflow=QUICK, step="tests.workflows.add", status="done") == 3
    step_duration = "everystep_step_duration_seconds_count"
    assert value(scraped, step_duration, workflow=QUICK, step="tests.workflows.add") == 3
    assert value(scraped, "everystep_worker_pool_size", runner="counted") == 3
    assert value(scraped, "everystep_worker_inflight", runner="counted") == 0
    assert value(scraped, "everystep_worker_claims_total", runner="counted") == 4
    assert value(scraped, "everystep_worker_requeued_total", runner="counted") == 0
    started_at = value(scraped, "everystep_worker_started_at_seconds", runner="counted")
    assert time.time() - 120 < started_at <= time.time()
    assert value(scraped, "everystep_pickup_delay_seconds_count", workflow=QUICK) == 3
    assert value(scraped, "everystep_worker_db_outage", runner="counted") == 0
    assert value(scraped, "everystep_db_retries_total", runner="counted") == 0
    assert value(scraped, "everystep_workflows_pending", queue="default") == 2
    assert value(scraped, "everystep_workflows_running") == 0
    assert value(scraped, "everystep_workflows_blocked") == 0
    assert value(scraped, "everystep_workflows_oldest_pending_age_seconds") >= 0
    # Labels are names from code, never run ids.
    assert not any(str(run) in repr(key) for run in runs for key in scraped)
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0


def test_cancelled_runs_retried_calls_and_runs_not_yet_due_in_the_metrics(spawn_worker):
    worker = metrics_worker(spawn_worker, "controlled").wait_ready()
    cancelled = schedule(workflows.cancels_itself).id
    retried = schedule(workflows.retried, 2).id
    later = schedule(workflows.quick, 1, delay=3600).id
    wait_until(lambda: statuses([cancelled, retried]) == {"cancelled": 1, "completed": 1})

    runs_total = "everystep_workflow_runs_total"
    workflow = "tests.workflows.cancels_itself"

    def scraped_after_the_queue_read_and_the_end():
        # The run's end is counted once its last write has committed, which
        # the test may see first: wait for the count as for the gauge.
        scraped = samples(get(worker.metrics_port, "/metrics")[1])
        read = value(scraped, "everystep_workflows_pending", queue="default") == 0
        ended = value(scraped, runs_total, workflow=workflow, status="cancelled") is not None
        return scraped if read and ended else None

    scraped = wait_until(
        scraped_after_the_queue_read_and_the_end, timeout=30, message="the queue gauges"
    )
    assert value(scraped, runs_total, workflow=workflow, status="cancelled") == 1
    flaky = {"workflow": "tests.workflows.retried", "step": "tests.workflows.flaky"}
    assert value(scraped, "everystep_step_runs_total", **flaky, status="retrying") == 2
    assert value(scraped, "everystep_step_runs_total", **flaky, status="done") == 1
    assert Workflow.objects.get(id=later).status == "scheduled"  # waiting: not pending
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0


def test_a_real_prometheus_scrapes_a_worker_and_answers_promql(
    spawn_worker,
    prometheus_server,  # noqa: F811
):
    worker = metrics_worker(spawn_worker, "scraped").wait_ready()
    runs = [schedule(workflows.quick, n).id for n in range(2)]
    wait_until(lambda: statuses(runs) == {"completed": 2})
    prometheus = prometheus_server([f"127.0.0.1:{worker.metrics_port}"])
    query = f'sum(everystep_workflow_runs_total{{workflow="{QUICK}", status="completed"}})'
    result = prometheus.wait_for(query, lambda result: result and float(result[0]["value"][1]) == 2)
    assert PrometheusServer.value(result) == 2
    up = prometheus.wait_for('up{job="everystep"}')
    assert PrometheusServer.value(up) == 1
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0


def test_the_probes_follow_the_worker_from_ready_to_draining(spawn_worker, tmp_path):
    worker = metrics_worker(spawn_worker, "probed", "--drain", "60").wait_ready()
    wait_until(lambda: get(worker.metrics_port, "/readyz") == (200, "ok\n"))
    assert get(worker.metrics_port, "/healthz") == (200, "ok\n")
    assert get(worker.metrics_port, "/nowhere")[0] == 404

    run = schedule(workflows.gated, str(tmp_path))
    started(tmp_path, "first")
    inflight = "everystep_worker_inflight"
    assert value(samples(get(worker.metrics_port, "/metrics")[1]), inflight, runner="probed") == 1
    worker.send(signal.SIGTERM)
    # Draining: alive, but out of rotation until the step finishes.
    wait_until(lambda: get(worker.metrics_port, "/readyz") == (503, "draining\n"))
    assert get(worker.metrics_port, "/healthz") == (200, "ok\n")
    opened(tmp_path, "first")
    assert worker.wait() == 0
    assert statuses([run.id]) == {"scheduled": 1}


@pytest.mark.backends("postgres", "mariadb")
def test_readyz_is_503_while_starting_and_during_an_outage(fault_proxy, spawn_worker):
    proxy = fault_proxy(database_url())
    proxy.refuse()
    env = {"EVERYSTEP_DATABASE_URL": proxy.url(database_url())}
    # A short deadline: the loop's backoff (up to 5 s) must not read as a wedged loop.
    worker = metrics_worker(spawn_worker, "outaged", "--db-deadline", "1", env=env)
    port = worker.metrics_port
    wait_until(lambda: _answers(port), message="the metrics port to answer")
    assert get(port, "/readyz") == (503, "starting\n")
    assert get(port, "/healthz") == (200, "ok\n")
    wait_until(lambda: _outage_gauge(port) == 1, message="the outage gauge while starting")

    proxy.pass_through()
    worker.wait_ready()
    wait_until(lambda: get(port, "/readyz") == (200, "ok\n"))
    proxy.refuse()
    wait_until(lambda: get(port, "/readyz") == (503, "database unreachable\n"), timeout=30)
    # Alive throughout, across the backoff's longest waits.
    holds_for(6, lambda: get(port, "/healthz") == (200, "ok\n"), "/healthz answers 200")
    _, text = get(port, "/metrics")
    assert value(samples(text), "everystep_worker_db_outage", runner="outaged") == 1
    assert value(samples(text), "everystep_db_retries_total", runner="outaged") >= 0

    proxy.pass_through()
    wait_until(lambda: get(port, "/readyz") == (200, "ok\n"), timeout=30)
    _, text = get(port, "/metrics")
    assert value(samples(text), "everystep_worker_db_outage", runner="outaged") == 0
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0


def holds_for(seconds, condition, what):
    """Fail unless `condition` stays true, checked every 0.1 s, for `seconds`."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        assert condition(), f"{what}: no longer true"
        time.sleep(0.1)


def _outage_gauge(port):
    return value(samples(get(port, "/metrics")[1]), "everystep_worker_db_outage", runner="outaged")


def _answers(port):
    try:
        get(port, "/healthz")
    except OSError:
        return False
    return True


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--metrics-port", "http"], "--metrics-port 'http' is not a port number"),
        (["--metrics-port", "70000"], "must be a port number from 1 to 65535"),
        (["--metrics-bind", " "], "--metrics-bind ' ' must be an address"),
    ],
)
def test_a_bad_metrics_flag_exits_2_with_one_line(spawn_worker, flags, message):
    worker = spawn_worker("misconfigured", *flags)
    assert worker.wait() == 2
    lines = worker.log().strip().splitlines()
    assert len(lines) == 1 and message in lines[0], worker.log()


def test_a_taken_metrics_port_exits_2_with_one_line(spawn_worker):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        worker = spawn_worker("crowded", "--metrics-bind", "127.0.0.1", "--metrics-port", str(port))
        assert worker.wait() == 2
    lines = worker.log().strip().splitlines()
    assert len(lines) == 1, worker.log()
    assert f"cannot serve metrics on 127.0.0.1:{port}: Address already in use" in lines[0]


def test_the_queue_is_read_at_most_once_every_5s_however_often_it_is_scraped():
    schedule(workflows.quick, 1)
    collector = metrics.QueueCollector()
    with CaptureQueriesContext(connection) as first:
        gauges = {family.name: family for family in collector.collect()}
    assert gauges["everystep_workflows_pending"].samples[0].value == 1
    with CaptureQueriesContext(connection) as again:
        for _ in range(10):
            collector.collect()
    assert len(first) > 0
    assert len(again) == 0


@override_settings(ROOT_URLCONF="tests.urls")
def test_a_django_project_serves_the_metrics_with_metrics_view():
    schedule(workflows.quick, 1)
    response = Client().get("/everystep/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    scraped = samples(response.content.decode())
    assert value(scraped, "everystep_workflows_pending", queue="default") is not None
    assert ("everystep_workflows_running", ()) in scraped


MILLION = 1_000_000

# One statement per backend that inserts MILLION completed runs (a few
# scheduled, running and blocked ones come from the test).
_FINISHED_RUNS_SQL = {
    "postgresql": """
        INSERT INTO everystep_workflow
               (id, name, args, status, created_at, run_at, completed_at)
        SELECT gen_random_uuid(), 'tests.workflows.quick', '[1]', 'completed',
               now() - n * interval '1 second', now() - n * interval '1 second', now()
          FROM generate_series(1, %(count)s) AS n
    """,
    "mysql": """
        INSERT INTO everystep_workflow
               (id, name, args, status, created_at, run_at, completed_at)
        SELECT REPLACE(UUID(), '-', ''), 'tests.workflows.quick', '[1]', 'completed',
               NOW() - INTERVAL seq SECOND, NOW() - INTERVAL seq SECOND, NOW()
          FROM seq_1_to_%(count)s
    """,
    "sqlite": """
        WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < %(count)s)
        INSERT INTO everystep_workflow
               (id, name, args, status, created_at, run_at, completed_at)
        SELECT lower(hex(randomblob(16))), 'tests.workflows.quick', '[1]', 'completed',
               datetime('now', '-' || i || ' seconds'), datetime('now', '-' || i || ' seconds'),
               datetime('now')
          FROM n
    """,
}


def test_the_queue_gauges_read_only_unfinished_runs_with_a_million_finished_ones():
    """Each queue query reads an index that holds only the unfinished runs
    (on MariaDB, one led by the status), and takes under 50 ms with a
    million finished runs in the table (§11)."""
    with connection.cursor() as cursor:
        cursor.execute(_FINISHED_RUNS_SQL[connection.vendor] % {"count": MILLION})
        if connection.vendor == "postgresql":
            cursor.execute("ANALYZE everystep_workflow")
        elif connection.vendor == "mysql":
            cursor.execute("ANALYZE TABLE everystep_workflow")
            cursor.fetchall()
        else:
            cursor.execute("ANALYZE")
    for n in range(5):
        schedule(workflows.quick, n)
    Workflow.objects.create(name=QUICK, args=[9], status="running", claimed_by="w")
    Workflow.objects.create(name=QUICK, args=[9], status="blocked")
    assert Workflow.objects.count() == MILLION + 7

    with CaptureQueriesContext(connection) as queries:
        reads.queue_state()  # also warms the caches after the bulk load
    assert len(queries) == 4  # due runs, running, blocked, parked in a wait
    for query in queries:
        assert_read_from_an_unfinished_runs_index(query["sql"])
    fastest = min(_timed(reads.queue_state) for _ in range(5))
    state = reads.queue_state()
    assert (state.pending, state.running, state.blocked) == (5, 1, 1)
    print(f"queue gauges with {MILLION:,} finished runs: {fastest * 1000:.1f} ms")
    assert fastest < 0.050, f"the queue read took {fastest * 1000:.0f} ms"


def _timed(func):
    began = time.perf_counter()
    func()
    return time.perf_counter() - began


EXPLAIN = {"postgresql": "EXPLAIN ", "mysql": "EXPLAIN ", "sqlite": "EXPLAIN QUERY PLAN "}
# Indexes that hold only the unfinished runs (on MariaDB/MySQL, the claim's,
# led by the status); SQLite is told which (reads._queue_index). The runs
# waiting are counted from the indexes of what they wait for, which only
# the runs waiting now hold (a range of the set values on MariaDB).
WAIT_INDEXES = ("everystep_workflow_wait_topic", "everystep_workflow_wait_run")
QUEUE_INDEXES = {
    "postgresql": (
        "everystep_workflow_scheduled",
        "everystep_workflow_claim",
        "everystep_workflow_claimed_by",
        "everystep_workflow_blocked",
        *WAIT_INDEXES,
    ),
    "mysql": ("everystep_workflow_scheduled", "everystep_workflow_claim", *WAIT_INDEXES),
    "sqlite": (
        "everystep_workflow_scheduled",
        "everystep_workflow_claimed_by",
        "everystep_workflow_blocked",
        *WAIT_INDEXES,
    ),
}
# Indexes of every run led by the status (MariaDB's, migrations 0007 and
# 0008, and the running runs by queue of 0012): a planner with statistics
# may read one status's range of them instead, as cheaply.
LED_BY_STATUS = ("everystep_run_status", "everystep_workflow_queue_status")


def assert_read_from_an_unfinished_runs_index(sql):
    with connection.cursor() as cursor:
        cursor.execute(EXPLAIN[connection.vendor] + sql)
        columns = [column[0] for column in cursor.description]
        rows = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
    plan = "\n".join(" ".join(str(cell) for cell in row.values()) for row in rows)
    # The index read: on MariaDB its chosen key, not the ones it considered.
    read = " ".join(str(row["key"]) for row in rows) if connection.vendor == "mysql" else plan
    if connection.vendor != "sqlite" and any(index in read for index in LED_BY_STATUS):
        sought = "Index Cond: (status" if connection.vendor == "postgresql" else " ref "
        assert sought in plan, f"not one status's range: {sql}\n{plan}"
    else:
        assert any(index in read for index in QUEUE_INDEXES[connection.vendor]), f"{sql}\n{plan}"
    if connection.vendor == "postgresql":
        assert "Index Only Scan" in plan and "Seq Scan" not in plan, f"{sql}\n{plan}"
    elif connection.vendor == "mysql":
        assert "Using index" in plan, f"{sql}\n{plan}"
    else:
        assert "USING" in plan and "INDEX" in plan, f"{sql}\n{plan}"
