"""A real kernel partition inside a private network namespace: a database
server of the current backend runs in it, and clients in it lose the server
while the partition holds and reach it again once it heals."""

import fcntl
import os
import socket
import struct
import subprocess
import sys
import termios
import threading
import time

import pytest

from tests.helpers import driver_connection, wait_until
from tests.netns import Namespace
from tests.plugin import current_backend

pytestmark = pytest.mark.backends("postgres", "mariadb")

DEADLINE = 2  # seconds: the clients' own connect and read timeouts
TCP_ESTABLISHED = 1

# A client process: connect, SELECT 1, print the answer; exit 1 with the
# driver's error once its connect/read timeout passes.
CLIENT = """
import sys
from urllib.parse import unquote, urlsplit
url, deadline = sys.argv[1], int(sys.argv[2])
try:
    if url.startswith("postgres"):
        import psycopg
        with psycopg.connect(url, connect_timeout=deadline) as conn:
            print(conn.execute("SELECT 1").fetchone()[0])
    else:
        import pymysql
        p = urlsplit(url)
        conn = pymysql.connect(host=p.hostname, port=p.port, user=unquote(p.username),
                               password=unquote(p.password or ""), database=p.path[1:],
                               connect_timeout=deadline, read_timeout=deadline)
        with conn.cursor() as cursor:
            cursor.execute("SELECT 1")
            print(cursor.fetchone()[0])
except Exception as exc:
    sys.exit(f"{type(exc).__name__}: {exc}")
"""


@pytest.fixture(scope="module")
def namespace():
    with Namespace() as ns:
        yield ns


@pytest.fixture(scope="module")
def server(namespace):
    return namespace.start_server(current_backend())


@pytest.fixture(autouse=True)
def _healed(namespace):
    yield
    namespace.heal()


def connect(url):
    """A raw driver connection in autocommit (made inside the namespace by ns.call)."""
    return driver_connection(url, timeout=DEADLINE)


def driver_errors():
    if current_backend() == "postgres":
        import psycopg

        return psycopg.OperationalError
    import pymysql

    return pymysql.OperationalError


def select_one(conn):
    with conn.cursor() as cursor:
        cursor.execute("SELECT 1")
        return cursor.fetchone()[0]


def fileno(conn):
    return conn.fileno() if current_backend() == "postgres" else conn._sock.fileno()


def tcp_info(fd):
    """(state, retransmits) of a socket from the kernel's struct tcp_info."""
    with socket.socket(fileno=os.dup(fd)) as sock:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
    return info[0], info[2]


def unsent(fd):
    """Bytes the kernel holds in the socket's send queue, not yet acknowledged."""
    return struct.unpack("i", fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0" * 4))[0]


def run_client(namespace, server, group=None):
    """Run CLIENT inside the namespace (under `group`, if given): (exit
    status, output, seconds)."""
    began = time.monotonic()
    result = subprocess.run(
        namespace.command([sys.executable, "-c", CLIENT, server.url, str(DEADLINE)], group),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result.returncode, (result.stdout + result.stderr).strip(), time.monotonic() - began


def test_the_server_runs_inside_the_namespace_and_nowhere_else(namespace, server):
    assert os.readlink(f"/proc/{server.pid}/ns/net") == namespace.id
    assert os.readlink(f"/proc/{server.helper.pid}/ns/net") == namespace.id
    assert os.readlink("/proc/self/ns/net") != namespace.id
    assert server.pid in namespace.processes_inside()


def test_a_client_inside_times_out_during_the_partition_and_succeeds_after_heal(namespace, server):
    assert run_client(namespace, server)[:2] == (0, "1")

    namespace.partition(server.port)
    status, output, elapsed = run_client(namespace, server)
    assert status != 0, output
    assert elapsed >= DEADLINE
    print(f"client during the partition: exit {status} after {elapsed:.2f}s: {output}")

    namespace.heal()
    status, output, elapsed = run_client(namespace, server)
    assert (status, output) == (0, "1")
    print(f"client after heal: {output} in {elapsed:.2f}s")


def test_a_partition_of_one_group_cuts_off_its_processes_and_no_other(namespace, server):
    cut_off = 4242
    assert run_client(namespace, server, group=cut_off)[:2] == (0, "1")

    namespace.partition(server.port, group=cut_off)
    status, output, elapsed = run_client(namespace, server, group=cut_off)
    assert status != 0 and elapsed >= DEADLINE, output
    assert run_client(namespace, server)[:2] == (0, "1")  # another host keeps the server

    namespace.heal()
    assert run_client(namespace, server, group=cut_off)[:2] == (0, "1")


def test_a_partition_of_one_group_holds_its_established_connections_until_the_heal(
    namespace, server
):
    """A connection made before the cut: its query is retransmitted into the
    void, no reset, and answered once the partition heals."""
    conn = namespace.call(connect_as, server.url, 4242)
    try:
        assert select_one(conn) == 1
        namespace.partition(server.port, group=4242)
        outcome = {}
        query = threading.Thread(target=lambda: outcome.update(result=select_one(conn)))
        query.daemon = True
        query.start()
        # Dropped as it leaves: the query stays queued in the kernel, unsent.
        wait_until(lambda: unsent(fileno(conn)) > 0, 10, message="the query queued")
        assert tcp_info(fileno(conn))[0] == TCP_ESTABLISHED and query.is_alive()
        namespace.heal()
        query.join(60)
        assert outcome == {"result": 1}
    finally:
        namespace.heal()
        conn.close()


def connect_as(url, group):
    """`connect(url)` from this thread with the process's effective group id
    set to `group` while the socket is made (a socket's owner is fixed when
    it is created)."""
    saved = os.getegid()
    os.setegid(group)
    try:
        return connect(url)
    finally:
        os.setegid(saved)


def test_a_partition_drops_silently_and_tcp_delivers_the_query_after_heal(namespace, server):
    conn = namespace.call(connect, server.url)
    try:
        assert select_one(conn) == 1

        namespace.partition(server.port)
        outcome = {}
        query = threading.Thread(target=lambda: outcome.update(result=select_one(conn)))
        query.daemon = True
        query.start()
        # The kernel retransmits into the void: no RST, no ACK.
        wait_until(lambda: tcp_info(fileno(conn))[1] > 0, 10, message="a retransmission")
        state, _ = tcp_info(fileno(conn))
        assert state == TCP_ESTABLISHED
        assert query.is_alive()

        healed = time.monotonic()
        namespace.heal()
        query.join(60)
        assert outcome == {"result": 1}
        print(
            f"query sent during the partition answered {time.monotonic() - healed:.2f}s after heal"
        )
    finally:
        conn.close()


def test_a_tcp_user_timeout_gives_up_on_a_partitioned_connection(namespace, server):
    conn = namespace.call(connect, server.url)
    try:
        with socket.socket(fileno=os.dup(fileno(conn))) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, DEADLINE * 1000)
        namespace.partition(server.port)
        began = time.monotonic()
        with pytest.raises(driver_errors()) as error:
            select_one(conn)
        elapsed = time.monotonic() - began
        assert elapsed >= DEADLINE
        assert "timed out" in str(error.value)
        print(f"kernel gave up after {elapsed:.2f}s: {error.value!r}")
    finally:
        try:
            conn.close()
        except Exception:
            pass


def test_close_stops_every_process_started_inside():
    with Namespace() as ns:
        sleeper = ns.popen(["sleep", "600"])
        # Its child escapes to a session of its own: stopping the parent
        # leaves it running, the sweep of the namespace finds it.
        parent = ns.popen(["sh", "-c", "setsid sleep 600 & exec sleep 600"])
        wait_until(lambda: len(ns.processes_inside()) == 3, 10, message="three processes")
        inside = ns.processes_inside()
        assert ns.run(["sh", "-c", "exit 3"]).returncode == 3
        with pytest.raises(subprocess.TimeoutExpired):
            ns.run(["sleep", "600"], timeout=0.5)
    assert sleeper.poll() is not None and parent.poll() is not None
    for pid in inside:
        assert not os.path.exists(f"/proc/{pid}/ns/net"), f"process {pid} survived"
