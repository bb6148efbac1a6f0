"""Procrastinate on the benchmark's PostgreSQL server.

Run by `bench.peers` under the peers' virtualenv; prints one JSON object:

- ``pickup_p50_ms``/``pickup_p99_ms``: defer-to-start of a job on an idle
  worker (LISTEN/NOTIFY, Procrastinate's default) — the job records
  ``time.time()`` as it starts; defers are spaced by a random pause of up to
  0.2 s, like everystep's probe;
- ``jobs_per_s``: one-step jobs at worker concurrency 8: all deferred in
  one statement (``batch_defer_async``) while the worker idles, timed from
  its commit until none is left to do.

The worker runs in this process (``run_worker_async``), as asyncio tasks.

Usage: python procrastinate_bench.py POSTGRES_URL JOBS SAMPLES
"""

import asyncio
import json
import random
import sys
import time

from procrastinate import App, PsycopgConnector

WARM_UP = 10
url, jobs, samples = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
app = App(connector=PsycopgConnector(conninfo=url))
started = {}
arrived = asyncio.Event()
done = {"count": 0, "target": None, "event": asyncio.Event()}


@app.task(name="probe")
async def probe(tag):
    started[tag] = time.time()
    arrived.set()


@app.task(name="one_step")
async def one_step():
    done["count"] += 1
    if done["count"] == done["target"]:
        done["event"].set()


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


async def pickup():
    rng = random.Random(1)
    delays = []
    for tag in range(WARM_UP + samples):
        await asyncio.sleep(rng.uniform(0, 0.2))
        arrived.clear()
        await probe.defer_async(tag=tag)  # committed on return
        deferred = time.time()
        async with asyncio.timeout(30):
            while tag not in started:
                await arrived.wait()
                arrived.clear()
        if tag >= WARM_UP:
            delays.append(started[tag] - deferred)
    return delays


async def unfinished():
    rows = await app.connector.execute_query_all_async(
        "SELECT count(*) AS n FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
    )
    return rows[0]["n"]


async def throughput():
    done["target"] = jobs
    await one_step.batch_defer_async(*[{} for _ in range(jobs)])
    began = time.perf_counter()
    async with asyncio.timeout(600):
        await done["event"].wait()
        while await unfinished():
            await asyncio.sleep(0.01)
    elapsed = time.perf_counter() - began
    failed = await app.connector.execute_query_all_async(
        "SELECT count(*) AS n FROM procrastinate_jobs WHERE status <> 'succeeded'"
    )
    if failed[0]["n"]:
        raise RuntimeError(f"{failed[0]['n']} Procrastinate jobs did not succeed")
    return jobs / elapsed


async def main():
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        worker = asyncio.create_task(
            app.run_worker_async(concurrency=8, install_signal_handlers=False)
        )
        try:
            delays = await pickup()
            per_second = await throughput()
        finally:
            worker.cancel()
            try:
                async with asyncio.timeout(30):
                    await worker
            except (asyncio.CancelledError, TimeoutError):
                pass
    print(
        json.dumps(
            {
                "pickup_p50_ms": percentile(delays, 0.5) * 1e3,
                "pickup_p99_ms": percentile(delays, 0.99) * 1e3,
                "jobs_per_s": per_second,
                "jobs": jobs,
                "pickup_samples": samples,
            }
        )
    )


asyncio.run(main())
