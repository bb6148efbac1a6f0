"""How a worker is asked to stop, and the promise that stopping never hangs.

The first SIGTERM or SIGINT (or `Worker.stop()`) asks for a drain; a second
one hurries it. A standalone worker (one whose loop owns the main thread,
so it installed the signal handlers) also gets a last-resort deadline:
``drain`` + `EXIT_GRACE` seconds after the first signal, if the worker has
still not returned — a database that went silent under a blocked call —
`on_deadline` runs (it names the runs left parked) and the process exits.
"""

import logging
import signal
import threading

logger = logging.getLogger(__name__)

EXIT_GRACE = 8.0  # seconds past the drain time before a standalone worker exits regardless


class Shutdown:
    """The stop and hurry requests of one worker; `wake` is called on each."""

    def __init__(self, worker_name, wake):
        self.worker_name = worker_name
        self.requested = threading.Event()
        self.hurried = threading.Event()
        self._wake = wake
        self._deadline = None  # (seconds, on_deadline) once armed
        self._timer = None

    def request(self):
        """Ask for a drain; a second request hurries it."""
        if self.requested.is_set():
            self.hurried.set()
        self.requested.set()
        if self._deadline is not None and self._timer is None:
            seconds, on_deadline = self._deadline
            self._timer = threading.Timer(seconds, on_deadline)
            self._timer.daemon = True
            self._timer.start()
        self._wake()

    def install_signal_handlers(self, drain, on_deadline):
        """On the main thread only, make SIGTERM and SIGINT call `request`
        and arm the exit deadline (none when `drain` is 0: wait forever).
        Returns the undo, which also disarms the deadline."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        if drain:
            self._deadline = (drain + EXIT_GRACE, on_deadline)

        def on_signal(signum, frame):
            logger.info(
                "worker %s received %s: %s",
                self.worker_name,
                signal.Signals(signum).name,
                "requeuing now" if self.requested.is_set() else "draining",
                extra={"action": "signal", "worker": self.worker_name},
            )
            self.request()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}

        def undo():
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self._timer is not None:
                self._timer.cancel()
            self._deadline = None

        return undo
