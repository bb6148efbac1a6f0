"""OpenTelemetry spans, fed by the engine's events (`everystep.core.events`).

Every run attempt is a span on the tracer ``everystep``, named after the
workflow, with ``everystep.workflow.id``, ``everystep.workflow.name``,
``everystep.workflow.status`` and ``everystep.worker``. Each executed step
is a child span named after the step, with ``everystep.step.id``; a step
served from the record is not traced. A ``parallel()`` fork is a span whose
branches' steps nest under it across threads. A failure sets the span's
status to error with the exception recorded; a `Terminal` stop is no error.

`schedule()` stores the caller's W3C trace context on the run
(`current_context`); the attempt's span is its child — or, for an attempt
that resumes a run with recorded steps, a new trace linked to it — so a
trace started by a web request shows the run it scheduled.

The library only uses ``opentelemetry-api``: spans go wherever the
application's tracer provider sends them, and nowhere without one. A
process that has not imported OpenTelemetry has set no provider: there the
API is not even imported (it costs a worker's start-up more than it
gives), and no event is followed. Spans
start and end on the thread they belong to, so each thread keeps a stack of
its open spans; each open span is also the thread's current OpenTelemetry
context, so the step's own code sees it as its parent.
"""

import sys
import threading

from everystep.core import events
from everystep.errors import Terminal

# The OpenTelemetry API, once `_api()` imported it.
otel_context = propagate = trace = Link = SpanKind = Status = StatusCode = None

TRACER_NAME = "everystep"

_open = threading.local()  # .spans: a stack of (span, context token) on this thread


def _api():
    """Whether this process uses OpenTelemetry: it imported the API (no
    tracer provider can be set without) and the API imports here too."""
    global otel_context, propagate, trace, Link, SpanKind, Status, StatusCode
    if trace is not None:
        return True
    if "opentelemetry.trace" not in sys.modules:
        return False
    try:
        from opentelemetry import context as otel_context
        from opentelemetry import propagate, trace
        from opentelemetry.trace import Link, SpanKind, Status, StatusCode
    except ImportError:  # pragma: no cover - opentelemetry-api is a dependency
        return False
    return True


def install():
    """Subscribe the spans to the engine's events, if this process uses
    OpenTelemetry; idempotent."""
    if _api():
        events.subscribe(on_event)


def current_context():
    """The caller's W3C trace context as a dict to store with a run, or None
    outside a recorded span (or without OpenTelemetry)."""
    if not _api() or not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier = {}
    propagate.inject(carrier)
    return carrier or None


def _tracer():
    """The tracer ``everystep``, made once: a proxy until the application
    sets its tracer provider, then that provider's."""
    global _cached_tracer
    if _cached_tracer is None:
        _cached_tracer = trace.get_tracer(TRACER_NAME)
    return _cached_tracer


_cached_tracer = None


def _attempt_started(fields):
    name = fields["workflow"]
    attributes = {
        "everystep.workflow.id": str(fields["run_id"]),
        "everystep.workflow.name": name,
        "everystep.worker": fields["worker"] or "",
    }
    parent, links = None, ()
    stored = fields.get("trace_context")
    if stored:
        scheduled_by = propagate.extract(stored)
        if fields.get("resumed"):
            span_context = trace.get_current_span(scheduled_by).get_span_context()
            links = [Link(span_context)] if span_context.is_valid else ()
        else:
            parent = scheduled_by
    span = _tracer().start_span(
        name, context=parent, kind=SpanKind.CONSUMER, attributes=attributes, links=links
    )
    _push("attempt", span)


def _run_finished(fields):
    span = _find("attempt")
    if span is not None:
        span.set_attribute("everystep.workflow.status", fields["status"])
        _failed(span, fields.get("exception"))


def _attempt_ended(fields):
    span = _find("attempt")
    if span is not None and fields["status"] not in events.FINISHED:
        span.set_attribute("everystep.workflow.status", fields["status"])
        _failed(span, fields.get("exception"))  # an error of the engine's own
    _end("attempt")


def _step_started(fields):
    span = _tracer().start_span(fields["step"], attributes={"everystep.step.id": fields["step_id"]})
    _push("step", span)


def _step_ended(fields):
    span = _find("step")
    if span is not None:
        _failed(span, fields.get("exception"))
        _end("step")


def _failed(span, exception):
    """Mark `span` failed by `exception`, unless there is none or it is a
    `Terminal` (a chosen stop, not an error)."""
    if exception is None or isinstance(exception, Terminal):
        return
    span.record_exception(exception)
    span.set_status(Status(StatusCode.ERROR, f"{type(exception).__name__}: {exception}"))


def _fork_started(fields):
    span = _tracer().start_span(
        f"parallel {fields['fork_id']}",
        attributes={"everystep.step.id": fields["fork_id"], "everystep.branches": fields["count"]},
    )
    _push("fork", span)


def _fork_ended(fields):
    _end("fork")


def _push(kind, span):
    token = otel_context.attach(trace.set_span_in_context(span))
    _stack().append((kind, span, token))


def _find(kind):
    """The innermost open span of `kind` on this thread, or None."""
    for open_kind, span, _ in reversed(_stack()):
        if open_kind == kind:
            return span
    return None


def _end(kind):
    """End the innermost open span of `kind` on this thread, and the spans
    opened inside it that were left open (a step whose record failed)."""
    stack = _stack()
    if not any(open_kind == kind for open_kind, _, _ in stack):
        return
    while stack:
        open_kind, span, token = stack.pop()
        span.end()
        otel_context.detach(token)
        if open_kind == kind:
            return


def _stack():
    stack = getattr(_open, "spans", None)
    if stack is None:
        stack = _open.spans = []
    return stack


#: How each event opens, marks or ends spans: event name → handler(fields).
on_event = {
    "attempt_started": _attempt_started,
    "attempt_ended": _attempt_ended,
    **{f"run_{status}": _run_finished for status in events.FINISHED},
    "step_started": _step_started,
    "step_recorded": _step_ended,
    "step_retrying": _step_ended,
    "step_unrecorded": _step_ended,
    "fork_started": _fork_started,
    "fork_ended": _fork_ended,
}
