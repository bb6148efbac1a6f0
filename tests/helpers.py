"""Helpers the tests share: run a workflow through the real runner, read
what it recorded, simulate a crash, wait on a condition with a deadline."""

import time
import urllib.parse

import pytest

from tests import servers
from tests.plugin import current_backend

WORKER = "tests"


def claim_one(worker=WORKER, *, parked=False):
    """Claim exactly one run (the test's) and return it."""
    from everystep.db import claims

    claimed = claims.claim(worker, 1, only_parked=parked)
    assert len(claimed) == 1, f"expected one run to claim, got {claimed}"
    return claimed[0]


def attempt(*, parked=False):
    """Claim the test's run and execute one attempt of it; return the status."""
    from everystep.engine import runner

    return runner.execute(claim_one(parked=parked))


def run_to_end(func, *args):
    """Schedule `func(*args)`, execute it once, and return its refreshed row."""
    from everystep import schedule

    run = schedule(func, *args)
    attempt()
    run.refresh_from_db()
    return run


def recorded_steps(run):
    """The run's step rows as {step_id: (name, status, result)}."""
    return {
        s.step_id: (s.name.rsplit(".", 1)[-1], s.status, s.result) for s in run.steps.order_by("id")
    }


def crash_at(step_id, workflow=None):
    """A fault hook that simulates a process death right after `step_id` ran
    (in runs of `workflow` only, when given)."""
    from everystep.errors import SimulatedCrash

    def fault(ctx, current_step_id, name):
        if current_step_id != step_id:
            return
        if workflow is None or ctx.workflow_name == workflow.__everystep_workflow__:
            raise SimulatedCrash(step_id)

    return fault


def blocked_payment(calls):
    """A run of `pay` whose unsafe charge ran but was never recorded: blocked."""
    from everystep import schedule
    from everystep.engine import runner
    from everystep.models import Workflow
    from tests import workflows

    runner.fault = crash_at("1")
    run = schedule(workflows.pay, 30)
    attempt()
    assert recorded_steps(run) == {"1": ("charge", "started", None)}

    runner.fault = None
    assert attempt(parked=True) == Workflow.Status.BLOCKED
    run.refresh_from_db()
    assert calls["charge"] == 1  # never charged twice
    return run


def lost_worker(name):
    """A worker row whose heartbeat is too old: operators see it lost."""
    import datetime

    from django.utils import timezone

    from everystep.db import workers
    from everystep.models import Worker

    workers.started(name, 4, ["tests.workflows.quick"])
    Worker.objects.filter(name=name).update(
        heartbeat_at=timezone.now() - datetime.timedelta(seconds=Worker.LOST_AFTER + 5)
    )


def opened(gates, label):
    """Open the gate `label` in `gates` (`tests.workflows.gate`)."""
    (gates / f"{label}.go").write_text("")


def started(gates, label):
    """Wait until the gate's mark is written: not only its file made, which
    a kill between the two would leave empty."""
    mark = gates / f"{label}.started"
    return wait_until(lambda: mark.exists() and mark.read_text(), message=f"gate {label} reached")


def wait_until(condition, timeout=30.0, interval=0.02, message="condition"):
    """Poll `condition` until it returns a truthy value, which is returned;
    fail the test if `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def database_url():
    """The URL of the database this test process is using (the test
    database), for the worker subprocesses it starts."""
    from urllib.parse import quote

    from django.db import connection

    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{settings['NAME']}"
    scheme = "postgres" if connection.vendor == "postgresql" else "mysql"
    password = f":{quote(settings['PASSWORD'], safe='')}" if settings["PASSWORD"] else ""
    user = quote(settings["USER"], safe="")
    port = settings["PORT"]
    if current_backend() == "pgbouncer":
        port = urllib.parse.urlsplit(servers.server_url("pgbouncer")).port
    return f"{scheme}://{user}{password}@{settings['HOST']}:{port}/{settings['NAME']}"


def session_url():
    """The direct URL of the test database, for the sessions of the worker
    subprocesses (`EVERYSTEP_SESSION_URL`) when their database URL goes
    through PgBouncer; None on every other backend."""
    if current_backend() != "pgbouncer":
        return None
    from django.db import connection

    settings = connection.settings_dict
    direct = urllib.parse.urlsplit(servers.server_url("postgres"))
    return direct._replace(path=f"/{settings['NAME']}").geturl()


def query_until_reachable(query, timeout=60.0):
    """Run `query()` (an ORM call), reconnecting through a database restart."""
    from django.db import InterfaceError, OperationalError, connection

    deadline = time.monotonic() + timeout
    while True:
        try:
            return query()
        except (OperationalError, InterfaceError):
            connection.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def statuses(run_ids):
    """How many of `run_ids` are in each status, e.g. {"completed": 3}."""
    from collections import Counter

    from everystep.models import Workflow

    return dict(Counter(Workflow.objects.filter(id__in=run_ids).values_list("status", flat=True)))


class sentry_events:
    """Initialize the real sentry-sdk with a transport that keeps the events
    it would send (``with sentry_events() as events: ...``); shut it down after."""

    def __enter__(self):
        import sentry_sdk
        from sentry_sdk.transport import Transport

        events = self.events = []

        class Keep(Transport):
            def capture_envelope(self, envelope):
                event = envelope.get_event()
                if event is not None:
                    events.append(event)

        sentry_sdk.init(dsn="http://public@127.0.0.1:9/1", transport=Keep)
        return events

    def __exit__(self, *exc_info):
        import sentry_sdk

        sentry_sdk.get_client().flush()
        sentry_sdk.init(dsn=None)


def driver_connection(url, timeout=5, read_timeout=None):
    """A raw driver connection in autocommit to the database at `url`
    (psycopg or PyMySQL), bypassing Django; `read_timeout` bounds each
    read on MariaDB (libpq has none)."""
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(url)
    if parts.scheme.startswith("postgres"):
        import psycopg

        return psycopg.connect(url, autocommit=True, connect_timeout=timeout)
    import pymysql

    return pymysql.connect(
        host=parts.hostname,
        port=parts.port,
        user=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
        database=parts.path.lstrip("/"),
        autocommit=True,
        connect_timeout=timeout,
        read_timeout=read_timeout,
        write_timeout=read_timeout,
    )


def park(workflow_func, *args, worker):
    """A run of `workflow_func` left ``running`` under the name `worker`, as
    a process that died (or lost a claim's reply) leaves it."""
    import uuid

    from everystep.models import Workflow

    return Workflow.objects.create(
        name=workflow_func.__everystep_workflow__,
        args=list(args),
        status=Workflow.Status.RUNNING,
        claimed_by=worker,
        claim_token=uuid.uuid4(),
    )


def url_with_password(password):
    """The test database's URL with a password in it that the server accepts:
    a user with this password is created."""
    from django.db import connection

    url = database_url()
    if connection.vendor == "sqlite":
        return url
    user = "secretive"
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT 1 FROM pg_roles WHERE rolname = '{user}'")
            verb = "ALTER" if cursor.fetchone() else "CREATE"
            cursor.execute(f"{verb} ROLE {user} LOGIN SUPERUSER PASSWORD '{password}'")
    if connection.vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute(
                f"CREATE USER IF NOT EXISTS '{user}'@'127.0.0.1' IDENTIFIED BY '{password}'"
            )
            cursor.execute(f"ALTER USER '{user}'@'127.0.0.1' IDENTIFIED BY '{password}'")
            cursor.execute(f"GRANT ALL ON *.* TO '{user}'@'127.0.0.1'")
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{user}:{password}@{rest.split('@', 1)[1]}"
