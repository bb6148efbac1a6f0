import logging
import os
import sys

from django.apps import apps
from django.core.management.base import BaseCommand, CommandError

from everystep.core import events
from everystep.errors import ConfigurationError
from everystep.observe import logs
from everystep.worker import LoopDied, NameHeld, NameLost, Worker, options


class Command(BaseCommand):
    help = (
        "Run a worker: claim scheduled workflow runs and execute them on a thread pool. "
        "SIGTERM or SIGINT drains it: in-flight runs are requeued at their next step. "
        "Each flag falls back to the EVERYSTEP_* variable named in its help."
    )
    requires_system_checks = []

    def add_arguments(self, parser):
        options.add_arguments(parser)

    def handle(self, **flags):
        try:
            level, log_format = logs.settings_from(os.environ)
        except ValueError as exc:
            raise CommandError(str(exc), returncode=2) from None
        # A new project configures no logging for everystep: show what the
        # worker does all the same (a project's own configuration wins).
        logs.show_by_default(level, log_format)
        import_error = apps.get_app_config("everystep").import_error
        if import_error is not None:
            raise CommandError(import_error, returncode=2)
        try:
            resolved = options.resolve(flags, options.from_environment(os.environ))
            options.check_queues(resolved)
        except options.OptionError as exc:
            raise CommandError(str(exc), returncode=2) from None
        if not flags.get("name") and options.unstable_name(os.environ):
            recovered = resolved.orphan_timeout > 0
            events.announce(
                "name_unstable" if recovered else "name_unstable_unrecovered", worker=resolved.name
            )
        worker = Worker(resolved)
        try:
            worker.run()
        except (NameHeld, NameLost, ConfigurationError) as exc:
            raise CommandError(str(exc), returncode=2) from None
        except LoopDied as exc:
            raise CommandError(str(exc)) from None
        if worker.abandoned:
            # Steps still running on daemon threads were requeued; exit now
            # rather than let interpreter shutdown interrupt them mid-write.
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
