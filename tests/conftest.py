"""Fixtures every test shares: a clean fault hook, step-call counters, and
(from their modules) worker processes, embedded workers and the zipapp."""

import pytest

from tests import workflows
from tests.faultproxy import fault_proxy  # noqa: F401
from tests.workerproc import embedded_worker, spawn_process, spawn_worker  # noqa: F401
from tests.zipapp import pyz  # noqa: F401


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
