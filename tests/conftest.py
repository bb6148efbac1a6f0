"""Fixtures every test shares: a clean fault hook, step-call counters, and
(from their modules) worker processes, embedded workers, the zipapp and
the standalone UI."""

import datetime

import pytest

from tests import postmortem, workflows
from tests.faultproxy import fault_proxy  # noqa: F401
from tests.freshproject import fresh_project  # noqa: F401
from tests.uiprocess import start_ui  # noqa: F401
from tests.workerproc import embedded_worker, spawn_process, spawn_worker  # noqa: F401
from tests.zipapp import pyz  # noqa: F401


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report also shows the database's sessions and the
    processes it started, stacks included for those still running."""
    report = yield
    if report.when in ("setup", "call") and report.failed:
        report.sections.extend(postmortem.failure_sections(item))
    return report


@pytest.fixture(autouse=True)
def _fresh_state():
    """Every test starts with no fault hook and zeroed call counters."""
    from everystep.engine import runner

    workflows.calls.clear()
    runner.fault = None
    yield
    runner.fault = None


@pytest.fixture(scope="session", autouse=True)
def _pooler_lets_the_test_database_go(request):
    """On the pgbouncer backend, PgBouncer keeps server connections to the
    test database: close them before the database is dropped."""
    from tests.plugin import current_backend

    if current_backend() != "pgbouncer":
        yield
        return
    request.getfixturevalue("django_db_setup")  # torn down after this fixture
    yield
    from django.db import connection

    from tests import servers

    servers.pgbouncer_admin(f"KILL {connection.settings_dict['NAME']}")


@pytest.fixture
def calls():
    """How many times each test step function really executed."""
    return workflows.calls


@pytest.fixture
def moved_clock():
    """The engine's clock, stopped at the real time now and moved by
    ``moved_clock.advance(seconds)``."""

    class Clock:
        def __init__(self):
            self.moment = datetime.datetime.now(datetime.UTC)

        def __call__(self):
            return self.moment

        def advance(self, seconds):
            self.moment += datetime.timedelta(seconds=seconds)

    stopped = Clock()
    from everystep.core import clock

    clock.override = stopped
    yield stopped
    clock.override = None
