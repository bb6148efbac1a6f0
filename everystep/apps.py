import importlib

from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


class EverystepConfig(AppConfig):
    """The everystep Django app.

    When ready it imports every installed app's ``workflows`` and ``tasks``
    modules and the modules listed in the ``EVERYSTEP_WORKFLOWS`` setting, so
    that a worker knows every ``@workflow`` and ``@task`` (`everystep.tasks`)
    it may be asked to run, tunes each new
    MySQL/MariaDB connection's socket (`everystep.resilience.timeouts`) and notes each
    new connection's server session (`everystep.resilience.sessions`) and the
    outage generation it opened in (`everystep.resilience.outage`).
    """

    name = "everystep"
    verbose_name = "everystep"
    default_auto_field = "django.db.models.BigAutoField"
    #: Why a module of ``EVERYSTEP_WORKFLOWS`` could not be imported, one
    #: line: reported by the system checks (``everystep.E001``) and refused
    #: by the worker, rather than failing every command with a traceback.
    import_error = None

    def ready(self):
        from django.db.backends.signals import connection_created

        from everystep import checks  # noqa: F401 - registers the checks
        from everystep.resilience import outage, sessions, timeouts

        receivers = (
            timeouts.on_connection_created,
            sessions.on_connection_created,
            outage.stamp,
        )
        for receiver in receivers:
            connection_created.connect(receiver, dispatch_uid=receiver.__module__)

        self._import_app_modules()
        try:
            import_workflow_modules(getattr(settings, "EVERYSTEP_WORKFLOWS", ()))
        except ImproperlyConfigured as exc:
            self.import_error = str(exc)

    def _import_app_modules(self):
        """Import every installed app's ``workflows`` and ``tasks`` module —
        but this app's own ``tasks``, the Tasks backend, which Django loads
        when a ``@task`` is declared (a worker without any is spared the
        import)."""
        from django.apps import apps
        from django.utils.module_loading import module_has_submodule

        for config in apps.get_app_configs():
            for module in ("workflows", "tasks"):
                if config is self and module == "tasks":
                    continue
                if module_has_submodule(config.module, module):
                    importlib.import_module(f"{config.name}.{module}")


def import_workflow_modules(modules):
    """Import each module so its ``@workflow``s register; a module that fails
    raises `ImproperlyConfigured` naming it and the error, on one line."""
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:
            reason = " ".join(str(exc).split())
            raise ImproperlyConfigured(
                f"cannot import workflow module {module}: {type(exc).__name__}: {reason}"
            ) from exc
