"""The README's checkout (``examples/checkout.py``): paid in time, it makes
its invoice in a child run; unpaid for 30 minutes, it cancels the order; a
webhook delivered twice pays once."""

import json
import sys

import pytest
from django.test import RequestFactory

from everystep import schedule, testing
from everystep.models import Message, Workflow
from tests.workerproc import REPO

sys.path.insert(0, str(REPO / "examples"))
import checkout  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)


def webhook(run, event_id, amount):
    body = json.dumps({"order_run": str(run.id), "amount": amount, "id": event_id})
    request = RequestFactory().post("/webhook", body, content_type="application/json")
    return checkout.payment_webhook(request)


def test_a_paid_order_makes_its_invoice_in_a_child_run():
    run = schedule(checkout.checkout, 7)
    testing.run_scheduled()
    assert Workflow.objects.get(id=run.id).wait_topic == "payment"
    assert webhook(run, "evt_1", 4900).status_code == 204
    assert webhook(run, "evt_1", 4900).status_code == 204  # redelivered
    assert Message.objects.filter(workflow_id=run.id).count() == 1
    testing.run_scheduled()
    assert run.get_result(timeout=0) == {"paid": 4900, "invoice": "INV-7-4900"}
    child = Workflow.objects.get(parent_id=run.id)
    assert (child.name, child.status) == ("checkout.make_invoice", "completed")


def test_an_order_unpaid_for_30_minutes_is_cancelled():
    run = schedule(checkout.checkout, 8)
    testing.run_scheduled(until=29 * 60)
    assert Workflow.objects.get(id=run.id).status == "scheduled"
    assert 8 in checkout.RESERVED
    testing.run_scheduled(until=31 * 60)
    assert run.get_result(timeout=0) == "cancelled"
    assert 8 not in checkout.RESERVED
