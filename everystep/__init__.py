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
    "cancel": "everystep.control",
    "retry": "everystep.control",
    "Terminal": "everystep.errors",
}
_SUBMODULES = {
    "api",
    "attempts",
    "checks",
    "clock",
    "command_names",
    "context",
    "control",
    "cron",
    "deadline",
    "endpoint",
    "errors",
    "events",
    "logs",
    "metrics",
    "models",
    "nameguard",
    "namelock",
    "notify",
    "operations",
    "options",
    "pool",
    "recovery",
    "registry",
    "reporting",
    "transient",
    "runner",
    "schema",
    "serde",
    "sessions",
    "shutdown",
    "store",
    "testing",
    "timeouts",
    "tracing",
    "views",
    "worker",
}

__all__ = [*_NAMES, *sorted(_SUBMODULES)]


def __getattr__(name):
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"everystep.{name}")
    raise AttributeError(f"module 'everystep' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *__all__])
