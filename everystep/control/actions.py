"""An operator's control of a run: cancel it, retry it after it failed.

Both are what the command line, ``manage.py`` and the operator UI call,
with the same refusals (`EverystepError`, saying why).

- `cancel`: a ``scheduled`` run (also one sleeping or waiting to retry a
  step) or a ``blocked`` one becomes ``cancelled`` at once. A ``running``
  one is asked to stop: its runner records the step in flight, starts no
  further step and ends the run ``cancelled``. If that runner's worker has
  died, the next claim of the run (its take-back, or any worker after a
  requeue) ends it so, without running a step.
- `retry`: a ``failed`` run returns to ``scheduled``, due now. Its ``done``
  steps stay recorded and are served on replay; its ``failed`` (and
  ``retrying``) step records are removed, so those steps run again. A
  ``started`` record of an unsafe step stays: its effect is unknown, so the
  replay blocks the run on it for an operator to resolve.
"""

import uuid

from django.db import transaction

from everystep.core import clock, serde
from everystep.db import store
from everystep.errors import Cancelled, EverystepError
from everystep.models import Step, Workflow

Status = Workflow.Status


def cancel(run_id, reason=None):
    """Cancel the run `run_id`, for `reason` (stored as its error). Returns
    its status: ``cancelled``, or ``running`` when its runner was asked to
    stop at the next step boundary. `EverystepError` for a run that has
    finished, or no such run."""
    with transaction.atomic():
        run = _locked(run_id)
        error = serde.encode_exception(Cancelled(reason or "cancelled by an operator"))
        if run.status in (Status.SCHEDULED, Status.BLOCKED):
            store.transition([run.id], run.status, Status.CANCELLED, error=error)
            return Status.CANCELLED
        if run.status == Status.RUNNING:
            Workflow.objects.filter(id=run.id, status=Status.RUNNING).update(
                cancel_requested_at=clock.now(), error=error
            )
            return Status.RUNNING
    raise EverystepError(
        f"run {run.id} is {run.status}: only a scheduled, running or blocked run can be cancelled"
    )


def retry(run_id):
    """Return the failed run `run_id` to ``scheduled``, due now: its done
    steps replay, its failed steps run again. Returns ``scheduled``;
    `EverystepError` for a run that is not failed, or no such run."""
    with transaction.atomic():
        run = _locked(run_id)
        if run.status != Status.FAILED:
            raise EverystepError(
                f"run {run.id} is {run.status}, not failed: only a failed run can be retried"
            )
        # A started row stays: an unsafe step whose outcome is unknown must
        # not run again, so the replay blocks the run on it, to be resolved.
        Step.objects.filter(
            workflow_id=run.id, status__in=[Step.Status.FAILED, Step.Status.RETRYING]
        ).delete()
        store.transition(
            [run.id],
            Status.FAILED,
            Status.SCHEDULED,
            error=None,
            completed_at=None,
            claimed_by=None,
            claimed_at=None,
            cancel_requested_at=None,  # a cancel asked before it failed is spent
            run_at=clock.now(),
        )
    return Status.SCHEDULED


def _locked(run_id):
    """The run `run_id`, its row locked until the transaction ends."""
    try:
        run_id = uuid.UUID(str(run_id))
    except ValueError:
        raise EverystepError(f"{run_id!r} is not a run id") from None
    run = Workflow.objects.select_for_update().filter(id=run_id).first()
    if run is None:
        raise EverystepError(f"no run {run_id}")
    return run
