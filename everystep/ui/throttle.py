"""How fast the standalone UI's password may be guessed: hardly at all.

Each failed sign-in (the login form, or HTTP basic auth) is counted for the
client it came from and for everyone together, over the last `WINDOW`
seconds. A client past `PER_CLIENT` failures, or everyone past `OVERALL`
(a guesser spread over many addresses), is refused without its password
being looked at until the window has room again: 429, with the seconds to
wait. A client that signs in has its own count cleared. Counts live in the
process (the standalone UI is one process); a restart clears them.
"""

import collections
import threading
import time

WINDOW = 60.0  # seconds
PER_CLIENT = 5  # failures of one client within the window
OVERALL = 30  # failures of all clients together within the window
MAX_CLIENTS = 10_000  # clients remembered at most; the oldest are forgotten first


class Throttle:
    """Failed sign-ins, per client and overall, over a sliding window."""

    def __init__(self, window=WINDOW, per_client=PER_CLIENT, overall=OVERALL, clock=time.monotonic):
        self.window = window
        self.per_client = per_client
        self.overall = overall
        self._clock = clock
        self._lock = threading.Lock()
        self._clients = collections.OrderedDict()  # client → deque of failure times
        self._everyone = collections.deque()

    def wait(self, client):
        """Seconds `client` must wait before its password is checked again;
        0 when it may try now."""
        with self._lock:
            now = self._clock()
            self._forget_before(now - self.window)
            waits = [0.0]
            mine = self._clients.get(client)
            if mine is not None and len(mine) >= self.per_client:
                waits.append(mine[-self.per_client] + self.window - now)
            if len(self._everyone) >= self.overall:
                waits.append(self._everyone[-self.overall] + self.window - now)
            return max(waits)

    def failed(self, client):
        """`client` gave a wrong password."""
        with self._lock:
            now = self._clock()
            mine = self._clients.pop(client, None) or collections.deque(maxlen=self.per_client)
            mine.append(now)
            self._clients[client] = mine  # the most recent last
            while len(self._clients) > MAX_CLIENTS:
                self._clients.popitem(last=False)
            self._everyone.append(now)

    def succeeded(self, client):
        """`client` signed in: its own failures are forgiven."""
        with self._lock:
            self._clients.pop(client, None)

    def _forget_before(self, cutoff):
        """Drop what fell out of the window: clients are ordered by their
        latest failure, so the forgotten ones are at the front."""
        while self._everyone and self._everyone[0] < cutoff:
            self._everyone.popleft()
        while self._clients:
            client, times = next(iter(self._clients.items()))
            if times[-1] >= cutoff:
                return
            del self._clients[client]


#: The UI's one throttle.
sign_ins = Throttle()
