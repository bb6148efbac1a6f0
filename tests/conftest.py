"""Fixtures every test shares: a clean fault hook and step-call counters."""

import pytest

from tests import workflows


@pytest.fixture(autouse=True)
def _fresh_state():
    """Every test starts with no fault hook and zeroed call counters."""
    from everystep import runner

    workflows.calls.clear()
    runner.fault = None
    yield
    runner.fault = None


@pytest.fixture
def calls():
    """How many times each test step function really executed."""
    return workflows.calls
from tests.workerproc import spawn_process, spawn_worker  # noqa: F401, E402
from tests.workerproc import embedded_worker  # noqa: F401, E402
from tests.zipapp import pyz  # noqa: F401, E402
