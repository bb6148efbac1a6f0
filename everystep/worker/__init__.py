"""One worker process: a short orchestrator (`orchestrator.Worker`) over
the claim turn (`claimer`), the pool that executes and reaps claimed runs
(`pool`), the wake-ups (`wakeup`), the state it shows (`presence`), the
hold on its name (`nameguard`), the stop and its drain (`shutdown`), its
background threads (`loops`), its HTTP endpoint (`endpoint`), the setup of
its process (`process`) and its options, each defined once (`options`).

May import: `engine`, `control`, `observe` and everything below them.

The public names: `Worker`, `WorkerOptions`, and the errors a run can end
with, `NameHeld`, `NameLost` and `LoopDied`.
"""

import importlib

_NAMES = {
    "Worker": "everystep.worker.orchestrator",
    "WorkerOptions": "everystep.worker.options",
    "NameHeld": "everystep.worker.nameguard",
    "NameLost": "everystep.db.namelock",
    "LoopDied": "everystep.worker.loops",
}

__all__ = list(_NAMES)


def __getattr__(name):
    # Loaded on first use: the worker's parts import Django's models, which
    # a caller of `options` alone (the standalone configuration) must not need.
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    raise AttributeError(f"module 'everystep.worker' has no attribute {name!r}")
