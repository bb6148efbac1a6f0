"""``python -m bench``: the benchmark suite, printed as a table and written
to ``bench/out/results.json``.

It starts a throwaway PostgreSQL and MariaDB (`tests.servers`, the servers'
default durability: fsync and synchronous commit on) and runs each
measurement in a subprocess of its own against a fresh, migrated database
(`bench.harness`, `bench.child`). What each section measures, and how, is
in its module's docstring:

    steps       bench.steps, bench.limits   physical limit, recorded step cost
    throughput  bench.throughput            worker processes draining a queue
    pickup      bench.pickup,               schedule() to first step, idle worker; its floor,
                bench.pickup_floor          a NOTIFY's commit to a claim's reply (raw psycopg)
    many        bench.many                  16 workers on one PostgreSQL, directly and through
                                            PgBouncer, beside 1 worker with the same total pool:
                                            claims per run, connections, lock waits, throughput
    claims      bench.claims                claim latency with 1,000,000 finished, then future,
                                            runs; with limits; with 1,000,000 of another queue due
                                            (each backend; PostgreSQL also unprepared)
    prune       bench.prune                 pruning 1,000,000 finished runs beside a worker:
                                            its rate, claims and pickup before and during
    flow        bench.flow                  a limited queue's throughput, a rate limit's accuracy
    ui          bench.ui                    operator UI pages with 1,000,000 runs
    replay      bench.replay                resuming a run of 1,000 recorded steps
    footprint   bench.footprint             worker start-up and memory
    profile     bench.profile               where a worker's CPU goes (yappi, CPU clocks)
    zipapp      bench.zipapp                the zipapp's start-up
    peers       bench.peers                 DBOS Transact and Procrastinate

Every figure is a median of repetitions (or a percentile of samples); every
comparison is a ratio of two figures measured in this same run. Every wait
has a deadline, and every process and server started is stopped by its id,
also on failure or interruption. A section that fails is reported and the
others still run; the exit status is then 1.

    python -m bench                       the full suite (about 15 minutes on 2 cores)
    python -m bench --quick               a smoke run: few repetitions, small counts
    python -m bench --only steps,claims   some sections
"""

import argparse
import dataclasses
import json
import pathlib
import shutil
import signal
import sys
import tempfile
import time
from datetime import UTC, datetime

from bench import harness, peers, report, zipapp
from bench.common import ROOT

OUT = ROOT / "bench" / "out"
LOGS = OUT / "logs"
SECTIONS = (
    "steps",
    "throughput",
    "pickup",
    "many",
    "claims",
    "prune",
    "flow",
    "ui",
    "replay",
    "footprint",
    "profile",
    "zipapp",
    "peers",
)


@dataclasses.dataclass
class Sizes:
    """How much each section does: the full suite, or a smoke run."""

    quick: bool

    def __getattr__(self, name):
        full, quick = SIZES[name]
        return quick if self.quick else full


SIZES = {  # name: (full, quick)
    "step_repeat": (7, 3),
    "sequential": (50, 20),
    "runs": (2000, 300),
    "throughput_repeat": (3, 1),
    "pickup_samples": (200, 30),
    "wake_samples": (60, 15),
    "claim_samples": (200, 50),
    "finished_runs": (1_000_000, 50_000),
    "churned_runs": (20_000, 800),
    "prune_runs": (1_000_000, 50_000),
    "prune_samples": (100, 20),
    "ui_runs": (1_000_000, 50_000),
    "flow_runs": (200, 80),
    "flow_rated": (200, 60),
    "ui_samples": (20, 5),
    "replay_repeat": (5, 2),
    "start_repeat": (5, 2),
    "zipapp_repeat": (3, 1),
    "many_workers": (16, 4),
    "many_runs": (2000, 200),
    "many_trickle": (200, 20),
    "peer_runs": (2000, 200),
    "peer_samples": (200, 20),
}


@dataclasses.dataclass
class Task:
    """One measurement: `section` on `backend`, its figures under `prefix`."""

    section: str
    prefix: str
    backend: str = "postgres"
    options: dict = dataclasses.field(default_factory=dict)
    timeout: float = 300
    #: Appended to the database URL (connection options).
    url_query: str = ""


def plan(size):
    tasks = [
        Task(
            "steps",
            f"steps.{backend}",
            backend,
            timeout=180,
            options={
                "repeat": size.step_repeat,
                "sequential": size.sequential,
            },
        )
        for backend in report.BACKENDS
    ]
    throughput = [("postgres", 1, "five_steps"), ("postgres", 1, "one_step")]
    throughput += [("mariadb", 1, "five_steps"), ("sqlite", 1, "five_steps")]
    if not size.quick:
        throughput += [
            (backend, w, "five_steps") for backend in ("postgres", "mariadb") for w in (2, 4)
        ]
    for backend, workers, workflow in throughput:
        shape = f"{workers}w" + ("_one_step" if workflow == "one_step" else "")
        tasks.append(
            Task(
                "throughput",
                f"throughput.{backend}.{shape}",
                backend,
                timeout=420,
                options={
                    "workers": workers,
                    "runs": size.runs,
                    "workflow": workflow,
                    "repeat": size.throughput_repeat,
                    "log_dir": str(LOGS),
                },
            )
        )
    # (backend, notify, delay): a delay measures a delayed run's pickup
    # from its due time.
    pickups = [
        ("postgres", True, None),
        ("postgres", False, None),
        ("mariadb", True, None),
        ("postgres", True, 0.5),
        ("mariadb", True, 0.5),
    ]
    # The floor under a pickup, next to the pickup it is the floor of.
    tasks.append(
        Task(
            "pickup",
            "pickup.postgres.floor",
            timeout=240,
            options={"samples": size.pickup_samples, "floor": True, "log_dir": str(LOGS)},
        )
    )
    for backend, notify, delay in pickups if not size.quick else pickups[:1]:
        mode = ("default" if notify else "polling") + ("_due" if delay else "")
        tasks.append(
            Task(
                "pickup",
                f"pickup.{backend}.{mode}",
                backend,
                timeout=240,
                options={
                    "samples": size.pickup_samples,
                    "notify": notify,
                    "delay": delay,
                    "log_dir": str(LOGS),
                },
            )
        )
    # The wake-up of a parked run: by a message, by its child's end.
    tasks += [
        Task(
            "pickup",
            f"pickup.{backend}.{wake}",
            backend,
            timeout=300,
            options={"samples": size.wake_samples, "wake": wake, "log_dir": str(LOGS)},
        )
        for backend in report.BACKENDS
        for wake in ("message", "result")
    ]
    # (prefix, workers, pool, through PgBouncer): the same total pool.
    many = [
        ("postgres.16w", size.many_workers, 32 // size.many_workers, False),
        ("postgres.1w", 1, 32, False),
        ("pgbouncer.16w", size.many_workers, 32 // size.many_workers, True),
        ("pgbouncer.1w", 1, 32, True),
    ]
    tasks += [
        Task(
            "many",
            f"many.{prefix}",
            timeout=900,
            options={
                "workers": workers,
                "pool": pool,
                "runs": size.many_runs,
                "trickle": size.many_trickle,
                "pooled": pooled,
                "log_dir": str(LOGS),
            },
        )
        for prefix, workers, pool, pooled in many
    ]
    # PostgreSQL also without prepared statements, as behind PgBouncer in
    # transaction mode: every claim is then planned afresh.
    claims = [(backend, backend, "") for backend in report.BACKENDS]
    claims.insert(1, ("postgres", "postgres_unprepared", "?prepare_threshold=none"))
    tasks += [
        Task(
            "claims",
            f"claims.{name}",
            backend,
            timeout=600,
            url_query=url_query,
            options={
                "samples": size.claim_samples,
                "finished": size.finished_runs,
                "churned": size.churned_runs,
            },
        )
        for backend, name, url_query in claims
    ]
    tasks += [
        Task(
            "prune",
            f"prune.{backend}",
            backend,
            timeout=1800,
            options={
                "runs": size.prune_runs,
                "samples": size.prune_samples,
                "log_dir": str(LOGS),
            },
        )
        for backend in report.BACKENDS
    ]
    tasks += [
        Task(
            "flow",
            f"flow.{backend}",
            backend,
            timeout=300,
            options={
                "runs": size.flow_runs,
                "rated": size.flow_rated,
                "log_dir": str(LOGS),
            },
        )
        for backend in report.BACKENDS
    ]
    tasks += [
        Task(
            "ui",
            f"ui.{backend}",
            backend,
            timeout=600,
            options={"runs": size.ui_runs, "samples": size.ui_samples, "log_dir": str(LOGS)},
        )
        for backend in report.BACKENDS
    ]
    tasks += [
        Task("replay", "replay.postgres", timeout=120, options={"repeat": size.replay_repeat}),
        Task(
            "footprint",
            "footprint.postgres",
            timeout=120,
            options={
                "repeat": size.start_repeat,
                "log_dir": str(LOGS),
            },
        ),
        Task(
            "profile",
            "profile.postgres",
            timeout=300,
            options={"runs": size.runs, "log_dir": str(LOGS)},
        ),
        Task("zipapp", "zipapp", timeout=180, options={"repeat": size.zipapp_repeat}),
        Task(
            "peers",
            "peers.procrastinate",
            timeout=300,
            options={
                "args": [size.peer_runs, size.peer_samples],
            },
        ),
        Task(
            "peers",
            "peers.dbos",
            timeout=600,
            options={
                "args": [size.peer_runs, size.peer_samples, size.sequential],
            },
        ),
    ]
    order = {section: index for index, section in enumerate(SECTIONS)}
    return sorted(tasks, key=lambda task: order[task.section])


def run_task(task, databases, workdir):
    """The figures of one task, as a dict."""
    if task.section == "zipapp":
        return zipapp.measure(databases.fresh("postgres"), workdir, **task.options)
    if task.section == "peers":
        url = databases.fresh("postgres", migrate=False)
        return peers.measure(
            task.prefix.split(".")[1], url, *task.options["args"], timeout=task.timeout
        )
    url = databases.fresh(task.backend) + task.url_query
    options = dict(task.options)
    if options.pop("pooled", False):
        options["pooler_url"] = databases.through_pooler(url)
    return harness.measure(url, task.section, task.timeout, **options)


def parse_arguments():
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: few repetitions, small counts"
    )
    parser.add_argument(
        "--only", metavar="NAME[,NAME]", help=f"sections to run: {', '.join(SECTIONS)}"
    )
    args = parser.parse_args()
    args.sections = SECTIONS
    if args.only:
        args.sections = tuple(name.strip() for name in args.only.split(",") if name.strip())
        unknown = set(args.sections) - set(SECTIONS) - {"limits"}
        if unknown:
            names = ", ".join(sorted(unknown))
            parser.error(f"unknown section(s) {names}: choose from {', '.join(SECTIONS)}")
        args.sections = tuple("steps" if name == "limits" else name for name in args.sections)
    return args


def main():
    args = parse_arguments()
    # SIGTERM unwinds like Ctrl-C: the servers and subprocesses are stopped.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    size = Sizes(args.quick)
    tasks = [task for task in plan(size) if task.section in args.sections]
    results = {
        "figures": {},
        "notes": {},
        "failures": {},
        "settings": {
            "quick": args.quick,
            "sections": list(args.sections),
            "sizes": {name: getattr(size, name) for name in SIZES},
            "durability": {},  # as read from each server by bench.limits
            "worker": "python -m django everystep_worker --pool 8 --poll 0.2 "
            "(pickup: --poll 0.2, default pool)",
            "peer_queue_polling_s": 0.2,
        },
        "versions": {},
        "machine": report.machine(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "seconds": None,
    }
    began = time.monotonic()
    shutil.rmtree(LOGS, ignore_errors=True)
    LOGS.mkdir(parents=True)
    interrupted = False
    with tempfile.TemporaryDirectory(prefix="everystep-bench-") as work:
        work = pathlib.Path(work)
        databases = harness.Databases(work)
        try:
            for task in tasks:
                progress(began, f"{task.prefix} ...")
                started = time.monotonic()
                try:
                    figures = run_task(task, databases, work)
                except (harness.SectionFailed, RuntimeError, TimeoutError, OSError) as exc:
                    results["failures"][task.prefix] = str(exc)
                    progress(began, f"{task.prefix} FAILED: {str(exc).splitlines()[0]}")
                    continue
                finally:
                    release(databases, results, began)
                record(results, task.prefix, figures)
                progress(began, f"{task.prefix} done in {time.monotonic() - started:.0f}s")
                save(results, began)
            results["versions"] = report.versions(databases.servers, peers.versions())
        except KeyboardInterrupt:
            interrupted = True
            results["failures"]["interrupted"] = "the run was interrupted"
        finally:
            databases.stop()
    save(results, began)
    print(report.table(results))
    print(
        f"\n{len(results['figures'])} figures in {results['seconds']:.0f}s, written to "
        f"{(OUT / 'results.json').relative_to(ROOT)}; worker logs in {LOGS.relative_to(ROOT)}/"
    )
    if interrupted:
        sys.exit(130)
    sys.exit(1 if results["failures"] else 0)


def release(databases, results, began):
    """Drop the task's databases; a failure to is reported, not fatal."""
    try:
        databases.release()
    except Exception as exc:  # noqa: BLE001 - the next task gets a fresh database anyway
        results["failures"].setdefault("cleanup", str(exc))
        progress(began, f"cleanup: {exc}")


def record(results, prefix, figures):
    """Flatten one task's figures into `results`, one key per figure."""
    if "durability" in figures:
        results["settings"]["durability"][prefix.split(".")[-1]] = figures.pop("durability")
    for reason_key in ("not_measured", "note"):
        if reason_key in figures:
            results["notes"][prefix] = figures.pop(reason_key)
    if prefix in results["notes"] and not figures:
        results["figures"][prefix] = None
    for key, value in figures.items():
        results["figures"][f"{prefix}.{key}"] = value


def save(results, began):
    results["seconds"] = round(time.monotonic() - began, 1)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")


def progress(began, message):
    print(f"[{time.monotonic() - began:5.0f}s] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
