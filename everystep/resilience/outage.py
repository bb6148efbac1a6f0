"""Whether this process sees its database as unreachable, and since when.

One `tracker` per process, shared by the worker's loop, its runners and its
background threads: an outage is announced once, when the first operation
fails, and its end once, when one succeeds again, however many threads
retry in between. Each outage has a generation; every new connection is
stamped with the generation it opened in (`stamp`, Django's
``connection_created`` receiver), so a connection older than the latest
outage — which may have been cut off without a word — is told apart.
"""

import threading
import time

from everystep.core import events
from everystep.resilience import classify

_STAMP = "everystep_outage_generation"  # set on each Django connection wrapper


class Outage:
    """Whether this process sees the database as unreachable, and since when.

    `generation` counts the outages. A connection opened before the latest
    one may have been cut off without a word (a failed-over host, a hung
    proxy), so its holder replaces it before using it again instead of
    waiting out the deadline on it. An operation that began before the
    latest outage (`generation_of`) and fails after it ended is the outage's
    tail, not a new one — even when its failure's cleanup reconnected, as
    Django does when it leaves a transaction whose connection broke.
    """

    def __init__(self):
        self.since = None
        self.generation = 0
        self._lock = threading.Lock()

    def failed(self, what, exc, began_in=None):
        """An operation that began in outage generation `began_in`
        (`generation_of`; None when unknown) failed with `exc`. Contention
        (`is_contention`) is no outage, and neither is an operation that
        began before the latest outage: that outage cut it off."""
        if classify.is_contention(exc):
            return
        with self._lock:
            if self.since is not None or (began_in is not None and began_in < self.generation):
                return
            self.since = time.monotonic()
            self.generation += 1
        events.announce("db_outage", what=what, error=classify.one_line(exc))

    def succeeded(self):
        if self.since is None:
            return
        with self._lock:
            since, self.since = self.since, None
        if since is not None:
            events.announce("db_recovered", seconds=time.monotonic() - since)


tracker = Outage()


def generation_of(wrapper):
    """The outage generation of an operation starting now on `wrapper` (a
    Django connection): that of the connection it holds, or the current one
    when it will open a fresh connection."""
    stamped = wrapper.__dict__.get(_STAMP)
    if wrapper.connection is not None and stamped is not None:
        return stamped
    return tracker.generation


def stamp(sender, connection, **kwargs):
    """Django's ``connection_created`` receiver: note on the connection
    wrapper the outage generation it opened in."""
    connection.__dict__[_STAMP] = tracker.generation
