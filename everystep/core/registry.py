"""The workflows this process can run, by qualified name ``module.qualname``."""

from everystep.core.queues import DEFAULT
from everystep.errors import EverystepError

MAX_NAME_LENGTH = 300
_workflows = {}
_schedules = {}  # name → its `everystep.core.cron.Schedule`, for cron workflows
_placement = {}  # name → (queue, priority), where its runs go unless told


def qualified_name(func):
    """The name a function is registered and recorded under."""
    return f"{func.__module__}.{func.__qualname__}"


def register(func, schedule=None, queue=DEFAULT, priority=0, name=None):
    """Register `func` as a workflow, under `name` (default: its qualified
    name), with its cron `schedule` if it has one and the `queue` and
    `priority` its runs take unless told; return its name. Registering the
    same name again replaces the earlier function (a module reloaded)."""
    name = name or qualified_name(func)
    if len(name) > MAX_NAME_LENGTH:
        raise EverystepError(f"workflow name {name!r} is longer than {MAX_NAME_LENGTH} characters")
    _workflows[name] = func
    _placement[name] = (queue, priority)
    _schedules.pop(name, None)
    if schedule is not None:
        _schedules[name] = schedule
    return name


def placement(name):
    """``(queue, priority)`` that runs of the workflow `name` take unless
    told; the default queue at priority 0 for a workflow not registered."""
    return _placement.get(name, (DEFAULT, 0))


def unregister(name):
    """Forget the workflow `name` (a module unloaded); nothing if unknown."""
    _workflows.pop(name, None)
    _schedules.pop(name, None)
    _placement.pop(name, None)


def schedules():
    """The cron schedules of the registered workflows, by name."""
    return [_schedules[name] for name in sorted(_schedules)]


def get(name):
    """The workflow registered under `name`, or None."""
    return _workflows.get(name)


def names():
    """The registered workflow names, sorted."""
    return sorted(_workflows)


def find(name):
    """The registered name for `name`: a qualified name, or a bare function
    name that matches exactly one workflow. Raises `LookupError` otherwise."""
    if name in _workflows:
        return name
    matches = [full for full in _workflows if full.rsplit(".", 1)[-1] == name]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise LookupError(f"workflow name {name!r} is ambiguous: {', '.join(sorted(matches))}")
    raise LookupError(f"no workflow named {name!r} is registered")
