"""Serialization (§4): tagged types round-trip everywhere; others are refused."""

import decimal
import subprocess
import sys

import pytest

from everystep import schedule, serde
from everystep.errors import EverystepError, StepFailure, Terminal
from everystep.models import Workflow
from tests import workflows
from tests.helpers import run_to_end

VALUES = workflows.SAMPLE_VALUES


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_encode_then_decode_gives_back_the_same_value_and_type(value):
    decoded = serde.decode(serde.encode(value))
    assert decoded == value
    assert type(decoded) is type(value)


@pytest.mark.parametrize(
    "value",
    [{1, 2}, decimal.Decimal("1.5"), object(), {1: "int key"}, [float("nan")], {"x": frozenset()}],
    ids=repr,
)
def test_other_types_are_refused_naming_the_type(value):
    with pytest.raises(EverystepError, match="cannot serialize"):
        serde.encode(value)


def test_exceptions_round_trip_through_their_encoding():
    payload = serde.encode_exception(Terminal("halt", {"n": 1}))
    assert payload == {
        "type": "everystep.errors.Terminal",
        "message": "halt",
        "args": ["halt", {"n": 1}],
    }
    rebuilt = serde.decode_exception(payload)
    assert (type(rebuilt), rebuilt.reason, rebuilt.payload) == (Terminal, "halt", {"n": 1})

    odd = serde.encode_exception(ValueError(object()))
    assert odd["args"] == [odd["message"]]
    missing = serde.decode_exception({"type": "nowhere.Error", "message": "m", "args": ["m"]})
    assert isinstance(missing, StepFailure) and missing.message == "m"
    not_an_exception = serde.decode_exception({"type": "builtins.dict", "message": "m", "args": []})
    assert isinstance(not_an_exception, StepFailure)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_args_step_results_and_workflow_results_come_back_typed_from_the_store(value):
    run = run_to_end(workflows.typed_values, value)
    assert run.status == Workflow.Status.COMPLETED, run.error
    stored = Workflow.objects.get(id=run.id)
    assert stored.args == [value] and type(stored.args[0]) is type(value)
    assert stored.result == value and type(stored.result) is type(value)
    step = stored.steps.get()
    assert step.result == value and type(step.result) is type(value)
    assert step.args == [value]


@pytest.mark.django_db(transaction=True)
def test_outcomes_hold_decoded_values_on_replay():
    from everystep import context, runner, step, workflow
    from tests.helpers import attempt, crash_at

    seen = {}

    @step
    def peek():
        seen.update(context.current().outcomes)

    @workflow
    def typed_then_peek():
        workflows.echo(VALUES[8])
        peek()

    runner.fault = crash_at("2")
    schedule(typed_then_peek)
    attempt()
    runner.fault = None
    attempt(parked=True)
    assert seen["1"] == {
        "name": "tests.workflows.echo",
        "status": "done",
        "result": VALUES[8],
        "error": None,
    }


@pytest.mark.django_db(transaction=True)
def test_a_workflow_result_that_cannot_be_serialized_fails_the_run():
    run = run_to_end(workflows.returns_unserializable)
    assert run.status == Workflow.Status.FAILED
    assert "builtins.object" in run.error["message"]


@pytest.mark.django_db(transaction=True)
def test_scheduling_unserializable_arguments_is_refused_and_writes_nothing():
    with pytest.raises(EverystepError, match="builtins.set"):
        schedule(workflows.typed_values, {1})
    assert not Workflow.objects.exists()


def test_importing_everystep_does_not_import_django():
    code = "import sys, everystep; assert everystep.Terminal; print('django' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
