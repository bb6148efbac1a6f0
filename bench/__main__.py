"""``python -m bench``: the benchmark suite, printed as a table and written
to ``bench/out/results.json``.

It starts a throwaway PostgreSQL and MariaDB (default durability: fsync and
synchronous commit on), gives each measurement a freshly migrated database,
and runs the measurements of `bench.engine` and `bench.startup` in
subprocesses. Every figure is a median of repetitions; every comparison is a
ratio of two figures measured in this same run.
"""

import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime

from bench import report, startup
from tests import servers

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"


class Databases:
    """Fresh, migrated databases on the suite's servers."""

    def __init__(self, workdir, backends):
        self.workdir = workdir
        self.servers = {}
        if "postgres" in backends:
            self.servers["postgres"] = servers.start_postgres(workdir / "postgres")
        if "mariadb" in backends:
            self.servers["mariadb"] = servers.start_mariadb(workdir / "mariadb")
        self.count = 0

    def fresh(self, backend):
        """The URL of a new database on `backend`, migrated."""
        self.count += 1
        name = f"bench_{self.count}"
        if backend == "sqlite":
            url = f"sqlite:///{self.workdir / (name + '.sqlite3')}"
        else:
            server_url = self.servers[backend].url
            _create_database(backend, server_url, name)
            url = server_url.rsplit("/", 1)[0] + "/" + name
        subprocess.run(
            [sys.executable, "-m", "django", "migrate", "-v", "0"], env=environment(url), check=True
        )
        return url

    def stop(self):
        for server in self.servers.values():
            server.stop()


def _create_database(backend, server_url, name):
    if backend == "postgres":
        import psycopg

        with psycopg.connect(
            server_url.replace("postgres://", "postgresql://"), autocommit=True
        ) as conn:
            conn.execute(f"CREATE DATABASE {name}")
    else:
        import pymysql
        from urllib.parse import urlsplit

        parts = urlsplit(server_url)
        conn = pymysql.connect(
            host=parts.hostname, port=parts.port, user=parts.username, password=parts.password or ""
        )
        with conn.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
        conn.close()


def environment(url):
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVERYSTEP_")}
    env.update(
        DJANGO_SETTINGS_MODULE="bench.settings",
        EVERYSTEP_DATABASE_URL=url,
        PYTHONPATH=str(ROOT),
    )
    return env


def engine(databases, backend, section, *flags, log_dir):
    """Run one `bench.engine` section on a fresh database; its figures."""
    url = databases.fresh(backend)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.engine",
            section,
            "--log-dir",
            str(log_dir),
            *map(str, flags),
        ],
        env=environment(url),
        capture_output=True,
        text=True,
        timeout=900,
    )
    if result.returncode != 0:
        raise RuntimeError(f"bench.engine {section} on {backend} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def repeated(times, measure):
    """Run `measure()` `times` times; the median of each figure."""
    import statistics

    results = [measure() for _ in range(times)]
    return {key: statistics.median(r[key] for r in results) for key in results[0]}


def main():
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and smaller counts")
    parser.add_argument(
        "--only",
        help="comma-separated sections: steps, throughput, pickup, claims, replay, footprint, startup",
    )
    args = parser.parse_args()
    sections = set(args.only.split(",")) if args.only else None
    quick = args.quick

    def wanted(name):
        return sections is None or name in sections

    began = time.monotonic()
    figures = {}
    with tempfile.TemporaryDirectory(prefix="everystep-bench-") as work:
        work = pathlib.Path(work)
        logs = work / "logs"
        logs.mkdir()
        databases = Databases(work, {"postgres", "mariadb"})
        try:
            reps = 1 if quick else 3
            runs = 300 if quick else 2000
            if wanted("steps"):
                for backend in ("postgres", "mariadb", "sqlite"):
                    figures[f"steps.{backend}"] = engine(
                        databases, backend, "steps", "--repeat", 3 if quick else 7, log_dir=logs
                    )
            if wanted("throughput"):
                # The headline figures (one PostgreSQL worker) are medians of
                # `reps` runs; the scaling and other backends are one run each,
                # to keep the suite within its 15 minutes.
                configs = [
                    ("postgres", 1, reps),
                    ("postgres", 2, 1),
                    ("postgres", 4, 1),
                    ("mariadb", 1, 1),
                    ("mariadb", 2, 1),
                    ("mariadb", 4, 1),
                    ("sqlite", 1, 1),
                ]
                for backend, workers, times in configs:
                    figures[f"throughput.{backend}.{workers}w"] = repeated(
                        times,
                        lambda: engine(
                            databases,
                            backend,
                            "throughput",
                            "--workers",
                            workers,
                            "--runs",
                            runs,
                            log_dir=logs,
                        ),
                    )
                figures["throughput.postgres.one_step"] = repeated(
                    reps,
                    lambda: engine(
                        databases,
                        "postgres",
                        "throughput",
                        "--workflow",
                        "one_step",
                        "--runs",
                        runs,
                        log_dir=logs,
                    ),
                )
            if wanted("pickup"):
                samples = 50 if quick else 200
                figures["pickup.postgres.notify"] = engine(
                    databases, "postgres", "pickup", "--samples", samples, log_dir=logs
                )
                figures["pickup.postgres.polling"] = engine(
                    databases,
                    "postgres",
                    "pickup",
                    "--samples",
                    samples,
                    "--no-notify",
                    log_dir=logs,
                )
                figures["pickup.mariadb.polling"] = engine(
                    databases, "mariadb", "pickup", "--samples", samples, log_dir=logs
                )
            if wanted("claims"):
                figures["claims.postgres"] = engine(
                    databases,
                    "postgres",
                    "claims",
                    "--samples",
                    50 if quick else 200,
                    "--finished",
                    100_000 if quick else 1_000_000,
                    log_dir=logs,
                )
            if wanted("replay"):
                figures["replay.postgres"] = engine(
                    databases,
                    "postgres",
                    "replay",
                    "--count",
                    1000,
                    "--repeat",
                    3 if quick else 5,
                    log_dir=logs,
                )
            if wanted("footprint"):
                figures["footprint.postgres"] = engine(
                    databases, "postgres", "footprint", "--runs", runs, log_dir=logs
                )
            if wanted("startup"):
                figures["startup.postgres"] = startup.measure(
                    databases.fresh("postgres"), work, repeat=reps
                )
        finally:
            databases.stop()
    results = {
        "figures": figures,
        "settings": {
            "quick": quick,
            "runs": 300 if quick else 2000,
            "durability": "server defaults (fsync on, synchronous commit on)",
        },
        "versions": report.versions(),
        "machine": report.machine(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - began, 1),
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(report.table(results))
    print(f"\nwritten to {OUT / 'results.json'} in {results['seconds']}s")


if __name__ == "__main__":
    main()
