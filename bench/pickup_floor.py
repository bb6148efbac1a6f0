"""The pickup's floor: a NOTIFY's commit to a claim's reply, with nothing
of everystep in the way.

A listener process of the raw driver (psycopg, `bench.limits.connect`)
LISTENs on one connection. The probe, on a connection of its own, INSERTs a
row into a plain queue table and NOTIFYs in the same autocommit statement,
as a run's scheduling and its trigger do, at a random point of a poll
interval. On each notification the listener claims the oldest unclaimed
row on a second connection, idle until then as a worker's loop connection
is: an UPDATE of the row chosen ``FOR UPDATE SKIP LOCKED``, ``RETURNING``
it, through a partial index of the unclaimed rows, and committed without
waiting for the WAL's flush, as everystep's claim is. It sends the probe
the row's id and the time of the claim's reply as a UDP datagram, as the
pickup's probe run sends its first step's start.

From the commit to that reply is the floor under a pickup on this machine
and server: waking an idle process, and one round trip on an idle
connection, with no run to start. The probe reads the clock as the raw
driver returns; ``schedule()`` returns through a little more code, so the
pickup's own samples start a few microseconds later after the commit.

``python -m bench.pickup_floor ADDRESS`` is the listener (Django's
database settings name the server); `Listener` starts and stops it.
"""

import os
import pathlib
import socket
import sys
import time

from bench.common import WorkerProcess, child_environment
from bench.limits import connect

CHANNEL = "bench_pickup_floor"
TABLES = (
    "CREATE TABLE IF NOT EXISTS bench_pickup_floor (id bigserial PRIMARY KEY, owner text)",
    "CREATE INDEX IF NOT EXISTS bench_pickup_floor_free ON bench_pickup_floor (id) "
    "WHERE owner IS NULL",
)
CLAIM = (
    "UPDATE bench_pickup_floor SET owner = 'listener' WHERE id = ("
    "SELECT id FROM bench_pickup_floor WHERE owner IS NULL ORDER BY id LIMIT 1 "
    "FOR UPDATE SKIP LOCKED) RETURNING id"
)
SCHEDULE = (
    "WITH row AS (INSERT INTO bench_pickup_floor DEFAULT VALUES RETURNING id) "
    f"SELECT id, pg_notify('{CHANNEL}', '') FROM row"
)


class Listener:
    """The listener process, claiming for the probe at `address`, and the
    probe's connection (a context manager)."""

    def __init__(self, address, log_dir):
        self.raw = connect()
        for statement in TABLES:
            self.raw.execute(statement)
        command = [sys.executable, "-m", "bench.pickup_floor", address]
        env = child_environment(os.environ["EVERYSTEP_DATABASE_URL"])
        log = pathlib.Path(log_dir) / "bench-pickup-floor.log"
        self.process = WorkerProcess("bench-pickup-floor", command, env, log)

    def schedule(self):
        """Insert and notify a row (committed on return); its id."""
        return self.raw.execute(SCHEDULE).fetchone()[0]

    def __enter__(self):
        try:
            self.process.wait_ready()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        try:
            self.process.stop()
        finally:
            self.raw.close()


def listen(address):
    """Claim a row for each notification, and send its id and the time of
    the claim's reply to `address` (``HOST:PORT``), until killed."""
    host, _, port = address.rpartition(":")
    listening, claiming = connect(), connect()
    claiming.execute("SET synchronous_commit = off")
    listening.execute(f"LISTEN {CHANNEL}")
    print("pickup floor listener ready: LISTEN and an idle connection", flush=True)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _ in listening.notifies():
            claimed = claiming.execute(CLAIM).fetchone()
            replied = time.time()
            if claimed is not None:
                probe.sendto(f"{claimed[0]} {replied!r}".encode(), (host, int(port)))


if __name__ == "__main__":
    import django

    django.setup()
    listen(sys.argv[1])
