"""Scheduling: transactional, idempotent, one INSERT."""

import threading

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from everystep import schedule
from everystep.errors import EverystepError
from everystep.models import Workflow
from tests import workflows

pytestmark = pytest.mark.django_db(transaction=True)


class Rollback(Exception):
    pass


def test_schedule_returns_a_scheduled_row_with_its_arguments():
    run = schedule(workflows.add_twice, 1, 2)
    assert run.status == Workflow.Status.SCHEDULED
    assert run.name == "tests.workflows.add_twice"
    stored = Workflow.objects.get(id=run.id)
    assert stored.args == [1, 2]
    assert stored.id.version == 7


def test_run_ids_are_time_ordered():
    ids = [schedule(workflows.add_twice, i, i).id for i in range(20)]
    assert ids == sorted(ids)


def test_schedule_inside_a_rolled_back_transaction_leaves_nothing():
    with pytest.raises(Rollback), transaction.atomic():
        schedule(workflows.add_twice, 1, 2)
        assert Workflow.objects.count() == 1
        raise Rollback
    assert not Workflow.objects.exists()


def test_schedule_is_one_insert():
    with CaptureQueriesContext(connection) as queries:
        schedule(workflows.add_twice, 1, 2)
    assert len(queries) == 1
    assert queries[0]["sql"].startswith("INSERT")


def test_an_idempotency_key_returns_the_existing_run():
    first = schedule(workflows.add_twice, 1, 2, idempotency_key="order-7")
    again = schedule(workflows.add_twice, 9, 9, idempotency_key="order-7")
    other = schedule(workflows.named_and_positional, idempotency_key="order-7")
    assert again.id == first.id
    assert again.args == [1, 2]
    assert other.id != first.id
    assert Workflow.objects.count() == 2


def test_an_idempotency_key_inside_a_transaction_does_not_abort_it():
    with transaction.atomic():
        first = schedule(workflows.add_twice, 1, 2, idempotency_key="k")
        again = schedule(workflows.add_twice, 1, 2, idempotency_key="k")
        assert Workflow.objects.count() == 1
    assert again.id == first.id


def test_concurrent_scheduling_with_one_key_from_many_threads_yields_one_run():
    threads_count = 8
    barrier = threading.Barrier(threads_count, timeout=30)
    ids, errors = [], []

    def schedule_it():
        try:
            barrier.wait()
            ids.append(schedule(workflows.add_twice, 1, 2, idempotency_key="once").id)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=schedule_it) for _ in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len(ids) == threads_count and len(set(ids)) == 1
    assert Workflow.objects.count() == 1


def test_only_workflows_can_be_scheduled():
    with pytest.raises(TypeError, match="not an @everystep.workflow"):
        schedule(workflows.add, 1, 2)
    with pytest.raises(EverystepError, match="idempotency_key"):
        schedule(workflows.add_twice, 1, 2, idempotency_key="x" * 256)


def test_an_async_view_schedules_with_aschedule():
    from asgiref.sync import async_to_sync
    from django.test import AsyncClient

    client = AsyncClient()
    first = async_to_sync(client.get)("/order", {"key": "order-7"})
    again = async_to_sync(client.get)("/order", {"key": "order-7"})
    assert first.status_code == 200, first.content
    assert first.json() == again.json()  # idempotent, as schedule() is
    run = Workflow.objects.get(id=first.json()["id"])
    assert (run.name, run.args, run.status) == ("tests.workflows.add_twice", [1, 2], "scheduled")


def test_schedule_itself_is_refused_in_async_code_which_is_why_aschedule_exists():
    import asyncio

    from django.core.exceptions import SynchronousOnlyOperation

    async def in_a_coroutine():
        return schedule(workflows.add_twice, 1, 2)

    with pytest.raises(SynchronousOnlyOperation):
        asyncio.run(in_a_coroutine())
