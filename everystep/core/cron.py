"""Cron workflows: ``@workflow(cron="*/5 * * * *", timezone="UTC")``.

The expression is parsed by croniter when the workflow is decorated; a bad
one, or an unknown time zone, raises `EverystepError` naming the workflow.

Each tick is one run, whatever the number of workers: every worker, on
each turn of its loop, schedules the latest tick that has come (a pure
computation until a new one comes), with the idempotency key
``cron:<tick in UTC, ISO 8601>``, so the database's unique key lets one
insert in and turns the others away. Ticks missed while no worker ran are
not made up: the first worker back schedules only the latest one, due at
its tick time. A cron workflow takes no arguments.
"""

import dataclasses
import datetime
import inspect
import zoneinfo

from everystep.errors import EverystepError

KEY_PREFIX = "cron:"


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A cron workflow's schedule: its expression, read in `timezone`."""

    workflow: str
    expression: str
    timezone: str

    def latest_tick(self, now):
        """The latest tick at or before `now` (aware), in UTC."""
        return (
            self._iterator(now + datetime.timedelta(microseconds=1))
            .get_prev(datetime.datetime)
            .astimezone(datetime.UTC)
        )

    def next_tick(self, now):
        """The first tick after `now` (aware), in UTC."""
        return self._iterator(now).get_next(datetime.datetime).astimezone(datetime.UTC)

    def _iterator(self, moment):
        from croniter import croniter

        return croniter(self.expression, moment.astimezone(zoneinfo.ZoneInfo(self.timezone)))


def schedule_for(func, name, expression, timezone):
    """The checked `Schedule` of the workflow `func` (registered as `name`);
    `EverystepError` naming it for a bad expression, zone or signature."""
    from croniter import croniter

    if not isinstance(expression, str) or not croniter.is_valid(expression):
        raise EverystepError(
            f"workflow {name}: cron {expression!r} is not a cron expression "
            f"(five fields: minute hour day-of-month month day-of-week, such as '*/5 * * * *')"
        )
    try:
        zoneinfo.ZoneInfo(timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError):
        raise EverystepError(
            f"workflow {name}: timezone {timezone!r} is not a time zone name, such as "
            f"'UTC' or 'Europe/Paris'"
        ) from None
    schedule = Schedule(name, expression, timezone)
    now = datetime.datetime.now(datetime.UTC)
    try:
        schedule.latest_tick(now)
        schedule.next_tick(now)
    except Exception:  # noqa: BLE001 - croniter's own errors: a date that never comes
        raise EverystepError(
            f"workflow {name}: cron {expression!r} names a date that never comes"
        ) from None
    required = [
        parameter.name
        for parameter in inspect.signature(func).parameters.values()
        if parameter.default is parameter.empty
        and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
    ]
    if required:
        raise EverystepError(
            f"workflow {name}: a cron workflow is called with no arguments, but it needs "
            f"{', '.join(required)}"
        )
    return schedule


def tick_key(tick):
    """The idempotency key of the run of `tick`."""
    return f"{KEY_PREFIX}{tick.astimezone(datetime.UTC).isoformat()}"


class Ticker:
    """What one worker schedules of the cron workflows it has: the latest
    tick of each, once per tick. It remembers when each workflow's next tick
    comes, so a turn of the loop between ticks computes nothing."""

    def __init__(self, schedules):
        self.schedules = list(schedules)
        self._next = {}  # workflow → when its tick after the one scheduled comes

    def due(self, now):
        """``[(schedule, tick)]``: the ticks come since this process last
        scheduled each workflow's."""
        return [
            (schedule, schedule.latest_tick(now))
            for schedule in self.schedules
            if schedule.workflow not in self._next or now >= self._next[schedule.workflow]
        ]

    def scheduled(self, schedule, tick):
        """Note that the run of `tick` is in the database (this process's or
        another's)."""
        self._next[schedule.workflow] = schedule.next_tick(tick)
