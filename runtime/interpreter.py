"""Refuse to run a zipapp under an interpreter it was not built for.

A zipapp bundles compiled dependencies (psycopg's binary build) for one
Python version and platform; under another they fail obscurely at import.
The build writes `everystep_build` beside the bundled packages; this check
compares it with the running interpreter before anything else is imported.
"""

import sys
import sysconfig


def built_for():
    """``(python_version, platform)`` the zipapp was built for, or None when
    running from a source install (no build record)."""
    try:
        import everystep_build
    except ImportError:
        return None
    return everystep_build.PYTHON, everystep_build.PLATFORM


def running_on():
    return f"{sys.version_info.major}.{sys.version_info.minor}", sysconfig.get_platform()


def mismatch():
    """A one-line explanation when this interpreter cannot run the build, else None."""
    build = built_for()
    if build is None or build == running_on():
        return None
    (python, platform), (here_python, here_platform) = build, running_on()
    return (
        f"this everystep.pyz was built for Python {python} on {platform}, but is running "
        f"on Python {here_python} on {here_platform}: run it with python{python}, or "
        f"rebuild it with `make pyz PYTHON=python{here_python}`"
    )
