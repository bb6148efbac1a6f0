"""pytest plugin for everystep's test suite.

- checks EVERYSTEP_TEST_DB (postgres, mariadb, sqlite — the default — or
  pgbouncer) before anything, Django settings included, is loaded;
- shows the backend in the report header;
- deselects tests marked ``@pytest.mark.backends(...)`` that do not list the
  current backend;
- on ``pgbouncer`` — PostgreSQL, with the worker processes a test starts
  reaching it through PgBouncer in transaction mode — runs the worker
  tests only (`POOLED_MODULES`), and a test marked for ``postgres`` runs
  there too;
- stops the database servers the run started, whether the tests passed or not.

Django is not imported here: this module loads before Django is configured.
"""

from __future__ import annotations

import os

import pytest

BACKENDS = ("postgres", "mariadb", "sqlite", "pgbouncer")
# What the pgbouncer backend runs: the tests of worker processes, whose
# claims, steps, name lock and wake-ups then go through the pooler.
POOLED_MODULES = (
    "test_pgbouncer.py",
    "test_worker_claims.py",
    "test_worker_names.py",
    "test_worker_outage.py",
    "test_worker_recovery.py",
    "test_worker_shutdown.py",
    "test_crash_window.py",
    "test_orphans.py",
    "test_libpq.py",
)


def current_backend() -> str:
    """The database backend this run tests against."""
    return os.environ.get("EVERYSTEP_TEST_DB") or "sqlite"


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """Refuse an unknown backend before the settings (which read it) are imported."""
    backend = current_backend()
    if backend not in BACKENDS:
        raise pytest.UsageError(
            f"EVERYSTEP_TEST_DB={backend!r}: expected one of {', '.join(BACKENDS)}"
        )
    return (yield)


def pytest_report_header(config) -> str:
    header = f"everystep database backend: {current_backend()} (EVERYSTEP_TEST_DB)"
    if current_backend() == "pgbouncer":
        header += f"; the worker tests only: {', '.join(POOLED_MODULES)}"
    return header


def pytest_collection_modifyitems(config, items) -> None:
    """Deselect the tests whose backends marker does not name the current backend."""
    backend = current_backend()
    selected, deselected = [], []
    for item in items:
        marker = item.get_closest_marker("backends")
        unknown = set(marker.args if marker else ()) - set(BACKENDS)
        if unknown:
            raise pytest.UsageError(f"{item.nodeid}: unknown backend(s) {sorted(unknown)}")
        if backend == "pgbouncer" and item.path.name not in POOLED_MODULES:
            deselected.append(item)
        elif marker is None or backend in marker.args:
            selected.append(item)
        elif backend == "pgbouncer" and "postgres" in marker.args:
            selected.append(item)
        else:
            deselected.append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected


def pytest_unconfigure(config) -> None:
    """Stop the servers this run started, whatever the outcome of the tests."""
    from tests import servers

    servers.stop_all()
