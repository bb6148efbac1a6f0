"""The intended shape of a workflow, read from its source.

`graph(workflow_func)` parses the body of a workflow and, when it is a
straight sequence of step calls and ``parallel()`` forks, returns the steps
it will record, with their ids exactly as §2 of the contract assigns them
(each scope counts its unnamed calls from 1; a call with ``everystep_id``
takes its name and no position; branch ``i`` of fork ``F`` is the scope
``F.i.``), and the order between them. Anything else — a loop, a branch, a
helper function whose steps cannot be seen, a workflow calling a workflow —
has no fixed shape: the graph then says why, and the operator UI draws the
steps as they were recorded instead.

Calls are taken in the order Python evaluates them: ``add(n, echo(n))``
records ``echo`` as 1 and ``add`` as 2.
"""

import ast
import builtins
import dataclasses
import inspect
import textwrap


@dataclasses.dataclass
class Node:
    """A step, or a fork, of the graph. `after` lists the ids of the nodes
    that end before it starts (a fork's successor follows all its branches)."""

    id: str
    kind: str  # "step" or "fork"
    name: str  # the step's qualified name; "parallel" for a fork
    after: list = dataclasses.field(default_factory=list)
    branches: int = 0


@dataclasses.dataclass
class Graph:
    """The nodes in recording order, or, when the body has no fixed shape,
    none and the `fallback` reason."""

    nodes: list = dataclasses.field(default_factory=list)
    fallback: str | None = None

    def as_dict(self):
        return {
            "nodes": [dataclasses.asdict(node) for node in self.nodes],
            "fallback": self.fallback,
        }


class NoShape(Exception):
    """The body is not a straight sequence of steps and forks; says why."""


def graph(workflow_func):
    """The `Graph` of `workflow_func`, a ``@workflow`` function."""
    try:
        source = textwrap.dedent(inspect.getsource(workflow_func))
    except (OSError, TypeError):
        return Graph(fallback="its source is not available")
    function = ast.parse(source).body[0]
    if not isinstance(function, ast.FunctionDef):
        return Graph(fallback="it is not a plain function")
    reader = _Reader(workflow_func.__globals__)
    try:
        reader.scope(_body(function), prefix="", after=[])
    except NoShape as exc:
        return Graph(fallback=str(exc))
    return Graph(nodes=reader.nodes)


def _body(function):
    """The body's statements, without its docstring."""
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return body


class _Reader:
    """Walks a body in evaluation order, giving ids as the engine would."""

    def __init__(self, namespace):
        self.namespace = namespace
        self.nodes = []

    def scope(self, statements, prefix, after):
        """Read the statements of one scope; returns the ids the next node
        in the enclosing order follows."""
        counter = _Counter(prefix)
        for statement in statements:
            after = self.statement(statement, counter, after)
        return after

    def statement(self, statement, counter, after):
        if isinstance(statement, ast.Expr | ast.Return | ast.Assign | ast.AnnAssign):
            if statement.value is None:
                return after
            return self.expression(statement.value, counter, after)
        if isinstance(statement, ast.Pass):
            return after
        kind = type(statement).__name__.lower()
        raise NoShape(f"the body has a `{kind}` statement at line {statement.lineno}")

    def expression(self, node, counter, after):
        """Read the calls of an expression, innermost first (as evaluated)."""
        if isinstance(node, ast.Lambda | ast.ListComp | ast.SetComp | ast.DictComp):
            raise NoShape(f"a comprehension or lambda at line {node.lineno} may repeat steps")
        if isinstance(node, ast.GeneratorExp):
            raise NoShape(f"a generator at line {node.lineno} may repeat steps")
        if isinstance(node, ast.Call):
            return self.call(node, counter, after)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                after = self.expression(child, counter, after)
        return after

    def call(self, node, counter, after):
        target = self.resolve(node.func)
        if target is _parallel():
            return self.fork(node, counter, after)
        for argument in [*node.args, *(keyword.value for keyword in node.keywords)]:
            after = self.expression(argument, counter, after)
        step_name = getattr(target, "__everystep_step__", None)
        if step_name is None:
            if getattr(target, "__everystep_workflow__", None) is not None:
                raise NoShape(f"it calls the workflow {_text(node.func)} at line {node.lineno}")
            if target is not None and getattr(builtins, _text(node.func), None) is target:
                return after  # a builtin calls no step
            raise NoShape(
                f"it calls {_text(node.func)}() at line {node.lineno}, whose steps cannot be seen"
            )
        step_id = counter.next(_named(node))
        self.nodes.append(Node(step_id, "step", step_name, after=list(after)))
        return [step_id]

    def fork(self, node, counter, after):
        if node.keywords and any(k.arg != "everystep_id" for k in node.keywords):
            raise NoShape(f"parallel() at line {node.lineno} takes unknown arguments")
        fork_id = counter.next(_named(node))
        fork = Node(fork_id, "fork", "parallel", after=list(after), branches=len(node.args))
        self.nodes.append(fork)
        ends = []
        for index, branch in enumerate(node.args):
            calls = branch.elts if isinstance(branch, ast.List) else [branch]
            statements = []
            for call in calls:
                if not isinstance(call, ast.Lambda) or call.args.args:
                    raise NoShape(
                        f"branch {index} of parallel() at line {node.lineno} is not a lambda"
                    )
                statements.append(ast.Expr(call.body))
            ends.extend(self.scope(statements, f"{fork_id}.{index}.", [fork_id]))
        return ends or [fork_id]

    def resolve(self, node):
        """The object a call's target names in the workflow's module, or None."""
        if isinstance(node, ast.Name):
            if node.id in self.namespace:
                return self.namespace[node.id]
            return getattr(builtins, node.id, None)
        if isinstance(node, ast.Attribute):
            owner = self.resolve(node.value)
            return getattr(owner, node.attr, None) if owner is not None else None
        return None


class _Counter:
    """A scope's ids: positions for unnamed calls, names for named ones."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.position = 0

    def next(self, name):
        if name is not None:
            return f"{self.prefix}{name}"
        self.position += 1
        return f"{self.prefix}{self.position}"


def _named(call):
    """The literal ``everystep_id`` of a call, None without one."""
    for keyword in call.keywords:
        if keyword.arg == "everystep_id":
            if not isinstance(keyword.value, ast.Constant) or not isinstance(
                keyword.value.value, str
            ):
                raise NoShape(f"the everystep_id at line {call.lineno} is not a literal")
            return keyword.value.value
    return None


def _text(node):
    return ast.unparse(node)


def _parallel():
    from everystep.api import parallel

    return parallel
