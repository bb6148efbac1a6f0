"""The fault proxy breaks a real database connection the way production does:
each fault is checked through the proxy against the test server, with the raw
driver (psycopg on PostgreSQL, PyMySQL on MariaDB)."""

import os
import socket
import threading
import time
import uuid

import pytest

from tests.faultproxy import FaultProxy, ProxyError, fault_proxy  # noqa: F401
from tests.helpers import database_url, driver_connection, wait_until
from tests.plugin import current_backend

pytestmark = pytest.mark.backends("postgres", "mariadb")

DEADLINE = 2.0  # the client-side deadline of a query through a silent proxy
LATENCY = 0.25
TCP_ESTABLISHED = 1


class Client:
    """A raw driver connection in autocommit whose queries give up after
    `deadline` seconds without an answer: PyMySQL's read timeout on MariaDB,
    a watchdog that shuts the socket down on PostgreSQL (libpq has no read
    timeout)."""

    def __init__(self, url, deadline=10.0):
        self.deadline = deadline
        self.connection = driver_connection(url, timeout=10, read_timeout=deadline)

    def fileno(self):
        if current_backend() == "postgres":
            return self.connection.fileno()
        return self.connection._sock.fileno()

    def query(self, sql):
        """Rows of sql, or the driver's error once the deadline passes."""
        watchdog = None
        if current_backend() == "postgres":
            watchdog = threading.Timer(self.deadline, _shut_down, [self.fileno()])
            watchdog.daemon = True
            watchdog.start()
        try:
            with self.connection.cursor() as cursor:
                cursor.execute(sql)
                return [tuple(row) for row in cursor.fetchall()] if cursor.description else []
        finally:
            if watchdog is not None:
                watchdog.cancel()

    def close(self):
        try:
            self.connection.close()
        except Exception:
            pass


def _shut_down(fileno):
    """Shut a client's socket down under its driver: the blocked read returns at once."""
    with socket.socket(fileno=os.dup(fileno)) as sock:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def driver_errors():
    if current_backend() == "postgres":
        import psycopg

        return (psycopg.OperationalError,)
    import pymysql

    # The package's own names: once Django imported PyMySQL as MySQLdb,
    # `pymysql.err` may name a second copy of the module.
    return (pymysql.OperationalError, pymysql.InterfaceError)


def tcp_state(fileno):
    """The kernel's TCP state of a socket (1 is ESTABLISHED)."""
    with socket.socket(fileno=os.dup(fileno)) as sock:
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]


def session_id_sql():
    return (
        "SELECT pg_backend_pid()" if current_backend() == "postgres" else "SELECT CONNECTION_ID()"
    )


def session_exists(direct, session_id):
    if current_backend() == "postgres":
        sql = f"SELECT count(*) FROM pg_stat_activity WHERE pid = {int(session_id)}"
    else:
        sql = f"SELECT count(*) FROM information_schema.processlist WHERE id = {int(session_id)}"
    return direct.query(sql)[0][0] == 1


def timed(func, *args):
    """(result, seconds) of func(*args); the result is the exception it raised, if any."""
    began = time.monotonic()
    try:
        result = func(*args)
    except Exception as exc:
        result = exc
    return result, time.monotonic() - began


def in_thread(func, *args):
    """Start func(*args) on a daemon thread; `thread.outcome` gets timed()'s answer."""
    thread = threading.Thread(target=lambda: setattr(thread, "outcome", timed(func, *args)))
    thread.daemon = True
    thread.start()
    return thread


@pytest.fixture
def clients():
    """Open `Client`s: ``clients(url, deadline=...)``; all closed at the end."""
    opened = []

    def connect(url, **options):
        client = Client(url, **options)
        opened.append(client)
        return client

    yield connect
    for client in opened:
        client.close()


@pytest.fixture
def proxy(fault_proxy):  # noqa: F811
    return fault_proxy(database_url())


def test_queries_pass_through_and_are_counted(proxy, clients):
    client = clients(proxy.url(database_url()))

    assert client.query("SELECT 1") == [(1,)]
    assert proxy.accepted == 1
    assert proxy.open_connections == 1
    assert proxy.bytes_to_server > 0 and proxy.bytes_to_client > 0
    assert proxy.bytes_discarded == 0


def test_blackhole_hangs_a_query_until_the_client_deadline_with_every_socket_open(proxy, clients):
    direct = clients(database_url())
    client = clients(proxy.url(database_url()), deadline=DEADLINE)
    (session,) = client.query(session_id_sql())[0]

    proxy.blackhole()
    query = in_thread(client.query, "SELECT 2")
    wait_until(lambda: proxy.bytes_discarded > 0, 10, message="the query to reach the proxy")
    # The query is out and unanswered, yet nobody saw a close.
    assert query.is_alive()
    assert tcp_state(client.fileno()) == TCP_ESTABLISHED
    assert proxy.open_connections == 1
    query.join(DEADLINE + 15)

    error, elapsed = query.outcome
    assert isinstance(error, driver_errors()), error
    assert elapsed >= DEADLINE
    print(f"blackholed query gave up after {elapsed:.2f}s (deadline {DEADLINE}s)")
    # The server never learned that the client gave up...
    assert session_exists(direct, session)
    # ...until the proxy resets the connection.
    proxy.reset()
    wait_until(lambda: not session_exists(direct, session), 10, message="the session to end")


def test_a_connection_made_during_a_blackhole_waits_and_is_served_after_it(proxy, clients):
    proxy.blackhole()
    attempt = in_thread(lambda: clients(proxy.url(database_url())).query("SELECT 1"))
    attempt.join(1.0)
    assert attempt.is_alive(), "a connection through a blackhole must hang"
    assert proxy.accepted == 0

    proxy.pass_through()
    attempt.join(30)
    assert attempt.outcome[0] == [(1,)]
    assert proxy.accepted == 1


def test_reset_breaks_the_connection_at_once_and_a_new_one_works(proxy, clients):
    client = clients(proxy.url(database_url()))
    assert client.query("SELECT 1") == [(1,)]

    proxy.reset()
    error, elapsed = timed(client.query, "SELECT 1")
    assert isinstance(error, driver_errors()), error
    assert elapsed < DEADLINE
    assert proxy.open_connections == 0
    print(f"query on a reset connection failed after {elapsed:.3f}s")

    assert clients(proxy.url(database_url())).query("SELECT 1") == [(1,)]
    assert proxy.accepted == 2


def test_refuse_resets_connections_and_refuses_new_ones_until_passed_through(proxy, clients):
    client = clients(proxy.url(database_url()))
    proxy.refuse()

    error, _ = timed(client.query, "SELECT 1")
    assert isinstance(error, driver_errors()), error
    error, elapsed = timed(clients, proxy.url(database_url()))
    assert isinstance(error, driver_errors()), error
    assert elapsed < DEADLINE
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=5).close()
    assert proxy.accepted == 1
    print(f"connecting to a refusing proxy failed after {elapsed:.3f}s: {error}")

    proxy.pass_through()
    assert clients(proxy.url(database_url())).query("SELECT 1") == [(1,)]


def test_a_lost_reply_fails_the_client_though_the_insert_committed(proxy, clients):
    direct = clients(database_url())
    table = f"faultproxy_{uuid.uuid4().hex[:12]}"
    direct.query(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY)")
    try:
        client = clients(proxy.url(database_url()))
        assert client.query("SELECT 1") == [(1,)]

        proxy.lose_next_reply()
        error, elapsed = timed(client.query, f"INSERT INTO {table} (id) VALUES (1)")
        assert isinstance(error, driver_errors()), error
        assert elapsed < DEADLINE
        assert proxy.replies_lost == 1
        assert direct.query(f"SELECT id FROM {table}") == [(1,)]

        # One reply only: the proxy passes through again.
        assert clients(proxy.url(database_url())).query("SELECT 1") == [(1,)]
        assert proxy.replies_lost == 1
    finally:
        direct.query(f"DROP TABLE {table}")


def test_silence_after_cuts_one_connection_off_inside_its_transaction(proxy, clients):
    direct = clients(database_url())
    table = f"faultproxy_{uuid.uuid4().hex[:12]}"
    direct.query(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY)")
    direct.query(f"INSERT INTO {table} (id) VALUES (1)")
    try:
        client = clients(proxy.url(database_url()), deadline=DEADLINE)
        (session,) = client.query(session_id_sql())[0]
        client.query("BEGIN")

        proxy.silence_after(b"FOR UPDATE")
        error, elapsed = timed(client.query, f"SELECT id FROM {table} WHERE id = 1 FOR UPDATE")
        assert isinstance(error, driver_errors()), error
        assert elapsed >= DEADLINE
        assert proxy.connections_silenced == 1
        # The server ran the locking read and keeps the session, in its
        # transaction, with the row locked.
        assert session_exists(direct, session)
        assert direct.query(f"SELECT id FROM {table} FOR UPDATE SKIP LOCKED") == []
        # The other connections pass.
        assert clients(proxy.url(database_url())).query("SELECT 1") == [(1,)]
    finally:
        proxy.reset()
        wait_until(lambda: not session_exists(direct, session), 10, message="the session to end")
        direct.query(f"DROP TABLE {table}")


def test_latency_delays_every_chunk(proxy, clients):
    client = clients(proxy.url(database_url()))
    client.query("SELECT 1")
    _, before = timed(client.query, "SELECT 1")

    proxy.latency(LATENCY)
    result, delayed = timed(client.query, "SELECT 1")
    assert result == [(1,)]
    # The query and its reply are each held LATENCY seconds.
    assert delayed >= 2 * LATENCY
    print(f"round trip {before * 1000:.1f} ms, with {LATENCY}s latency {delayed * 1000:.1f} ms")


def test_close_resets_connections_and_releases_the_port(clients):
    proxy = FaultProxy.for_url(database_url())
    client = clients(proxy.url(database_url()))
    assert client.query("SELECT 1") == [(1,)]

    proxy.close()
    proxy.close()
    error, _ = timed(client.query, "SELECT 1")
    assert isinstance(error, driver_errors()), error
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=5).close()
    assert not proxy._thread.is_alive()
    with pytest.raises(ProxyError):
        proxy.blackhole()


def test_url_keeps_everything_but_the_host_and_port(proxy):
    url = "postgres://us%40er:p%3Aw@db.example:6543/name?sslmode=disable&application_name=x"
    assert proxy.url(url) == (
        f"postgres://us%40er:p%3Aw@127.0.0.1:{proxy.port}/name?sslmode=disable&application_name=x"
    )
    assert proxy.url("mysql://db.example/name") == f"mysql://127.0.0.1:{proxy.port}/name"
    with FaultProxy.for_url("mysql://root@127.0.0.1/x") as other:
        assert other.target == ("127.0.0.1", 3306)


def test_tcp_state_reads_the_kernel_state():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert tcp_state(sock.fileno()) == 10  # TCP_LISTEN
