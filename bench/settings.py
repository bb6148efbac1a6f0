"""Django settings for the benchmark processes: the database comes from
``EVERYSTEP_DATABASE_URL`` (and ``EVERYSTEP_SESSION_URL``), as for a
standalone worker."""

import os

from everystep_config.database import database_settings

DATABASES = {"default": database_settings(os.environ["EVERYSTEP_DATABASE_URL"])}
if os.environ.get("EVERYSTEP_SESSION_URL"):  # the database URL goes through a pooler
    DATABASES["everystep_session"] = database_settings(os.environ["EVERYSTEP_SESSION_URL"])
    EVERYSTEP_SESSION_DATABASE = "everystep_session"
INSTALLED_APPS = ["everystep"]
EVERYSTEP_WORKFLOWS = os.environ.get("BENCH_WORKFLOWS", "bench.workflows").split(",")
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {"everystep": {"handlers": ["stderr"], "level": "INFO"}},
}
