"""``everystep COMMAND``: run workers and operate runs without a Django project.

One linear path: check the interpreter, parse the command line, read the
environment, configure Django, run the command, turn the outcome into an
exit status — 0 success, 2 when the command cannot start (bad input or
configuration), 1 when it fails while running. Errors are one line on
stderr; secrets never reach the output.
"""

import argparse
import contextlib
import gc
import os
import signal
import sys
import traceback

from everystep_runtime.errors import Failure, UsageError
from everystep_runtime.zipapp import leave_the_archive, mismatch

from everystep.control.arguments import COMMANDS
from everystep.core import clock
from everystep.errors import EverystepError
from everystep.worker import options


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and exit 2."""

    def error(self, message):
        raise UsageError(message)


def port(text):
    """`ui --port`: a port number."""
    try:
        return options.port_number(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def seconds_to_wait(text):
    """`ui --wait-for-migrations`: read as the worker's option is."""
    option = next(o for o in options.OPTIONS if o.field == "wait_for_migrations")
    try:
        return option.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def moment(text):
    """`schedule --at`: an ISO 8601 time with its zone."""
    return _converted(clock.parse_moment, text)


def duration(text):
    """`schedule --in`: a duration such as 90s, 15m or 2h."""
    return _converted(clock.parse_duration, text)


def _converted(parse, text):
    try:
        return parse(text)
    except EverystepError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser():
    parser = Parser(
        prog="everystep",
        description="Durable workflow execution: run workers, schedule and inspect runs.",
        epilog="Configuration comes from EVERYSTEP_* environment variables; flags override them.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    worker = commands.add_parser(
        "worker",
        help="run a worker; exits 0 after a clean drain",
        description="Run a worker. Each flag falls back to the variable named in its help.",
    )
    options.add_arguments(worker)

    commands.add_parser("migrate", help="create or upgrade the tables; idempotent")

    schedule = commands.add_parser("schedule", help="schedule a run and print its id")
    schedule.add_argument("workflow", help="module.qualname, or a unique function name")
    schedule.add_argument(
        "args",
        nargs="*",
        metavar="JSON_ARG",
        help="each positional argument, as JSON; - reads one from standard input and @PATH "
        "from the file PATH (for arguments too large for a command line)",
    )
    schedule.add_argument(
        "--idempotency-key", help="return the existing run scheduled with this key"
    )
    schedule.add_argument("--queue", help="the queue it waits in (default: the workflow's)")
    schedule.add_argument(
        "--priority",
        type=int,
        help="-100 to 100, higher claimed first (default: the workflow's)",
    )
    schedule.add_argument(
        "--concurrency-key", metavar="KEY", help="what its queue's key_concurrency counts by"
    )
    when = schedule.add_mutually_exclusive_group()
    when.add_argument(
        "--at",
        type=moment,
        metavar="TIME",
        help="not before this ISO 8601 time, with its zone (2026-12-24T18:00Z)",
    )
    when.add_argument(
        "--in",
        dest="delay",
        type=duration,
        metavar="DURATION",
        help="not before this long from now: 90s, 15m, 2h, 1d or 1h30m",
    )

    show = commands.add_parser("show", help="one run with its recorded steps")
    show.add_argument("run_id")
    show.add_argument("--json", action="store_true", help="one JSON object")

    for command in COMMANDS.values():
        command.add_arguments(
            commands.add_parser(command.name, help=command.summary, description=command.help)
        )

    ui = commands.add_parser(
        "ui",
        help="serve the operator UI (needs EVERYSTEP_UI_PASSWORD)",
        description="Serve the operator UI with waitress until stopped. Its user is admin, "
        "with the password EVERYSTEP_UI_PASSWORD; EVERYSTEP_UI_READ_ONLY=true removes every "
        "action.",
    )
    ui.add_argument("--port", type=port, help="the port to listen on (EVERYSTEP_UI_PORT, 8000)")
    ui.add_argument(
        "--bind", help="the address to listen on (EVERYSTEP_UI_BIND, 127.0.0.1; 0.0.0.0 for all)"
    )
    ui.add_argument(
        "--wait-for-migrations",
        type=seconds_to_wait,
        metavar="SECONDS",
        help="seconds to wait at start for the database's migrations, as the worker does "
        "(EVERYSTEP_WAIT_FOR_MIGRATIONS, default 0: refuse to start while any is pending)",
    )

    commands.add_parser(
        "check", help="show the configuration, connect, list workflows and migrations"
    )

    manage = commands.add_parser("manage", help="run a Django management command", add_help=False)
    manage.add_argument("manage_args", nargs=argparse.REMAINDER)
    return parser


def main(argv=None):
    """Run the command line in `argv` (default: ``sys.argv[1:]``) and exit."""
    problem = mismatch()
    if problem:
        _fail(problem, 2)
    leave_the_archive()
    argv = sys.argv[1:] if argv is None else argv
    try:
        _check_utf8(argv)
        args = build_parser().parse_args(argv)
        if args.version:
            import everystep

            print(f"everystep {everystep.__version__}")
            return
        if args.command is None:
            build_parser().print_help()
            raise UsageError("name a command")
        if args.command in ("worker", "ui"):
            # Until the worker installs its own handlers (it drains), a stop
            # finds nothing claimed: exit at once, and cleanly. The UI holds
            # nothing: it stops this way whenever it is asked to.
            signal.signal(signal.SIGTERM, _stopped_while_starting)
        with _collector_held_off():
            from everystep_runtime import commands, setup

            env = setup.read_environment(os.environ)
            setup.configure(env, args.command)
        if args.command in COMMANDS:
            # Parsed again, by the management command, with the same definition.
            args.command_argv = argv[argv.index(args.command) + 1 :]
            code = commands.operate(env, args)
        else:
            code = getattr(commands, args.command.replace("-", "_"))(env, args)
    except UsageError as exc:
        _fail(exc, 2)
    except Failure as exc:
        _fail(exc, 1)
    except KeyboardInterrupt:
        _fail("interrupted", 1)
    except Exception as exc:  # noqa: BLE001 - one line; the traceback at DEBUG
        if os.environ.get("EVERYSTEP_LOG_LEVEL", "").upper() == "DEBUG":
            traceback.print_exc()
        _fail(f"{type(exc).__name__}: {exc}", 1)
    sys.exit(code or 0)


@contextlib.contextmanager
def _collector_held_off():
    """Hold Python's garbage collector off while the process loads its code
    and settings, then freeze what that made out of its reach.

    Loading Django, the drivers and the workflows makes some 90,000 objects
    (modules, classes, functions) that live as long as the process, and few
    cycles: collecting meanwhile only walks them again and again, a tenth of
    a worker's start. Frozen (`gc.freeze`), they are walked by no later
    collection either; the few cycles the start leaves (some 1,200 objects)
    stay with them.
    """
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def _check_utf8(argv):
    """Python decodes bytes that are not UTF-8 to lone surrogates, which no
    database, JSON parser or log line can take: refuse them up front."""
    for index, arg in enumerate(argv, 1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError(f"command-line argument {index} is not valid UTF-8") from None


def _stopped_while_starting(signum, frame):
    raise SystemExit(0)


def _fail(message, status):
    print(f"everystep: error: {' '.join(str(message).split())}", file=sys.stderr)
    sys.exit(status)
