"""A Django project made the way a new user makes one — ``django-admin
startproject``, ``startapp``, everystep added to ``INSTALLED_APPS`` — on a
database of its own on the suite's backend, driven only through its
``manage.py`` in subprocesses: nothing of the suite's settings leaks in."""

import dataclasses
import pathlib
import subprocess
import sys
import textwrap
import uuid
from urllib.parse import unquote, urlsplit, urlunsplit

import pytest

from tests import servers
from tests.helpers import driver_connection
from tests.settings import BACKEND
from tests.zipapp import clean_environment

#: The project's workflows: one that completes, one whose step fails, one
#: with a fork.
WORKFLOWS = """
from everystep import parallel, step, workflow


@step
def reserve(item):
    return {"reserved": item}


@step
def charge(order_id, amount):
    if amount < 0:
        raise ValueError(f"cannot charge {amount}")
    return {"charged": amount}


@step
def notify(channel, order_id):
    return f"{channel}:{order_id}"


@workflow
def fulfil(order_id, item, amount):
    reserved = reserve(item)
    charged = charge(order_id, amount)
    sent = parallel(lambda: notify("mail", order_id), lambda: notify("sms", order_id))
    return {**reserved, **charged, "sent": list(sent)}
"""

#: What the README tells a project on SQLite to set.
SQLITE_OPTIONS = """
DATABASES["default"]["OPTIONS"] = {
    "transaction_mode": "IMMEDIATE",
    "timeout": 30,
    "init_command": "PRAGMA journal_mode=WAL;",
}
"""


@dataclasses.dataclass
class Project:
    path: pathlib.Path
    env: dict

    def manage(self, *args, timeout=180, env=None):
        """``python manage.py ARGS`` in the project, to its end."""
        return self.run_module("manage.py", *args, timeout=timeout, env=env)

    def run_module(self, module, *args, timeout=180, env=None):
        """``python -m MODULE ARGS`` (or a script, ``manage.py``) in the
        project, to its end."""
        command = [module] if module.endswith(".py") else ["-m", module]
        return subprocess.run(
            [sys.executable, *command, *args],
            cwd=self.path,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def must(self, *args, **kwargs):
        result = self.manage(*args, **kwargs)
        assert result.returncode == 0, f"manage.py {' '.join(args)}:\n{result.stderr}"
        return result

    def add_settings(self, text):
        settings = self.path / "mysite" / "settings.py"
        settings.write_text(settings.read_text() + "\n" + textwrap.dedent(text))

    def write(self, relative, text):
        target = self.path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(text).lstrip())
        return target

    def schedule(self, *calls):
        """Schedule ``fulfil(*args)`` for each of `calls` from ``manage.py
        shell``; returns the run ids."""
        code = "from everystep import schedule; from orders.workflows import fulfil\n" + "".join(
            f"print('RUN', schedule(fulfil, *{list(args)!r}).id)\n" for args in calls
        )
        out = self.must("shell", "-c", code).stdout
        return [line.split()[1] for line in out.splitlines() if line.startswith("RUN ")]

    def files(self):
        """Every file in the project but caches: what a run may leave behind."""
        return sorted(
            str(path.relative_to(self.path))
            for path in self.path.rglob("*")
            if path.is_file()
            and "__pycache__" not in path.parts
            and ".pytest_cache" not in path.parts
        )


def make_project(base, *, sqlite_options=True, workflows_module=True):
    """A fresh project under `base` with an ``orders`` app; on PostgreSQL
    and MariaDB, a database of its own."""
    env = clean_environment(PYTHONUNBUFFERED="1")
    path = base / "mysite"
    path.mkdir()
    for command in (["startproject", "mysite", str(path)],):
        subprocess.run([sys.executable, "-m", "django", *command], env=env, check=True)
    subprocess.run(
        [sys.executable, "manage.py", "startapp", "orders"], cwd=path, env=env, check=True
    )
    project = Project(path, env)
    if workflows_module:
        project.write("orders/workflows.py", WORKFLOWS)
    project.add_settings('INSTALLED_APPS += ["everystep", "orders"]\n')
    if BACKEND == "sqlite":
        if sqlite_options:
            project.add_settings(SQLITE_OPTIONS)
    else:
        project.add_settings(_server_database(BACKEND))
    return project


def empty_database_url(directory):
    """The URL of a new, empty database on the suite's backend: a file in
    `directory` on SQLite, a new database on the suite's server otherwise
    (dropped with the server at the end of the run)."""
    if BACKEND == "sqlite":
        return f"sqlite:///{directory}/empty.sqlite3"
    server = servers.server_url(BACKEND)
    name = f"fresh_{uuid.uuid4().hex[:10]}"
    with driver_connection(server) as admin:
        admin.cursor().execute(f"CREATE DATABASE {name}")
    return urlunsplit(urlsplit(server)._replace(path=f"/{name}"))


def _server_database(backend):
    """The project's settings for an empty database on the suite's server."""
    parts = urlsplit(empty_database_url(None))
    engine = "postgresql" if backend == "postgres" else "mysql"
    prelude = "import pymysql\npymysql.install_as_MySQLdb()\n" if backend == "mariadb" else ""
    return f"""{prelude}
DATABASES = {{
    "default": {{
        "ENGINE": "django.db.backends.{engine}",
        "NAME": {parts.path.lstrip("/")!r},
        "USER": {unquote(parts.username or "")!r},
        "PASSWORD": {unquote(parts.password or "")!r},
        "HOST": {parts.hostname!r},
        "PORT": {parts.port!r},
    }}
}}
"""


@pytest.fixture
def fresh_project(tmp_path):
    """``fresh_project(sqlite_options=True, workflows_module=True)``."""
    return lambda **options: make_project(tmp_path, **options)
