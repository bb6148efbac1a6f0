"""The environment variables of the standalone runtime, declared once.

`load(environ)` reads them into an `Environment`; a bad value raises
`ConfigError` with one line naming the variable and what is wrong with it
(never a password the value holds). `secrets(env)` are the strings no
output may show. `generate_help()` prints the table the README shows.
"""

import urllib.parse

import environ
from everystep_config.database import DatabaseURLError, database_settings, url_secrets

from everystep.observe import logs
from everystep.worker import options

DEFAULT_DATABASE_URL = "sqlite:///everystep.sqlite3"


class ConfigError(Exception):
    """A configuration value cannot be used; the message names it."""


TRACES_EXPORTERS = ("otlp", "console", "none")


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


def _flag(variable):
    """true/false (also 1/0, yes/no, on/off); anything else is refused, so a
    typo never quietly turns a safety setting off."""

    def convert(value):
        if isinstance(value, bool):
            return value
        text = value.strip().lower()
        if text in ("true", "1", "yes", "on"):
            return True
        if text in ("false", "0", "no", "off", ""):
            return False
        raise ConfigError(f"{variable}={value!r} is not true or false")

    return convert


def _port(variable):
    def convert(value):
        try:
            return options.port_number(value)
        except ValueError as exc:
            raise ConfigError(f"{variable}={value!r} {exc}") from None

    return convert


@environ.config
class UI:
    """The operator UI served by ``everystep ui``."""

    password = environ.var(
        None, help="required by `ui` (with the bundled settings): the password of its user, admin"
    )
    read_only = environ.var(
        "false",
        converter=_flag("EVERYSTEP_UI_READ_ONLY"),
        help="true: the UI shows everything and offers no action",
    )
    port = environ.var(
        "8000", converter=_port("EVERYSTEP_UI_PORT"), help="the port `ui` listens on"
    )
    bind = environ.var("127.0.0.1", help="the address `ui` listens on (0.0.0.0 in a container)")
    trusted_origins = environ.var(
        None,
        converter=_listing(","),
        help="comma-separated origins the UI is reached at through a proxy that ends TLS, "
        "such as https://ops.example.com (its forms are refused from any other)",
    )
    trusted_proxy = environ.var(
        None,
        help="the address of the proxy in front of `ui` (* for any): its X-Forwarded-Proto and "
        "X-Forwarded-For are believed, so cookies are Secure over TLS and sign-ins are counted "
        "per client; without it they are removed",
    )
    secret_key = environ.var(
        None,
        help="signs the UI's login sessions; without it a random key is drawn at each start, "
        "which logs everyone out on restart and cannot be shared by replicas",
    )


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
    session_url = environ.var(
        None,
        help="a direct connection to the same database (or a pooler's in session mode) for the "
        "worker's name lock and LISTEN, when the database URL goes through a connection pooler "
        "in transaction mode (PgBouncer)",
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
    installed_apps = environ.var(
        None, converter=_listing(","), help="extra Django apps, comma-separated"
    )
    log_level = environ.var(
        "INFO", converter=_choice("EVERYSTEP_LOG_LEVEL", logs.LEVELS, str.upper), help="log level"
    )
    log_format = environ.var(
        "text",
        converter=_choice("EVERYSTEP_LOG_FORMAT", logs.FORMATS),
        help="text, or json (one object per line)",
    )
    django_settings_module = environ.var(
        None, name="DJANGO_SETTINGS_MODULE", help="your own settings instead of the bundled ones"
    )
    sentry_dsn = environ.var(None, name="SENTRY_DSN", help="report crashed runs to Sentry")
    sentry_environment = environ.var(None, name="SENTRY_ENVIRONMENT", help="Sentry environment")
    sentry_release = environ.var(None, name="SENTRY_RELEASE", help="Sentry release")
    traces_exporter = environ.var(
        None,
        name="OTEL_TRACES_EXPORTER",
        converter=lambda value: (
            value if value is None else _choice("OTEL_TRACES_EXPORTER", TRACES_EXPORTERS)(value)
        ),
        help="send OpenTelemetry traces: otlp (configured by the OTEL_EXPORTER_OTLP_* "
        "variables), console, or none",
    )

    ui = environ.group(UI)

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
    """Read the environment; raise `ConfigError` on the first bad value.

    The worker's variables (``EVERYSTEP_POOL`` …) are checked too, so that
    a bad one fails every command at once (see `load_worker`)."""
    try:
        env = environ.to_config(Environment, environ=environ_mapping)
    except environ.exceptions.ConfigError as exc:
        raise ConfigError(f"missing {', '.join(exc.args)}") from None
    load_worker(environ_mapping)
    try:
        database = database_settings(env.effective_database_url)
    except DatabaseURLError as exc:
        message = f"{env.database_variable}: {exc}"
        raise ConfigError(mask(message, url_secrets(env.effective_database_url))) from None
    if env.session_url:
        _check_session_url(env.session_url, database["ENGINE"])
    return env


def _check_session_url(url, engine):
    """Refuse a session URL that cannot serve the database `engine` names."""
    try:
        session = database_settings(url)
    except DatabaseURLError as exc:
        raise ConfigError(mask(f"EVERYSTEP_SESSION_URL: {exc}", url_secrets(url))) from None
    if session["ENGINE"] != engine or engine.endswith("sqlite3"):
        raise ConfigError(
            "EVERYSTEP_SESSION_URL: must be a PostgreSQL or MariaDB/MySQL URL of the same "
            "database as the database URL"
        )


def load_worker(environ_mapping):
    """The worker's options as the environment sets them (their variables are
    defined with the options, in `everystep.worker.options`); `ConfigError` on a bad
    value."""
    try:
        return options.resolve({}, options.from_environment(environ_mapping))
    except options.OptionError as exc:
        raise ConfigError(str(exc)) from None


def secrets(env):
    """The strings no output may show: the database URL's passwords, the
    Sentry DSN's keys and the UI's password and key."""
    found = url_secrets(env.effective_database_url)
    if env.session_url:
        found |= url_secrets(env.session_url)
    found |= {value for value in (env.ui.password, env.ui.secret_key) if value}
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
    """The variables with their help, as environ-config formats them, then
    the worker's options' variables."""
    lines = [Environment.generate_help(display_defaults=True)]
    for option in options.OPTIONS:
        default = getattr(options.DEFAULTS, option.field)
        lines.append(f"{option.variable} (Optional, Default={default}): {option.help}.")
    return "\n".join(lines)
