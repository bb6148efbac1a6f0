"""The thread model: many runs at once on threads never mix their contexts."""

import concurrent.futures

import pytest
from django.db import connections

from everystep import schedule
from everystep.db import claims
from everystep.engine import runner
from everystep.models import Workflow
from tests import workflows

pytestmark = pytest.mark.django_db(transaction=True)


def test_many_runs_executing_concurrently_never_mix_contexts_or_step_ids():
    tags = {schedule(workflows.whoami, f"tag-{i}").id: f"tag-{i}" for i in range(40)}
    claimed = claims.claim("tests", len(tags))
    assert {c.fence.run_id for c in claimed} == set(tags)

    def execute(one):
        try:
            return runner.execute(one)
        finally:
            connections.close_all()

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        statuses = list(pool.map(execute, claimed))
    assert statuses == [Workflow.Status.COMPLETED] * len(tags)

    for run in Workflow.objects.filter(id__in=tags).prefetch_related("steps"):
        tag = tags[run.id]
        assert run.result == [
            [str(run.id), "", tag],
            [str(run.id), "2.0.", tag],
            [str(run.id), "2.1.", tag],
        ]
        assert {s.step_id: s.result for s in run.steps.all()} == {
            "1": [str(run.id), "", tag],
            "2.0.1": [str(run.id), "2.0.", tag],
            "2.1.1": [str(run.id), "2.1.", tag],
        }
