"""Pickup latency: how long a run waits for an idle worker.

One worker process (``--poll 0.2``, the default; pool and everything else
the defaults) idles. The probe schedules a run with ``schedule()`` in
autocommit mode — committed when it returns, when the clock is read — and
the run's first step records ``time.time()`` as it starts; the difference
is the pickup latency (same machine, same wall clock). The step also sends
its time to the probe as a UDP datagram on 127.0.0.1, so the probe waits
without querying the database (which would load the machine under test);
the run's completion is then checked before the next sample, so every
sample meets an idle worker. Schedules are spaced by a random pause of up
to one poll interval (seeded), so that they land at every point of the
worker's poll cycle rather than in step with it. A few warm-up samples are
dropped; p50 and p99 are taken over the rest.

With ``notify`` false the worker is started with ``--no-notify`` (polling
only); otherwise it does whatever the engine does by default on this
database (on PostgreSQL, a LISTEN/NOTIFY wake-up).

With ``delay`` (seconds), each probe run is scheduled to start that much
later (``schedule(..., delay=...)``, plus the same random part of a poll),
and its latency runs from its due time (``run_at``) instead of its commit:
how fast a run that falls due is picked up.

With ``wake``, the latency is a parked run's wake-up (§15). ``message``:
the probe run waits in a ``receive()``; once it is parked, the probe sends
it a message (autocommit), and the latency runs from that commit to the
start of the step after the receive. ``result``: the probe run waits for
its child's result, the child for a message; the probe sends the child its
message, and the latency runs from the child's end (``completed_at``) to
the start of the parent's next step.

With ``limit``, no worker runs: the figures are the floor under a pickup on
this machine and server, a NOTIFY's commit to a claim's reply through the
raw driver (`bench.pickup_limit`), sampled the same way.
"""

import os
import random
import socket
import time

from bench import pickup_limit, workflows
from bench.common import Workers, percentile, wait_for
from everystep import schedule, send
from everystep.models import Workflow

WARM_UP = 10
TIMEOUT = 30  # seconds a probe run may take to start


def receive_start(probe, run_id):
    """The start time the probe run `run_id` sends (others are ignored)."""
    deadline = time.monotonic() + TIMEOUT
    while (remaining := deadline - time.monotonic()) > 0:
        probe.settimeout(remaining)
        try:
            message = probe.recv(200).decode()
        except TimeoutError:
            break
        sender, _, started = message.partition(" ")
        if sender == str(run_id):
            return float(started)
    raise TimeoutError(f"the probe run {run_id} did not start within {TIMEOUT}s")


def scheduled(delay, rng, poll):
    """Schedule a probe run at a random point of the worker's poll (due
    `delay` seconds later, if given); returns the run and the moment its
    latency runs from."""
    pause = rng.uniform(0, poll)
    if delay is None:
        time.sleep(pause)
        run = schedule(workflows.pickup_probe)  # autocommit: committed on return
        committed = time.time()
    else:
        run = schedule(workflows.pickup_probe, delay=delay + pause)
        committed = run.run_at.timestamp()  # from when it is due
    return run, lambda: committed


def parked(run_id):
    return Workflow.objects.filter(id=run_id, status="scheduled", run_at__year=9999).exists()


def wait_parked(run_id):
    wait_for(lambda: parked(run_id), TIMEOUT, "the probe run to park", interval=0.005)


def woken(wake, rng, poll):
    """Schedule a probe run that parks (`wake`: ``message`` or ``result``),
    wake it at a random point of the worker's poll; returns the run and the
    moment its latency runs from, a function called once it has started."""
    probe = workflows.wake_probe if wake == "message" else workflows.result_probe
    run = schedule(probe)
    wait_parked(run.id)
    target = run.id
    if wake == "result":
        wait_for(lambda: Workflow.objects.filter(parent_id=run.id).exists(), TIMEOUT, "the child")
        target = Workflow.objects.get(parent_id=run.id).id
        wait_parked(target)
    time.sleep(rng.uniform(0, poll))
    send(target, "go")  # autocommit: committed on return
    sent = time.time()
    if wake == "message":
        return run, lambda: sent
    return run, lambda: Workflow.objects.get(id=target).completed_at.timestamp()


def measure(
    samples=200, poll=0.2, notify=True, log_dir=".", seed=1, delay=None, wake=None, limit=False
):
    """The pickup's figures, in ms; with `limit`, no worker: the floor under
    a pickup, a NOTIFY's commit to a claim's reply (`bench.pickup_limit`)."""
    rng = random.Random(seed)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
        if limit:
            with pickup_limit.Listener(address, log_dir) as listener:
                delays = _sample(samples, probe, lambda: _limit_sample(listener, rng, poll))
        else:
            delays = _pickups(samples, poll, notify, log_dir, delay, wake, rng, probe, address)
    return {
        "samples": samples,
        "pickup_p50_ms": percentile(delays, 0.5) * 1e3,
        "pickup_p99_ms": percentile(delays, 0.99) * 1e3,
        "pickup_min_ms": min(delays) * 1e3,
        "pickup_max_ms": max(delays) * 1e3,
    }


def _pickups(samples, poll, notify, log_dir, delay, wake, rng, probe, address):
    """The pickups of probe runs by one idle worker, in seconds."""
    flags = ["--poll", str(poll)] + ([] if notify else ["--no-notify"])
    url = os.environ["EVERYSTEP_DATABASE_URL"]
    env = {workflows.PROBE_ADDRESS: address}
    with Workers(1, flags, url, log_dir, prefix="bench-pickup", env=env) as group:
        group.wait_ready()

        def one():
            if wake is None:
                run, since = scheduled(delay, rng, poll)
            else:
                run, since = woken(wake, rng, poll)
            return run.id, since, lambda: _wait_completed(run.id)

        return _sample(samples, probe, one)


def _limit_sample(listener, rng, poll):
    """One sample of the pickup's limit, as `_sample` takes it."""
    time.sleep(rng.uniform(0, poll))
    row = listener.schedule()  # autocommit: committed on return
    committed = time.time()
    return row, lambda: committed, lambda: None


def _sample(samples, probe, one):
    """`samples` delays (seconds) after `WARM_UP` dropped: `one()` starts a
    sample and returns its id, a function of the moment it runs from, and
    one that waits until the sample is done with."""
    delays = []
    for index in range(WARM_UP + samples):
        sample_id, since, done = one()
        started = receive_start(probe, sample_id)
        began = since()
        done()
        if index >= WARM_UP:
            delays.append(started - began)
    return delays


def _wait_completed(run_id):
    wait_for(
        lambda: Workflow.objects.filter(id=run_id, status="completed").exists(),
        TIMEOUT,
        "the probe run to complete",
        interval=0.005,
    )
