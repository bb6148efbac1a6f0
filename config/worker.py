"""The worker's environment: the variables of its options (``EVERYSTEP_POOL``,
``EVERYSTEP_POLL`` … as `everystep.options` defines them) and its default
name, for both ``manage.py everystep_worker`` and ``everystep worker``."""

import socket

from everystep.options import OPTIONS


def worker_variables(environ):
    """The worker options' variables set in `environ` (a mapping), with the
    default name filled in: ``EVERYSTEP_NAME``, else ``DYNO`` (a Heroku dyno's
    stable name), else the hostname."""
    variables = {
        option.variable: environ[option.variable]
        for option in OPTIONS
        if environ.get(option.variable, "") != ""
    }
    variables.setdefault("EVERYSTEP_NAME", environ.get("DYNO") or socket.gethostname())
    return variables
