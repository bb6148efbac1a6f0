"""The operator commands' arguments, each defined once.

``manage.py everystep_cancel`` and ``everystep cancel`` (and each other
pair) build their parsers from the same `Command`: the same flags, the
same help, so the two command lines cannot drift apart. The ``manage.py``
command is the one that runs; the standalone runtime calls it.
"""

import argparse
import dataclasses


@dataclasses.dataclass(frozen=True)
class Command:
    """One operator command: `name` on the standalone command line,
    `django_name` as a management command, a `summary` for the list of
    commands, its `help`, and `add_arguments(parser)`, which adds its
    arguments to an argparse parser."""

    name: str
    summary: str
    help: str
    add_arguments: object

    @property
    def django_name(self):
        return "everystep_" + self.name.replace("-", "_")


def _resolve_step(parser):
    parser.add_argument("run_id", metavar="RUN_ID", help="the blocked run's id")
    parser.add_argument(
        "step_id", metavar="STEP_ID", help="the id of its started step, e.g. 3 or fanout.1.charge"
    )
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument("--result", help="the step succeeded: its result, as JSON")
    how.add_argument("--error", help="the step failed: this message is recorded")
    how.add_argument(
        "--discard", action="store_true", help="the step never took effect: run it again"
    )


def _requeue(parser):
    parser.add_argument("run_ids", nargs="*", metavar="RUN_ID", help="the runs to requeue")
    parser.add_argument(
        "--claimed-by", metavar="NAME", help="every run parked under this worker name"
    )


def _cancel(parser):
    parser.add_argument("run_id", metavar="RUN_ID", nargs="?", help="the run to cancel")
    parser.add_argument("--reason", help="why, kept as the run's error")
    _bulk(parser, "scheduled, running or blocked (default: all three)")


def _retry(parser):
    parser.add_argument(
        "run_id", metavar="RUN_ID", nargs="?", help="the failed run to schedule again"
    )
    _bulk(parser, "failed (the only status a run is retried from)")


def _bulk(parser, statuses):
    """The filters of a bulk cancel or retry, instead of a run id."""
    bulk = parser.add_argument_group("many runs at once, instead of a RUN_ID")
    bulk.add_argument("--status", help=statuses)
    bulk.add_argument("--workflow", metavar="NAME", help="runs of this workflow (module.function)")
    bulk.add_argument("--queue", metavar="NAME", help="runs of this queue")
    bulk.add_argument(
        "--since", metavar="TIME", help="created since TIME (ISO 8601) or a duration ago (2h)"
    )
    bulk.add_argument(
        "--until", metavar="TIME", help="created before TIME (ISO 8601) or a duration ago"
    )
    bulk.add_argument(
        "--all", action="store_true", help="every run it can change: no filter, said explicitly"
    )
    bulk.add_argument(
        "--dry-run", action="store_true", help="print the runs it would change; change none"
    )


def _send(parser):
    parser.add_argument("run_id", metavar="RUN_ID", help="the run to send the message to")
    parser.add_argument("topic", metavar="TOPIC", help="the topic its receive() waits on")
    parser.add_argument(
        "payload", metavar="JSON", nargs="?", default="null", help="the payload, as JSON"
    )
    parser.add_argument(
        "--idempotency-key", metavar="KEY", help="a second message with this key is not stored"
    )


def _fork(parser):
    parser.add_argument("run_id", metavar="RUN_ID", help="the run to fork")
    parser.add_argument(
        "--from-step",
        metavar="STEP_ID",
        required=True,
        help="the first step the new run runs again; those recorded before it are copied",
    )


def _prune(parser):
    parser.add_argument(
        "--older-than",
        metavar="DURATION",
        required=True,
        help="runs that ended longer ago than this: 30d, 12h, 90m",
    )
    parser.add_argument(
        "--status",
        metavar="STATUS[,STATUS]",
        help="completed, stopped, cancelled (the default), failed, blocked",
    )
    parser.add_argument(
        "--workflow", metavar="NAME", help="runs of this workflow only (module.function)"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="count the runs it would delete; delete none"
    )


MAX_LIMIT = 10_000  # rows `runs` lists at most


def _limit(text):
    """`runs --limit`: a whole number from 1 to `MAX_LIMIT`."""
    try:
        number = int(text)
    except ValueError:
        number = None
    if number is None or not 1 <= number <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {MAX_LIMIT}")
    return number


def _runs(parser):
    parser.add_argument(
        "--status",
        help="scheduled, running, completed, failed, stopped, blocked or cancelled",
    )
    parser.add_argument(
        "--workflow",
        metavar="NAME",
        help="runs of this workflow: module.function, or a unique function name",
    )
    parser.add_argument("--worker", metavar="NAME", help="runs claimed by this worker")
    parser.add_argument("--queue", metavar="NAME", help="runs of this queue")
    parser.add_argument(
        "--since", metavar="TIME", help="created since TIME (ISO 8601) or a duration ago (2h, 1d)"
    )
    parser.add_argument(
        "--waiting",
        action="store_true",
        help="only runs parked waiting for a message or for another run to end",
    )
    parser.add_argument(
        "--limit", type=_limit, default=20, help=f"how many, 1 to {MAX_LIMIT} (default 20)"
    )
    _json_only(parser)


def _json_only(parser):
    parser.add_argument("--json", action="store_true", help="one JSON array")


COMMANDS = {
    command.name: command
    for command in (
        Command(
            "resolve-step",
            "resolve a blocked run's uncertain step",
            "Resolve the uncertain step of a blocked run and return the run to scheduled: "
            "record its result, record an error, or discard it so it runs again.",
            _resolve_step,
        ),
        Command(
            "requeue",
            "put parked running runs back to scheduled",
            "Put running runs parked under a worker that will not come back back to "
            "scheduled, so any worker resumes them. Refused while that worker is alive "
            "(it holds its name).",
            _requeue,
        ),
        Command(
            "cancel",
            "cancel a run: scheduled or blocked at once, running at its next step boundary",
            "Cancel a run: a scheduled or blocked one at once, a running one at its next "
            "step boundary (the step in flight is recorded, no further step starts). With "
            "filters instead of a run id (or --all), every run they select, one by one.",
            _cancel,
        ),
        Command(
            "retry",
            "schedule a failed run again: done steps replay, failed ones run again",
            "Retry a failed run: it is scheduled again; its done steps are served from the "
            "record and its failed steps run again. With filters instead of a run id (or "
            "--all), every failed run they select.",
            _retry,
        ),
        Command(
            "send",
            "send a run a message: its receive() of the topic takes it",
            "Send a message to a run: it waits in the run's mailbox until a receive() of its "
            "topic takes it, and a run parked in such a receive is woken. Refused for a run "
            "that has ended.",
            _send,
        ),
        Command(
            "fork",
            "start a run again from one of its steps, on the code deployed now",
            "Start a new run with a finished run's arguments whose steps recorded before "
            "--from-step are copied, so that a run broken by a bug resumes on fixed code from "
            "where it went wrong. The new run names its origin; a running run is refused.",
            _fork,
        ),
        Command(
            "prune",
            "delete finished runs older than a duration, with their steps and messages",
            "Delete the runs that ended longer ago than --older-than, with their steps, messages "
            "and events, a batch of at most 500 rows per transaction. Completed, stopped and "
            "cancelled runs by default; failed and blocked ones only when --status names them.",
            _prune,
        ),
        Command(
            "runs",
            "recent runs, newest first",
            "List the newest runs first, filtered as the UI's runs page filters them; --json "
            "prints them as its api/runs gives them, step counts included.",
            _runs,
        ),
        Command(
            "schedules",
            "the cron workflows, their next tick and their latest tick's run",
            "List the cron workflows with their next tick and the run of their latest tick.",
            _json_only,
        ),
        Command(
            "queues",
            "the queues: limits, runs running, due and held back, and who serves them",
            "List the queues with runs scheduled or running, or with declared limits: their "
            "limits, how many runs are running and due, how many due runs wait for a limit "
            "or for a worker that serves the queue, and the live workers serving it.",
            _json_only,
        ),
        Command(
            "workers",
            "the workers that have run on this database, live ones first",
            "List the workers that have run on this database, live ones first: a worker "
            "whose heartbeat is older than 60 s and that did not stop shows as lost.",
            _json_only,
        ),
    )
}
