"""The commands of ``everystep``, each ``command(env, args)`` returning an
exit status or None. Django is configured before any of them runs."""

import os
import signal
import textwrap

from django.core.management import CommandError, call_command
from everystep_runtime import jsonargs, sqlite
from everystep_runtime.errors import Failure, UsageError

# Connection options whose value is a password (psycopg, PyMySQL).
SECRET_OPTIONS = ("password", "sslpassword", "passwd")
# Requests the UI serves at once; each live page holds one for its stream.
UI_THREADS = 16
UI_CONNECTIONS = 500  # open connections at most; waitress stops accepting past it
UI_IDLE_SECONDS = 15  # a connection that sends and receives nothing is closed (streams ping)
UI_MAX_BODY = 4 * 1024 * 1024  # bytes; a larger request body is refused with 413


def worker(env, args):
    """Run the `everystep_worker` management command: the same options, each
    flag over its environment variable (`everystep.worker.options`)."""
    from everystep.worker import options

    sqlite.migrate()  # a server database's migrations the worker checks (or waits for)
    flags = {option.field: getattr(args, option.field) for option in options.OPTIONS}
    _call(
        "everystep_worker", **{field: value for field, value in flags.items() if value is not None}
    )


def migrate(env, args):
    with sqlite.migration_lock():
        _call("migrate", verbosity=1)


def schedule(env, args):
    from everystep import schedule as schedule_run
    from everystep.core import registry
    from everystep.errors import EverystepError

    try:
        name = registry.find(args.workflow)
    except LookupError as exc:
        raise UsageError(f"{exc} (known: {', '.join(registry.names()) or 'none'})") from None
    arguments = jsonargs.decoded(args.args)
    try:
        run = schedule_run(
            registry.get(name),
            *arguments,
            idempotency_key=args.idempotency_key,
            run_at=args.at,
            delay=args.delay,
            queue=args.queue,
            priority=args.priority,
            concurrency_key=args.concurrency_key,
        )
    except EverystepError as exc:
        raise UsageError(str(exc)) from None
    print(run.id)


def show(env, args):
    from everystep.db import mailbox, reads
    from everystep.errors import EverystepError

    try:
        run, steps = reads.run_with_steps(_run_id(args.run_id))
    except EverystepError as exc:
        raise Failure(str(exc)) from None
    steps = [reads.step_fields(step) for step in steps]
    fields = reads.run_fields(run)
    children = reads.children(run.id)
    messages = mailbox.messages(run.id)
    published = mailbox.event_values(run.id)
    if args.json:
        _print_json(
            {
                **fields,
                "args": run.args,
                "result": run.result,
                "error": run.error,
                "steps": steps,
                "children": children,
                "messages": messages,
                "events": published,
            }
        )
        return
    print(f"run {run.id}  {run.name}  {run.status}")
    print(f"  args:         {_plain_json(run.args)}")
    for label in ("claimed_by", "created_at", "completed_at", "parent_id", "waits_for"):
        if fields[label]:
            print(f"  {label + ':':<14}{fields[label]}")
    if run.status == "completed":
        print(f"  result:       {_plain_json(run.result)}")
    if run.error:
        print(f"  error:        {run.error['type']}: {run.error['message']}")
    for step in steps:
        outcome = (
            _plain_json(step["result"])
            if step["status"] == "done"
            else (step["error"] or {}).get("message", "")
        )
        print(f"  step {step['step_id']:<12} {step['status']:<8} {step['name']}  {outcome}")
    for child in children:
        print(f"  child {child['id']}  {child['name']}  {child['status']}")
    for message in messages:
        consumed = message["consumed_by"]
        state = f"consumed by step {consumed}" if consumed else "not consumed"
        print(f"  message {message['topic']:<12} {state}  {_plain_json(message['payload'])}")
    for key, value in published.items():
        print(f"  event {key:<14} {_plain_json(value)}")
    if run.error and run.error.get("traceback"):
        print("  traceback:")
        print(textwrap.indent(run.error["traceback"].rstrip(), "    "))


def operate(env, args):
    """An operator command (`everystep.control.arguments`): its management
    command, given the arguments as typed, which it parses with the same
    definition."""
    from everystep.control.arguments import COMMANDS

    _call(COMMANDS[args.command].django_name, *args.command_argv)


def ui(env, args):
    """Serve the operator UI with waitress — a pure-Python WSGI server, one
    process whose threads serve requests while its event loop buffers slow
    clients — until SIGTERM or SIGINT."""
    import logging

    from django.core.wsgi import get_wsgi_application
    from waitress.server import create_server

    from everystep.ui.api import stop_streams

    _migrate_or_wait(_wait_for_migrations(args))
    port = args.port or env.ui.port
    bind = args.bind or env.ui.bind
    application = get_wsgi_application()
    try:
        server = create_server(
            application,
            host=bind,
            port=port,
            threads=UI_THREADS,
            ident="everystep",
            # Many clients, but none may hold a connection idle for long,
            # nor send a body larger than an action's form.
            connection_limit=UI_CONNECTIONS,
            channel_timeout=UI_IDLE_SECONDS,
            cleanup_interval=2,
            max_request_body_size=UI_MAX_BODY,
            # Read on while a request is served, so a live stream learns
            # that its client has gone (waitress.client_disconnected).
            channel_request_lookahead=1,
            **_proxy(env.ui.trusted_proxy),
        )
    except OSError as exc:
        raise UsageError(f"cannot listen on {bind}:{port}: {exc.strerror or exc}") from None
    except ValueError as exc:  # waitress: an address it cannot resolve
        raise UsageError(f"cannot listen on {bind}:{port}: {exc}") from None
    host, bound_port = server.socket.getsockname()[:2]
    mode = "read-only" if env.ui.read_only else "actions enabled"
    logging.getLogger("everystep.ui").info(
        "operator UI serving on http://%s:%d/ (%s)",
        host,
        bound_port,
        mode,
        extra={"action": "ui_ready", "bind": host, "port": bound_port},
    )

    def stop(signum, frame):
        # Ended first: waitress waits for its threads, and a stream holds one.
        stop_streams()
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        server.run()  # returns once a signal stopped it
    finally:
        server.close()
    logging.getLogger("everystep.ui").info("operator UI stopped", extra={"action": "ui_stopped"})


def check(env, args):
    from django.db import connection
    from everystep_config.database import masked_url
    from everystep_config.environment import load_worker

    from everystep.core import registry
    from everystep.db import schema

    problems = []
    print(f"database:   {masked_url(env.effective_database_url)}")
    if env.session_url:
        print(f"sessions:   {masked_url(env.session_url)}")
    print(f"workflows:  {', '.join(env.workflows) or '(EVERYSTEP_WORKFLOWS not set)'}")
    for name in registry.names():
        print(f"  {name}")
    worker = load_worker(os.environ)
    print(
        f"worker:     pool {worker.pool_size}, poll {worker.poll}s, drain {worker.drain}s, "
        f"catchup {worker.catchup}, database deadline {worker.db_deadline}s"
    )
    sentry = "on" if env.sentry_dsn else "off"
    print(f"logging:    {env.log_level} as {env.log_format}; sentry {sentry}")
    try:
        pending = schema.pending_migrations()
    except Exception as exc:  # noqa: BLE001 - reported as a problem
        problems.append(f"cannot connect to the database: {' '.join(str(exc).split())}")
    else:
        version = ".".join(map(str, connection.get_database_version()))
        print(f"connected:  {connection.vendor} {version}")
        if pending:
            problems.append(f"{len(pending)} migration(s) pending: run migrate")
        else:
            print("migrations: up to date")
            _print_unclaimable()
    if not env.workflows:
        problems.append("EVERYSTEP_WORKFLOWS is not set: the worker would have nothing to run")
    for problem in problems:
        print(f"problem:    {problem}")
    return 1 if problems else 0


def manage(env, args):
    """Django's command line, its output masked: ``diffsettings``, ``shell``
    and the like would otherwise print the database password."""
    from django.core.management import execute_from_command_line
    from everystep_config.environment import secrets
    from everystep_runtime.masking import masked_output

    with masked_output(secrets(env) | _settings_secrets()) as mask:
        try:
            execute_from_command_line(["everystep manage", *args.manage_args])
        except Exception as exc:  # noqa: BLE001 - one line, masked like the output
            raise Failure(mask(f"{type(exc).__name__}: {exc}")) from None


def _call(command, *args, **options):
    """Call a management command; its error's status decides ours: 2 (bad
    input, a refusal) is a usage error, anything else a failure."""
    try:
        call_command(command, *args, **options)
    except CommandError as exc:
        if exc.returncode == 2:
            raise UsageError(str(exc)) from None
        raise Failure(str(exc)) from None


def _settings_secrets():
    """The passwords in Django's ``DATABASES``: the bundled settings' or the
    user's own ``DJANGO_SETTINGS_MODULE``'s."""
    from django.conf import settings

    found = set()
    for database in settings.DATABASES.values():
        options = database.get("OPTIONS") or {}
        found |= {database.get("PASSWORD")} | {options.get(key) for key in SECRET_OPTIONS}
    return {secret for secret in found if isinstance(secret, str) and secret}


def _print_unclaimable():
    """Say which scheduled runs no live worker can claim: their workflow is in
    no live worker's process (a deploy in progress, a module missing), or
    their queue is served by no live worker."""
    from everystep.db import queues, reads

    for name, count in sorted(reads.unclaimable().items()):
        print(f"waiting:    {count} scheduled run(s) of {name}: no live worker has this workflow")
    for queue in queues.statuses():
        if queue.held_by == "no_worker":
            print(
                f"waiting:    {queue.held} due run(s) in queue {queue.name}: "
                f"no live worker serves this queue"
            )


def _proxy(address):
    """waitress's settings for a trusted proxy at `address`: it alone may say
    which scheme and which client a request came with."""
    if not address:
        return {}
    return {
        "trusted_proxy": address,
        "trusted_proxy_headers": {"x-forwarded-proto", "x-forwarded-for"},
        "trusted_proxy_count": 1,
    }


def _migrate_or_wait(seconds):
    """SQLite is migrated on the spot; a server database's migrations are
    waited for up to `seconds` (a release process started beside this one),
    then refused with the command to run."""
    from everystep.db import schema
    from everystep.errors import ConfigurationError

    sqlite.migrate()
    try:
        schema.wait_for_migrations(seconds)
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from None


def _wait_for_migrations(args):
    """`ui --wait-for-migrations`, else the worker's variable for it."""
    from everystep_config.environment import load_worker

    if args.wait_for_migrations is not None:
        return args.wait_for_migrations
    return load_worker(os.environ).wait_for_migrations


def _run_id(text):
    """A run id typed on the command line; a usage error otherwise."""
    from everystep.core import ids
    from everystep.errors import EverystepError

    try:
        return ids.parse_run_id(text)
    except EverystepError as exc:
        raise UsageError(str(exc)) from None


def _plain_json(value):
    from everystep.core.serde import readable_json

    return readable_json(value)


def _print_json(value):
    from everystep.core.serde import readable_json

    print(readable_json(value, indent=2))
