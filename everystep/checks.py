"""Django system checks (``manage.py check``, ``check --deploy``): the
settings a project needs for everystep to work, each finding on one line
with its fix as the hint.

- ``everystep.E001``: a module named in ``EVERYSTEP_WORKFLOWS`` cannot be
  imported (the app records the error when it starts, instead of failing
  every command with a traceback).
- ``everystep.W001``: no workflows registered at all: no
  ``EVERYSTEP_WORKFLOWS`` setting and no installed app with a
  ``workflows`` module. A worker would claim nothing.
- ``everystep.W002``: a SQLite database without the WAL journal or
  immediate transactions: a worker and a web process then fail each other
  with "database is locked".
- ``everystep.E002``: ``EVERYSTEP_SESSION_DATABASE`` names no database of
  ``DATABASES``.
- ``everystep.I001`` (``--deploy``): a PostgreSQL database without
  server-side binding and prepared statements, which halve the cost of a
  step's writes.
"""

from django.core import checks

SQLITE_OPTIONS = (
    'DATABASES["default"]["OPTIONS"] = {"transaction_mode": "IMMEDIATE", "timeout": 30, '
    '"init_command": "PRAGMA journal_mode=WAL;"}'
)

POSTGRES_OPTIONS = (
    'DATABASES["default"]["OPTIONS"] = {"server_side_binding": True, "prepare_threshold": 5} '
    "(prepare_threshold None behind a pooler in transaction mode: a worker turns them off by "
    "itself, other processes do not)"
)


@checks.register("everystep")
def check_workflows(app_configs=None, **kwargs):
    from django.apps import apps

    from everystep.core import registry

    config = apps.get_app_config("everystep")
    if config.import_error is not None:
        return [
            checks.Error(
                config.import_error,
                hint="fix the module, or the EVERYSTEP_WORKFLOWS setting that names it",
                id="everystep.E001",
            )
        ]
    if not registry.names():
        return [
            checks.Warning(
                "no everystep workflows are registered: the EVERYSTEP_WORKFLOWS setting "
                "is unset and no installed app has a workflows module",
                hint="put your @workflow functions in an app's workflows.py, or name their "
                "modules in EVERYSTEP_WORKFLOWS = ['myproject.workflows']",
                id="everystep.W001",
            )
        ]
    return []


@checks.register("everystep")
def check_session_database(app_configs=None, **kwargs):
    from django.conf import settings

    alias = getattr(settings, "EVERYSTEP_SESSION_DATABASE", None)
    if alias is None or alias in settings.DATABASES:
        return []
    return [
        checks.Error(
            f"EVERYSTEP_SESSION_DATABASE names {alias!r}, which is not in DATABASES",
            hint="name the DATABASES entry of a direct connection to the same database "
            "(for the worker's name lock and LISTEN), or remove the setting",
            id="everystep.E002",
        )
    ]


def _databases(engine):
    """``(alias, OPTIONS)`` of each configured database of `engine`
    (``sqlite3``, ``postgresql``): settings only, no connection."""
    from django.db import connections

    for alias in connections:
        settings = connections.settings[alias]
        if settings["ENGINE"].endswith(engine):
            yield alias, settings.get("OPTIONS", {})


def _settings_hint(snippet, alias):
    """A hint to set `snippet` (settings written for the "default" database)
    on the database `alias`."""
    return f"set {snippet}".replace('"default"', repr(alias))


@checks.register("everystep")
def check_sqlite(app_configs=None, **kwargs):
    findings = []
    for alias, options in _databases("sqlite3"):
        wal = "journal_mode=wal" in options.get("init_command", "").lower().replace(" ", "")
        immediate = str(options.get("transaction_mode", "")).upper() == "IMMEDIATE"
        if not (wal and immediate):
            wanted = (("the WAL journal", wal), ("immediate transactions", immediate))
            missing = " and ".join(what for what, present in wanted if not present)
            findings.append(
                checks.Warning(
                    f"database {alias!r} is SQLite without {missing}: a worker and a web "
                    f"process will fail each other with 'database is locked'",
                    hint=_settings_hint(SQLITE_OPTIONS, alias),
                    id="everystep.W002",
                )
            )
    return findings


@checks.register("everystep", deploy=True)
def check_postgres(app_configs=None, **kwargs):
    findings = []
    for alias, options in _databases("postgresql"):
        if not options.get("server_side_binding") or "prepare_threshold" not in options:
            findings.append(
                checks.Info(
                    f"database {alias!r} is PostgreSQL without server-side binding and "
                    f"prepared statements: each of a step's writes is parsed and planned again",
                    hint=_settings_hint(POSTGRES_OPTIONS, alias),
                    id="everystep.I001",
                )
            )
    return findings
