"""What a worker sets up once for its whole process, before it starts: the
deadline on the engine's database operations, the hardened connection
settings (and no prepared statement until it knows whether a pooler
stands in between), and the subscribers that observe it (metrics, Sentry,
tracing).
Each is idempotent: a process that runs a worker again sets them again.
"""

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
