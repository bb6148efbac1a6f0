"""The worker's environment: the variables of its options (``EVERYSTEP_POOL``,
``EVERYSTEP_POLL`` … as `everystep.worker.options` defines them) and its default
name, for both ``manage.py everystep_worker`` and ``everystep worker``."""

import re
import socket

from everystep.worker.options import OPTIONS

# Kubernetes' alphabet for generated names: no vowels, no look-alikes.
_KUBERNETES = "[bcdfghjklmnpqrstvwxz2456789]"
# Host names that change with every container or pod: Docker's and Podman's
# default (the container id's first 12 hex digits), and a Kubernetes
# Deployment's pod (its ReplicaSet's hash, then 5 random characters).
_RANDOM_HOSTNAMES = (
    re.compile(r"[0-9a-f]{12}"),
    re.compile(rf".+-{_KUBERNETES}{{6,10}}-{_KUBERNETES}{{5}}"),
)


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


def unstable_name(environ):
    """The default name the worker would take from `environ`, if it is a
    host name that looks random (a container's id, a Deployment's pod): a
    worker restarted under a new name leaves the runs it held parked under
    the old one. None when the name is set or stable."""
    if environ.get("EVERYSTEP_NAME") or environ.get("DYNO"):
        return None
    hostname = socket.gethostname()
    if any(pattern.fullmatch(hostname) for pattern in _RANDOM_HOSTNAMES):
        return hostname
    return None
