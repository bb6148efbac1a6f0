"""OpenTelemetry spans (§11), recorded by the real SDK with an in-memory
exporter in this process, and printed by the zipapp's console exporter."""

import json
import signal

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from everystep import schedule
from everystep.engine import runner
from everystep.observe import tracing
from tests import workflows
from tests.helpers import attempt, crash_at, statuses, wait_until
from tests.zipapp import run_pyz, workflow_environment

pytestmark = pytest.mark.django_db(transaction=True)

_exporter = InMemorySpanExporter()


@pytest.fixture
def spans():
    """The spans this test ends, from a real SDK tracer provider (set once
    for the process: OpenTelemetry's global provider cannot be replaced)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
        trace.set_tracer_provider(provider)
    tracing.install()
    _exporter.clear()
    yield _exporter
    _exporter.clear()


def by_name(finished, name):
    found = [span for span in finished if span.name == name]
    assert len(found) == 1, f"{name}: {[span.name for span in finished]}"
    return found[0]


def test_a_run_scheduled_in_a_request_is_a_child_of_its_trace_with_its_steps(spans):
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("POST /orders") as request:
        run = schedule(workflows.quick, 5)
    assert attempt() == "completed"

    finished = spans.get_finished_spans()
    request_context = request.get_span_context()
    run_span = by_name(finished, "tests.workflows.quick")
    assert run_span.context.trace_id == request_context.trace_id
    assert run_span.parent.span_id == request_context.span_id
    assert dict(run_span.attributes) == {
        "everystep.workflow.id": str(run.id),
        "everystep.workflow.name": "tests.workflows.quick",
        "everystep.workflow.status": "completed",
        "everystep.worker": "tests",
    }
    assert run_span.status.status_code == StatusCode.UNSET
    echo, add = by_name(finished, "tests.workflows.echo"), by_name(finished, "tests.workflows.add")
    for step, step_id in ((echo, "1"), (add, "2")):
        assert step.parent.span_id == run_span.context.span_id
        assert step.attributes["everystep.step.id"] == step_id


def test_a_fork_is_a_span_whose_branches_steps_nest_under_it_across_threads(spans):
    schedule(workflows.fanned, 1)
    assert attempt() == "completed"

    finished = spans.get_finished_spans()
    run_span = by_name(finished, "tests.workflows.fanned")
    fork = by_name(finished, "parallel 1")
    assert fork.parent.span_id == run_span.context.span_id
    branch_steps = [span for span in finished if span.name.startswith("tests.workflows.")]
    branch_steps.remove(run_span)
    assert len(branch_steps) == 3
    assert {span.parent.span_id for span in branch_steps} == {fork.context.span_id}
    assert {span.attributes["everystep.step.id"] for span in branch_steps} == {
        "1.0.1",
        "1.1.1",
        "1.2.1",
    }


def test_a_failure_is_an_error_with_its_exception_and_a_terminal_stop_is_not(spans):
    schedule(workflows.failing_body)
    assert attempt() == "failed"
    schedule(workflows.stop_in_body)
    assert attempt() == "stopped"
    schedule(workflows.stop_in_branch)
    assert attempt() == "stopped"
    terminal_step = by_name(spans.get_finished_spans(), "tests.workflows.stop_here")
    assert terminal_step.status.status_code == StatusCode.UNSET

    finished = spans.get_finished_spans()
    failed = by_name(finished, "tests.workflows.failing_body")
    assert failed.status.status_code == StatusCode.ERROR
    assert failed.attributes["everystep.workflow.status"] == "failed"
    [exception] = [event for event in failed.events if event.name == "exception"]
    assert exception.attributes["exception.message"] == "the body itself failed"
    stopped = by_name(finished, "tests.workflows.stop_in_body")
    assert stopped.status.status_code == StatusCode.UNSET
    assert stopped.attributes["everystep.workflow.status"] == "stopped"


def test_a_step_that_ran_but_was_not_recorded_ends_its_span_on_its_own_thread(spans):
    """A process death after a branch's step ran: every span opened is ended,
    the unrecorded step's as an error, and nothing nests under it."""
    schedule(workflows.fanned, 1)
    runner.fault = crash_at("1.1.1")
    try:
        assert attempt() == "running"
    finally:
        runner.fault = None

    finished = spans.get_finished_spans()
    fork = by_name(finished, "parallel 1")
    steps = [
        span for span in finished if span.parent and span.parent.span_id == fork.context.span_id
    ]
    assert sorted(span.attributes["everystep.step.id"] for span in steps) == [
        "1.0.1",
        "1.1.1",
        "1.2.1",
    ]
    [crashed] = [span for span in steps if span.attributes["everystep.step.id"] == "1.1.1"]
    assert crashed.status.status_code == StatusCode.ERROR
    run_span = by_name(finished, "tests.workflows.fanned")
    assert run_span.attributes["everystep.workflow.status"] == "running"
    assert fork.parent.span_id == run_span.context.span_id


def test_a_resumed_attempt_traces_only_the_steps_it_executes_and_links_the_first(spans):
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("POST /orders") as request:
        schedule(workflows.quick, 5)
    runner.fault = crash_at("2")
    try:
        assert attempt() == "running"  # died after step 2 ran, before it was recorded
    finally:
        runner.fault = None
    first = spans.get_finished_spans()
    spans.clear()
    assert attempt(parked=True) == "completed"

    resumed = spans.get_finished_spans()
    run_span = by_name(resumed, "tests.workflows.quick")
    # Step 1 was served from the record: not traced again.
    assert [span.name for span in resumed if span is not run_span] == ["tests.workflows.add"]
    assert run_span.parent is None
    assert [link.context.span_id for link in run_span.links] == [request.get_span_context().span_id]
    assert by_name(first, "tests.workflows.quick").attributes["everystep.workflow.status"] == (
        "running"
    )


def test_the_zipapp_sends_spans_to_the_exporter_otel_traces_exporter_names(
    pyz, spawn_process, tmp_path
):
    env = workflow_environment(OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="shop-worker")
    run = run_pyz(pyz, "schedule", "tests.workflows.quick", "3", env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    run_id = run.stdout.strip()
    worker = spawn_process(
        "traced", [str(pyz), "worker", "--name", "traced"], env=env, cwd=tmp_path
    )
    wait_until(lambda: statuses([run_id]) == {"completed": 1})
    worker.send(signal.SIGTERM)
    assert worker.wait() == 0  # the batch of spans is flushed at exit
    printed = _json_objects(worker.log())
    run_span = next(span for span in printed if span.get("name") == "tests.workflows.quick")
    assert run_span["attributes"]["everystep.workflow.id"] == run_id
    assert run_span["resource"]["attributes"]["service.name"] == "shop-worker"


def test_an_unknown_traces_exporter_exits_2_with_one_line(pyz, tmp_path):
    env = workflow_environment(OTEL_TRACES_EXPORTER="zipkin-over-pigeons")
    result = run_pyz(pyz, "check", env=env, cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert (
        "OTEL_TRACES_EXPORTER='zipkin-over-pigeons' is not one of: otlp, console, none" in lines[0]
    )


def _json_objects(text):
    """The JSON objects printed in `text` (the console exporter indents them)."""
    decoder = json.JSONDecoder()
    found, index = [], 0
    while (start := text.find("{", index)) != -1:
        try:
            value, index = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            index = start + 1
            continue
        if isinstance(value, dict):
            found.append(value)
    return found
