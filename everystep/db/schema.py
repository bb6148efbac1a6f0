"""Whether the database has the tables this code expects: the migrations
still to apply, and a worker's wait for them.

A platform runs its release process (``migrate``) before the new workers
start; honcho, Compose or a Kubernetes pod without an init container may
start them side by side. A worker told to wait (``--wait-for-migrations
SECONDS``) polls until the migrations are applied, for at most that long,
instead of refusing to start.
"""

import threading
import time

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor

from everystep.core import command_names, events
from everystep.errors import ConfigurationError
from everystep.resilience import transient

#: Seconds between two looks at the migrations while waiting for them.
POLL_SECONDS = 1.0


def pending_migrations(alias=DEFAULT_DB_ALIAS):
    """The migrations not yet applied to the database `alias`, of every
    installed app (workflows use the project's models too), in the order
    they would be (one query)."""
    executor = MigrationExecutor(connections[alias])
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    return [migration for migration, _ in plan]


def wait_for_migrations(seconds, stop=None):
    """Return True once the migrations are all applied, waiting for
    them up to `seconds` (0: not at all); False when the `threading.Event`
    `stop` is set meanwhile. Raises `ConfigurationError` naming what to run
    when they are still pending at the end of the wait."""
    stop = stop or threading.Event()  # never set: wait the whole time
    give_up_at = time.monotonic() + seconds
    waiting = False
    while True:
        try:
            pending = transient.first_contact(
                lambda attempt: pending_migrations(),
                what="checking migrations",
                should_stop=stop.is_set,
            )
        except DatabaseError:
            if stop.is_set():
                return False  # stopped while the database was out of reach
            raise
        if not pending:
            if waiting:
                events.announce("migrations_applied")
            return True
        left = give_up_at - time.monotonic()
        if stop.is_set():
            return False
        if left <= 0:
            raise ConfigurationError(_refusal(len(pending), seconds))
        if not waiting:
            waiting = True
            events.announce(
                "migrations_pending",
                count=len(pending),
                seconds=seconds,
                migrate=command_names.command("migrate"),
            )
        if stop.wait(min(POLL_SECONDS, left)):
            return False


def _refusal(count, seconds):
    migrate = command_names.command("migrate")
    if seconds:
        return (
            f"the database still has {count} unapplied migration(s) after "
            f"waiting {seconds:g}s: run `{migrate}`"
        )
    return (
        f"the database has {count} unapplied migration(s): run `{migrate}` first, "
        f"or start the worker with --wait-for-migrations SECONDS to wait for it"
    )
