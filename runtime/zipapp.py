"""What a zipapp settles before its command runs: that this interpreter can
run it, and that its archive is off the import path.

A zipapp bundles compiled dependencies (psycopg's binary build) for one
Python version and platform; under another they fail obscurely at import.
The build writes `everystep_build` beside the bundled packages; `mismatch`
compares it with the running interpreter before any of them is imported.

Python runs a zipapp with the archive first on ``sys.path``. Once shiv has
extracted the bundled packages and put them on the path, nothing is
imported from the archive any more, but every lookup of installed
distributions (psycopg's binary build asks for its own version at import;
OpenTelemetry finds its parts through entry points, Sentry lists the
installed packages) reads the archive's whole directory of thousands of
files first: a tenth of a second of the start.
"""

import os
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


def leave_the_archive():
    """Take the archive this program runs from off ``sys.path``, once its
    packages are extracted (a zipapp's build record is importable only
    then); a no-op outside a zipapp."""
    archive = os.path.realpath(sys.argv[0])
    if built_for() is None or not os.path.isfile(archive):
        return  # not a zipapp: a source install, or no program file (``-c``)
    sys.path[:] = [entry for entry in sys.path if os.path.realpath(entry) != archive]
