"""A run's step graph and timeline, laid out for SVG.

`step_graph(run, steps)` gives the graph of the run's workflow
(`everystep.ui.graph`) with each node's live status — done, failed, uncertain,
in flight or pending — or, when the body has no fixed shape or its
workflow is not imported here, the recorded steps in order with the reason.
`timeline(run, steps)` puts each recorded step on a time axis, one lane per
scope: the body's own steps on one, each fork branch's on its own, side by
side. Both return plain data; the templates draw it.
"""

import dataclasses
import functools

from django.utils import timezone

from everystep.core import registry
from everystep.models import Step, Workflow
from everystep.ui import graph as graphs

NODE_WIDTH, NODE_HEIGHT, GAP_X, GAP_Y, MARGIN = 200, 44, 24, 36, 8
LANE_HEIGHT, LABEL_WIDTH, AXIS_WIDTH = 28, 150, 760

DONE, FAILED, UNCERTAIN, IN_FLIGHT, PENDING = "done", "failed", "uncertain", "in flight", "pending"
WAITING = "waiting"  # a step that failed and waits for its next attempt


@dataclasses.dataclass
class Box:
    """A node as drawn: its id, label, status and position."""

    id: str
    kind: str
    name: str
    status: str
    x: int = 0
    y: int = 0
    width: int = NODE_WIDTH
    height: int = NODE_HEIGHT
    #: The run a ``start()`` step started: the box links to it.
    child: object = None

    @property
    def short_name(self):
        return self.name.rsplit(".", 1)[-1]

    @property
    def css(self):
        return self.status.replace(" ", "-")


@dataclasses.dataclass
class Drawing:
    """Boxes and edges (``(x1, y1, x2, y2)``) in a `width` × `height` SVG;
    `fallback` says why the recorded steps are shown instead of the shape."""

    boxes: list
    edges: list
    width: int
    height: int
    fallback: str | None = None
    edges_by_id: list = dataclasses.field(default_factory=list)

    def as_dict(self):
        return {
            "nodes": [
                {
                    "id": box.id,
                    "kind": box.kind,
                    "name": box.name,
                    "status": box.status,
                    **({"child": box.child} if box.child else {}),
                }
                for box in self.boxes
            ],
            "edges": self.edges_by_id,
            "fallback": self.fallback,
        }


@functools.lru_cache(maxsize=256)
def _shape(workflow_func):
    return graphs.graph(workflow_func)


def step_graph(run, steps):
    """The run's `Drawing`: its workflow's shape with live statuses, or the
    recorded steps in order with the reason there is no shape."""
    recorded = {step.step_id: step for step in steps}
    workflow_func = registry.get(run.name)
    if workflow_func is None:
        shape = graphs.Graph(
            fallback=f"the workflow {run.name} is not imported by this process, so its "
            "source cannot be read (EVERYSTEP_WORKFLOWS)"
        )
    else:
        shape = _shape(workflow_func)
    if shape.fallback:
        return _flat(run, steps, shape.fallback)
    return _layered(run, shape.nodes, recorded)


START = "everystep.start"


def _child(step):
    """The run a recorded ``start()`` step started, or None."""
    if step is not None and step.name == START and step.status == Step.Status.DONE:
        return step.result
    return None


def _step_status(run, step):
    if step is None:
        return PENDING
    if step.status == Step.Status.STARTED:
        # A started step is recorded only for a step unsafe to repeat: it is
        # running while the run is, and uncertain once the run stopped.
        return IN_FLIGHT if run.status == Workflow.Status.RUNNING else UNCERTAIN
    if step.status in (Step.Status.RETRYING, Step.Status.WAITING):
        return WAITING
    return DONE if step.status == Step.Status.DONE else FAILED


def _statuses(run, nodes, recorded):
    """Each node's status. A step not recorded yet is in flight when the run
    is running and every node before it is done (a fork counts as done for
    its branches once the nodes before it are)."""
    by_id = {node.id: node for node in nodes}
    status = {
        node.id: _step_status(run, recorded.get(node.id)) for node in nodes if node.kind == "step"
    }

    @functools.cache
    def reached(node_id):
        node = by_id[node_id]
        if node.kind == "fork":
            return all(reached(before) for before in node.after)
        return status[node_id] == DONE

    for node in nodes:
        if node.kind == "step" and status[node.id] == PENDING:
            if run.status == Workflow.Status.RUNNING and all(reached(b) for b in node.after):
                status[node.id] = IN_FLIGHT
    for node in nodes:
        if node.kind == "fork":
            prefix = node.id + "."
            inside = [status[n.id] for n in nodes if n.kind == "step" and n.id.startswith(prefix)]
            status[node.id] = _fork_status(inside)
    return status


def _fork_status(inside):
    for worst in (FAILED, UNCERTAIN, IN_FLIGHT):
        if worst in inside:
            return worst
    if inside and all(status == DONE for status in inside):
        return DONE
    return IN_FLIGHT if DONE in inside else PENDING


def _layered(run, nodes, recorded):
    """Nodes in rows by depth (the longest chain of nodes before them),
    left to right in recording order within a row."""
    status = _statuses(run, nodes, recorded)
    depth, rows = {}, {}
    for node in nodes:
        depth[node.id] = 1 + max((depth[b] for b in node.after), default=-1)
        rows.setdefault(depth[node.id], []).append(node)
    boxes = {}
    for row, row_nodes in rows.items():
        for column, node in enumerate(row_nodes):
            boxes[node.id] = Box(
                node.id,
                node.kind,
                node.name,
                status[node.id],
                x=MARGIN + column * (NODE_WIDTH + GAP_X),
                y=MARGIN + row * (NODE_HEIGHT + GAP_Y),
                child=_child(recorded.get(node.id)),
            )
    edges, edges_by_id = [], []
    for node in nodes:
        for before in node.after:
            start, end = boxes[before], boxes[node.id]
            edges.append(
                (
                    start.x + NODE_WIDTH // 2,
                    start.y + NODE_HEIGHT,
                    end.x + NODE_WIDTH // 2,
                    end.y,
                )
            )
            edges_by_id.append([before, node.id])
    columns = max(len(row_nodes) for row_nodes in rows.values()) if rows else 0
    return Drawing(
        boxes=list(boxes.values()),
        edges=edges,
        width=2 * MARGIN + max(columns, 1) * (NODE_WIDTH + GAP_X),
        height=2 * MARGIN + max(len(rows), 1) * (NODE_HEIGHT + GAP_Y),
        edges_by_id=edges_by_id,
    )


def not_drawn(reason):
    """No drawing at all, and why."""
    return Drawing(boxes=[], edges=[], width=0, height=0, fallback=reason)


def _flat(run, steps, reason):
    """The recorded steps one under the other, in recording order."""
    boxes = [
        Box(
            step.step_id,
            "step",
            step.name,
            _step_status(run, step),
            x=MARGIN,
            y=MARGIN + index * (NODE_HEIGHT + GAP_Y // 3),
            child=_child(step),
        )
        for index, step in enumerate(steps)
    ]
    return Drawing(
        boxes=boxes,
        edges=[],
        width=2 * MARGIN + NODE_WIDTH,
        height=2 * MARGIN + max(len(steps), 1) * (NODE_HEIGHT + GAP_Y // 3),
        fallback=reason,
    )


@dataclasses.dataclass
class Bar:
    step_id: str
    name: str
    status: str
    x: float
    width: float
    seconds: float | None

    @property
    def css(self):
        return self.status.replace(" ", "-")


@dataclasses.dataclass
class Lane:
    label: str
    y: int
    bars: list


def timeline(run, steps, now=None):
    """The steps on a time axis of `AXIS_WIDTH` pixels, from the first start
    to the last end (now, for a step still started), one `Lane` per scope
    in the order of their ids (the body first, then each fork's branches);
    returns ``(lanes, total seconds)``."""
    if not steps:
        return [], 0.0
    now = now or timezone.now()
    ends = [_end(run, step, now) for step in steps]
    first = min(step.started_at for step in steps)
    total = max((max(ends) - first).total_seconds(), 0.001)
    lanes = {}
    for step, end in zip(steps, ends, strict=True):
        scope = step.step_id.rpartition(".")[0]
        lane = lanes.setdefault(scope, Lane(_lane_label(scope), 0, []))
        start = (step.started_at - first).total_seconds()
        seconds = (end - step.started_at).total_seconds()
        lane.bars.append(
            Bar(
                step.step_id,
                step.name,
                _step_status(run, step),
                x=LABEL_WIDTH + AXIS_WIDTH * start / total,
                width=max(2.0, AXIS_WIDTH * seconds / total),
                seconds=seconds if step.finished_at else None,
            )
        )
    ordered = [lanes[scope] for scope in sorted(lanes, key=_scope_order)]
    for index, lane in enumerate(ordered):
        lane.y = index * LANE_HEIGHT
    return ordered, total


def _scope_order(scope):
    """``"2.0.1.1"`` as ``((0, 2), (0, 0), (0, 1), (0, 1))``: positions in
    number order, named steps after them by name."""
    if not scope:
        return ()
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in scope.split("."))


def _end(run, step, now):
    if step.finished_at:
        return max(step.finished_at, step.started_at)
    return now if run.status == Workflow.Status.RUNNING else (run.completed_at or now)


def _lane_label(scope):
    """``""`` is the body; ``"3.1"`` is branch 1 of fork 3."""
    if not scope:
        return "body"
    fork, _, branch = scope.rpartition(".")
    return f"fork {fork}, branch {branch}"
