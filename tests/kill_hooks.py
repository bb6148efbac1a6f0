"""A real process death at a chosen instant, for worker subprocesses: with
``EVERYSTEP_TEST_KILL_AT`` set to a step's name (``everystep.receive``,
``note``), the worker SIGKILLs itself the first time such a step ends,
before its outcome is recorded (`everystep.engine.runner.fault`). Loaded as
a workflows module: ``EVERYSTEP_TEST_WORKFLOWS=...,tests.kill_hooks``."""

import os
import signal

from everystep.engine import runner

KILL_AT = os.environ.get("EVERYSTEP_TEST_KILL_AT")


def _kill(ctx, step_id, name):
    if KILL_AT in (name, name.rsplit(".", 1)[-1]):
        os.kill(os.getpid(), signal.SIGKILL)


if KILL_AT:
    runner.fault = _kill
