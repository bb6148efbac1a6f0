"""One worker process: a short orchestrator (`orchestrator.Worker`) over
the pool that executes claimed runs (`pool`), the wake-ups (`wakeup`), the
hold on its name (`nameguard`), the stop and its drain (`shutdown`), its
HTTP endpoint (`endpoint`) and its options, each defined once (`options`).

May import: `engine`, `control`, `observe` and everything below them.

The public names: `Worker`, `WorkerOptions`, and the errors a start can
end with, `NameHeld` and `NameLost`.
"""

import importlib

_NAMES = {
    "Worker": "everystep.worker.orchestrator",
    "WorkerOptions": "everystep.worker.options",
    "NameHeld": "everystep.worker.nameguard",
    "NameLost": "everystep.db.namelock",
}

__all__ = list(_NAMES)


def __getattr__(name):
    # Loaded on first use: the worker's parts import Django's models, which
    # a caller of `options` alone (the standalone configuration) must not need.
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    raise AttributeError(f"module 'everystep.worker' has no attribute {name!r}")
