"""The physical limit: what one connection can commit, with nothing of
everystep in the way.

One connection of the database's own driver (psycopg, PyMySQL, sqlite3) in
autocommit mode INSERTs a step-shaped row — a run's UUID, a step id, a small
JSON result — into a plain table, one commit per row. The time per commit
is the floor under a recorded step: the engine writes one such row per step
and the server's durability (fsync, synchronous commit) is paid for each.
Every other time in the report is also shown as a multiple of it.
"""

import json
import time
import uuid

from django.db import connection

TABLES = {
    "postgresql": "CREATE TABLE IF NOT EXISTS bench_limit "
    "(workflow_id uuid, step_id varchar(300), result jsonb)",
    "mysql": "CREATE TABLE IF NOT EXISTS bench_limit "
    "(workflow_id char(32), step_id varchar(300), result json)",
    "sqlite": "CREATE TABLE IF NOT EXISTS bench_limit "
    "(workflow_id char(32), step_id varchar(300), result text)",
}


def connect():
    """A new autocommit connection of the raw driver to Django's database."""
    settings = connection.settings_dict
    if connection.vendor == "postgresql":
        import psycopg

        return psycopg.connect(
            host=settings["HOST"],
            port=settings["PORT"] or 5432,
            user=settings["USER"],
            password=settings["PASSWORD"] or None,
            dbname=settings["NAME"],
            autocommit=True,
        )
    if connection.vendor == "mysql":
        import pymysql

        return pymysql.connect(
            host=settings["HOST"],
            port=int(settings["PORT"] or 3306),
            user=settings["USER"],
            password=settings["PASSWORD"] or "",
            database=settings["NAME"],
            charset="utf8mb4",
            autocommit=True,
        )
    import sqlite3

    raw = sqlite3.connect(settings["NAME"], isolation_level=None)  # autocommit
    raw.execute("PRAGMA journal_mode=WAL")  # as everystep's SQLite settings
    return raw


class PhysicalLimit:
    """A raw connection and its table; `per_commit(count)` times `count`
    single-row autocommit INSERTs and returns seconds per commit."""

    def __init__(self):
        self.vendor = connection.vendor
        self.raw = connect()
        cursor = self.raw.cursor()
        cursor.execute(TABLES[self.vendor])
        cursor.close()
        marker = "?" if self.vendor == "sqlite" else "%s"
        self.sql = f"INSERT INTO bench_limit VALUES ({marker}, {marker}, {marker})"
        self.sequence = 0

    def durability(self):
        """The server's durability settings, as read from it."""
        queries = {
            "postgresql": "SELECT 'fsync=' || current_setting('fsync') || ', synchronous_commit='"
            " || current_setting('synchronous_commit')",
            "mysql": "SELECT CONCAT('innodb_flush_log_at_trx_commit=', "
            "@@innodb_flush_log_at_trx_commit, ', sync_binlog=', @@sync_binlog)",
            "sqlite": "SELECT 'journal_mode=' || (SELECT journal_mode FROM pragma_journal_mode)"
            " || ', synchronous=' || (SELECT synchronous FROM pragma_synchronous)",
        }
        cursor = self.raw.cursor()
        cursor.execute(queries[self.vendor])
        setting = cursor.fetchone()[0]
        cursor.close()
        return setting

    def per_commit(self, count):
        workflow_id = uuid.uuid4()
        if self.vendor != "postgresql":
            workflow_id = workflow_id.hex
        cursor = self.raw.cursor()
        began = time.perf_counter()
        for _ in range(count):
            self.sequence += 1
            cursor.execute(self.sql, (workflow_id, str(self.sequence), json.dumps(self.sequence)))
        elapsed = time.perf_counter() - began
        cursor.close()
        return elapsed / count

    def close(self):
        self.raw.close()
