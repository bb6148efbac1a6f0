"""The minimal Django settings a worker needs, built from an `Environment`:
the database, everystep plus any extra apps, and logging to stderr; and
what the operator UI adds to serve requests (`ui_settings`)."""

import secrets

from everystep_config.database import database_settings

from everystep.observe import logs

SESSION_ALIAS = "everystep_session"


def django_settings(env, *, workflows=(), ui=False, sessions=True):
    """Settings for ``django.conf.settings.configure()``; `workflows` are the
    modules the everystep app imports when ready; `ui` adds what serving the
    operator UI needs; `sessions` installs the UI's sessions app, so that
    the commands that migrate and check the database cover its table."""
    # Sessions, for the UI's sign-ins: kept in the database, so a sign-out
    # ends one for good and replicas share them.
    apps = ["everystep", "django.contrib.sessions"] if sessions else ["everystep"]
    settings = {
        "DATABASES": {"default": database_settings(env.effective_database_url)},
        "INSTALLED_APPS": [*apps, *env.installed_apps],
        "EVERYSTEP_WORKFLOWS": list(workflows),
        # Django's @task functions in those modules run as everystep runs,
        # on any queue they name.
        "TASKS": {"default": {"BACKEND": "everystep.tasks.EverystepBackend", "QUEUES": []}},
        "USE_TZ": True,
        "TIME_ZONE": "UTC",
        "DEFAULT_AUTO_FIELD": "django.db.models.BigAutoField",
        "LOGGING_CONFIG": None,  # logging is set up by `logging_config`, below
    }
    if env.session_url:
        # The worker's session-level work (its name lock, LISTEN) goes
        # there when the database URL goes through a pooler.
        settings["DATABASES"][SESSION_ALIAS] = database_settings(env.session_url)
        settings["EVERYSTEP_SESSION_DATABASE"] = SESSION_ALIAS
    if ui:
        settings.update(ui_settings(env))
    return settings


def ui_settings(env):
    """The standalone operator UI: its one user signed in by password (no
    user tables: a session in the database, for 12 hours at most), CSRF-
    checked forms, cookies ``Secure`` over TLS, the templates of the
    everystep app, and its URLs at the root."""
    return {
        "SECRET_KEY": env.ui.secret_key or secrets.token_urlsafe(50),
        "ROOT_URLCONF": "everystep_config.urls",
        "ALLOWED_HOSTS": ["*"],  # reached through any name; every page needs the password
        "MIDDLEWARE": [
            # First, so that it sees the cookies every other one has set.
            "everystep.ui.security.SecureCookies",
            "django.middleware.security.SecurityMiddleware",
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.middleware.csrf.CsrfViewMiddleware",
            "django.middleware.clickjacking.XFrameOptionsMiddleware",
        ],
        "TEMPLATES": [
            {
                "BACKEND": "django.template.backends.django.DjangoTemplates",
                "APP_DIRS": True,
                "OPTIONS": {"context_processors": ["django.template.context_processors.request"]},
            }
        ],
        "SESSION_ENGINE": "django.contrib.sessions.backends.db",
        "SESSION_COOKIE_AGE": 12 * 3600,
        "SESSION_COOKIE_NAME": "everystep_session",
        "SESSION_COOKIE_HTTPONLY": True,
        "SESSION_COOKIE_SAMESITE": "Lax",
        "CSRF_COOKIE_NAME": "everystep_csrftoken",
        "CSRF_COOKIE_HTTPONLY": True,
        "CSRF_TRUSTED_ORIGINS": env.ui.trusted_origins,
        "EVERYSTEP_UI_PASSWORD": env.ui.password,
        "EVERYSTEP_UI_READ_ONLY": env.ui.read_only,
        # Below the server's 16 threads: past it, pages poll instead.
        "EVERYSTEP_UI_MAX_STREAMS": 8,
    }


def logging_config(env):
    """`logging.config.dictConfig` input: everything to stderr, as text or
    one JSON object per line, at the configured level."""
    formatter = {"()": f"everystep.observe.logs.{logs.FORMATTERS[env.log_format].__name__}"}
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
