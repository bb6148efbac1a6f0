"""The operator UI's pages and actions.

Pages: the runs (filters, search, counts per status, keyset pages), one
run (its values, steps, graph and timeline), the blocked runs and the
workers. Each renders `everystep.ui.snapshots` data; asked by htmx, only
its live part, which the page fetches again when the stream says it
changed. Actions — resolve a blocked step, cancel a run, retry a failed
one, send it a message, fork it, requeue a lost worker's runs, cancel or
retry the runs a filter selects — call the library functions the command
line calls, with the same refusals, and answer a refusal with its reason.
"""

import json
import logging
import urllib.parse

from django.db import transaction
from django.http import HttpResponseRedirect
from django.urls import reverse
from django.views.decorators.cache import never_cache

from everystep.control import actions
from everystep.control.actions import resolve_step
from everystep.core import command_names
from everystep.db import reads
from everystep.errors import EverystepError
from everystep.models import Workflow
from everystep.ui import access, drawing, filters, responses, snapshots

logger = logging.getLogger("everystep.ui")

CANCELLABLE = (Workflow.Status.SCHEDULED, Workflow.Status.RUNNING, Workflow.Status.BLOCKED)
NOTICES = {
    "resolved": "Resolved: the run is scheduled again.",
    "cancelled": "Cancelled.",
    "cancelling": "Asked to cancel: the run stops at its next step boundary.",
    "retried": "Retried: the run is scheduled again; its done steps will replay.",
    "requeued": "Requeued: any worker may now resume those runs.",
    "sent": "Sent: the message waits in the run's mailbox for a receive() of its topic.",
    "forked": "Forked: this new run resumes from that step on the code deployed now.",
    "bulk-cancel": "Cancelled the runs selected; running ones stop at their next step boundary.",
    "bulk-retry": "Retried the failed runs selected: they are scheduled again.",
}
#: The most runs one bulk action of the UI changes; more is for the command line.
BULK_LIMIT = 10_000


def _common(request, **context):
    return {
        "may_act": access.may_act(request),
        "read_only": access.read_only(),
        "standalone": access.password() is not None,
        "notice": NOTICES.get(request.GET.get("notice", "")),
        **context,
    }


@never_cache
@access.viewer
@transaction.non_atomic_requests
def runs(request):
    """The runs, newest first, a page at a time."""
    context = {
        "statuses": reads.STATUSES,
        "query": request.GET,
        "active": {},
    }
    try:
        context["active"] = filters.active(request.GET)
        data = snapshots.runs(request.GET)
    except EverystepError as exc:
        return responses.page(request, "runs", _common(request, **context, error=str(exc)), 400)
    if data["next_cursor"]:
        context["next_page"] = "?" + urllib.parse.urlencode(
            {**context["active"], "cursor": data["next_cursor"]}
        )
    page = {
        **context["active"],
        **({"cursor": request.GET["cursor"]} if "cursor" in request.GET else {}),
    }
    context["stream_query"] = _stream_query("runs", page, data)
    counts = [
        (status, _count_text(data["counts"][status]), _status_link(context["active"], status))
        for status in reads.STATUSES
    ]
    return responses.page(request, "runs", _common(request, **context, data=data, counts=counts))


@never_cache
@access.viewer
@transaction.non_atomic_requests
def run(request, run_id):
    """One run: values, steps, graph, timeline; a blocked run's resolutions."""
    page = request.GET.get("page", 1)
    try:
        data = snapshots.run(run_id, page)
    except snapshots.NotFound as exc:
        return responses.problem(request, 404, str(exc))
    return responses.page(request, "run", _common(request, **_run_context(data, page=page)))


def _run_context(data, page=1, **extra):
    found, steps, graph, recorded = data["_model"]
    lanes, total = drawing.timeline(found, recorded) if recorded is not None else ([], 0)
    return {
        "run": found,
        "data": data,
        "steps": list(zip(steps, data["steps"], strict=True)),
        "graph": graph,
        "lanes": lanes,
        "timeline_seconds": total,
        "timeline_height": max(1, len(lanes)) * drawing.LANE_HEIGHT,
        "timeline_width": drawing.LABEL_WIDTH + drawing.AXIS_WIDTH + 10,
        "label_width": drawing.LABEL_WIDTH,
        "uncertain": [s for s in steps if s.status == "started"]
        if found.status == Workflow.Status.BLOCKED
        else [],
        "may_cancel": found.status in CANCELLABLE,
        "may_send": found.status not in Workflow.ENDED,
        "may_fork": found.status != Workflow.Status.RUNNING and bool(steps),
        "may_retry": found.status == Workflow.Status.FAILED,
        "stream_query": _stream_query("run", {"id": str(found.id), "page": page}, data),
        **extra,
    }


@never_cache
@access.viewer
@transaction.non_atomic_requests
def blocked(request):
    """The blocked runs, each with its uncertain step and the resolutions."""
    return _whole_view(request, "blocked", snapshots.blocked())


@never_cache
@access.viewer
@transaction.non_atomic_requests
def workers(request):
    """Every worker: state, host, pid, pool, heartbeat, the runs it holds."""
    return _whole_view(request, "workers", snapshots.workers())


@never_cache
@access.viewer
@transaction.non_atomic_requests
def queues(request):
    """Every queue: limits, running, due, held back and why, who serves it."""
    return _whole_view(request, "queues", snapshots.queues())


def _whole_view(request, view, data):
    """A page showing one snapshot, taking no parameters, with its stream."""
    context = _common(request, data=data, stream_query=_stream_query(view, {}, data))
    return responses.page(request, view, context)


@access.actor
@transaction.non_atomic_requests
def resolve(request, run_id):
    """Resolve a blocked run's uncertain step: with a result (JSON), an
    error message, or discarded so it runs again."""
    step_id = request.POST.get("step_id", "")
    how = request.POST.get("how", "")
    try:
        resolution = _resolution(how, request.POST)
    except BadForm as exc:
        return _refused(request, run_id, str(exc), 400)
    try:
        resolve_step(run_id, step_id, **resolution)
    except EverystepError as exc:
        return _refused(request, run_id, str(exc), 409)
    access.acted(
        request,
        "resolve",
        f"run {run_id}: step {step_id} resolved ({how})",
        run_id=str(run_id),
        step_id=step_id,
        resolution=how,
    )
    return _back(reverse("everystep:run", args=[run_id]), "resolved")


@access.actor
@transaction.non_atomic_requests
def cancel(request, run_id):
    """Cancel the run: at once, or at its next step boundary if it runs."""
    reason = _reason(request.POST)
    try:
        status = actions.cancel(run_id, reason)
    except EverystepError as exc:
        return _refused(request, run_id, str(exc), 409)
    running = status == Workflow.Status.RUNNING
    access.acted(
        request,
        "cancel",
        f"run {run_id}: {'cancel asked' if running else 'cancelled'}",
        run_id=str(run_id),
    )
    return _back(reverse("everystep:run", args=[run_id]), "cancelling" if running else "cancelled")


@access.actor
@transaction.non_atomic_requests
def retry(request, run_id):
    """Schedule the failed run again."""
    try:
        actions.retry(run_id)
    except EverystepError as exc:
        return _refused(request, run_id, str(exc), 409)
    access.acted(request, "retry", f"run {run_id}: retried", run_id=str(run_id))
    return _back(reverse("everystep:run", args=[run_id]), "retried")


@access.actor
@transaction.non_atomic_requests
def send(request, run_id):
    """Send a message to the run (an approval, a webhook replayed by hand)."""
    topic = request.POST.get("topic", "").strip()
    try:
        payload = _json_field("the payload", request.POST.get("payload", "").strip() or "null")
        actions.send(run_id, topic, payload)
    except EverystepError as exc:
        return _refused(request, run_id, str(exc), 409)
    access.acted(request, "send", f"run {run_id}: message on {topic} sent", run_id=str(run_id))
    return _back(reverse("everystep:run", args=[run_id]), "sent")


@access.actor
@transaction.non_atomic_requests
def fork(request, run_id):
    """Start a new run from one of this run's steps; its page next."""
    from_step = request.POST.get("from_step", "").strip()
    try:
        forked = actions.fork(run_id, from_step)
    except EverystepError as exc:
        return _refused(request, run_id, str(exc), 409)
    access.acted(
        request,
        "fork",
        f"run {run_id}: forked from step {from_step} as {forked}",
        run_id=str(run_id),
    )
    return _back(reverse("everystep:run", args=[forked]), "forked")


class BadForm(EverystepError):
    """The action's form is filled in wrongly; says what to fix."""


def _resolution(how, form):
    if how == "result":
        return {"result": _json_field("the result", form.get("result", ""))}
    if how == "error":
        message = form.get("error", "").strip()
        if not message:
            raise BadForm("give the error message to record")
        return {"error": message}
    if how == "discard":
        return {"discard": True}
    raise BadForm(f"{how!r} is not a resolution: choose result, error or discard")


def _json_field(what, text):
    """A form field's JSON, decoded; `BadForm` saying what is wrong."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # a JSONDecodeError is a ValueError
        reason = getattr(exc, "msg", None) or (
            "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        )
        raise BadForm(f"{what} is not valid JSON ({reason}): {text[:60]!r}") from None


def _refused(request, run_id, reason, status):
    """The run's page again, with the reason the action was refused, or a
    problem page when the run itself cannot be shown."""
    try:
        data = snapshots.run(run_id)
    except snapshots.NotFound as exc:
        return responses.problem(request, 404, str(exc))
    context = _common(request, **_run_context(data, error=f"Refused: {reason}"))
    return responses.page(request, "run", context, status=status)


@access.actor
@transaction.non_atomic_requests
def requeue(request):
    """Requeue the runs parked under a lost worker's name; refused while
    that worker is alive."""
    name = request.POST.get("worker", "").strip()
    if not name:
        return responses.problem(request, 400, "name the worker whose runs to requeue")
    try:
        requeued = actions.requeue(claimed_by=name)
    except EverystepError as exc:
        return responses.problem(request, 409, f"Refused: {exc}")
    access.acted(
        request,
        "requeue",
        f"{len(requeued)} run(s) of worker {name} requeued",
        worker=name,
        count=len(requeued),
    )
    return _back(reverse("everystep:workers"), "requeued")


@access.actor
@transaction.non_atomic_requests
def bulk(request, action):
    """Cancel (``cancel``) or retry (``retry``) the runs the runs page's
    filter selects. A first POST answers a page naming how many runs that
    is; its form, confirmed, posts that count back, and the runs are then
    changed one by one as each would be alone. A count that changed in
    between is named again instead of acted on."""
    if action not in actions.BULK:
        return responses.problem(request, 404, f"{action!r} is not a bulk action")
    form = request.POST
    try:
        selection = filters.active(form)
        if not selection:
            raise EverystepError(
                "choose a filter first; to act on every run, use the command line's --all"
            )
        run_filter = filters.run_filter(form)
        count = actions.count_matching(action, run_filter, BULK_LIMIT + 1)
    except EverystepError as exc:
        return responses.problem(request, 400, f"Refused: {exc}")
    if count > BULK_LIMIT:
        return responses.problem(
            request,
            409,
            f"Refused: more than {BULK_LIMIT:,} runs; use {command_names.command(action)} "
            "with the same filters on the command line",
        )
    back = f"{reverse('everystep:runs')}?{urllib.parse.urlencode(selection)}"
    if form.get("confirmed") != str(count) or count == 0:
        context = {"action": action, "count": count, "selection": selection, "back": back}
        return responses.page(request, "bulk", _common(request, **context))
    if action == "cancel":
        changed = actions.cancel_matching(run_filter, _reason(form))
    else:
        changed = actions.retry_matching(run_filter)
    described = " ".join(f"{name}={value}" for name, value in selection.items())
    access.acted(
        request,
        f"bulk_{action}",
        f"{action} of {len(changed)} run(s) selected by {described}",
        count=len(changed),
        selection=described,
    )
    return _back(back, f"bulk-{action}")


def _reason(form):
    """A cancel's reason as its form gives it: None when left empty."""
    return form.get("reason", "").strip()[:500] or None


def _back(url, notice):
    separator = "&" if "?" in url else "?"
    response = HttpResponseRedirect(f"{url}{separator}notice={notice}")
    response.status_code = 303
    return response


def _stream_query(view, params, data):
    """The page's stream: its view and parameters, and the digest of the data
    it was rendered with (`snapshots.encoded`)."""
    return urllib.parse.urlencode({"view": view, **params, "last": snapshots.encoded(data)[1]})


def _status_link(active, status):
    return "?" + urllib.parse.urlencode({**active, "status": status})


def _count_text(count):
    return f"{reads.COUNT_CAP:,}+" if count > reads.COUNT_CAP else f"{count:,}"
