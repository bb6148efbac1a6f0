"""The two tables everystep keeps: one row per run, one row per recorded step.

Both hold arguments and results in the JSON encoding of `everystep.core.serde`,
read back decoded. A run's ``claim_token`` changes with every claim: the
runner's writes are fenced on it (see `everystep.db.store`).
"""

from django.db import models
from django.utils import timezone

from everystep.core import ids, serde


class EncodedJSONField(models.JSONField):
    """A JSON column holding values in everystep's tagged encoding: datetimes,
    UUIDs, bytes, tuples and enums read back as themselves."""

    def get_prep_value(self, value):
        return super().get_prep_value(serde.to_json(value))

    def from_db_value(self, value, expression, connection):
        data = super().from_db_value(value, expression, connection)
        return serde.from_json(data)


class Workflow(models.Model):
    """A run of a workflow: its arguments, where it stands and how it ended."""

    class Status(models.TextChoices):
        SCHEDULED = "scheduled"
        RUNNING = "running"
        COMPLETED = "completed"
        FAILED = "failed"
        STOPPED = "stopped"
        BLOCKED = "blocked"
        CANCELLED = "cancelled"

    TERMINAL = (Status.COMPLETED, Status.FAILED, Status.STOPPED, Status.BLOCKED, Status.CANCELLED)
    #: The statuses a run's result is waited for: a ``blocked`` run is not
    #: ended, an operator resolves it and it goes on.
    ENDED = (Status.COMPLETED, Status.FAILED, Status.STOPPED, Status.CANCELLED)

    id = models.UUIDField(primary_key=True, default=ids.new_run_id, editable=False)
    name = models.CharField(max_length=300)
    args = EncodedJSONField(default=list)
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.SCHEDULED)
    claimed_by = models.CharField(max_length=255, null=True, blank=True)
    claim_token = models.UUIDField(null=True, blank=True, editable=False)
    result = EncodedJSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    #: Not claimed before this time: the creation time, or later for a
    #: delayed start, a durable sleep or a retry's wait. Scheduled runs are
    #: claimed in this order.
    run_at = models.DateTimeField(default=timezone.now)
    claimed_at = models.DateTimeField(null=True, blank=True)
    #: When a cancel was asked of the run while it ran: its runner cancels
    #: it at the next step boundary (`everystep.control.actions.cancel`).
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    #: The W3C trace context of the code that scheduled the run (§11), so
    #: that its attempts' spans join the trace that asked for it.
    trace_context = models.JSONField(null=True, blank=True)
    #: The queue the run waits in and is limited by (`everystep.core.queues`).
    queue = models.CharField(max_length=64, default="default")
    #: Higher first, from -100 to 100; a run due long enough is claimed as
    #: if at the top (`everystep.db.claims`).
    priority = models.SmallIntegerField(default=0)
    #: Runs of a queue with ``key_concurrency`` are limited per key.
    concurrency_key = models.CharField(max_length=255, null=True, blank=True)
    #: When the run was first claimed: the start a queue's rate counts.
    started_at = models.DateTimeField(null=True, blank=True)
    #: The run whose body started this one (`everystep.start`).
    parent_id = models.UUIDField(null=True, blank=True)
    #: While ``scheduled`` after a `receive()` found no message: the topic
    #: it waits on, until ``run_at``. A message on it makes the run due.
    wait_topic = models.CharField(max_length=255, null=True, blank=True)
    #: While ``scheduled`` in a wait for a run's result: that run, until
    #: ``run_at``. Its end makes this run due.
    wait_run = models.UUIDField(null=True, blank=True)
    #: The run this one was forked from (`everystep fork`).
    origin_id = models.UUIDField(null=True, blank=True)

    class Meta:
        db_table = "everystep_workflow"
        constraints = [
            models.UniqueConstraint(
                fields=["name", "idempotency_key"], name="everystep_workflow_idempotency"
            ),
        ]
        # The claim's index (scheduled runs by due time) and the
        # catchup's (running runs by worker name) leave the finished runs
        # out, which each backend does its own way: migrations 0002 and 0003.
        # The runs by parent and the runs waiting for a run are indexed
        # where set only, where the backend can (0013).
        # The operator UI lists runs newest first by id (a UUIDv7, so in
        # creation order) and seeks each filter's runs through one of these;
        # the status filter's own indexes hold the finished runs only, each
        # backend its own way (migration 0007), and so do the indexes of the
        # counts per status under a workflow or worker filter (0008).
        indexes = [
            models.Index(fields=["name", "id"], name="everystep_run_name"),
            models.Index(fields=["claimed_by", "id"], name="everystep_run_worker"),
            models.Index(fields=["queue", "id"], name="everystep_run_queue"),
            models.Index(fields=["idempotency_key"], name="everystep_run_key"),
        ]

    def __str__(self):
        return f"{self.name} {self.id} ({self.status})"


class Queue(models.Model):
    """A queue's limits as the workers last declared them: one row per
    limited queue, written by each worker as it starts. A claim of the
    queue's runs locks this row, so limits hold across workers."""

    name = models.CharField(max_length=64, primary_key=True)
    concurrency = models.IntegerField(null=True, blank=True)
    key_concurrency = models.IntegerField(null=True, blank=True)
    rate_limit = models.IntegerField(null=True, blank=True)
    rate_seconds = models.FloatField(null=True, blank=True)
    declared_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "everystep_queue"

    def __str__(self):
        return self.name


class Step(models.Model):
    """The recorded outcome of one step of a run, unique by ``step_id``."""

    class Status(models.TextChoices):
        DONE = "done"
        FAILED = "failed"
        STARTED = "started"
        #: It failed and will be called again at the time in `result`.
        RETRYING = "retrying"
        #: A `receive()` or a wait for a run's result, parked until the
        #: time in `result` at the latest.
        WAITING = "waiting"

    # The unique (workflow, step_id) index serves lookups by workflow, so the
    # foreign key needs no index of its own (one less index per step write).
    workflow = models.ForeignKey(
        Workflow, on_delete=models.CASCADE, related_name="steps", db_index=False
    )
    step_id = models.CharField(max_length=300)
    name = models.CharField(max_length=300)
    args = EncodedJSONField(default=list)
    kwargs = EncodedJSONField(default=dict)
    status = models.CharField(max_length=16, choices=Status.choices)
    result = EncodedJSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    #: How many times the function was called (a retried step's calls);
    #: `error` holds the last one's error while it is ``retrying``.
    attempts = models.IntegerField(default=1)

    class Meta:
        db_table = "everystep_step"
        constraints = [
            models.UniqueConstraint(fields=["workflow", "step_id"], name="everystep_step_identity"),
        ]

    def __str__(self):
        return f"{self.step_id} {self.name} ({self.status})"


class Message(models.Model):
    """A message sent to a run (`everystep.send`): it waits in the run's
    mailbox until a `receive()` of its topic consumes it, once."""

    workflow = models.ForeignKey(
        Workflow, on_delete=models.CASCADE, related_name="messages", db_index=False
    )
    topic = models.CharField(max_length=255)
    payload = EncodedJSONField(null=True, blank=True)
    #: Sending twice with one key stores one message.
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    sent_at = models.DateTimeField(default=timezone.now)
    #: The step of the run that consumed it, and when.
    consumed_by = models.CharField(max_length=300, null=True, blank=True)
    consumed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "everystep_message"
        constraints = [
            models.UniqueConstraint(
                fields=["workflow", "idempotency_key"], name="everystep_message_idempotency"
            ),
        ]
        # A receive reads the oldest unconsumed message of a topic.
        indexes = [
            models.Index(fields=["workflow", "topic", "id"], name="everystep_message_mailbox")
        ]

    def __str__(self):
        return f"{self.topic} to {self.workflow_id}"


class Event(models.Model):
    """A value a run published under a key (`everystep.set_event`): one row
    per setting, the latest one read."""

    workflow = models.ForeignKey(
        Workflow, on_delete=models.CASCADE, related_name="events", db_index=False
    )
    key = models.CharField(max_length=255)
    value = EncodedJSONField(null=True, blank=True)
    #: The step of the run that set it.
    step_id = models.CharField(max_length=300)
    set_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "everystep_event"
        indexes = [models.Index(fields=["workflow", "key", "id"], name="everystep_event_key")]

    def __str__(self):
        return f"{self.key} of {self.workflow_id}"


class Worker(models.Model):
    """A worker process, as it last reported itself: one row per name.

    The row is written when the worker starts and stops, and its heartbeat
    every few seconds with the name-lock check (never per step). A worker
    whose heartbeat is older than `LOST_AFTER` seconds is lost: it died, or
    it cannot reach the database. `workflows` lists the workflows registered
    in its process: a run of any other waits for another worker.
    """

    class State(models.TextChoices):
        STARTING = "starting"
        READY = "ready"
        OUTAGE = "outage"
        DRAINING = "draining"
        STOPPED = "stopped"

    LOST_AFTER = 60

    name = models.CharField(max_length=255, unique=True)
    hostname = models.CharField(max_length=255)
    pid = models.IntegerField()
    version = models.CharField(max_length=64)
    pool_size = models.IntegerField()
    in_flight = models.IntegerField(default=0)
    state = models.CharField(max_length=16, choices=State.choices, default=State.STARTING)
    workflows = models.JSONField(default=list)
    #: The queues it serves; None when it serves every queue.
    queues = models.JSONField(null=True, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    heartbeat_at = models.DateTimeField(default=timezone.now)
    stopped_at = models.DateTimeField(null=True, blank=True)
    #: The live worker that requeued the runs this one left claimed when it
    #: went silent (SPEC §16), when, and how many; cleared when a worker
    #: starts under this name again.
    recovered_by = models.CharField(max_length=255, null=True, blank=True)
    recovered_at = models.DateTimeField(null=True, blank=True)
    recovered_runs = models.IntegerField(default=0)

    class Meta:
        db_table = "everystep_worker"

    def __str__(self):
        return f"{self.name} ({self.state})"
