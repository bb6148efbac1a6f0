"""The minimal Django settings a worker needs, built from an `Environment`:
the database, everystep plus any extra apps, and logging to stderr. No
secret key, middleware or templates: a worker serves no requests."""

from everystep_config.database import database_settings


def django_settings(env, *, workflows=()):
    """Settings for ``django.conf.settings.configure()``; `workflows` are the
    modules the everystep app imports when ready."""
    return {
        "DATABASES": {"default": database_settings(env.effective_database_url)},
        "INSTALLED_APPS": ["everystep", *env.installed_apps],
        "EVERYSTEP_WORKFLOWS": list(workflows),
        "USE_TZ": True,
        "TIME_ZONE": "UTC",
        "DEFAULT_AUTO_FIELD": "django.db.models.BigAutoField",
        "LOGGING_CONFIG": None,  # logging is set up by `logging_config`, below
    }


def logging_config(env):
    """`logging.config.dictConfig` input: everything to stderr, as text or
    one JSON object per line, at the configured level."""
    if env.log_format == "json":
        formatter = {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s",
            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
        }
    else:
        formatter = {"format": "%(asctime)s %(levelname)-7s %(name)s: %(message)s"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"default": formatter},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "default",
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"handlers": ["stderr"], "level": "WARNING"},
        "loggers": {"everystep": {"level": env.log_level}},
    }
