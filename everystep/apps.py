from django.apps import AppConfig


class EverystepConfig(AppConfig):
    """The everystep Django app. On ready it imports each installed app's
    ``workflows`` module, so the worker knows every ``@workflow``."""

    name = "everystep"
    verbose_name = "everystep"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.utils.module_loading import autodiscover_modules

        autodiscover_modules("workflows")
