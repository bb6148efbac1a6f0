"""SQLite, the embedded default: migrated on the spot, one process at a
time, in a file that every uid of the volume's group can write."""

import contextlib
import os
import stat

from django.core.management import call_command


def migrate():
    """SQLite, the embedded default, is migrated on the spot."""
    from everystep.db import schema

    with migration_lock() as sqlite:
        if sqlite and schema.pending_migrations():
            call_command("migrate", verbosity=0)


@contextlib.contextmanager
def migration_lock():
    """On SQLite, hold the lock under which its migrations run, one process
    at a time: a release's ``migrate``, a worker and the UI started together
    on a new file would otherwise each create its tables. The lock is on the
    file's directory, which needs no file of its own and leaves SQLite's
    locks on the database alone. A new file is created under the lock
    (`_create_file`). Yields whether the database is SQLite."""
    import fcntl

    from django.db import connection

    if connection.vendor != "sqlite":
        yield False
        return
    path = os.path.abspath(connection.settings_dict["NAME"])
    descriptor = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        _create_file(path)
        yield True
    finally:
        os.close(descriptor)  # and with it the lock


def _create_file(path):
    """Create the SQLite file at `path` if it is missing, writable by the
    group when its directory is (the image's /app/data, shared by any uid
    in group 0): SQLite gives its WAL and shared-memory files the same
    mode, so another uid on the same volume can write them all."""
    directory = os.path.dirname(path)
    group_writable = os.stat(directory).st_mode & stat.S_IWGRP
    try:
        descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return
    try:
        os.fchmod(descriptor, 0o664 if group_writable else 0o644)
    finally:
        os.close(descriptor)
