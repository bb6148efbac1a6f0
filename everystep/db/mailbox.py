"""Messages sent to runs and the events runs publish.

A message is one INSERT into the run's mailbox, beside one UPDATE of the
run's row that makes it due when it is parked on the message's topic. That
UPDATE also locks the row, which is what makes a wake-up impossible to
miss: a run parks (`everystep.db.runs.park`) by locking its own row and only
then looking in its mailbox, so a message committed before the park is
seen by it, and one sent after finds the run parked and wakes it.
"""

from django.db import transaction
from django.db.models import Case, DateTimeField, F, Q, Value, When
from django.db.models.functions import Least

from everystep.core import clock, events, ids, serde
from everystep.db import sql
from everystep.errors import EverystepError
from everystep.models import Event, Message, Workflow
from everystep.resilience import local


def check(run_id, topic, payload, idempotency_key=None):
    """The run id of a message to send, parsed, once its `topic` is checked
    to be a name (as a step's ``everystep_id``), its key a non-empty string
    of at most 255 characters, and its payload storable (as a step's
    result); `EverystepError` with one line saying what is wrong otherwise."""
    run_id = ids.parse_run_id(run_id)
    ids.check_name(topic, "a message's topic")
    ids.check_idempotency_key(idempotency_key)
    serde.check_size(f"the payload of a message to run {run_id}", serde.encode(payload))
    return run_id


def send(run_id, topic, payload, idempotency_key=None):
    """Store a message for the run `run_id` in the caller's transaction (its
    own one if there is none) and make the run due if it waits on `topic`:
    one statement on PostgreSQL, an UPDATE and an INSERT elsewhere. With
    `idempotency_key`, a second message with that key is not stored.

    `EverystepError` when there is no such run or it has ended.
    """
    now = clock.now()
    db = local.connection()
    if db.vendor == "postgresql":
        found = _send_in_one_statement(db, run_id, topic, payload, idempotency_key, now)
    else:
        found = _send(run_id, topic, payload, idempotency_key, now)
    if not found:  # raised outside any block of ours: the caller's transaction stays usable
        raise refused(run_id, "takes no messages")
    events.announce("message_sent", run_id=run_id, topic=topic)


def _send(run_id, topic, payload, idempotency_key, now):
    waiting = Q(status=Workflow.Status.SCHEDULED, wait_topic=topic)
    with transaction.atomic(savepoint=False):
        found = (
            Workflow.objects.filter(id=run_id)
            .exclude(status__in=Workflow.ENDED)
            .update(
                # In this order: MariaDB assigns left to right, and the wait
                # is read before it is cleared.
                run_at=Case(
                    When(waiting, then=Least("run_at", Value(now, output_field=DateTimeField()))),
                    default=F("run_at"),
                ),
                wait_topic=Case(When(waiting, then=Value(None)), default=F("wait_topic")),
            )
        )
        if found:
            message = Message(
                workflow_id=run_id,
                topic=topic,
                payload=payload,
                idempotency_key=idempotency_key,
                sent_at=now,
            )
            Message.objects.bulk_create([message], ignore_conflicts=idempotency_key is not None)
    return found


# The run's row is locked (and made due, its wait over, if it waits on the
# topic) and the message stored only if the run has not ended, in one round
# trip.
_SEND = f"""
WITH target AS (
    UPDATE everystep_workflow
       SET run_at = CASE WHEN status = 'scheduled' AND wait_topic = %s
                         THEN LEAST(run_at, %s) ELSE run_at END,
           wait_topic = CASE WHEN status = 'scheduled' AND wait_topic = %s
                             THEN NULL ELSE wait_topic END
     WHERE id = %s AND status NOT IN ({", ".join(f"'{status}'" for status in Workflow.ENDED)})
 RETURNING id
), stored AS (
    INSERT INTO everystep_message (workflow_id, topic, payload, idempotency_key, sent_at)
    SELECT id, %s, CAST(%s AS jsonb), %s, %s FROM target
        ON CONFLICT DO NOTHING
 RETURNING 1
)
SELECT (SELECT count(*) FROM target), (SELECT count(*) FROM stored)
"""


def _send_in_one_statement(db, run_id, topic, payload, idempotency_key, now):
    text = serde.dumps(serde.to_json(payload))
    params = [topic, now, topic, run_id, topic, text, idempotency_key, now]
    [(found, _)] = sql.fetch(db, _SEND, params)
    return found


def refused(run_id, what):
    """The `EverystepError` for a run that is not there, or has ended."""
    status = Workflow.objects.filter(id=run_id).values_list("status", flat=True).first()
    if status is None:
        return EverystepError(f"no run {run_id}")
    return EverystepError(f"run {run_id} is {status}: a run that has ended {what}")


def oldest(run_id, topic):
    """``(id, payload)`` of the oldest message on `topic` that the run has
    not consumed, or None."""
    return (
        Message.objects.filter(workflow_id=run_id, topic=topic, consumed_by__isnull=True)
        .order_by("id")
        .values_list("id", "payload")
        .first()
    )


def consume(message_id, step_id):
    """Mark the message consumed by the step `step_id`. Returns whether it
    was still unconsumed."""
    return (
        Message.objects.filter(id=message_id, consumed_by__isnull=True).update(
            consumed_by=step_id, consumed_at=clock.now()
        )
        == 1
    )


def has_unconsumed(run_id, topic):
    """Whether a message on `topic` waits in the run's mailbox."""
    return Message.objects.filter(
        workflow_id=run_id, topic=topic, consumed_by__isnull=True
    ).exists()


def messages(run_id):
    """The run's messages, oldest first, as dicts (for `show` and the UI)."""
    fields = ("id", "topic", "payload", "idempotency_key", "sent_at", "consumed_by", "consumed_at")
    return list(Message.objects.filter(workflow_id=run_id).order_by("id").values(*fields))


def publish(run_id, key, value, step_id):
    """Record `value` as the run's latest for `key`, set by `step_id`; one INSERT."""
    Event.objects.create(workflow_id=run_id, key=key, value=value, step_id=step_id)


def latest(run_id, key):
    """``(True, value)`` of the run's latest event for `key`, or ``(False, None)``."""
    row = (
        Event.objects.filter(workflow_id=run_id, key=key)
        .order_by("-id")
        .values_list("value", flat=True)[:1]
    )
    values = list(row)
    return (True, values[0]) if values else (False, None)


def event_values(run_id):
    """The latest value of each of the run's event keys: ``{key: value}``."""
    latest_values = {}
    for key, value in (
        Event.objects.filter(workflow_id=run_id).order_by("id").values_list("key", "value")
    ):
        latest_values[key] = value
    return latest_values
