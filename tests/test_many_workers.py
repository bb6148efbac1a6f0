"""Many workers on one PostgreSQL: sixteen worker processes, two runs each
at a time, share the notifications and the polling, so that the claims a
run costs do not grow with the number of idle workers.

The claims are counted by the server (``pg_stat_statements``), not by the
workers: a worker that claimed on every notification — sixteen claims for
each run scheduled — fails here.
"""

import datetime
import signal
import uuid

import pytest
from django.db import connection
from django.utils import timezone

from everystep import schedule
from everystep.models import Step, Worker, Workflow
from everystep.worker import wakeup
from tests import workflows
from tests.helpers import opened, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.backends("postgres")]

WORKERS = 16
POOL = 2
MAX_CLAIMS_PER_RUN = 3


def calls(like):
    """How many times the server ran the statements of this database whose
    text is `like` (a LIKE pattern), since the last reset."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements "
            "WHERE query LIKE %s AND dbid = (SELECT oid FROM pg_database "
            "WHERE datname = current_database())",
            [like],
        )
        return int(cursor.fetchone()[0])


def claim_statements():
    """How many claims the server has executed since the last reset: the
    claim's UPDATE, and only it, its constants shown or normalized."""
    return calls("%claimed_by = %claimed_at = %started_at = COALESCE(started_at%")


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
def test_two_peers_answer_each_notification_and_the_word_goes_round_once():
    """Without a database: which of sixteen peers answer a payload."""
    names = [f"many-{i:02}" for i in range(WORKERS)]

    def responders_among(peers):
        found = {name: wakeup.Responders(name, poll=0.2) for name in peers}
        for responder in found.values():
            responder._peers = tuple(peers)
        return found

    def answering(responders, payload):
        return {name for name, responder in responders.items() if responder.chosen(payload)}

    responders = responders_among(names)
    payloads = [f"1765000{n:03}.{n}" for n in range(200)]
    chosen = {payload: answering(responders, payload) for payload in payloads}
    assert {len(names) for names in chosen.values()} == {wakeup.RESPONDERS}
    # Spread over the peers: each answers some of the 200 payloads.
    assert set().union(*chosen.values()) == set(names)
    # A freed slot of a limited queue (no payload): whoever has room.
    assert answering(responders, "") == set(names)
    # Passed on: the next two of the payload's ranking each time; after 7
    # passes the word has been round the sixteen, and goes no further.
    payload = payloads[0]
    reached = [answering(responders, f"{wakeup.PASSED_ON}{n}:{payload}") for n in range(8)]
    assert reached[0] == chosen[payload]
    assert set().union(*reached) == set(names) and sum(map(len, reached)) == WORKERS
    words = {name: r.chosen(f"{wakeup.PASSED_ON}3:{payload}") for name, r in responders.items()}
    assert {name for name, word in words.items() if word is not None} == reached[3]
    assert {words[name] for name in reached[3]} == {wakeup.Word(3, payload)}
    assert responders["many-00"].chosen("").passes == wakeup.HEARD_BY_ALL
    assert responders["many-00"].may_pass_on(6) and not responders["many-00"].may_pass_on(7)
    assert not responders["many-00"].may_pass_on(wakeup.HEARD_BY_ALL)
    # A peer leaving changes the responders of the payloads it answered, only.
    fewer = responders_among(names[1:])
    for payload in payloads:
        if "many-00" not in chosen[payload]:
            assert answering(fewer, payload) == chosen[payload]
    # A full worker passes the word on only if a peer it has yet to reach
    # had room: not one it reached already.
    word = wakeup.Word(0, payload)
    first, second = sorted(chosen[payload])
    later = sorted(set(names) - chosen[payload])
    full = responders[first]
    full._with_room = frozenset({second})
    assert not full.room_ahead(word)
    full._with_room = frozenset({second, later[0]})
    assert full.room_ahead(word)
    # And passes a word on once: the two that answered a pass both pass it.
    options = type("Options", (), {"name": first, "poll": 0.2})()
    waking = wakeup.Wakeup(options)
    waking._responders = full
    assert waking.should_pass_on(word, full=True)
    assert not waking.should_pass_on(wakeup.Word(0, payload), full=True)
    assert waking.should_pass_on(wakeup.Word(0, payloads[1]), full=False)
    # The polling is shared: sixteen peers poll as two would.
    assert responders["many-00"].spread() == WORKERS / wakeup.RESPONDERS
    # Peers not yet known (or two or fewer): every notification is its own.
    alone = wakeup.Responders("many-00", poll=0.2)
    assert alone.chosen("anything") and alone.spread() == 1.0


def payload_of(run_at):
    """The notification's payload of a run due at `run_at` (migration 0009)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM %s::timestamptz)::text", [run_at])
        return cursor.fetchone()[0]


def responders_of(payload, peers):
    """The two peers that answer `payload` (`wakeup.Responders.chosen`)."""
    found = set()
    for name in peers:
        responder = wakeup.Responders(name, poll=600)
        responder._peers = tuple(peers)
        if responder.chosen(payload):
            found.add(name)
    return found


def test_a_run_whose_two_responders_are_full_goes_to_a_peer_with_room(spawn_worker, tmp_path):
    """Four workers of one run each; three hold a run at a gate. A run
    scheduled whose notification falls to two of the full ones is claimed
    at once by the fourth, which had room: the full ones pass the word on.
    The workers poll every 600 s, so no poll finds it meanwhile."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    names = [f"room-{letter}" for letter in "abcd"]
    workers = [spawn_worker(name, "--pool", "1", "--poll", "600") for name in names]
    for worker in workers:
        worker.wait_ready(timeout=120)
    for worker in workers:
        worker.wait_for_log("is one of 4 ready worker(s)", timeout=60)
    gates = [tmp_path / f"gate-{n}" for n in range(3)]
    now = timezone.now()
    for gate in gates:
        gate.mkdir()
    Workflow.objects.bulk_create(  # one transaction, one notification: passed on to the third
        Workflow(name="tests.workflows.gated", args=[str(gate)], run_at=now) for gate in gates
    )
    wait_until(
        lambda: Worker.objects.filter(name__in=names, in_flight=1).count() == 3,
        timeout=60,
        message="three workers full, as their heartbeats say",
    )
    [idle] = Worker.objects.filter(name__in=names, in_flight=0).values_list("name", flat=True)
    reads = calls("SELECT name, workflows, queues, pool_size, in_flight FROM everystep_worker%")
    wait_until(  # eight reads by four listeners 5 s apart: each has read since
        lambda: calls("SELECT name, workflows, queues, pool_size%") >= reads + 8,
        timeout=60,
        message="every worker read its peers' heartbeats",
    )
    run_at = next(
        moment
        for moment in (now - datetime.timedelta(milliseconds=k) for k in range(1, 1000))
        if idle not in responders_of(payload_of(moment), sorted(names))
    )
    notified_before = calls("SELECT pg_notify%")
    run = Workflow.objects.create(name="tests.workflows.quick", args=[7], run_at=run_at)
    wait_until(
        lambda: Workflow.objects.get(id=run.id).status == "completed",
        timeout=30,
        message="the run completed by the worker with room",
    )
    assert Workflow.objects.get(id=run.id).claimed_by == idle
    # Passed on by the two full responders, each once, and by no one else.
    assert calls("SELECT pg_notify%") - notified_before <= 2
    for gate in gates:
        opened(gate, "first")
        opened(gate, "second")
    wait_until(
        lambda: Workflow.objects.filter(status="completed").count() == 4,
        timeout=60,
        message="the gated runs completed",
    )
    for worker in workers:
        worker.send(signal.SIGTERM)
    for worker in workers:
        assert worker.wait() == 0, worker.log()
