"""The built zipapp, run as a user runs it: from a directory outside the
repository, configured only by environment variables."""

import os
import subprocess

import pytest

from tests.helpers import database_url, session_url
from tests.workerproc import REPO

PYZ = REPO / "dist" / "everystep.pyz"


@pytest.fixture(scope="session")
def pyz():
    """The path of dist/everystep.pyz, rebuilt first if the sources changed."""
    subprocess.run(["make", "-s", "-C", str(REPO), "dist/everystep.pyz"], check=True)
    return PYZ


def clean_environment(**variables):
    """The process environment without any everystep or Django setting of
    the developer's, plus `variables`."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("EVERYSTEP_", "DJANGO_", "SENTRY_", "PYTHON"))
        and key not in ("DATABASE_URL", "DYNO")
    }
    env.update({key: str(value) for key, value in variables.items()})
    return env


def workflow_environment(url=None, **variables):
    """Environment for the test workflows (``tests.workflows``) on the test
    database, or on `url`."""
    defaults = {
        "EVERYSTEP_DATABASE_URL": url or database_url(),
        "EVERYSTEP_WORKFLOWS": "tests.workflows",
        "EVERYSTEP_PATH": str(REPO),
    }
    if url is None and session_url():
        defaults["EVERYSTEP_SESSION_URL"] = session_url()
    return clean_environment(**{**defaults, **variables})


def run_pyz(pyz_path, *args, env, cwd, timeout=120, input=None):
    """Run ``everystep.pyz ARGS`` to completion, with `input` (a string) on
    its standard input, else none; returns the CompletedProcess."""
    return subprocess.run(
        [str(pyz_path), *map(str, args)],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input,
        stdin=subprocess.DEVNULL if input is None else None,
    )


def one_line_error(result):
    """Assert `result` failed with exactly one line on stderr, and return it."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line of error, got:\n{result.stderr}"
    assert "Traceback" not in result.stderr
    return lines[0]
