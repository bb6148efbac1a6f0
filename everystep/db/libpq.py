"""The engine's own statements on PostgreSQL, sent through libpq itself.

psycopg's cursor runs a statement through several layers of Python: it
converts the query, keeps its prepared statements' books, and waits for the
reply in a loop of generators. On a worker that code runs cold, after every
wait on the server, and costs more CPU than libpq's own work: a ``SELECT 1``
after an idle moment takes 348 µs of CPU through the cursor against 118 µs
through libpq (bench machine, medians of 70). The engine's statements (a
step's record, a run's move, the claim) run once per step or per pickup, so
they go straight to the driver's libpq connection: each is prepared once per
connection (once it has run ``prepare_threshold`` times, as psycopg does)
and executed with `PGconn.exec_prepared`, which waits in libpq with the GIL
released. Where psycopg would prepare nothing (``prepare_threshold`` None,
as a worker sets it behind a pooler, or client-side binding, Django's
default) it is always sent unnamed.

The parameters are dumped, and the rows loaded, by psycopg's own
`Transformer` on the connection's adapters, so every value reads and writes
as it does through the cursor; a failed statement raises the exception
psycopg raises, so Django's error mapping, the engine's retries and the
deadline's watchdog (which shuts the socket down under a blocked call) see
no difference. Only statements in autocommit take this way: in a
transaction, psycopg's cursor keeps the books of it.
"""

import functools
import itertools
import re

from psycopg import ClientCursor, OperationalError, errors, pq
from psycopg.adapt import PyFormat, Transformer

_FAILED = (pq.ExecStatus.FATAL_ERROR, pq.ExecStatus.NONFATAL_ERROR)
MAX_PREPARED = 100  # statements a connection keeps prepared; others are sent unnamed
_names = {}  # (statement, parameter types) → the name it is prepared under
_numbers = itertools.count(1)


def execute(sql, params, many, context):
    """Run `sql` (``%s`` or ``%(name)s`` placeholders) with `params` on the
    connection of the psycopg cursor in `context`, and return the number of
    rows it touched; None when it ran on that cursor instead. The signature
    of a Django execute wrapper's callee."""
    result = _sent(context["cursor"], sql, params)
    return None if result is None else result.command_tuples


def fetch(sql, params, many, context):
    """Run `sql` as `execute` does, and return its rows as tuples; None
    when it ran on the cursor instead."""
    cursor = context["cursor"]
    result = _sent(cursor, sql, params)
    if result is None:
        return None
    transformer = _state_of(cursor).transformer
    transformer.set_pgresult(result)
    try:
        return transformer.load_rows(0, result.ntuples, tuple)
    finally:
        transformer.set_pgresult(None)


def _sent(cursor, sql, params):
    """The result of `sql` run through libpq, or None if it ran on `cursor`."""
    raw = cursor.connection
    pgconn = raw.pgconn
    if not raw.autocommit or pgconn.transaction_status != pq.TransactionStatus.IDLE:
        # In a transaction, psycopg keeps its books: it begins it, and its
        # rollback deallocates every prepared statement (ours too).
        cursor.execute(sql, params)
        return None
    query, names = _numbered(sql)
    values = params if names is None else [params[name] for name in names]
    state = _state_of(cursor)
    transformer = state.transformer
    data = transformer.dump_sequence(values, [PyFormat.AUTO] * len(values))
    types, formats = tuple(transformer.types), transformer.formats
    name = _prepared_name(raw, state, query, types) if state.prepares else None
    if name is None:
        result = pgconn.exec_params(query, data, types, formats)
    else:
        result = pgconn.exec_prepared(name, data, formats)
        if result.error_field(pq.DiagnosticField.SQLSTATE) == b"26000":
            # Gone from the session: psycopg deallocates all after a rollback
            # of the user's code, or a DISCARD ALL ran. Prepare it again.
            _prepare(raw, name, query, types)
            result = pgconn.exec_prepared(name, data, formats)
    if result.status in _FAILED:
        raise _error(raw, result)
    return result


def _prepared_name(raw, state, query, types):
    """The name `query` is prepared under on `raw`; None while it is to be
    sent unnamed. As psycopg does, a statement is prepared once it has run
    more than the connection's ``prepare_threshold`` times (0: at once),
    unless the connection holds `MAX_PREPARED` already."""
    name = _names.get((query, types))
    if name is None:
        name = _names.setdefault((query, types), f"everystep_{next(_numbers)}".encode())
    if name in state.prepared:
        return name
    runs = state.runs[name] = state.runs.get(name, 0) + 1
    if runs <= raw.prepare_threshold or len(state.prepared) >= MAX_PREPARED:
        return None
    _prepare(raw, name, query, types)
    state.prepared.add(name)
    return name


def _prepare(raw, name, query, types):
    result = raw.pgconn.prepare(name, query, types)
    if result.status in _FAILED:
        raise _error(raw, result)


class _State:
    """What the engine's statements keep on one connection (used by one
    thread at a time): a psycopg `Transformer` on its adapters; whether
    psycopg would prepare statements there (not with client-side binding,
    Django's default and often chosen for a pooler, nor with
    ``prepare_threshold`` None); the names prepared there, and how many
    times each statement not yet prepared ran."""

    __slots__ = ("transformer", "prepares", "prepared", "runs")

    def __init__(self, cursor):
        raw = cursor.connection
        self.transformer = Transformer.from_context(raw)
        self.prepares = raw.prepare_threshold is not None and not isinstance(cursor, ClientCursor)
        self.prepared = set()
        self.runs = {}


def _state_of(cursor):
    """The `_State` of `cursor`'s connection, made at its first statement
    (a connection's cursor factory and threshold are set when it opens)."""
    raw = cursor.connection
    try:
        return raw._everystep_statements
    except AttributeError:
        raw._everystep_statements = _State(cursor)
        return raw._everystep_statements


def _error(raw, result):
    """The exception psycopg raises for the failed `result`."""
    if raw.pgconn.status == pq.ConnStatus.BAD:
        message = result.error_message.decode(errors="replace").strip()
        return OperationalError(f"consuming input failed: {message or 'the connection is lost'}")
    return errors.error_from_result(result, encoding=raw.info.encoding)


@functools.cache
def _numbered(sql):
    """`sql` with libpq's numbered placeholders ($1, $2…) for psycopg's, and
    the names of its parameters in their numbers' order (None when they are
    positional). A name used twice is one parameter, as psycopg sends it."""
    names = []

    def number(match):
        if match[0] == "%%":
            return "%"
        name = match[1]
        if name is None:
            names.append(None)
        elif name not in names:
            names.append(name)
        return f"${len(names) if name is None else names.index(name) + 1}"

    query = re.sub(r"%(?:\((\w+)\))?[s%]", number, sql)
    return query.encode(), (None if None in names or not names else tuple(names))
