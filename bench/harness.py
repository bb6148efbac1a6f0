"""The orchestrating side: throwaway servers, a fresh database per
measurement, and measurement subprocesses run with a deadline.

The servers come from `tests.servers` (the test suite's throwaway
PostgreSQL and MariaDB, with the servers' default durability: fsync and
synchronous commit on). Each measurement gets a database of its own,
migrated by ``manage.py migrate`` and dropped afterwards (then a
CHECKPOINT), and runs in a subprocess of its own
session (`bench.child`): when it overruns its deadline the whole process
group — it and the workers it started — is killed by its id.
"""

import json
import os
import signal
import subprocess
import sys

from bench.common import child_environment, start_process


class SectionFailed(RuntimeError):
    """A measurement subprocess failed or overran; the message says how."""


class Databases:
    """The suite's servers, and fresh migrated databases on them."""

    def __init__(self, workdir):
        self.workdir = workdir
        self.servers = {}
        self.count = 0
        self.created = []  # (backend, name) of the databases not yet dropped

    def server(self, backend):
        """The server for `backend`, started on first use."""
        if backend not in self.servers:
            from tests import servers

            if backend == "pgbouncer":  # in front of the suite's PostgreSQL
                postgres = self.server("postgres").url
                self.servers[backend] = servers.start_pgbouncer(self.workdir / backend, postgres)
                return self.servers[backend]
            start = {"postgres": servers.start_postgres, "mariadb": servers.start_mariadb}
            self.servers[backend] = start[backend](self.workdir / backend)
        return self.servers[backend]

    def through_pooler(self, url):
        """`url`, a database on the suite's PostgreSQL, through PgBouncer."""
        port = self.server("postgres").port
        return url.replace(f":{port}/", f":{self.server('pgbouncer').port}/", 1)

    def fresh(self, backend, migrate=True):
        """The URL of a new, empty database on `backend`; migrated for
        everystep unless `migrate` is false."""
        self.count += 1
        name = f"bench_{self.count}"
        if backend == "sqlite":
            url = f"sqlite:///{self.workdir / (name + '.sqlite3')}"
        else:
            server_url = self.server(backend).url
            create_database(backend, server_url, name)
            url = server_url.rsplit("/", 1)[0] + "/" + name
        self.created.append((backend, name))
        if migrate:
            run(
                [sys.executable, "-m", "django", "migrate", "-v", "0"],
                child_environment(url),
                timeout=180,
                what=f"migrating {backend}",
            )
        return url

    def release(self):
        """Drop the databases made so far and flush the servers' dirty pages,
        so that no measurement pays for the vacuum, checkpoint or purge of
        the one before it."""
        while self.created:
            backend, name = self.created.pop()
            if backend == "sqlite":
                for suffix in ("", "-wal", "-shm"):
                    (self.workdir / f"{name}.sqlite3{suffix}").unlink(missing_ok=True)
            else:
                execute(backend, self.servers[backend].url, f"DROP DATABASE IF EXISTS {name}")
        if "postgres" in self.servers:
            execute("postgres", self.servers["postgres"].url, "CHECKPOINT")

    def stop(self):
        for server in reversed(list(self.servers.values())):  # the pooler first
            server.stop()


def create_database(backend, server_url, name):
    charset = "" if backend == "postgres" else " CHARACTER SET utf8mb4"
    execute(backend, server_url, f"CREATE DATABASE {name}{charset}")


def execute(backend, server_url, sql):
    """Run one statement on the server at `server_url`, in autocommit."""
    if backend == "postgres":
        import psycopg

        url = server_url.replace("postgres://", "postgresql://", 1)
        if sql.startswith("DROP DATABASE"):
            sql += " WITH (FORCE)"
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql)
        return
    from urllib.parse import urlsplit

    import pymysql

    parts = urlsplit(server_url)
    conn = pymysql.connect(
        host=parts.hostname,
        port=parts.port,
        user=parts.username,
        password=parts.password or "",
        connect_timeout=10,
    )
    try:
        with conn.cursor() as cursor:
            cursor.execute(sql)
    finally:
        conn.close()


def run(command, env, timeout, what):
    """Run `command` in a session of its own; its stdout. On failure or
    after `timeout` seconds, its process group is killed and `SectionFailed`
    raised with the end of its stderr."""
    process = start_process(command, env, stderr=subprocess.PIPE, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(process)
        raise SectionFailed(f"{what}: no result after {timeout:.0f}s") from None
    finally:
        kill_group(process)
    if process.returncode != 0:
        tail = "\n".join(stderr.strip().splitlines()[-15:])
        raise SectionFailed(f"{what} failed (exit {process.returncode}):\n{tail}")
    return stdout


def kill_group(process):
    """Kill what is left of `process`'s group (the process and anything it
    started), by the group's id."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.communicate(timeout=10)
    except (subprocess.TimeoutExpired, ValueError):
        pass


def measure(url, section, timeout, **options):
    """Run ``bench.SECTION.measure(**options)`` in a subprocess against the
    database at `url`; its figures."""
    stdout = run(
        [sys.executable, "-m", "bench.child", section, json.dumps(options)],
        child_environment(url),
        timeout,
        what=f"bench.{section}",
    )
    return json.loads(stdout.strip().splitlines()[-1])
