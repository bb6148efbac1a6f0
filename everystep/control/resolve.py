"""Operator recovery: resolving a blocked run's uncertain step.

A run ends ``blocked`` when an unsafe-to-repeat step started but its outcome
was never recorded. Once the operator knows what happened, one of three
resolutions records it and puts the run back to ``scheduled``:
``result`` (the step succeeded with this value), ``error`` (it failed with
this message) or ``discard`` (it never took effect: run it again).
"""

import uuid

from django.db import transaction
from django.utils import timezone

from everystep.core import serde
from everystep.db import store
from everystep.errors import EverystepError, StepFailure
from everystep.models import Step, Workflow

_UNSET = object()


def resolve_step(workflow_id, step_id, *, result=_UNSET, error=None, discard=False):
    """Resolve the ``started`` step `step_id` of the blocked run `workflow_id`
    and return the run to ``scheduled``; exactly one resolution is given.

    Raises `EverystepError` with the reason when the run is not blocked or
    the step is not its started one.
    """
    chosen = [result is not _UNSET, error is not None, bool(discard)]
    if chosen.count(True) != 1:
        raise EverystepError("give exactly one of a result, an error or discard")
    if result is not _UNSET:
        serde.to_json(result)
    try:
        workflow_id = uuid.UUID(str(workflow_id))
    except ValueError:
        raise EverystepError(f"{workflow_id!r} is not a run id") from None
    with transaction.atomic():
        run = Workflow.objects.select_for_update().filter(id=workflow_id).first()
        if run is None:
            raise EverystepError(f"no run {workflow_id}")
        if run.status != Workflow.Status.BLOCKED:
            raise EverystepError(
                f"run {workflow_id} is {run.status}, not blocked: only a blocked run's "
                f"started step can be resolved"
            )
        step = Step.objects.filter(workflow=run, step_id=step_id).first()
        if step is None or step.status != Step.Status.STARTED:
            state = "not recorded" if step is None else step.status
            raise EverystepError(
                f"step {step_id} of run {workflow_id} is {state}, not started: "
                f"only the started step of a blocked run can be resolved"
            )
        if discard:
            step.delete()
        else:
            step.status = Step.Status.FAILED if error is not None else Step.Status.DONE
            step.result = None if error is not None else result
            step.error = serde.encode_exception(StepFailure(error)) if error is not None else None
            step.finished_at = timezone.now()
            step.save(update_fields=["status", "result", "error", "finished_at"])
        store.transition(
            [run.id],
            Workflow.Status.BLOCKED,
            Workflow.Status.SCHEDULED,
            claimed_by=None,
            claim_token=None,
            claimed_at=None,
            error=None,
            completed_at=None,
            cancel_requested_at=None,  # resolving it is asking it to go on
        )
