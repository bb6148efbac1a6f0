"""Database chores of the measurement subprocesses (Django set up)."""

from django.db import connection, transaction
from django.db.models import Count

from everystep.models import Workflow


def clear_runs():
    """Remove every run and step."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("TRUNCATE everystep_step, everystep_workflow")
        else:
            cursor.execute("DELETE FROM everystep_step")
            cursor.execute("DELETE FROM everystep_workflow")


def schedule_many(workflow, count, args=()):
    """Schedule `count` runs of `workflow` in one transaction, as an
    application would in a bulk import; they are claimable when it returns."""
    name = workflow.__everystep_workflow__
    with transaction.atomic():
        Workflow.objects.bulk_create(
            [Workflow(name=name, args=list(args)) for _ in range(count)], batch_size=1000
        )


def unfinished():
    """How many runs are not yet terminal."""
    return Workflow.objects.exclude(status__in=Workflow.TERMINAL).count()


def outcome_counts():
    """Runs per status."""
    rows = Workflow.objects.values_list("status").annotate(count=Count("id")).order_by()
    return dict(rows)
