"""Django settings for the test suite.

The backend comes from ``EVERYSTEP_TEST_DB`` (postgres, mariadb, sqlite or
pgbouncer). ``EVERYSTEP_DATABASE_URL``, when set, names the database
outright: the suite sets it for the worker subprocesses it starts, so they
use its test database — on pgbouncer, through PgBouncer, with
``EVERYSTEP_SESSION_URL`` the direct connection for their sessions. The
test process itself talks to PostgreSQL directly.
"""

import atexit
import os
import shutil
import tempfile

from everystep_config.database import database_settings

from tests import servers

BACKEND = os.environ.get("EVERYSTEP_TEST_DB", "sqlite")

_url = os.environ.get("EVERYSTEP_DATABASE_URL")
if _url is None:
    if BACKEND == "sqlite":
        # A directory of its own: the database, its WAL and the workers' name
        # lock files all go when the suite ends.
        _directory = tempfile.mkdtemp(prefix="everystep-tests-")
        atexit.register(shutil.rmtree, _directory, ignore_errors=True)
        _url = f"sqlite:///{_directory}/everystep.sqlite3"
    else:
        _url = servers.server_url("postgres" if BACKEND == "pgbouncer" else BACKEND)

DATABASES = {"default": database_settings(_url)}
if os.environ.get("EVERYSTEP_SESSION_URL"):
    DATABASES["everystep_session"] = database_settings(os.environ["EVERYSTEP_SESSION_URL"])
    EVERYSTEP_SESSION_DATABASE = "everystep_session"
if BACKEND == "sqlite" and "EVERYSTEP_DATABASE_URL" not in os.environ:
    # A file, not Django's shared in-memory test database: worker threads and
    # subprocesses must all see it.
    DATABASES["default"]["TEST"] = {"NAME": DATABASES["default"]["NAME"]}

# The operator UI as a Django project mounts it: the project's users,
# sessions and admin (tests/urls.py).
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "everystep",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
ROOT_URLCONF = "tests.urls"
LOGIN_URL = "/admin/login/"
STATIC_URL = "/static/"
# A test's worker processes may import more (the cron tests' own module).
EVERYSTEP_WORKFLOWS = os.environ.get("EVERYSTEP_TEST_WORKFLOWS", "tests.workflows").split(",")
# Django's Tasks on everystep (tests/task_functions.py): the default
# backend, and one that retries.
TASKS = {
    "default": {
        "BACKEND": "everystep.tasks.EverystepBackend",
        "QUEUES": ["default", "emails"],
    },
    "retrying": {
        "BACKEND": "everystep.tasks.EverystepBackend",
        "QUEUES": ["default"],
        "OPTIONS": {"retries": 3, "backoff": 0.0},
    },
}
USE_TZ = True
TIME_ZONE = "UTC"
SECRET_KEY = "everystep-tests"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # The level first, so that a test can tell a note from a warning.
    "formatters": {"leveled": {"format": "%(levelname)s %(name)s: %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "leveled"}},
    "loggers": {"everystep": {"handlers": ["stderr"], "level": "INFO"}},
}
