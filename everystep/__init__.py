"""everystep: durable workflow execution for Django.

A workflow is a plain function made of steps; every executed step's outcome
is recorded in SQL, and an interrupted run resumes by replaying its body,
serving recorded steps and executing only what never ran::

    from everystep import workflow, step, schedule

    @step
    def charge(order_id): ...

    @workflow
    def checkout(order_id):
        charge(order_id)

    schedule(checkout, 42)

Importing this package does not import Django: names are loaded on first use.
"""

import importlib

__version__ = "0.1.0"

_NAMES = {
    "workflow": "everystep.api",
    "step": "everystep.api",
    "parallel": "everystep.api",
    "schedule": "everystep.api",
    "aschedule": "everystep.api",
    "sleep": "everystep.api",
    "patched": "everystep.api",
    "send": "everystep.api",
    "receive": "everystep.api",
    "set_event": "everystep.api",
    "get_event": "everystep.api",
    "start": "everystep.api",
    "result": "everystep.api",
    "aresult": "everystep.api",
    "RunHandle": "everystep.api",
    "cancel": "everystep.control.actions",
    "retry": "everystep.control.actions",
    "Terminal": "everystep.errors",
    "Queue": "everystep.core.queues",
}
# The modules a user reaches by name: ``everystep.context.current()``,
# ``everystep.serde``, the test hook ``everystep.runner.fault``. Each lives
# in the part of the package that holds its subject.
_MODULES = {
    "api": "everystep.api",
    "errors": "everystep.errors",
    "testing": "everystep.testing",
    "models": "everystep.models",
    "views": "everystep.views",
    "worker": "everystep.worker",
    "context": "everystep.engine.context",
    "runner": "everystep.engine.runner",
    "serde": "everystep.core.serde",
}

__all__ = [*_NAMES, *_MODULES]


def __getattr__(name):
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    raise AttributeError(f"module 'everystep' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *__all__])
