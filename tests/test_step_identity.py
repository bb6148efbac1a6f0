"""Step identity (§2): positional and named ids, fork prefixes, the limits."""

import pytest

from everystep import parallel, step, workflow
from everystep.engine import context
from everystep.errors import EverystepError
from everystep.models import Workflow
from tests import workflows
from tests.helpers import recorded_steps, run_to_end

pytestmark = pytest.mark.django_db(transaction=True)


def test_unnamed_steps_take_positions_and_named_ones_do_not_advance_the_counter():
    run = run_to_end(workflows.named_and_positional)
    assert run.status == Workflow.Status.COMPLETED
    assert run.result == ["one", "two", "three"]
    assert recorded_steps(run) == {
        "1": ("echo", "done", "one"),
        "middle": ("echo", "done", "two"),
        "2": ("echo", "done", "three"),
    }


def test_fork_branches_get_prefixed_ids_and_sequence_branches_return_tuples():
    run = run_to_end(workflows.fork_ids)
    assert run.status == Workflow.Status.COMPLETED
    assert run.result == ("b0", ("b1-1", "b1-2"))
    assert set(recorded_steps(run)) == {
        "1",
        "2.0.1",
        "2.1.1",
        "2.1.2",
        "fanout.0.1",
        "fanout.1.attach",
        "3",
    }


def test_ids_of_nested_forks_are_dotpaths():
    @workflow
    def nested():
        return parallel(lambda: parallel(lambda: workflows.echo("deep")), lambda: None)

    run = run_to_end(nested)
    assert run.result == (("deep",), None)
    assert set(recorded_steps(run)) == {"1.0.1.0.1"}


@pytest.mark.parametrize("bad", ["", "has space", "dot.ted", "slash/", "12", "ünï", 7])
def test_a_bad_name_is_refused_before_the_step_runs(bad, calls):
    @workflow
    def bad_name():
        workflows.echo("x", everystep_id=bad)

    run = run_to_end(bad_name)
    assert run.status == Workflow.Status.FAILED
    assert run.error["type"] == "everystep.errors.EverystepError"
    assert calls["echo"] == 0
    assert not run.steps.exists()


def test_the_same_name_twice_in_one_scope_is_refused_but_allowed_in_sibling_scopes(calls):
    @workflow
    def sibling_scopes():
        parallel(
            lambda: workflows.echo("a", everystep_id="same"),
            lambda: workflows.echo("b", everystep_id="same"),
        )
        workflows.echo("c", everystep_id="same")
        workflows.echo("d", everystep_id="same")

    run = run_to_end(sibling_scopes)
    assert run.status == Workflow.Status.FAILED
    assert "used twice" in run.error["message"]
    assert set(recorded_steps(run)) == {"1.0.same", "1.1.same", "same"}
    assert calls["echo"] == 3


def test_an_id_longer_than_300_characters_is_refused():
    ok_name = "n" * 300
    too_long = "n" * 301

    @workflow
    def long_ids():
        workflows.echo("fits", everystep_id=ok_name)
        workflows.echo("does not", everystep_id=too_long)

    run = run_to_end(long_ids)
    assert run.status == Workflow.Status.FAILED
    assert "300" in run.error["message"]
    assert set(recorded_steps(run)) == {ok_name}


def test_outside_a_workflow_steps_are_plain_calls_and_everystep_id_is_dropped(calls):
    assert context.current() is None
    assert workflows.add(2, 3, everystep_id="ignored") == 5
    assert workflows.add_twice(1, 2) == 5
    assert calls["add"] == 3
    assert not Workflow.objects.exists()


def test_outside_a_workflow_parallel_runs_branches_concurrently():
    import threading

    barrier = threading.Barrier(3, timeout=10)

    def meet(value):
        barrier.wait()  # only passes if all three branches run at once
        return value

    assert parallel(lambda: meet(1), [lambda: meet(2), lambda: 3], lambda: meet(4)) == (
        1,
        (2, 3),
        4,
    )


@pytest.mark.parametrize("branch", [[], "not callable", [lambda: 1, "x"]])
def test_parallel_refuses_what_is_not_a_branch(branch):
    with pytest.raises(TypeError):
        parallel(lambda: 1, branch)


def test_step_keeps_the_function_name_and_docstring():
    @step
    def documented():
        """Docs."""

    assert documented.__name__ == "documented"
    assert documented.__doc__ == "Docs."
    with pytest.raises(EverystepError):
        context.Context(None).next_step_id("x" * 301)
