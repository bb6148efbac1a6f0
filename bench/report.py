"""The benchmark's table, and what a result records besides its figures:
versions of everything measured and the machine it ran on.

Figures are flat: one key per figure (``steps.postgres.step_us``), so two
``results.json`` files can be compared key by key. Every time is also shown
as a multiple of the physical limit of its database (one autocommit INSERT
of a step-shaped row), measured in the same run.
"""

import importlib.metadata
import os
import platform
import sqlite3
import subprocess

from bench.common import ROOT

BACKENDS = ("postgres", "mariadb", "sqlite")
NAMES = {"postgres": "PostgreSQL (LISTEN/NOTIFY)", "mariadb": "MariaDB", "sqlite": "SQLite"}


# What a result records besides its figures.


def versions(servers, peer_versions):
    """Python, the drivers, the database servers, the peers, everystep."""
    found = {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version}
    for package in ("django", "psycopg", "pymysql", "everystep"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    found["everystep_commit"] = _git("rev-parse", "HEAD")
    found["everystep_tree_modified"] = bool(
        _git("status", "--porcelain", "--", "everystep", "config")
    )
    for backend, server in servers.items():
        found[backend] = _server_version(backend, server.url)
    for name, version in peer_versions.items():
        found[f"peer_{name}"] = version
    return found


def machine():
    info = {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": _first_value("/proc/cpuinfo", "model name"),
        "memory_gib": None,
        "platform": platform.platform(),
    }
    memory = _first_value("/proc/meminfo", "MemTotal")
    if memory:
        info["memory_gib"] = round(int(memory.split()[0]) / 2**20, 1)
    return info


def _first_value(path, key):
    try:
        with open(path) as lines:
            for line in lines:
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _git(*args):
    try:
        result = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


# Where each PostgreSQL-protocol server tells its version: the database of
# the URL, or PgBouncer's admin console, which answers simple queries only
# (hence the query is sent as one, to both).
VERSION_QUERIES = {
    "postgres": (None, b"SHOW server_version"),
    "pgbouncer": ("/pgbouncer", b"SHOW VERSION"),
}


def _server_version(backend, url):
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    try:
        if backend in VERSION_QUERIES:
            import psycopg

            path, query = VERSION_QUERIES[backend]
            dsn = parts._replace(scheme="postgresql", path=path or parts.path).geturl()
            with psycopg.connect(dsn) as conn:
                return conn.pgconn.exec_(query).get_value(0, 0).decode()
        import pymysql

        conn = pymysql.connect(
            host=parts.hostname, port=parts.port, user=parts.username, password=parts.password
        )
        try:
            with conn.cursor() as cursor:
                cursor.execute("SELECT VERSION()")
                return cursor.fetchone()[0]
        finally:
            conn.close()
    except Exception as exc:  # noqa: BLE001 - a version is not worth failing the run
        return f"unknown ({type(exc).__name__})"


# The table.


def number(value):
    if value is None:
        return "-"
    if isinstance(value, int) or abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def verdict(met):
    return "met" if met else "MISSED"


class Table:
    """Rows of (figure, value with unit, multiple of the physical limit, note)."""

    def __init__(self, figures):
        self.figures = figures
        self.rows = []

    def get(self, key):
        return self.figures.get(key)

    def limit_s(self, backend):
        limit = self.get(f"steps.{backend}.physical_limit_us")
        return limit / 1e6 if limit else None

    def row(self, label, value, unit, seconds=None, backend="postgres", note=""):
        """Add a row; `seconds`, a time to show as a multiple of `backend`'s limit."""
        limit = self.limit_s(backend)
        multiple = f"{number(seconds / limit)}×" if seconds is not None and limit else ""
        self.rows.append((label, f"{number(value)} {unit}".strip(), multiple, note))

    def heading(self, text):
        self.rows.append((f"[{text}]", "", "", ""))

    def text(self):
        widths = [max(len(row[i]) for row in self.rows + [HEADER]) for i in range(3)]
        lines = []
        for row in [HEADER, None, *self.rows]:
            if row is None:
                lines.append("-" * (sum(widths) + 40))
                continue
            label, value, multiple, note = row
            line = f"{label:<{widths[0]}}  {value:>{widths[1]}}  {multiple:>{widths[2]}}  {note}"
            lines.append(line.rstrip())
        return "\n".join(lines)


HEADER = ("figure", "value", "× limit", "note")
LEGEND = """\
× limit: a time as a multiple of its database's physical limit (one autocommit INSERT of a
step-shaped row, measured in this run); for a throughput, the time per step (1 / steps per s)."""


def table(results):
    t = Table(results["figures"])
    get = t.get
    _steps(t, get)
    _throughput(t, get)
    _pickup(t, get)
    _many(t, get)
    _claims(t, get)
    _prune(t, get)
    _flow(t, get)
    _ui(t, get)
    _replay(t, get)
    _footprint(t, get, results.get("notes", {}))
    _profile(t, get)
    _peers(t, get, results.get("notes", {}))
    if results.get("failures"):
        t.heading("sections that failed")
        for section, reason in results["failures"].items():
            t.rows.append((section, "not measured", "", reason.splitlines()[0][:120]))
    return LEGEND + "\n\n" + t.text()


#: The recorded step's target, as a multiple of its database's physical limit.
STEP_TARGETS = {"postgres": 1.3, "mariadb": 1.5, "sqlite": 1.5}


def _steps(t, get):
    for backend in BACKENDS:
        prefix = f"steps.{backend}"
        limit = get(f"{prefix}.physical_limit_us")
        if limit is None:
            continue
        t.heading(f"{backend}: physical limit and recorded step")
        t.row("physical limit: one autocommit INSERT", limit, "µs", limit / 1e6, backend)
        step = get(f"{prefix}.step_us")
        ratio = get(f"{prefix}.step_vs_limit")
        target = STEP_TARGETS[backend]
        t.row(
            f"recorded step (run of {get(f'{prefix}.steps_per_run')} steps, one thread)",
            step,
            "µs",
            step / 1e6,
            backend,
            f"target ≤ {target}× limit: {verdict(ratio <= target)}",
        )
        driver = get(f"{prefix}.step_in_driver_us")
        t.row(
            "  of which waiting in the driver",
            driver,
            "µs",
            driver / 1e6,
            backend,
            f"engine's own Python: {number(step - driver)} µs per step",
        )
        server_step = get(f"{prefix}.server_step_us")
        server_limit = get(f"{prefix}.server_limit_us")
        if server_step is not None and server_limit is not None:
            t.row(
                "  the step's INSERT on the server (executing)",
                server_step,
                "µs",
                note=f"the limit's INSERT: {number(server_limit)} µs; WAL "
                f"{number(get(f'{prefix}.server_step_wal_records'))} records, "
                f"{number(get(f'{prefix}.server_step_wal_bytes'))} B against "
                f"{number(get(f'{prefix}.server_limit_wal_records'))}, "
                f"{number(get(f'{prefix}.server_limit_wal_bytes'))} B",
            )
        for label, variant in (
            ("  added by the metrics", "metrics"),
            ("  by the metrics and spans, no-op tracer", "tracing_noop"),
            ("  by the metrics and spans, SDK in batches", "tracing_sdk"),
        ):
            overhead = get(f"{prefix}.{variant}_overhead")
            if overhead is None:
                continue
            t.row(
                label,
                get(f"{prefix}.{variant}_added_us"),
                "µs",
                note=f"{overhead * 100:.1f} % of the recorded step, target ≤ 5 %: "
                f"{verdict(overhead <= 0.05)}",
            )
        trips = get(f"{prefix}.step_round_trips")
        t.row(
            "round trips per step (counted)",
            trips,
            "",
            note=f"target 1: {verdict(trips <= 1.0)}; "
            f"{number(get(f'{prefix}.run_statements'))} statements per run",
        )
        if get(f"{prefix}.step_write_transactions") is not None:
            t.row(
                "write transactions per step (server)", get(f"{prefix}.step_write_transactions"), ""
            )
            prepared = get(f"{prefix}.prepared_statements")
            t.row(
                "statements prepared on the server",
                prepared,
                "",
                note="step statements parsed and planned once per connection"
                if prepared
                else "0: every step statement is parsed and planned again",
            )
        run = get(f"{prefix}.sequential_5_step_run_ms")
        t.row("sequential 5-step run: schedule, claim, execute", run, "ms", run / 1e3, backend)


def _throughput(t, get):
    shapes = [
        ("1w", "1 worker"),
        ("2w", "2 workers"),
        ("4w", "4 workers"),
        ("1w_one_step", "1 worker"),
    ]
    for backend in BACKENDS:
        rows = [(s, label) for s, label in shapes if get(f"throughput.{backend}.{s}.runs_per_s")]
        if not rows:
            continue
        t.heading(f"{backend}: throughput, pool 8 per worker")
        for shape, label in rows:
            p = f"throughput.{backend}.{shape}"
            steps_per_s = get(f"{p}.steps_per_s")
            t.row(
                f"{number(get(f'{p}.runs'))} runs of {get(f'{p}.steps_per_run')} step(s), {label}",
                get(f"{p}.runs_per_s"),
                "runs/s",
                1 / steps_per_s,
                backend,
                f"{number(steps_per_s)} steps/s; {number(get(f'{p}.runs_per_claim'))} runs per "
                f"claim; workers' CPU {number(get(f'{p}.worker_cpu_ms_per_run'))} ms/run; "
                f"machine CPU {get(f'{p}.machine_cpu_busy') * 100:.0f}% busy",
            )


def _pickup(t, get):
    modes = [
        ("postgres", "default", "PostgreSQL, default (LISTEN/NOTIFY)"),
        ("postgres", "polling", "PostgreSQL, --no-notify (polling)"),
        ("mariadb", "default", "MariaDB (polling)"),
        ("sqlite", "default", "SQLite (polling)"),
        ("postgres", "default_due", "PostgreSQL, a delayed run from its due time"),
        ("mariadb", "default_due", "MariaDB, a delayed run from its due time"),
    ]
    present = [m for m in modes if get(f"pickup.{m[0]}.{m[1]}.pickup_p50_ms") is not None]
    if not present:
        return
    t.heading("pickup: schedule() commit to first step, idle worker, poll 0.2 s")
    _pickup_floor(t, get)
    _pickup_rows(t, get, present)
    wakes = [
        (backend, wake, f"{NAMES[backend]}, {label}")
        for backend in BACKENDS
        for wake, label in (
            ("message", "a message: send() commit to the step after receive()"),
            ("result", "a child's result: the child's end to the parent's next step"),
        )
        if get(f"pickup.{backend}.{wake}.pickup_p50_ms") is not None
    ]
    if wakes:
        t.heading("waking a parked run, idle worker, poll 0.2 s")
        _pickup_rows(t, get, wakes)


def _many(t, get):
    shapes = [
        ("postgres", "PostgreSQL, directly"),
        ("pgbouncer", "PostgreSQL through PgBouncer (transaction mode), sessions direct"),
    ]
    for where, title in shapes:
        many, one = f"many.{where}.16w", f"many.{where}.1w"
        if get(f"{many}.drain_runs_per_s") is None:
            continue
        workers, pool = get(f"{many}.workers"), get(f"{many}.pool")
        t.heading(f"many workers: {workers} of pool {pool}, {title}")
        note = "target ≤ 3, whatever the idle workers"
        t.row("trickle: claims per run", get(f"{many}.trickle_claims_per_run"), "", note=note)
        t.row("trickle: pickup p50", get(f"{many}.trickle_pickup_p50_ms"), "ms")
        t.row("trickle: pickup p99", get(f"{many}.trickle_pickup_p99_ms"), "ms")
        t.row("drain: claims per run", get(f"{many}.drain_claims_per_run"), "", note=note)
        rate, single = get(f"{many}.drain_runs_per_s"), get(f"{one}.drain_runs_per_s")
        ratio = f"{rate / single:.2f}× one worker of pool 32" if rate and single else ""
        t.row("drain: 5-step runs per second", rate, "runs/s", note=ratio)
        t.row("drain: workers' CPU per run", get(f"{many}.drain_worker_cpu_ms_per_run"), "ms")
        share = get(f"{many}.drain_lock_wait_share")
        kinds = get(f"{many}.drain_lock_waits_by_kind") or {}
        t.row(
            "drain: samples with a lock wait",
            None if share is None else share * 100,
            "%",
            note=", ".join(f"{kind} {count}" for kind, count in kinds.items()),
        )
        held = get(f"{many}.idle_server_connections")
        note = f"of max_connections {get(f'{many}.max_connections')}"
        t.row("server connections, workers idle", held, "", note=note)
        if get(f"{one}.drain_runs_per_s") is not None:
            t.row("1 worker, pool 32: 5-step runs per second", single, "runs/s")
            t.row(
                "1 worker, pool 32: claims per run (trickle)",
                get(f"{one}.trickle_claims_per_run"),
                "",
            )
            t.row(
                "1 worker, pool 32: server connections idle",
                get(f"{one}.idle_server_connections"),
                "",
            )


def _pickup_floor(t, get):
    """The floor under a pickup, and the default pickup as a multiple of it."""
    p, ours = "pickup.postgres.floor", "pickup.postgres.default"
    for q in ("p50", "p99"):
        floor = get(f"{p}.pickup_{q}_ms")
        if floor is None:
            continue
        pickup = get(f"{ours}.pickup_{q}_ms")
        note = f"the pickup below is {pickup / floor:.2f}× this" if pickup else ""
        label = f"PostgreSQL floor: a NOTIFY's commit to a claim's reply, raw psycopg {q}"
        t.row(label, floor, "ms", floor / 1e3, "postgres", note)


#: The pickup's p99 targets (ms), by (backend, mode).
PICKUP_P99_TARGETS = {("postgres", "default"): 2, ("postgres", "default_due"): 5}


def _pickup_rows(t, get, modes):
    for backend, mode, label in modes:
        p = f"pickup.{backend}.{mode}"
        target = PICKUP_P99_TARGETS.get((backend, mode))
        for q in ("p50", "p99"):
            value = get(f"{p}.pickup_{q}_ms")
            note = f"{get(f'{p}.samples')} samples" if q == "p50" else ""
            if q == "p99" and target is not None and value is not None:
                note = f"target < {target} ms: {verdict(value < target)}"
            t.row(f"{label} {q}", value, "ms", value / 1e3, backend, note)


CLAIMS = (
    ("postgres", "postgres"),
    ("postgres_unprepared", "postgres, no prepared statements (PgBouncer)"),
    ("mariadb", "mariadb"),
    ("sqlite", "sqlite"),
)


def _claims(t, get):
    for name, title in CLAIMS:
        _claims_of(t, get, f"claims.{name}", title)


def _claims_of(t, get, p, title):
    if get(f"{p}.empty_idle_us") is None:
        return
    t.heading(f"{title}: claim of 8 as finished and future runs pile up")
    finished = number(get(f"{p}.finished_runs"))
    for case, label in (("8_waiting", "8 runs waiting"), ("idle", "nothing waiting")):
        empty, full = get(f"{p}.empty_{case}_us"), get(f"{p}.full_{case}_us")
        ratio = get(f"{p}.ratio_{case}")
        baseline = get(f"{p}.baseline_{case}_us")
        if baseline is not None:
            t.row(f"{label}, empty table, the claim before queues", baseline, "µs", baseline / 1e6)
        t.row(
            f"{label}, empty table",
            empty,
            "µs",
            empty / 1e6,
            note=""
            if baseline is None
            else f"ratio to the claim before queues {get(f'{p}.ratio_baseline_{case}'):.2f}",
        )
        lone = get(f"{p}.lone_{case}_us")
        if lone is not None:
            t.row(f"{label}, one run due tomorrow", lone, "µs", lone / 1e6)
        against = "the empty table" if lone is None else "the table holding one run due tomorrow"
        parked = get(f"{p}.parked_{case}_us")
        if parked is not None:
            parked_runs = number(get(f"{p}.parked_runs"))
            label_parked = f"{label}, beside {parked_runs} runs parked in a receive()"
            _against(t, label_parked, parked, get(f"{p}.ratio_parked_{case}"), against)
        t.row(
            f"{label}, {finished} finished runs",
            full,
            "µs",
            full / 1e6,
            note=f"ratio {ratio:.2f}, target < 1.5: {verdict(ratio < 1.5)}",
        )
        churned = get(f"{p}.churned_{case}_us")
        if churned is not None:
            runs = number(get(f"{p}.churned_runs"))
            label_churned = f"{label}, the same, {runs} runs claimed since a vacuum"
            ratio = get(f"{p}.ratio_churned_{case}")
            _against(t, label_churned, churned, ratio, f"{finished} finished runs")
        future = get(f"{p}.future_{case}_us")
        if future is not None:
            label_future = f"{label}, and {finished} runs due tomorrow or later"
            _against(t, label_future, future, get(f"{p}.ratio_future_{case}"), against)
        limited = get(f"{p}.limited_{case}_us")
        if limited is not None:
            ratio = get(f"{p}.ratio_limited_{case}")
            t.row(
                f"{label}, the same, its queue limited",
                limited,
                "µs",
                limited / 1e6,
                note=f"ratio to the same claim without limits {ratio:.2f}",
            )
            label_other = f"{label}, and {finished} runs of another queue due"
            other, ratio = get(f"{p}.other_queue_{case}_us"), get(f"{p}.ratio_other_queue_{case}")
            _against(t, label_other, other, ratio, against)


CLAIM_HELD_UP_LIMIT_MS = 100  # SPEC §16: pruning never holds a claim up longer


def _prune(t, get):
    for backend in BACKENDS:
        p = f"prune.{backend}"
        if get(f"{p}.prune_seconds") is None:
            continue
        pruned = get(f"{p}.pruned_runs")
        t.heading(f"{backend}: pruning {number(pruned)} finished runs beside a working worker")
        t.row("prune", get(f"{p}.prune_seconds"), "s", note=f"{get(f'{p}.batches'):,} batches")
        t.row("runs deleted per second", get(f"{p}.runs_per_second"), "runs/s")
        t.row("rows deleted per second (runs and steps)", get(f"{p}.rows_per_second"), "rows/s")
        t.row("a batch's transaction, p99", get(f"{p}.batch_p99_ms"), "ms")
        t.row("a batch's transaction, max", get(f"{p}.batch_max_ms"), "ms")
        for phase in ("before", "during"):
            p50, p99 = get(f"{p}.claim_{phase}_p50_ms"), get(f"{p}.claim_{phase}_p99_ms")
            longest = get(f"{p}.claim_{phase}_max_ms")
            note = f"p50 {number(p50)} ms, p99 {number(p99)} ms"
            if phase == "during":
                met = longest < CLAIM_HELD_UP_LIMIT_MS
                note += f"; target < {CLAIM_HELD_UP_LIMIT_MS} ms: {verdict(met)}"
            t.row(f"a claim {phase} the prune, max", longest, "ms", note=note)
        for phase in ("before", "during"):
            p50, p99 = get(f"{p}.pickup_{phase}_p50_ms"), get(f"{p}.pickup_{phase}_p99_ms")
            longest = get(f"{p}.pickup_{phase}_max_ms")
            note = f"p99 {number(p99)} ms, max {number(longest)} ms"
            t.row(f"pickup {phase} the prune, p50", p50, "ms", note=note)


def _against(t, label, micros, ratio, baseline):
    """A claim's row, with its ratio to the same claim on the `baseline` table."""
    note = f"ratio to {baseline} {ratio:.2f}, target < 1.5: {verdict(ratio < 1.5)}"
    t.row(label, micros, "µs", micros / 1e6, note=note)


def _flow(t, get):
    for backend in BACKENDS:
        p = f"flow.{backend}"
        if get(f"{p}.most_running") is None:
            continue
        t.heading(f"{backend}: flow control, 2 workers of pool 8")
        limit = get(f"{p}.concurrency_limit")
        most = get(f"{p}.most_running")
        t.row(
            f"concurrency-{limit} queue: most running at once",
            most,
            "",
            note=f"never above {limit}: {verdict(most <= limit)}",
        )
        t.row(
            "  mean running while it drains",
            get(f"{p}.mean_running"),
            "",
            note=f"{get(f'{p}.mean_running_of_limit'):.0%} of the limit",
        )
        t.row(
            "  throughput",
            get(f"{p}.limited_runs_per_s"),
            "runs/s",
            note=f"{get(f'{p}.limited_of_ideal'):.0%} of limit / hold",
        )
        rate = get(f"{p}.rate_limit_per_s")
        in_window = get(f"{p}.most_starts_in_a_window")
        t.row(
            f"rate {rate:g}/s: most first starts in any 1 s",
            in_window,
            "",
            note=f"never above {rate:g}: {verdict(in_window <= rate)}",
        )
        late = get(f"{p}.held_late_max_s")
        t.row(
            "  a held run's start after its window let it, median",
            get(f"{p}.held_late_median_s") * 1e3,
            "ms",
        )
        t.row(
            "  a held run's start after its window let it, max",
            late * 1e3,
            "ms",
            note=f"target: within a poll (200 ms) and a claim: {verdict(late < 0.25)}",
        )


UI_PAGES = (
    ("page1", "runs, page 1"),
    ("page21", "runs, page 21 (cursor followed 20 times)"),
    ("middle", "runs, a page from the middle of the table"),
    ("failed", "runs, status=failed"),
    ("blocked_runs", "runs, status=blocked"),
    ("workflow", "runs, workflow=one of 20"),
    ("worker", "runs, worker=one of 10"),
    ("failed_workflow", "runs, status=failed & workflow"),
    ("one_day", "runs, created within one day"),
    ("search_id", "runs, search by run id"),
    ("search_key", "runs, search by idempotency key"),
    ("api_runs", "JSON api/runs, page 1"),
    ("run", "one run with its steps, graph, timeline"),
    ("workers", "workers"),
    ("blocked", "blocked runs"),
)


def _ui(t, get):
    for backend in BACKENDS:
        p = f"ui.{backend}"
        if get(f"{p}.runs") is None:
            continue
        t.heading(
            f"{backend}: operator UI with {number(get(f'{p}.runs'))} runs, "
            f"{get(f'{p}.samples')} requests per page, in-process"
        )
        t.row(
            "fill: INSERT … SELECT of the runs",
            get(f"{p}.fill_s"),
            "s",
            note=f"then steps, workers and ANALYZE: {number(get(f'{p}.analyze_s'))} s",
        )
        for key, label in UI_PAGES:
            median, p95 = get(f"{p}.{key}.median_ms"), get(f"{p}.{key}.p95_ms")
            if median is None:
                continue
            t.row(
                f"{label}, median",
                median,
                "ms",
                note=f"p95 {number(p95)} ms; {get(f'{p}.{key}.queries')} queries, "
                f"{number(get(f'{p}.{key}.db_ms'))} ms in the database; "
                f"p95 < 200 ms: {verdict(p95 < 200)}",
            )


def _replay(t, get):
    p = "replay.postgres"
    if get(f"{p}.replay_ms") is None:
        return
    t.heading("postgres: replay")
    queries = get(f"{p}.queries")
    t.row(
        f"resume a run of {number(get(f'{p}.steps'))} recorded steps",
        get(f"{p}.replay_ms"),
        "ms",
        get(f"{p}.replay_ms") / 1e3,
        note=f"{number(queries)} queries (target 2: load + finish: {verdict(queries <= 2)})",
    )
    t.row(
        "  of which loading the recorded steps",
        get(f"{p}.load_ms"),
        "ms",
        get(f"{p}.load_ms") / 1e3,
    )


def _footprint(t, get, notes):
    start = get("footprint.postgres.start_to_ready_s")
    after = get("throughput.postgres.1w.worker_rss_after_mib")
    cold = get("zipapp.cold_start_s")
    if start is None and after is None and "zipapp.cold_start_s" not in t.figures:
        return
    t.heading("start-up and footprint")
    if start is not None:
        t.row("worker: exec to ready (python -m django)", start, "s", start)
        t.row("worker RSS, idle (pool 8)", get("footprint.postgres.rss_idle_mib"), "MiB")
    if after is not None:
        runs = get("throughput.postgres.1w.runs_per_worker_after")
        t.row(f"worker RSS after {number(runs)} 5-step runs", after, "MiB")
    if cold is not None:
        t.row("zipapp: exec to ready, cold (first extraction)", cold, "s", cold)
        warm = get("zipapp.warm_start_s")
        t.row("zipapp: exec to ready, warm", warm, "s", warm)
        bare = get("zipapp.warm_start_bare_s")
        if bare is not None:
            note = f"a python3 with nothing installed; target < 0.5 s: {verdict(bare < 0.5)}"
            t.row("zipapp: exec to ready, warm, bare python3", bare, "s", bare, note=note)
        floor = get("zipapp.django_import_bare_s")
        if floor is not None:
            note = f"the floor: the start above is {bare / floor:.2f}× this" if bare else ""
            t.row(
                "bare python3 importing Django's ORM and psycopg (the zipapp's)",
                floor,
                "s",
                floor,
                note=note,
            )
        t.row("zipapp size", get("zipapp.size_mib"), "MiB")
    elif "zipapp.cold_start_s" in t.figures:
        t.rows.append(("zipapp start-up", "not measured", "", notes.get("zipapp", "")))


def _profile(t, get):
    p = "profile.postgres"
    if get(f"{p}.cpu_ms_per_run") is None:
        return
    t.heading("postgres: where a worker's CPU goes (yappi, CPU clocks; shares of the profile)")
    t.row("CPU per 5-step run, profiled", get(f"{p}.cpu_ms_per_run"), "ms")
    for name, share in get(f"{p}.layers").items():
        t.row(f"  {name}", share * 100, "%")
    for title, key in (("own CPU", "self_top"), ("with callees", "inclusive_top")):
        for label, share, calls in get(f"{p}.{key}")[:10]:
            t.row(f"  {title}: {label}"[:95], share * 100, "%", note=f"{calls:,} calls")


PEERS = {
    "dbos": (
        "DBOS Transact",
        [
            (
                "sequential 5-step run",
                "sequential_5_step_run_ms",
                "steps.postgres.sequential_5_step_run_ms",
                "ms",
                1e-3,
                False,
            ),
            (
                "queued 5-step runs, concurrency 8",
                "queued_runs_per_s",
                "throughput.postgres.1w.runs_per_s",
                "runs/s",
                None,
                True,
            ),
            (
                "enqueue to start p50",
                "pickup_p50_ms",
                "pickup.postgres.default.pickup_p50_ms",
                "ms",
                1e-3,
                False,
            ),
            (
                "enqueue to start p99",
                "pickup_p99_ms",
                "pickup.postgres.default.pickup_p99_ms",
                "ms",
                1e-3,
                False,
            ),
        ],
    ),
    "procrastinate": (
        "Procrastinate",
        [
            (
                "one-step jobs, concurrency 8",
                "jobs_per_s",
                "throughput.postgres.1w_one_step.runs_per_s",
                "jobs/s",
                None,
                True,
            ),
            (
                "defer to start p50 (LISTEN/NOTIFY)",
                "pickup_p50_ms",
                "pickup.postgres.default.pickup_p50_ms",
                "ms",
                1e-3,
                False,
            ),
            (
                "defer to start p99 (LISTEN/NOTIFY)",
                "pickup_p99_ms",
                "pickup.postgres.default.pickup_p99_ms",
                "ms",
                1e-3,
                False,
            ),
        ],
    ),
}


def _peers(t, get, notes):
    for peer, (title, items) in PEERS.items():
        if f"peers.{peer}" in notes:
            t.heading(f"peer: {title}")
            t.rows.append((title, "not measured", "", notes[f"peers.{peer}"][:160]))
            continue
        if not any(get(f"peers.{peer}.{key}") is not None for _, key, *_ in items):
            continue
        t.heading(f"peer: {title}, same PostgreSQL server, same run")
        for label, key, ours_key, unit, scale, higher_is_better in items:
            theirs, ours = get(f"peers.{peer}.{key}"), get(ours_key)
            if theirs is None:
                continue
            note = ""
            if ours:
                better = "higher" if higher_is_better else "lower"
                note = (
                    f"everystep {number(ours)} {unit}: everystep/{peer} = {ours / theirs:.2f} "
                    f"({better} is better)"
                )
            t.row(label, theirs, unit, theirs * scale if scale else None, note=note)
