"""What a failed test leaves to read: the state of the database's sessions
(who waits for whose lock) and the stacks and logs of the processes the
test started, added to the failure's report. A wait that timed out then
says what blocked, not only that something did."""

import pytest

#: The processes the running test started (`tests.workerproc.spawn_process`).
STARTED = pytest.StashKey[list]()

LOG_LINES = 150

_SESSIONS = {
    "postgresql": [
        "SELECT pid, pg_blocking_pids(pid) AS blocked_by, state, wait_event_type, "
        "wait_event, now() - xact_start AS in_transaction, left(query, 300) AS query "
        "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
    ],
    "mysql": [
        "SELECT id, command, time, state, LEFT(info, 300) AS query "
        "FROM information_schema.processlist WHERE db = DATABASE() AND id <> CONNECTION_ID()",
        "SELECT trx_mysql_thread_id AS session, trx_state, trx_started, trx_rows_locked, "
        "trx_lock_structs, LEFT(trx_query, 300) AS query FROM information_schema.innodb_trx",
        "SELECT * FROM information_schema.innodb_lock_waits",
        "SELECT lock_trx_id, lock_mode, lock_type, lock_table, lock_index, lock_data "
        "FROM information_schema.innodb_locks",
    ],
}


def failure_sections(item):
    """``[(title, text)]`` for the report of `item`'s failed call: the
    database's sessions first (while the processes still hold theirs), then
    each process the test started, those still running stopped with SIGABRT
    so their logs end with their threads' stacks."""
    started = item.stash.get(STARTED, [])
    if not started:
        return []
    sections = [("database sessions at the failure", database_sessions())]
    for process in started:
        state = f"exited {process.process.returncode}"
        if process.alive():
            process.dump_stacks()
            state = "still running: stopped with SIGABRT for its stacks"
        lines = process.log().splitlines()[-LOG_LINES:]
        sections.append((f"log of {process.name} ({state})", "\n".join(lines)))
    return sections


def database_sessions():
    """The test database's other sessions, their transactions and lock
    waits, as text; never raises (a failure to look is reported instead)."""
    from django.db import connection

    queries = _SESSIONS.get(connection.vendor)
    if queries is None:
        return f"not looked at on {connection.vendor}"
    try:
        with _raw_connection(connection) as raw:
            return "\n\n".join(_table(raw, query) for query in queries)
    except Exception as exc:  # noqa: BLE001 - a report of the failure must not fail
        return f"could not look: {exc!r}"


def _raw_connection(connection):
    """A driver connection of its own to the test database (the test's own
    may be blocked by pytest-django outside a database test)."""
    settings = connection.settings_dict
    if connection.vendor == "postgresql":
        import psycopg

        return psycopg.connect(
            host=settings["HOST"],
            port=settings["PORT"],
            user=settings["USER"],
            password=settings["PASSWORD"],
            dbname=settings["NAME"],
            autocommit=True,
            connect_timeout=5,
        )
    import pymysql

    return pymysql.connect(
        host=settings["HOST"],
        port=int(settings["PORT"]),
        user=settings["USER"],
        password=settings["PASSWORD"],
        database=settings["NAME"],
        connect_timeout=5,
        autocommit=True,
    )


def _table(raw, query):
    cursor = raw.cursor()
    try:
        cursor.execute(query)
    except Exception as exc:  # noqa: BLE001 - a view the server lacks
        return f"{query}\n  failed: {exc}"
    names = [column[0] for column in cursor.description]
    rows = [" | ".join(names)] + [" | ".join(map(str, row)) for row in cursor.fetchall()]
    return "\n".join(rows)
