"""The step graph read from a workflow's source (§12) gives every step the
id the engine records for it (§2), or says why the body has no fixed shape."""

import pytest

from everystep.models import Step
from everystep.ui.graph import graph
from tests import workflows
from tests.helpers import run_to_end

pytestmark = pytest.mark.django_db(transaction=True)


def recorded_ids(func, *args):
    run = run_to_end(func, *args)
    assert run.status == "completed", run.error
    return set(Step.objects.filter(workflow_id=run.id).values_list("step_id", flat=True))


def nodes(func):
    shape = graph(func)
    assert shape.fallback is None, shape.fallback
    return {node.id: node for node in shape.nodes}


@pytest.mark.parametrize(
    "func, args",
    [
        (workflows.quick, (3,)),
        (workflows.add_twice, (1, 2)),
        (workflows.named_and_positional, ()),
        (workflows.fork_ids, ()),
        (workflows.fanned, (4,)),
        (workflows.nested_forks, (5,)),
        (workflows.step_calls_step, ()),  # what a step calls inside it takes no id
    ],
    ids=lambda value: getattr(value, "__name__", ""),
)
def test_every_step_of_the_graph_has_the_id_the_engine_records(func, args):
    steps = {id for id, node in nodes(func).items() if node.kind == "step"}
    assert steps == recorded_ids(func, *args)


def test_calls_are_read_in_the_order_python_evaluates_them():
    graph_of_quick = nodes(workflows.quick)
    assert (graph_of_quick["1"].name, graph_of_quick["2"].name) == (
        "tests.workflows.echo",
        "tests.workflows.add",
    )
    assert graph_of_quick["2"].after == ["1"]


def test_named_calls_take_no_position_and_forks_nest_their_branches():
    shape = nodes(workflows.nested_forks)
    assert list(shape) == [
        "1",
        "2",
        "2.0.1",
        "2.0.1.0.1",
        "2.0.1.1.1",
        "2.0.1.1.2",
        "2.1.1",
        "2.1.named",
        "3",
    ]
    assert (shape["2"].kind, shape["2"].branches) == ("fork", 2)
    assert shape["2.0.1"].after == ["2"]
    assert shape["2.0.1.1.2"].after == ["2.0.1.1.1"]  # a sequence branch
    assert shape["2.1.named"].after == ["2.1.1"]
    # The step after a fork follows every branch's last step.
    assert sorted(shape["3"].after) == ["2.0.1.0.1", "2.0.1.1.2", "2.1.named"]


def test_a_named_fork_prefixes_its_branches_with_its_name():
    shape = nodes(workflows.fork_ids)
    assert {"fanout", "fanout.0.1", "fanout.1.attach"} <= set(shape)
    assert sorted(shape["3"].after) == ["fanout.0.1", "fanout.1.attach"]


@pytest.mark.parametrize(
    "func, reason",
    [
        (workflows.echo_values, "comprehension"),
        (workflows.napping, "comprehension"),
        (workflows.with_cleanup, "`try` statement"),
        (workflows.calls_a_helper, "doubled_by_a_helper() at line"),
    ],
    ids=lambda value: getattr(value, "__name__", str(value)),
)
def test_a_body_without_a_fixed_shape_falls_back_and_says_why(func, reason):
    shape = graph(func)
    assert shape.nodes == []
    assert reason in shape.fallback
