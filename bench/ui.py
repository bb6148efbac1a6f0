"""The operator UI with a million runs: is every page served in under 200 ms?

The workflow table is filled with `runs` runs (1,000,000 in the full suite)
by ``INSERT … SELECT`` statements that generate the rows in the database,
100,000 at a time: ids are UUIDv7 whose timestamps rise evenly over the 30
days before now; about 97 % of the runs are completed, 2 % failed, 0.9 %
stopped and 0.05 % blocked; the newest 100 before the last 50 are running
and the last 50 scheduled; 20 workflow names and 10 worker names (in
``claimed_by``) are spread evenly; every 100th run has an idempotency key.
Only the newest 1,000 runs and the blocked ones have recorded steps, as the
list reads the step counts of its own page's runs only. Then the tables are
ANALYZEd (VACUUM ANALYZE on PostgreSQL, as autovacuum would have), the
load's dirty pages are flushed, and ten workers are registered (eight live,
one stopped, one lost).

The UI is mounted as a Django project mounts it (``/everystep/``, users,
sessions; the settings are switched on for this process only, so that the
other sections' workers keep the suite's minimal settings), and requested
in-process with Django's test client, logged in as a superuser, over a
persistent database connection (the client keeps it across requests, as
``CONN_MAX_AGE`` > 0 would). A request's time is the client's call: the
middleware (session and user lookups included), the view, its queries and
the template, without HTTP parsing or the network. Each page is requested
3 times to warm the caches, then `samples` times timed; its median and p95
are reported, with the statements it sends (one request captured by
``CaptureQueriesContext``) and the median time spent waiting for them in the
driver. The slowest statement of each page and its plan (EXPLAIN ANALYZE on
PostgreSQL, ANALYZE on MariaDB, EXPLAIN QUERY PLAN on SQLite) are written to
``ui-<backend>-plans.txt`` in `log_dir`.
"""

import datetime
import json
import pathlib
import time
import urllib.parse

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection, transaction
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import include, path
from django.utils import timezone

from bench.common import RoundTrips, median, percentile
from bench.db import Dialect, analyze
from everystep import parallel, step, workflow
from everystep.models import Step, Worker, Workflow
from everystep.ui import graph

# The project the UI is mounted in: ROOT_URLCONF points here.
urlpatterns = [path("everystep/", include("everystep.urls"))]

PROJECT = {
    "INSTALLED_APPS": [
        "django.contrib.auth",
        "django.contrib.contenttypes",
        "django.contrib.sessions",
        "everystep",
    ],
    "MIDDLEWARE": [
        "django.middleware.security.SecurityMiddleware",
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.common.CommonMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
    ],
    "TEMPLATES": [
        {
            "BACKEND": "django.template.backends.django.DjangoTemplates",
            "APP_DIRS": True,
            "OPTIONS": {
                "context_processors": [
                    "django.template.context_processors.request",
                    "django.contrib.auth.context_processors.auth",
                ]
            },
        }
    ],
    "ROOT_URLCONF": "bench.ui",
    "ALLOWED_HOSTS": ["testserver"],
    "SECRET_KEY": "everystep-bench-ui",
}

TARGET_MS = 200
WARM_UP = 3
CHUNK = 100_000
DAYS = 30
SCHEDULED, RUNNING = 50, 100  # the newest runs: scheduled, and running before them
WORKFLOWS = [
    "bench.ui.fulfil_order",
    *(
        f"{app}.workflows.{name}"
        for app, name in [
            ("shop", "refund_order"),
            ("shop", "restock_item"),
            ("shop", "cancel_order"),
            ("billing", "send_invoice"),
            ("billing", "charge_subscription"),
            ("billing", "retry_payment"),
            ("billing", "close_month"),
            ("accounts", "welcome_user"),
            ("accounts", "delete_account"),
            ("accounts", "export_data"),
            ("accounts", "reset_password"),
            ("mail", "send_digest"),
            ("mail", "bounce_cleanup"),
            ("search", "reindex_product"),
            ("search", "rebuild_suggestions"),
            ("media", "transcode_video"),
            ("media", "make_thumbnails"),
            ("crm", "sync_contact"),
            ("crm", "score_lead"),
        ]
    ),
]
WORKERS = [f"worker-{index}" for index in range(10)]
ERRORS = {
    "failed": {"type": "builtins.RuntimeError", "message": "gateway timed out"},
    "stopped": {"type": "everystep.errors.Terminal", "message": "out of stock"},
    "blocked": {"type": "everystep.errors.EffectUncertain", "message": "charge_card uncertain"},
}


# The workflow of the runs whose page is measured: its graph is drawn from
# this source (two steps, then a fork of two branches).


@step
def reserve_stock(item):
    return {"reservation": f"R-{item}"}


@step(unsafe_to_repeat=True)
def charge_card(amount):
    return {"charge": f"ch-{amount}"}


@step
def notify_warehouse(reservation):
    return None


@step
def email_customer(order_id):
    return None


@workflow
def fulfil_order(order):
    reservation = reserve_stock(order["item"])
    charge = charge_card(order["amount"])
    parallel(
        lambda: notify_warehouse(reservation["reservation"]),
        lambda: email_customer(order["id"], everystep_id="receipt"),
    )
    return charge


# The fill: one INSERT … SELECT per chunk, its rows computed from their
# number i (1 = the oldest run) in each backend's SQL (`bench.db.Dialect`).


def literal(value):
    return "'" + str(value).replace("'", "''") + "'"


def pick(number_sql, values):
    """SQL choosing ``values[number % len(values)]``."""
    whens = " ".join(f"WHEN {k} THEN {literal(v)}" for k, v in enumerate(values))
    return f"CASE ({number_sql}) % {len(values)} {whens} END"


def fill_statement(sql, count, first, last, start_ms, step_ms):
    """The INSERT of runs `first` to `last` of `count`."""
    share = "(i * 5761) % 10000"  # a permutation of 0..9999 every 10,000 runs
    status = (
        f"CASE WHEN i > {count - SCHEDULED} THEN 'scheduled' "
        f"WHEN i > {count - SCHEDULED - RUNNING} THEN 'running' "
        f"WHEN {share} < 200 THEN 'failed' WHEN {share} < 290 THEN 'stopped' "
        f"WHEN {share} < 295 THEN 'blocked' ELSE 'completed' END"
    )
    errors = " ".join(
        f"WHEN {literal(name)} THEN {sql.json(literal(json.dumps(error)))}"
        for name, error in ERRORS.items()
    )
    args = sql.json(sql.concat(literal('[{"id": '), sql.text("i"), literal("}]")))
    return f"""
        INSERT INTO everystep_workflow (id, name, args, idempotency_key, status, claimed_by,
            result, error, created_at, run_at, claimed_at, completed_at)
        SELECT {sql.run_id("ms")},
            {pick("(i * 1103 + 12345) % 9973", WORKFLOWS)},
            {args},
            CASE WHEN i % 100 = 0 THEN {sql.concat("'order-'", sql.text("i"))} END,
            status,
            CASE WHEN status <> 'scheduled' THEN {pick("(i * 7717) % 9967", WORKERS)} END,
            CASE WHEN status = 'completed' THEN {sql.json(literal('{"charge": "ch-1"}'))} END,
            CASE status {errors} END,
            {sql.moment("ms")},
            {sql.moment("ms")},
            CASE WHEN status <> 'scheduled' THEN {sql.moment("ms + 40")} END,
            CASE WHEN status NOT IN ('scheduled', 'running')
                THEN {sql.moment("ms + 1500 + (i % 7) * 300")} END
        FROM (SELECT i, {start_ms} + i * {step_ms} AS ms, {status} AS status
              FROM {sql.numbers(first, last)}) AS r
    """


def fill(count, now):
    """Insert `count` runs created over the `DAYS` days before `now`."""
    span_ms = DAYS * 86_400_000
    start_ms = int(now.timestamp() * 1000) - span_ms - 60_000
    sql = Dialect(connection.vendor)
    with connection.cursor() as cursor:
        for first in range(1, count + 1, CHUNK):
            last = min(count, first + CHUNK - 1)
            with transaction.atomic():
                cursor.execute(fill_statement(sql, count, first, last, start_ms, span_ms // count))
    return datetime.datetime.fromtimestamp(start_ms / 1000, datetime.UTC)


def record_steps(recent):
    """Steps for the newest `recent` runs and for every blocked one, in the
    shape of `fulfil_order` (what each status leaves recorded)."""
    shape = [node for node in graph.graph(fulfil_order).nodes if node.kind == "step"]
    runs = list(Workflow.objects.exclude(status=Workflow.Status.SCHEDULED).order_by("-id")[:recent])
    runs += Workflow.objects.filter(status=Workflow.Status.BLOCKED).exclude(
        id__in=[run.id for run in runs]
    )
    done = Step.Status.DONE
    recorded = {
        Workflow.Status.COMPLETED: [done] * len(shape),
        Workflow.Status.FAILED: [done, Step.Status.FAILED],
        Workflow.Status.STOPPED: [Step.Status.FAILED],
        Workflow.Status.BLOCKED: [done, Step.Status.STARTED],
        Workflow.Status.RUNNING: [done, Step.Status.STARTED],
    }
    steps = []
    for run in runs:
        began = run.claimed_at or run.created_at
        for index, status in enumerate(recorded[run.status]):
            node = shape[index]
            started = began + datetime.timedelta(milliseconds=50 + 300 * min(index, 2))
            finished = started + datetime.timedelta(milliseconds=250)
            steps.append(
                Step(
                    workflow_id=run.id,
                    step_id=node.id,
                    name=node.name,
                    args=[run.args],
                    status=status,
                    result={"ok": True} if status == done else None,
                    error=ERRORS.get(run.status) if status == Step.Status.FAILED else None,
                    started_at=started,
                    finished_at=None if status == Step.Status.STARTED else finished,
                )
            )
    Step.objects.bulk_create(steps, batch_size=1000)
    return len(steps)


def register_workers(now):
    """The workers named in ``claimed_by``: eight live, one stopped, one lost."""
    for index, name in enumerate(WORKERS):
        lost = index == len(WORKERS) - 1
        stopped = index == len(WORKERS) - 2
        Worker.objects.create(
            name=name,
            hostname=f"app-{index % 3}",
            pid=1000 + index,
            version="1.0",
            pool_size=8,
            in_flight=0 if stopped or lost else 4,
            state=Worker.State.STOPPED if stopped else Worker.State.READY,
            workflows=WORKFLOWS,
            started_at=now - datetime.timedelta(hours=5),
            heartbeat_at=now - datetime.timedelta(seconds=600 if lost else 2),
            stopped_at=now - datetime.timedelta(minutes=5) if stopped else None,
        )


# The pages.


def pages(client, count, start):
    """``[(key, label, url)]``: the pages to time, their filters chosen in
    the data just loaded."""
    runs = "/everystep/"
    middle = start + datetime.timedelta(days=DAYS / 2)
    cursor_at = Workflow.objects.filter(created_at__lte=middle).order_by("-id").first()
    third = Workflow.objects.filter(created_at__lte=start + datetime.timedelta(days=DAYS / 3))
    searched = third.order_by("-id").first()
    keyed = third.filter(idempotency_key__isnull=False).order_by("-id").first()
    shown = (
        Workflow.objects.filter(name=fulfil_order.__everystep_workflow__, status="completed")
        .filter(steps__isnull=False)
        .order_by("-id")
        .first()
    )
    after = middle.replace(hour=0, minute=0, second=0, microsecond=0)
    before = after + datetime.timedelta(days=1)

    def query(**params):
        return f"{runs}?{urllib.parse.urlencode(params)}"

    return [
        ("page1", "runs, page 1", runs),
        ("page21", "runs, page 21 (cursor followed 20 times)", follow(client, 20)),
        ("middle", f"runs, a page from the middle ({count // 2:,} runs in)",
         query(cursor=cursor_at.id)),
        ("failed", "runs, status=failed", query(status="failed")),
        ("blocked_runs", "runs, status=blocked", query(status="blocked")),
        ("workflow", f"runs, workflow={WORKFLOWS[3]}", query(workflow=WORKFLOWS[3])),
        ("worker", f"runs, worker={WORKERS[3]}", query(worker=WORKERS[3])),
        ("failed_workflow", f"runs, status=failed & workflow={WORKFLOWS[3]}",
         query(status="failed", workflow=WORKFLOWS[3])),
        ("one_day", f"runs, created on {after:%Y-%m-%d} (after & before)",
         query(after=after.isoformat(), before=before.isoformat())),
        ("search_id", "runs, search by run id", query(q=searched.id)),
        ("search_key", "runs, search by idempotency key", query(q=keyed.idempotency_key)),
        ("api_runs", "JSON api/runs, page 1", "/everystep/api/runs"),
        ("run", f"one run, {len(Step.objects.filter(workflow=shown))} steps (graph, timeline)",
         f"/everystep/run/{shown.id}"),
        ("workers", "workers", "/everystep/workers"),
        ("blocked", "blocked runs", "/everystep/blocked"),
    ]  # fmt: skip


def follow(client, pages):
    """The URL of the runs page after `pages` pages, by their cursors."""
    cursor = None
    for _ in range(pages):
        response = client.get("/everystep/api/runs", {"cursor": cursor} if cursor else {})
        cursor = json.loads(response.content)["next_cursor"]
    return f"/everystep/?cursor={cursor}"


class Statements:
    """An ``execute_wrapper`` keeping each statement, its parameters and time."""

    def __init__(self):
        self.all = []

    def __call__(self, execute, sql, params, many, context):
        began = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.all.append((time.perf_counter() - began, sql, params))


def get(client, url):
    response = client.get(url)
    if response.status_code != 200:
        raise RuntimeError(f"GET {url}: status {response.status_code}")
    return response


def time_page(client, url, samples):
    """The page's timings and statements: median and p95 ms over `samples`
    requests, statements per request, median ms in the driver, rows shown;
    and its slowest statement."""
    for _ in range(WARM_UP):
        get(client, url)
    statements = Statements()
    with CaptureQueriesContext(connection) as captured, connection.execute_wrapper(statements):
        response = get(client, url)
    queries = len(captured)  # now: the next request clears the connection's log
    timings, waits = [], []
    for _ in range(samples):
        trips = RoundTrips()
        with connection.execute_wrapper(trips):
            began = time.perf_counter()
            get(client, url)
            timings.append(time.perf_counter() - began)
        waits.append(trips.seconds)
    body = response.content.decode()
    api = url.startswith("/everystep/api/")
    rows = len(json.loads(body)["runs"]) if api else body.count("data-run=")
    figures = {
        "median_ms": median(timings) * 1e3,
        "p95_ms": percentile(timings, 0.95) * 1e3,
        "queries": queries,
        "db_ms": median(waits) * 1e3,
        "rows": rows,
    }
    return figures, max(statements.all, key=lambda statement: statement[0])


def explain(sql, params):
    """The plan the backend runs `sql` with, as text."""
    prefix = {
        "postgresql": "EXPLAIN (ANALYZE, BUFFERS) ",
        "mysql": "ANALYZE ",
        "sqlite": "EXPLAIN QUERY PLAN ",
    }[connection.vendor]
    with connection.cursor() as cursor:
        cursor.execute(prefix + sql, params)
        columns = [column[0] for column in cursor.description]
        rows = cursor.fetchall()
    if connection.vendor == "postgresql":
        return "\n".join(row[0] for row in rows)
    return "\n".join(
        " | ".join(f"{c}={v}" for c, v in zip(columns, row, strict=True)) for row in rows
    )


BACKEND = {"postgresql": "postgres", "mysql": "mariadb", "sqlite": "sqlite"}


def measure(runs=1_000_000, samples=20, log_dir="."):
    # For the rest of this process, which measures nothing else.
    override_settings(**PROJECT).enable()
    call_command("migrate", verbosity=0)  # the project's users and sessions
    return measure_pages(runs, samples, pathlib.Path(log_dir))


def measure_pages(runs, samples, log_dir):
    now = timezone.now()
    began = time.perf_counter()
    start = fill(runs, now)
    figures = {"runs": runs, "samples": samples, "fill_s": time.perf_counter() - began}
    began = time.perf_counter()
    figures["steps"] = record_steps(1000)
    register_workers(now)
    analyze("everystep_workflow", "everystep_step", vacuum=True)
    figures["analyze_s"] = time.perf_counter() - began

    client = Client()
    client.force_login(get_user_model().objects.create_superuser("operator"))
    plans = []
    for key, label, url in pages(client, runs, start):
        page, (seconds, sql, params) = time_page(client, url, samples)
        figures.update({f"{key}.{name}": value for name, value in page.items()})
        plans.append(
            f"== {label}: {url}\nmedian {page['median_ms']:.1f} ms, p95 {page['p95_ms']:.1f} "
            f"ms, {page['queries']} statements; the slowest ({seconds * 1e3:.1f} ms):\n"
            f"{sql}\n{params}\n\n{explain(sql, params)}\n"
        )
    figures["slowest_p95_ms"] = max(v for k, v in figures.items() if k.endswith(".p95_ms"))
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / f"ui-{BACKEND[connection.vendor]}-plans.txt").write_text("\n".join(plans))
    return figures
