"""Serialization (§4): tagged types round-trip everywhere; others are refused."""

import decimal
import json
import subprocess
import sys
import zoneinfo

import pytest
from django.utils import timezone

from everystep import schedule
from everystep.core import serde
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


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_the_stored_text_is_compact_json(value):
    data = serde.to_json(value)
    assert serde.encode(value) == json.dumps(data, separators=(",", ":"))


def test_the_engine_adapts_a_datetime_parameter_as_django_does():
    """`sql.datetime_param` skips Django's general path for UTC times: the
    text sent must be the same, for those and for the others."""
    from django.db import connection

    from everystep.db import sql

    paris = zoneinfo.ZoneInfo("Europe/Paris")
    now = timezone.now()
    for value in (now, now.replace(microsecond=0), now.astimezone(paris), None):
        assert sql.datetime_param(connection, value) == connection.ops.adapt_datetimefield_value(
            value
        )


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
        "traceback": None,  # never raised
    }
    rebuilt = serde.decode_exception(payload)
    assert (type(rebuilt), rebuilt.reason, rebuilt.payload) == (Terminal, "halt", {"n": 1})

    odd = serde.encode_exception(ValueError(object()))
    assert odd["args"] == [odd["message"]]
    missing = serde.decode_exception({"type": "nowhere.Error", "message": "m", "args": ["m"]})
    assert isinstance(missing, StepFailure) and missing.message == "m"
    not_an_exception = serde.decode_exception({"type": "builtins.dict", "message": "m", "args": []})
    assert isinstance(not_an_exception, StepFailure)


def _raise_deep(depth):
    if depth == 0:
        raise KeyError("the missing key")
    _raise_deep(depth - 1)


def test_a_raised_exception_keeps_its_traceback_and_a_replay_shows_where_it_first_happened():
    try:
        _raise_deep(2)
    except KeyError as exc:
        payload = serde.encode_exception(exc)
    first = payload["traceback"]
    assert first.startswith("Traceback (most recent call last)")
    assert first.count("in _raise_deep") == 3 and "KeyError: 'the missing key'" in first

    try:
        raise serde.decode_exception(payload)  # a replay raising the recorded failure
    except KeyError as exc:
        again = serde.encode_exception(exc)
    assert "Recorded when it first happened:" in again["traceback"]
    assert again["traceback"].count("in _raise_deep") == 3


def test_a_huge_traceback_keeps_its_beginning_and_its_end():
    try:
        raise ValueError("x" * 20_000 + " the end")
    except ValueError as exc:
        payload = serde.encode_exception(exc)
    text = payload["traceback"]
    assert len(text) <= serde.MAX_TRACEBACK_CHARS + 3
    assert text.startswith("Traceback (most recent call last)")
    assert "in test_a_huge_traceback_keeps_its_beginning_and_its_end" in text  # the frame
    assert "\n…\n" in text and text.rstrip().endswith("the end")


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
    from everystep import step, workflow
    from everystep.engine import context, runner
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


def test_a_stored_enum_tag_naming_a_callable_that_is_not_an_enum_calls_nothing(calls):
    tag = {"__es__": "enum", "v": {"class": "tests.workflows.count", "value": "called"}}
    with pytest.raises(EverystepError, match="not an Enum"):
        serde.from_json(tag)
    assert calls["called"] == 0


def test_a_stored_exception_type_naming_a_callable_that_is_not_an_exception_calls_nothing(calls):
    payload = {"type": "tests.workflows.count", "message": "m", "args": ["called"]}
    assert isinstance(serde.decode_exception(payload), StepFailure)
    assert calls["called"] == 0


def nested(levels):
    value = []
    for _ in range(levels):
        value = [value]
    return value


def test_values_nested_past_the_depth_limit_are_refused():
    assert serde.decode(serde.encode(nested(serde.MAX_DEPTH))) == nested(serde.MAX_DEPTH)
    with pytest.raises(EverystepError, match="nested deeper than"):
        serde.encode(nested(serde.MAX_DEPTH + 1))
    with pytest.raises(EverystepError, match="nested deeper than"):
        serde.encode({"deep": nested(10_000)})


@pytest.mark.parametrize("text", ["nul\x00inside", "lone \udcff surrogate"], ids=repr)
def test_strings_no_database_can_store_are_refused(text):
    with pytest.raises(EverystepError, match="cannot store a string"):
        serde.encode(text)
    with pytest.raises(EverystepError, match="cannot store a string"):
        serde.encode({text: 1})


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("text", ["nul\x00inside", "lone \udcff surrogate"], ids=repr)
def test_a_step_result_no_database_can_store_fails_the_run_with_a_clear_error(text):
    run = run_to_end(workflows.text_from_codes, [ord(char) for char in text])
    assert run.status == Workflow.Status.FAILED
    assert "cannot store a string" in run.error["message"]
    assert not run.steps.exists()
    with pytest.raises(EverystepError, match="cannot store a string"):
        schedule(workflows.typed_values, text)


@pytest.mark.django_db(transaction=True)
def test_an_outcome_over_the_size_limit_fails_the_run_instead_of_retrying_forever(calls):
    run = run_to_end(workflows.large_outcome, serde.MAX_RECORD_BYTES + 1024)
    assert run.status == Workflow.Status.FAILED
    assert "stores at most 8 MiB per record" in run.error["message"]
    assert not run.steps.exists()
    assert calls["sized"] == 1

    fits = run_to_end(workflows.large_outcome, 1024 * 1024)
    assert fits.status == Workflow.Status.COMPLETED and fits.result == 1024 * 1024


@pytest.mark.django_db(transaction=True)
@pytest.mark.backends("mariadb")
def test_an_outcome_over_the_servers_max_allowed_packet_fails_the_run_with_a_clear_error():
    """A server configured with a packet limit below everystep's own refuses
    the record: the run fails saying so, it is not retried forever."""
    import threading

    from django.db import connection

    from everystep.engine import runner
    from tests.helpers import claim_one

    with connection.cursor() as cursor:
        cursor.execute("SELECT @@global.max_allowed_packet")
        (before,) = cursor.fetchone()
        cursor.execute("SET GLOBAL max_allowed_packet = 1048576")
    connection.close()  # the limit applies to connections opened from now on
    try:
        run = schedule(workflows.large_outcome, 2 * 1024 * 1024)
        claimed = claim_one()
        attempt = threading.Thread(target=runner.execute, args=(claimed,), daemon=True)
        attempt.start()
        attempt.join(60)
        assert not attempt.is_alive(), "the record was retried instead of failing the run"
    finally:
        connection.close()
        with connection.cursor() as cursor:
            cursor.execute(f"SET GLOBAL max_allowed_packet = {before}")
    run.refresh_from_db()
    assert run.status == Workflow.Status.FAILED
    assert "max_allowed_packet" in run.error["message"]
    assert "cannot store" in run.error["message"]
