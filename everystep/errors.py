"""Exceptions of everystep, each named for the state it leads a run to.

- `Terminal` (raised by user code) ends a run ``stopped``.
- `EffectUncertain` ends a run ``blocked`` until an operator resolves it.
- `DrainOrphan` puts a run back to ``scheduled`` when its worker drains.
- `SimulatedCrash` leaves a run exactly as a process death would.
- `EverystepError` (and `WorkflowCodeError`) are usage errors: they fail the run.

The last three engine signals derive from `BaseException`, like
`KeyboardInterrupt`: a workflow's ``except Exception`` cleanup must not
swallow a drain, a crash or an uncertain effect.
"""


class EverystepError(Exception):
    """Misuse of everystep: a bad ``everystep_id``, a value that cannot be
    serialized, a name used twice in one scope."""


class WorkflowCodeError(EverystepError):
    """Replay found a different function at a recorded step id: the workflow's
    code changed under a run in flight. The run fails loudly."""


class StepFailure(Exception):
    """A recorded step failure whose exception class cannot be rebuilt.

    Carries the stored message and, when known, the original type's dotted
    path in `type_name`.
    """

    def __init__(self, message, type_name=None):
        super().__init__(message)
        self.message = message
        self.type_name = type_name

    def __str__(self):
        if self.type_name:
            return f"{self.type_name}: {self.message}"
        return str(self.message)


class Terminal(Exception):
    """Raise from a step or a workflow body to stop the run deliberately.

    The run ends ``stopped`` (not ``failed``), with this exception recorded in
    its ``error``; it is never reported to Sentry.
    """

    def __init__(self, reason, payload=None):
        super().__init__(reason, payload)
        self.reason = reason
        self.payload = payload

    def __str__(self):
        return str(self.reason)


class EngineSignal(BaseException):
    """Base of the signals the engine raises through user code to end a run
    attempt; never a step's own failure."""


class EffectUncertain(EngineSignal):
    """An unsafe-to-repeat step started but its outcome was never recorded.

    The run ends ``blocked``: resolve it with ``everystep resolve-step`` (or
    ``manage.py everystep_resolve_step``; ``--result``, ``--error`` or
    ``--discard``) once you know what happened.
    """

    def __init__(self, workflow_id, step_id):
        super().__init__(workflow_id, step_id)
        self.workflow_id = workflow_id
        self.step_id = step_id

    def __str__(self):
        from everystep.core.command_names import command

        return (
            f"step {self.step_id} of run {self.workflow_id} started and may have taken "
            f"effect, but its outcome was never recorded; resolve it with "
            f"{command('resolve-step')} {self.workflow_id} {self.step_id} "
            f"--result JSON | --error MSG | --discard"
        )


class DrainOrphan(EngineSignal):
    """The worker is draining: no new step starts, the run is requeued at this
    step boundary and resumes from its recorded steps on any worker."""


class Sleeping(EngineSignal):
    """The run sleeps (`everystep.sleep`): it leaves its worker and is
    scheduled again to wake at `wake_at`, on any worker."""

    def __init__(self, workflow_id, step_id, wake_at):
        super().__init__(workflow_id, step_id, wake_at)
        self.workflow_id = workflow_id
        self.step_id = step_id
        self.wake_at = wake_at

    def __str__(self):
        return f"run {self.workflow_id} sleeps at step {self.step_id} until {self.wake_at}"


class Waiting(Sleeping):
    """The run waits (`everystep.receive`, `everystep.result`) for a message
    on `topic` or the end of the run `awaited`, until `wake_at` at the
    latest: it leaves its worker, and what it waits for makes it due."""

    def __init__(self, workflow_id, step_id, wake_at, *, topic=None, awaited=None):
        super().__init__(workflow_id, step_id, wake_at)
        self.topic = topic
        self.awaited = awaited

    def __str__(self):
        what = f"a message on {self.topic!r}" if self.topic else f"the end of run {self.awaited}"
        return f"run {self.workflow_id} waits at step {self.step_id} for {what}"


class Cancelled(EngineSignal):
    """The run was cancelled (`everystep.cancel`), for `reason`: stored as a
    cancelled run's error, and raised at the step boundary where a running
    run stops."""

    def __init__(self, reason="cancelled"):
        super().__init__(reason)
        self.reason = reason

    def __str__(self):
        return str(self.reason)


class SimulatedCrash(EngineSignal):
    """Raised by a test's `everystep.engine.runner.fault` hook: the run is left exactly
    as a process death at that instant would leave it."""


class ClaimLost(EngineSignal):
    """This runner no longer owns the run (it was requeued or claimed by
    another runner): its writes are dropped and the attempt ends quietly."""


class EngineError(EngineSignal):
    """Wraps a non-transient error of the engine's own database writes so that
    no ``except Exception`` in a workflow body can swallow it; the runner
    unwraps it and the worker fails the run (see `everystep.worker`)."""

    def __init__(self, error):
        super().__init__(error)
        self.error = error


class ConfigurationError(EverystepError):
    """The database settings cannot work: a wrong password, an unknown user,
    database or host. Retrying would not help; the worker exits with status 2."""
