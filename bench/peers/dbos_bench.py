"""DBOS Transact on the benchmark's PostgreSQL server (its system database).

Run by `bench.peers` under the peers' virtualenv; prints one JSON object:

- ``sequential_5_step_run_ms``: a 5-step workflow called directly, one
  after the other (median);
- ``pickup_p50_ms``/``pickup_p99_ms``: enqueue-to-start of a workflow on an
  idle queue — the first step records ``time.time()`` and wakes the waiting
  probe in-process; enqueues are spaced by a random pause of up to one
  polling interval, like everystep's probe;
- ``queued_runs_per_s``: 5-step workflows on a queue with worker
  concurrency 8: all enqueued in one transaction (``DBOSClient.
  enqueue_in_transaction``) while the queue is idle, timed from its commit
  until all are done.

The queue polls every 0.2 s, as an everystep worker does by default (DBOS's
own default is 1 s).

Usage: python dbos_bench.py POSTGRES_URL RUNS SAMPLES SEQUENTIAL
"""

import json
import random
import statistics
import sys
import threading
import time

import sqlalchemy as sa
from dbos import DBOS, DBOSClient

POLL = 0.2
WARM_UP = 10
url, runs, samples, sequential = sys.argv[1], *map(int, sys.argv[2:5])
DBOS(config={"name": "everystep-bench", "system_database_url": url, "log_level": "WARNING"})


@DBOS.step()
def trivial(i):
    return i


started = {}  # probe tag -> when its first step began
arrived = threading.Condition()


@DBOS.step()
def started_at(tag):
    now = time.time()
    with arrived:
        started[tag] = now
        arrived.notify_all()
    return now


@DBOS.workflow()
def five_steps():
    for i in range(5):
        trivial(i)


@DBOS.workflow()
def probe(tag):
    return started_at(tag)


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def wait_for(condition, timeout, what, interval=0.02):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def sequential_runs():
    for _ in range(WARM_UP):
        five_steps()
    timings = []
    for _ in range(sequential):
        began = time.perf_counter()
        five_steps()
        timings.append(time.perf_counter() - began)
    return statistics.median(timings)


def pickup(queue):
    rng = random.Random(1)
    delays = []
    for tag in range(WARM_UP + samples):
        time.sleep(rng.uniform(0, POLL))
        handle = queue.enqueue(probe, tag)  # committed on return
        enqueued = time.time()
        with arrived:
            if not arrived.wait_for(lambda tag=tag: tag in started, timeout=30):
                raise TimeoutError(f"probe {tag} did not start within 30s")
        handle.get_result(polling_interval_sec=0.01)  # the queue is idle again
        if tag >= WARM_UP:
            delays.append(started[tag] - enqueued)
    return delays


def queued_throughput(engine):
    client = DBOSClient(system_database_url=url)
    options = {"queue_name": "bench", "workflow_name": five_steps.__qualname__}
    unfinished = sa.text(
        "SELECT count(*) FROM dbos.workflow_status "
        "WHERE queue_name = 'bench' AND status IN ('ENQUEUED', 'PENDING')"
    )
    try:
        with engine.begin() as conn:
            for _ in range(runs):
                client.enqueue_in_transaction(conn, options)
        began = time.perf_counter()

        def done():
            with engine.connect() as conn:
                return conn.execute(unfinished).scalar() == 0

        wait_for(done, 600, f"{runs} queued workflows")
        elapsed = time.perf_counter() - began
    finally:
        client.destroy()
    with engine.connect() as conn:
        failed = conn.execute(
            sa.text("SELECT count(*) FROM dbos.workflow_status WHERE status <> 'SUCCESS'")
        ).scalar()
    if failed:
        raise RuntimeError(f"{failed} DBOS workflows did not succeed")
    return runs / elapsed


def main():
    DBOS.launch()
    engine = sa.create_engine(sa.make_url(url).set(drivername="postgresql+psycopg"))
    try:
        queue = DBOS.register_queue("bench", worker_concurrency=8, polling_interval_sec=POLL)
        sequential_s = sequential_runs()
        delays = pickup(queue)
        throughput = queued_throughput(engine)
    finally:
        engine.dispose()
        DBOS.destroy()
    print(
        json.dumps(
            {
                "sequential_5_step_run_ms": sequential_s * 1e3,
                "pickup_p50_ms": percentile(delays, 0.5) * 1e3,
                "pickup_p99_ms": percentile(delays, 0.99) * 1e3,
                "queued_runs_per_s": throughput,
                "queued_runs": runs,
                "pickup_samples": samples,
                "queue_polling_interval_s": POLL,
            }
        )
    )


if __name__ == "__main__":
    main()
