"""Many workers on one PostgreSQL: sixteen worker processes, two runs each
at a time, share the notifications and the polling, so that the claims a
run costs do not grow with the number of idle workers.

The claims are counted by the server (``pg_stat_statements``), not by the
workers: a worker that claimed on every notification — sixteen claims for
each run scheduled — fails here.
"""

import signal
import uuid

import pytest
from django.db import connection
from django.utils import timezone

from everystep import schedule
from everystep.models import Step, Workflow
from everystep.worker import wakeup
from tests import workflows
from tests.helpers import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.backends("postgres")]

WORKERS = 16
POOL = 2
MAX_CLAIMS_PER_RUN = 3


def claim_statements():
    """How many claims the server has executed since the last reset."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements "
            "WHERE query LIKE %s AND dbid = (SELECT oid FROM pg_database "
            "WHERE datname = current_database())",
            # The claim's UPDATE, and only it, with its constants shown or
            # normalized into parameters.
            ["%claimed_by = %claimed_at = %started_at = COALESCE(started_at%"],
        )
        return int(cursor.fetchone()[0])


def reset_statements():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_statements_reset()")


@pytest.fixture
def sixteen_workers(spawn_worker):
    with connection.cursor() as cursor:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    workers = [spawn_worker(f"many-{i:02}", "--pool", str(POOL)) for i in range(WORKERS)]
    for worker in workers:
        worker.wait_ready(timeout=180)
    # Each has read its peers: all sixteen.
    for worker in workers:
        worker.wait_for_log(f"is one of {WORKERS} ready worker(s)", timeout=60)
    yield workers
    for worker in workers:
        worker.send(signal.SIGTERM)
    for worker in workers:
        assert worker.wait() == 0, worker.log()


def completed(run_ids):
    return Workflow.objects.filter(id__in=run_ids, status="completed").count() == len(run_ids)


def test_a_trickle_of_runs_wakes_two_of_sixteen_idle_workers(sixteen_workers):
    """Each run scheduled once the one before was claimed: every run finds
    the sixteen workers idle, the worst case for a notification that wakes
    them all."""
    reset_statements()
    run_ids = []
    for n in range(100):
        run = schedule(workflows.quick, n)
        run_ids.append(run.id)
        wait_until(
            lambda run=run: Workflow.objects.filter(id=run.id).exclude(status="scheduled").exists(),
            timeout=30,
            interval=0.005,
            message=f"run {n} claimed",
        )
    wait_until(lambda: completed(run_ids), timeout=60, message="100 runs completed")
    claims = claim_statements()
    assert claims / len(run_ids) <= MAX_CLAIMS_PER_RUN, f"{claims} claims for 100 runs"
    assert Step.objects.filter(workflow_id__in=run_ids).count() == 2 * len(run_ids)


def test_a_burst_spreads_over_the_sixteen_workers(sixteen_workers):
    """Five hundred runs scheduled in one transaction — one notification —
    reach every worker (the word is passed on), at under a claim per run."""
    reset_statements()
    token, now = uuid.uuid4().hex, timezone.now()  # one due time: one notification
    Workflow.objects.bulk_create(
        Workflow(name="tests.workflows.quick", args=[n], idempotency_key=f"{token}-{n}", run_at=now)
        for n in range(500)
    )
    run_ids = list(
        Workflow.objects.filter(idempotency_key__startswith=token).values_list("id", flat=True)
    )
    wait_until(lambda: completed(run_ids), timeout=240, message="500 runs completed")
    claims = claim_statements()
    assert claims / len(run_ids) <= MAX_CLAIMS_PER_RUN, f"{claims} claims for 500 runs"
    owners = set(
        Workflow.objects.filter(id__in=run_ids).values_list("claimed_by", flat=True).distinct()
    )
    assert len(owners) == WORKERS, f"only {sorted(owners)} took runs"
    assert Step.objects.filter(workflow_id__in=run_ids).count() == 2 * len(run_ids)


@pytest.mark.backends("postgres", "mariadb", "sqlite")
def test_two_adjacent_peers_answer_each_notification_and_the_word_passes_on():
    """Without a database: which of sixteen peers answer a payload."""
    names = [f"many-{i:02}" for i in range(WORKERS)]
    responders = {name: wakeup.Responders(name, poll=0.2) for name in names}
    for responder in responders.values():
        responder._peers = tuple(names)
    for payload in ("1765000000.123456", "1765000000.5", "1765000001"):
        chosen = [name for name, responder in responders.items() if responder.chosen(payload)]
        assert len(chosen) == wakeup.RESPONDERS
        first, second = (names.index(name) for name in chosen)
        assert (second - first) % WORKERS in (1, WORKERS - 1)  # neighbours: one covers the other
    # A freed slot of a limited queue (no payload): whoever has room.
    assert all(responder.chosen("") for responder in responders.values())
    # Passed on by a peer: the two after it.
    after = [name for name, r in responders.items() if r.chosen(f"{wakeup.PASSED_ON}many-15")]
    assert after == ["many-00", "many-01"]
    # The polling is shared: sixteen peers poll as two would.
    assert responders["many-00"].spread() == WORKERS / wakeup.RESPONDERS
    # Peers not yet known (or two or fewer): every notification is its own.
    alone = wakeup.Responders("many-00", poll=0.2)
    assert alone.chosen("anything") and alone.spread() == 1.0
