"""This thread's default database connection, looked up once per thread.

Django keeps one connection wrapper per thread, and each
``connections[DEFAULT_DB_ALIAS]`` finds it again through a context-aware
local: a few microseconds that the engine paid many times per step. The
wrapper of a thread never changes (closing it closes the driver's
connection, not the wrapper), so it is kept here, in a plain thread-local.
"""

import threading

from django.db import DEFAULT_DB_ALIAS, connections

_this_thread = threading.local()


def connection():
    """This thread's wrapper of the default database (Django's
    ``connections[DEFAULT_DB_ALIAS]``)."""
    try:
        return _this_thread.db
    except AttributeError:
        _this_thread.db = db = connections[DEFAULT_DB_ALIAS]
        return db
