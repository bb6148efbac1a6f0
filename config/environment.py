"""The environment variables of the standalone runtime, declared once.

`load(environ)` reads them into an `Environment`; a bad value raises
`ConfigError` with one line naming the variable and what is wrong with it
(never a password the value holds). `secrets(env)` are the strings no
output may show. `generate_help()` prints the table the README shows.
"""

import math
import urllib.parse

import environ
from everystep_config.database import DatabaseURLError, database_settings, url_secrets

DEFAULT_DATABASE_URL = "sqlite:///everystep.sqlite3"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("text", "json")


class ConfigError(Exception):
    """A configuration value cannot be used; the message names it."""


def _number(variable, kind, minimum, strictly=False):
    noun = "whole number" if kind is int else "number"

    def convert(value):
        try:
            number = kind(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{variable}={value!r} is not a {noun}") from None
        if kind is float and not math.isfinite(number):
            raise ConfigError(f"{variable}={value!r} is not a finite number")
        if number < minimum or (strictly and number == minimum):
            relation = ">" if strictly else ">="
            raise ConfigError(f"{variable}={value!r} must be {relation} {minimum}")
        return number

    return convert


def _boolean(variable):
    def convert(value):
        if isinstance(value, bool):
            return value
        lowered = value.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{variable}={value!r} is not a boolean: use true or false")

    return convert


def _choice(variable, choices, normalize=str.lower):
    def convert(value):
        if normalize(value) not in choices:
            raise ConfigError(f"{variable}={value!r} is not one of: {', '.join(choices)}")
        return normalize(value)

    return convert


def _listing(separator):
    def convert(value):
        if value is None or isinstance(value, list):
            return value or []
        return [item.strip() for item in value.split(separator) if item.strip()]

    return convert


@environ.config(prefix="EVERYSTEP")
class Environment:
    """everystep's settings, from ``EVERYSTEP_*`` and a few standard variables."""

    database_url = environ.var(
        None,
        help="postgres://, postgresql://, mysql://, mariadb:// or sqlite:///path "
        f"(default: DATABASE_URL, else {DEFAULT_DATABASE_URL})",
    )
    platform_database_url = environ.var(
        None, name="DATABASE_URL", help="used when EVERYSTEP_DATABASE_URL is not set"
    )
    workflows = environ.var(
        None,
        converter=_listing(","),
        help="comma-separated modules whose @workflows the worker runs (required by worker "
        "and schedule)",
    )
    path = environ.var(
        None, converter=_listing(":"), help="extra sys.path entries, ':'-separated (default: .)"
    )
    pool = environ.var("4", converter=_number("EVERYSTEP_POOL", int, 1), help="runs in flight")
    poll = environ.var(
        "0.2",
        converter=_number("EVERYSTEP_POLL", float, 0, strictly=True),
        help="seconds between claims when idle",
    )
    name = environ.var(None, help="worker name (default: DYNO, then the hostname)")
    drain = environ.var(
        "30",
        converter=_number("EVERYSTEP_DRAIN", float, 0),
        help="seconds to drain on SIGTERM; 0 waits forever",
    )
    catchup = environ.var(
        "true",
        converter=_boolean("EVERYSTEP_CATCHUP"),
        help="resume runs parked under the worker's name at start",
    )
    notify = environ.var(
        "true",
        converter=_boolean("EVERYSTEP_NOTIFY"),
        help="on PostgreSQL, wake idle workers with LISTEN/NOTIFY (false behind PgBouncer's "
        "transaction pooling)",
    )
    installed_apps = environ.var(
        None, converter=_listing(","), help="extra Django apps, comma-separated"
    )
    log_level = environ.var(
        "INFO", converter=_choice("EVERYSTEP_LOG_LEVEL", LOG_LEVELS, str.upper), help="log level"
    )
    log_format = environ.var(
        "text",
        converter=_choice("EVERYSTEP_LOG_FORMAT", LOG_FORMATS),
        help="text, or json (one object per line)",
    )
    django_settings_module = environ.var(
        None, name="DJANGO_SETTINGS_MODULE", help="your own settings instead of the bundled ones"
    )
    sentry_dsn = environ.var(None, name="SENTRY_DSN", help="report crashed runs to Sentry")
    sentry_environment = environ.var(None, name="SENTRY_ENVIRONMENT", help="Sentry environment")
    sentry_release = environ.var(None, name="SENTRY_RELEASE", help="Sentry release")

    @property
    def effective_database_url(self):
        return self.database_url or self.platform_database_url or DEFAULT_DATABASE_URL

    @property
    def database_variable(self):
        """The variable the database URL came from, for error messages."""
        if self.database_url:
            return "EVERYSTEP_DATABASE_URL"
        return "DATABASE_URL" if self.platform_database_url else "the default database URL"


def load(environ_mapping):
    """Read the environment; raise `ConfigError` on the first bad value."""
    try:
        env = environ.to_config(Environment, environ=environ_mapping)
    except environ.exceptions.ConfigError as exc:
        raise ConfigError(f"missing {', '.join(exc.args)}") from None
    try:
        database_settings(env.effective_database_url)
    except DatabaseURLError as exc:
        message = f"{env.database_variable}: {exc}"
        raise ConfigError(mask(message, url_secrets(env.effective_database_url))) from None
    return env


def secrets(env):
    """The strings no output may show: the database URL's passwords and the
    Sentry DSN's keys."""
    found = url_secrets(env.effective_database_url)
    if env.sentry_dsn:
        try:
            dsn = urllib.parse.urlsplit(env.sentry_dsn)
            keys = {dsn.username or "", dsn.password or ""}
        except ValueError:
            keys = {env.sentry_dsn}
        found |= {key for key in keys if key}
    return found


def mask(text, hidden):
    """`text` with every string of `hidden` replaced by ``***``, the longest first."""
    for secret in sorted(hidden, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def generate_help():
    """The variables with their help, as environ-config formats them."""
    return Environment.generate_help(display_defaults=True)
