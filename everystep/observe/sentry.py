"""Error reports to Sentry, fed by the engine's events (`everystep.core.events`).

When the application initialized sentry-sdk, every run that ends
``failed`` is reported once, with the exception that failed it, and so is
every error of the engine's own (a run that crashed outside its steps).
Each report carries an ``everystep`` context (``workflow``,
``workflow_id``, ``worker``) and the tags ``everystep.workflow`` and
``everystep.worker``. A `Terminal` stop, a blocked run, a drain and a
cancellation are outcomes, not errors: never reported. Without sentry-sdk,
or with it not initialized, nothing happens.
"""

import sys

from everystep.core import events


def install():
    """Subscribe the reports to the engine's events; idempotent."""
    events.subscribe(on_event)


def _failed(fields):
    exception = fields.get("exception")
    if exception is not None:
        report(exception, fields["workflow"], fields["run_id"], fields["worker"])


def report(exception, workflow, run_id, worker):
    """Send `exception` to Sentry with the run's context and tags, when the
    application initialized sentry-sdk."""
    sentry_sdk = sys.modules.get("sentry_sdk")
    if sentry_sdk is None or not sentry_sdk.get_client().is_active():
        return
    with sentry_sdk.new_scope() as scope:
        scope.set_context(
            "everystep", {"workflow": workflow, "workflow_id": str(run_id), "worker": worker}
        )
        scope.set_tag("everystep.workflow", workflow)
        scope.set_tag("everystep.worker", worker)
        sentry_sdk.capture_exception(exception)


#: What is reported: a run that failed, and one the engine failed after an error of its own.
on_event = {"run_failed": _failed, "run_crashed": _failed}
