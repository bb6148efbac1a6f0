"""Cron workflows for the cron tests only: imported by them (and by the
worker processes they start), never by the other tests, whose workers
would otherwise schedule these too."""

from everystep import step, workflow
from tests.workflows import count


@step
def tick_step():
    count("tick")
    return "ticked"


@workflow(cron="*/5 * * * *")
def every_five_minutes():
    return tick_step()


@workflow(cron="0 9 * * *", timezone="Europe/Paris")
def nine_in_paris():
    return tick_step()
