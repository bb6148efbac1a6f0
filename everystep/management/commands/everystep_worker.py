import logging
import os
import sys

from django.core.management.base import BaseCommand, CommandError

from everystep.worker import NameHeld, Worker, default_name


class Command(BaseCommand):
    help = (
        "Run a worker: claim scheduled workflow runs and execute them on a thread pool. "
        "SIGTERM or SIGINT drains it: in-flight runs are requeued at their next step."
    )
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument(
            "--pool", type=int, default=4, help="runs in flight at most (default 4)"
        )
        parser.add_argument(
            "--poll", type=float, default=0.2, help="seconds between claims when idle (default 0.2)"
        )
        parser.add_argument(
            "--name",
            default=None,
            help="unique, stable worker name (default: EVERYSTEP_NAME, DYNO, then the hostname)",
        )
        parser.add_argument(
            "--drain",
            type=float,
            default=30,
            help="seconds to wait for in-flight steps on shutdown; 0 waits forever (default 30)",
        )
        parser.add_argument(
            "--no-catchup",
            action="store_true",
            help="do not resume runs parked under this name by a crashed process",
        )
        parser.add_argument(
            "--no-notify",
            action="store_true",
            help="poll only; do not LISTEN for new runs (PostgreSQL behind PgBouncer in "
            "transaction mode)",
        )

    def handle(self, pool, poll, name, drain, no_catchup, no_notify, **options):
        try:
            worker = Worker(
                pool_size=pool,
                poll=poll,
                name=name or default_name(),
                drain=drain,
                catchup=not no_catchup,
                notify=not no_notify,
            )
        except ValueError as exc:
            raise CommandError(str(exc), returncode=2) from None
        try:
            worker.run()
        except NameHeld as exc:
            raise CommandError(str(exc), returncode=2) from None
        if worker.abandoned:
            # Steps still running on daemon threads were requeued; exit now
            # rather than let interpreter shutdown interrupt them mid-write.
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
