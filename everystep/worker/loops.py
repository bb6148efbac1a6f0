"""The worker's background threads, started from one place.

Every thread a worker runs beside its loop — the pool's, the name guard's,
the listener's, the endpoint's — is started by `Loops.start`. Each is a
daemon: a worker that must exit never waits for one. A thread that ends
with an error it did not handle is announced (``loop_died``, with its
traceback) and wakes the worker, which then drains and stops: a worker
missing one of its parts (its hold on its name, a pool thread) must not
go on as if it had it. A platform restarts it whole.
"""

import threading

from everystep.core import events
from everystep.resilience import classify


class LoopDied(Exception):
    """One of the worker's background threads died of an unhandled error."""


class Loops:
    """The background threads of the worker `worker_name`; `on_death()` is
    called when one dies."""

    def __init__(self, worker_name, on_death):
        self.worker_name = worker_name
        self.died = None  # the `LoopDied` of the first thread that died
        self._on_death = on_death

    def start(self, name, target):
        """Run ``target()`` on a daemon thread named ``everystep-<name>``."""
        thread = threading.Thread(
            target=self._run, args=(name, target), name=f"everystep-{name}", daemon=True
        )
        thread.start()
        return thread

    def _run(self, name, target):
        try:
            target()
        except BaseException as exc:  # noqa: BLE001 - any death stops the worker
            if self.died is None:
                self.died = LoopDied(
                    f"worker {self.worker_name}: its {name} thread died: {classify.one_line(exc)}"
                )
            events.announce(
                "loop_died",
                exc_info=(type(exc), exc, exc.__traceback__),
                worker=self.worker_name,
                loop=name,
                error=classify.one_line(exc),
            )
            self._on_death()
