"""From the environment to a configured Django: settings, logging, Sentry,
OpenTelemetry, the user's workflow modules."""

import logging
import logging.config
import os
import sys

from everystep_runtime.errors import UsageError

# Commands that run or schedule workflows need their modules imported; the
# UI imports them when named, to draw their step graphs, and `runs` to read a
# workflow's short name.
NEEDS_WORKFLOWS = {"worker", "schedule", "schedules"}
IMPORTS_WORKFLOWS = NEEDS_WORKFLOWS | {"check", "ui", "runs"}


#: The shortest password the standalone operator UI accepts.
MIN_PASSWORD_LENGTH = 12


def read_environment(environ):
    """The `Environment`, or `UsageError` naming the bad variable."""
    from everystep_config.environment import ConfigError, load

    try:
        return load(environ)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def configure(env, command):
    """Set up Django for `command`: the bundled settings (or the user's
    ``DJANGO_SETTINGS_MODULE``), logging, Sentry, the workflow modules."""
    import django
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from everystep_config.django import django_settings, logging_config

    if command in NEEDS_WORKFLOWS and not env.workflows:
        raise UsageError(
            "EVERYSTEP_WORKFLOWS is not set: name the modules that define your workflows"
        )
    if command == "ui" and env.django_settings_module is None:
        if not env.ui.password:
            raise UsageError(
                "EVERYSTEP_UI_PASSWORD is not set: the operator UI needs a password for its "
                "user, admin"
            )
        if len(env.ui.password) < MIN_PASSWORD_LENGTH:
            raise UsageError(
                f"EVERYSTEP_UI_PASSWORD is {len(env.ui.password)} characters long: the operator "
                f"UI needs at least {MIN_PASSWORD_LENGTH} (a phrase of a few words will do)"
            )
    workflows = env.workflows if command in IMPORTS_WORKFLOWS else []
    sys.path[:0] = [os.path.abspath(entry) for entry in (env.path or [os.curdir])]
    if env.django_settings_module is None:
        # A worker signs no one in: without the sessions app it starts sooner.
        sessions = command != "worker"
        settings.configure(
            **django_settings(env, workflows=workflows, ui=command == "ui", sessions=sessions)
        )
        logging.config.dictConfig(logging_config(env))
    _init_sentry(env)
    _init_tracing(env)
    try:
        django.setup()
        from django.apps import apps

        from everystep.core import command_names

        command_names.use_standalone_names()
        import_error = apps.get_app_config("everystep").import_error
        if import_error is not None:
            raise ImproperlyConfigured(import_error)
        if env.django_settings_module is not None:
            from everystep.apps import import_workflow_modules

            import_workflow_modules(workflows)
    except ImproperlyConfigured as exc:
        raise UsageError(str(exc)) from None
    except ImportError as exc:
        raise UsageError(f"DJANGO_SETTINGS_MODULE: {exc}") from None


def _init_tracing(env):
    """The OpenTelemetry SDK, configured by the standard ``OTEL_*`` variables,
    when ``OTEL_TRACES_EXPORTER`` asks for an exporter."""
    if env.traces_exporter in (None, "none"):
        return
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    if env.traces_exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    else:
        exporter = ConsoleSpanExporter()
    provider = TracerProvider()  # its resource and sampler come from OTEL_* too
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


def _init_sentry(env):
    if not env.sentry_dsn:
        return
    import sentry_sdk
    from sentry_sdk.utils import BadDsn

    try:
        sentry_sdk.init(
            dsn=env.sentry_dsn,
            environment=env.sentry_environment,
            release=env.sentry_release,
            send_default_pii=False,
            # A frame's locals hold a run's arguments and its steps' results:
            # the user's data, which an error report must not carry.
            include_local_variables=False,
        )
    except BadDsn:
        raise UsageError("SENTRY_DSN is not a valid Sentry DSN") from None
