"""What a worker sets up once for its whole process, before it starts: the
deadline on the engine's database operations, the hardened connection
settings (and no prepared statement until it knows whether a pooler
stands in between), the subscribers that observe it (metrics, Sentry,
tracing), and what it has loaded frozen out of the garbage collector's reach.
Each is idempotent: a process that runs a worker again sets them again.
"""

import gc

from django.db import DEFAULT_DB_ALIAS, connections

from everystep.observe import metrics, sentry, tracing
from everystep.resilience import deadline, sessions, timeouts


def prepare(options):
    """Set up this process for a worker with `options` (`WorkerOptions`)."""
    deadline.seconds = options.db_deadline
    for alias in {DEFAULT_DB_ALIAS, sessions.session_alias()}:
        timeouts.harden(connections[alias].settings_dict)
    sessions.hold_prepared(connections[DEFAULT_DB_ALIAS])
    metrics.install()
    sentry.install()
    tracing.install()
    freeze_what_is_loaded()


def freeze_what_is_loaded():
    """Collect once, then move every object that survives (Django, the
    drivers, the workflows: tens of thousands, that live as long as the
    process) out of the collector's reach (`gc.freeze`): a full collection
    then walks only what the worker made since, and pauses its threads for
    well under a millisecond, where it took 10 to 20."""
    gc.collect()
    gc.freeze()
