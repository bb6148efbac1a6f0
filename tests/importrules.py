"""The package's import rules, read from the source: every import statement
of every module, those inside functions included, resolved to the module it
loads.

The layers, lowest first (README, "Layout"): ``core`` and ``errors``;
``resilience``; ``db``, ``models`` and the migrations; ``engine``,
``control`` and ``observe``, which never import each other; ``worker``;
and the entry points (``api``, ``testing``, ``ui``, the Django glue).
"""

import ast
from dataclasses import dataclass

PACKAGE = "everystep"

# The part each module belongs to, by the first component of its name under
# the package: (rank, part). The parts of one rank never import each other.
_PARTS = {
    "core": (0, "core"),
    "errors": (0, "core"),
    "resilience": (1, "resilience"),
    "db": (2, "db"),
    "models": (2, "db"),
    "migrations": (2, "db"),
    "engine": (3, "engine"),
    "control": (3, "control"),
    "observe": (3, "observe"),
    "worker": (4, "worker"),
}
_ENTRY = (5, "entry points")

# Packages outside the library that it must never import.
_STANDALONE = ("everystep_config", "everystep_runtime", "config", "runtime")

# Reading the process environment: `os.environ`, `os.getenv` and friends.
_ENVIRONMENT = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


@dataclass(frozen=True)
class Import:
    """One import statement: `source` imports `target` at `line`."""

    source: str
    target: str
    line: int


def module_name(path, root):
    """The dotted name of the module at `path` under `root` (the folder
    that holds the package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root):
    """Every module of the package under `root`: {name: path}."""
    return {module_name(path, root): path for path in sorted((root / PACKAGE).rglob("*.py"))}


def _lazy_names(root):
    """The names the package's ``__init__`` loads on first use, and from
    which module: `from everystep import schedule` loads ``everystep.api``."""
    tree = ast.parse((root / PACKAGE / "__init__.py").read_text())
    names = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            for key, value in zip(node.value.keys, node.value.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(value, ast.Constant):
                    names[key.value] = value.value
    return names


def _resolve(name, known):
    """The known module that importing `name` loads: itself, or the package
    holding it when `name` is an attribute (a function, a class)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name


def imports(root):
    """Every import made by a module of the package, resolved to a module
    name (outside modules keep the name they were imported by)."""
    known = modules(root)
    lazy = _lazy_names(root)
    found = []
    for source, path in known.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    found.append(
                        Import(source, _resolve(alias.name, known) or alias.name, node.lineno)
                    )
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = source.split(".")
                    if not is_package:
                        anchor.pop()
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    if base == PACKAGE and alias.name in lazy:
                        target = lazy[alias.name]
                    elif full in known:
                        target = full
                    else:
                        target = _resolve(base, known) or base
                    found.append(Import(source, target, node.lineno))
    return found


def part_of(name):
    """(rank, part) of a module of the package."""
    if name == PACKAGE:
        return (0, "core")  # the package itself imports nothing on import
    first = name.split(".")[1]
    return _PARTS.get(first, _ENTRY)


def layer_violations(found):
    """Imports that reach a higher layer, or a sibling of the same rank."""
    wrong = []
    for imp in found:
        if not imp.target.startswith(PACKAGE + ".") and imp.target != PACKAGE:
            continue
        (rank, part), (target_rank, target_part) = part_of(imp.source), part_of(imp.target)
        if part == "entry points":
            continue
        if target_rank > rank or (target_rank == rank and target_part != part):
            wrong.append(f"{imp.source}:{imp.line} ({part}) imports {imp.target} ({target_part})")
    return wrong


def standalone_violations(found):
    """Imports of the standalone configuration or runtime."""
    return [
        f"{imp.source}:{imp.line} imports {imp.target}"
        for imp in found
        if imp.target.split(".")[0] in _STANDALONE
    ]


def circles(found):
    """Every set of modules that import each other, directly or not
    (strongly connected components of more than one module)."""
    graph = {}
    for imp in found:
        if imp.target.startswith(PACKAGE + ".") and imp.target != imp.source:
            graph.setdefault(imp.source, set()).add(imp.target)
    index, low, stack, on_stack, result = {}, {}, [], set(), []

    def visit(node):  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return result


def environment_readers(root):
    """Modules of the package that read the process environment, but for
    the management commands (entry points that a user runs)."""
    found = []
    for name, path in modules(root).items():
        if ".management.commands." in name:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            reads = (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "os"
                and node.attr in _ENVIRONMENT
            ) or (
                isinstance(node, ast.ImportFrom)
                and node.module == "os"
                and any(alias.name in _ENVIRONMENT for alias in node.names)
            )
            if reads:
                found.append(f"{name}:{node.lineno}")
    return found
