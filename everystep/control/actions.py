"""What an operator does to runs: cancel, retry, resolve a blocked step,
requeue a lost worker's runs, send a run a message, prune finished runs,
fork a run from one of its steps.

Every front end — the command line, ``manage.py`` and the operator UI —
calls these, so each refuses the same things in the same words
(`EverystepError`, saying why and what to do instead). Each reads its run
ids with `everystep.core.ids.parse_run_id`, and its statements are
`everystep.db`'s.

- `cancel`: a ``scheduled`` run (also one sleeping, waiting for a message
  or a run, or waiting to retry a step) or a ``blocked`` one becomes
  ``cancelled`` at once, and so do the unfinished runs it started. A ``running``
  one is asked to stop: its runner records the step in flight, starts no
  further step and ends the run ``cancelled``. If that runner's worker has
  died, the next claim of the run (its take-back, or any worker after a
  requeue) ends it so, without running a step.
- `retry`: a ``failed`` run returns to ``scheduled``, due now. Its ``done``
  steps stay recorded and are served on replay; its ``failed`` (and
  ``retrying``) step records are removed, so those steps run again. A
  ``started`` record of an unsafe step stays: its effect is unknown, so the
  replay blocks the run on it for an operator to resolve.
- `resolve_step`: a run ends ``blocked`` when an unsafe-to-repeat step
  started but its outcome was never recorded. Once the operator knows what
  happened, one of three resolutions records it and puts the run back to
  ``scheduled``: ``result`` (the step succeeded with this value), ``error``
  (it failed with this message) or ``discard`` (it never took effect: run
  it again).
- `requeue`: put runs parked under a worker name back to ``scheduled``,
  refused while that worker is alive. It holds the worker's name lock
  across its UPDATE, so the worker cannot start and resume them meanwhile.
"""

import contextlib
import dataclasses
import datetime
import itertools

from django.db import transaction

from everystep.core import clock, command_names, serde
from everystep.core.ids import parse_run_id
from everystep.db import mailbox, reads, retention, runs, steps
from everystep.db.namelock import name_lock
from everystep.errors import Cancelled, EverystepError, StepFailure
from everystep.models import Step, Workflow

Status = Workflow.Status
_UNSET = object()


def cancel(run_id, reason=None):
    """Cancel the run `run_id`, for `reason` (stored as its error), and the
    unfinished runs it started, and theirs. Returns its status:
    ``cancelled``, or ``running`` when its runner was asked to stop at the
    next step boundary. `EverystepError` for a run that has finished, or no
    such run."""
    with _locked(run_id) as run:
        error = serde.encode_exception(Cancelled(reason or "cancelled by an operator"))
        if run.status in (Status.SCHEDULED, Status.BLOCKED):
            runs.transition([run.id], run.status, Status.CANCELLED, error=error)
            runs.cancel_descendants(run.id)
            return Status.CANCELLED
        if run.status == Status.RUNNING:
            runs.ask_to_cancel(run.id, error)
            runs.cancel_descendants(run.id)
            return Status.RUNNING
    raise EverystepError(
        f"run {run.id} is {run.status}: only a scheduled, running or blocked run can be cancelled"
    )


def retry(run_id):
    """Return the failed run `run_id` to ``scheduled``, due now: its done
    steps replay, its failed steps run again. Returns ``scheduled``;
    `EverystepError` for a run that is not failed, or no such run."""
    with _locked(run_id) as run:
        if run.status != Status.FAILED:
            raise EverystepError(
                f"run {run.id} is {run.status}, not failed: only a failed run can be retried"
            )
        steps.forget_failed(run.id)
        runs.reschedule(run.id, Status.FAILED, run_at=clock.now())
    return Status.SCHEDULED


def resolve_step(run_id, step_id, *, result=_UNSET, error=None, discard=False):
    """Resolve the ``started`` step `step_id` of the blocked run `run_id`
    and return the run to ``scheduled``; exactly one resolution is given.

    Raises `EverystepError` with the reason when the run is not blocked or
    the step is not its started one.
    """
    chosen = [result is not _UNSET, error is not None, bool(discard)]
    if chosen.count(True) != 1:
        raise EverystepError("give exactly one of a result, an error or discard")
    if result is not _UNSET:
        serde.to_json(result)
    with _locked(run_id) as run:
        if run.status != Status.BLOCKED:
            raise EverystepError(
                f"run {run.id} is {run.status}, not blocked: only a blocked run's "
                f"started step can be resolved"
            )
        step = steps.started(run.id, step_id)
        if discard:
            steps.discard(step)
        elif error is not None:
            failure = serde.encode_exception(StepFailure(error))
            steps.settle(step, Step.Status.FAILED, error=failure)
        else:
            steps.settle(step, Step.Status.DONE, result=result)
        runs.reschedule(run.id, Status.BLOCKED, claim_token=None)


def send(run_id, topic, payload=None, idempotency_key=None):
    """Send a message to the run `run_id`, as `everystep.send` does from
    application code. `EverystepError` saying why for a bad topic or
    payload, or a run that does not exist or has ended."""
    run_id = mailbox.check(run_id, topic, payload, idempotency_key)
    mailbox.send(run_id, topic, payload, idempotency_key)


CANCELLABLE = (Status.SCHEDULED, Status.RUNNING, Status.BLOCKED)
#: Runs a bulk action reads at a time.
BULK_PAGE = 500


def cancel_matching(run_filter, reason=None, *, dry_run=False):
    """Cancel every run `run_filter` (a `reads.RunFilter`) selects, one by
    one as `cancel` does (a running run is asked to stop at its next step
    boundary), and the runs they started. Without a status in the filter:
    every scheduled, running and blocked run it selects. Returns ``[(run
    id, status)]``: ``cancelled`` or ``running`` (asked), or the status
    each has now with `dry_run`; a run that ended meanwhile is left out."""
    return _each_matching("cancel", run_filter, lambda run_id: cancel(run_id, reason), dry_run)


def retry_matching(run_filter, *, dry_run=False):
    """Retry every failed run `run_filter` selects, one by one as `retry`
    does. Returns ``[(run id, status)]`` of the runs retried (``scheduled``)
    or, with `dry_run`, that would be."""
    return _each_matching("retry", run_filter, retry, dry_run)


#: What each bulk action may change: the statuses it acts on, and its
#: past participle for a refusal.
BULK = {"cancel": (CANCELLABLE, "cancelled"), "retry": ((Status.FAILED,), "retried")}


def count_matching(action, run_filter, up_to):
    """How many runs the bulk `action` (``cancel``, ``retry``) would change
    now among those `run_filter` selects, counted up to `up_to`."""
    return sum(1 for _ in itertools.islice(_matching(action, run_filter), up_to))


def _each_matching(action, run_filter, change, dry_run):
    done = []
    for run_id, status in _matching(action, run_filter):
        if dry_run:
            done.append((run_id, status))
            continue
        try:
            done.append((run_id, change(run_id)))
        except EverystepError:
            continue  # it ended or changed meanwhile
    return done


def _matching(action, run_filter):
    """``(run id, status)`` of the runs `run_filter` selects that `action`
    may change; `EverystepError` when the filter's status is not one."""
    allowed, verb = BULK[action]
    if run_filter.status is None:
        return _selected(run_filter, allowed)
    if run_filter.status not in allowed:
        raise EverystepError(
            f"a {run_filter.status} run is not {verb}: only {', '.join(allowed)} runs are"
        )
    return _selected(run_filter, [run_filter.status])


def _selected(run_filter, statuses):
    """``(run id, status)`` of the runs the filter selects in `statuses`,
    read a page at a time, newest first."""
    for status in statuses:
        page_filter = dataclasses.replace(run_filter, status=status)
        cursor = None
        while True:
            page = reads.runs_page(page_filter, cursor, size=BULK_PAGE)
            yield from ((run.id, run.status) for run in page.runs)
            if page.next_cursor is None:
                break
            cursor = page.next_cursor


def fork(run_id, from_step):
    """Start a new run of the run `run_id`'s workflow with its arguments,
    its queue and priority, whose recorded steps before `from_step` (in the
    order they were recorded, a fork's branches included) are copied done
    or failed as they were: it resumes from `from_step` on the code
    deployed now. The new run names its origin. Returns its id.

    `EverystepError` for a running run (it may still record steps), and for
    a step it never recorded (the message lists those it did)."""
    with _locked(run_id) as run:
        if run.status == Status.RUNNING:
            raise EverystepError(
                f"run {run.id} is running and may still record steps: fork it once it has "
                f"ended, or cancel it first"
            )
        return runs.fork(run, from_step)


#: What `prune` deletes unless told: the runs that ended as they should.
PRUNED_BY_DEFAULT = (Status.COMPLETED, Status.STOPPED, Status.CANCELLED)
#: What it may be told to delete too: a failed or blocked run is kept for an
#: operator unless named.
PRUNABLE = (*PRUNED_BY_DEFAULT, Status.FAILED, Status.BLOCKED)


def prune(
    older_than, statuses=None, workflow=None, *, dry_run=False, progress=None, should_stop=None
):
    """Delete the runs that ended more than `older_than` seconds ago in one
    of `statuses` (by default completed, stopped and cancelled), of the
    workflow `workflow` if given, with their steps, messages and events, a
    batch at a time (`everystep.db.retention`); `progress(deleted)` is
    called after each batch, and `should_stop()`, if given, before each
    next one: True ends the prune there. Returns how many runs were (with `dry_run`:
    would be) deleted. `EverystepError` for a duration that is not more
    than 0 or a status that is not a finished one."""
    if not older_than > 0:
        raise EverystepError("--older-than must be more than 0: a run that just ended is kept")
    statuses = tuple(statuses or PRUNED_BY_DEFAULT)
    for status in statuses:
        if status not in PRUNABLE:
            known = ", ".join(PRUNABLE)
            raise EverystepError(f"status {status!r} is not a finished run's: prune takes {known}")
    before = clock.now() - datetime.timedelta(seconds=older_than)
    if dry_run:
        return retention.count(before, statuses, workflow)
    deleted = 0
    while batch := retention.delete_batch(before, statuses, workflow):
        deleted += batch
        if progress is not None:
            progress(deleted)
        if should_stop is not None and should_stop():
            break
        retention.yield_to_writers()
    return deleted


@contextlib.contextmanager
def _locked(run_id):
    """The run `run_id` (as typed), its row locked for the block, which is
    one transaction."""
    with transaction.atomic():
        yield runs.locked(parse_run_id(run_id))


class WorkerAlive(EverystepError):
    """The action needs a worker to be gone, and it holds its name."""


def requeue(run_ids=None, *, claimed_by=None):
    """Put ``running`` runs — these ids, or every one parked under the worker
    name `claimed_by` — back to ``scheduled``; returns the ids requeued.

    Refused with `WorkerAlive` when a worker holding one of their names is
    alive: it resumes its own runs. Each name's lock is held across the
    UPDATE, so no worker can start under it and resume them meanwhile.
    """
    if (run_ids is None) == (claimed_by is None):
        raise EverystepError("give run ids or a worker name, not both")
    if run_ids is None:
        names = {claimed_by}
    else:
        run_ids = [parse_run_id(run_id) for run_id in run_ids]
        found = runs.run_holders(run_ids)
        _refuse_unless_running(run_ids, found)
        names = {worker for _, worker in found.values()}
    with contextlib.ExitStack() as held:
        for name in sorted(name for name in names if name):
            held.enter_context(_holding_name(name))
        with transaction.atomic():
            if run_ids is not None:
                # Read again under the names' locks, the rows locked too: a
                # run requeued and claimed by a live worker meanwhile is
                # refused, not taken from it.
                _refuse_unless_running(run_ids, runs.run_holders(run_ids, lock=True), names)
            return runs.requeue_runs(run_ids, claimed_by=claimed_by)


def _refuse_unless_running(run_ids, found, names=None):
    """`EverystepError` naming each of `run_ids` that does not exist, is
    not ``running`` or (given the `names` locked) is held by another worker;
    `found` maps id → (status, worker). Requeue changes nothing unless it
    can requeue every run asked."""
    problems = []
    for run_id in run_ids:
        status, worker = found.get(run_id, (None, None))
        if status is None:
            problems.append(f"no run {run_id}")
        elif status != Workflow.Status.RUNNING:
            problems.append(f"run {run_id} {_why_not_running(status)}")
        elif names is not None and worker not in names:
            problems.append(f"run {run_id} is now held by worker {worker}")
    if problems:
        raise EverystepError("; ".join(problems) + " (only running runs are requeued)")


def _why_not_running(status):
    """Why a run in `status` is not requeued, and what to do instead."""
    if status == Workflow.Status.SCHEDULED:
        return "is scheduled: a worker will claim it"
    if status == Workflow.Status.FAILED:
        return f"failed: run it again with {command_names.command('retry')}"
    if status == Workflow.Status.BLOCKED:
        return f"is blocked: resolve its step with {command_names.command('resolve-step')}"
    return f"is {status}: it has ended"


@contextlib.contextmanager
def _holding_name(name):
    lock = name_lock(name)
    if not lock.try_acquire():
        lock.release()
        raise WorkerAlive(
            f"worker {name!r} is alive (it holds its name): stop it, or let it resume its own runs"
        )
    try:
        yield
    finally:
        lock.release()
