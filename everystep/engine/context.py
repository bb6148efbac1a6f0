"""The execution context of a running workflow, one per thread.

The runner sets a `Context` on the thread that runs a workflow body and
clears it when the body returns; `parallel()` gives each branch thread a
child context. Everything a run's contexts share — its fence (which run,
under which claim), the outcome store and the draining flag — lives in one
`RunState`; each
context owns only its scope: an id prefix, a counter and the names used.

The outcome store is a plain dict read and written from several branch
threads. Each step writes its own key once, with a fresh dict, and readers
do plain lookups: atomic under CPython's GIL, so no lock is needed.
"""

import dataclasses
import threading

from everystep.core.fence import Fence
from everystep.core.ids import NAME as _NAME
from everystep.errors import EverystepError

MAX_STEP_ID_LENGTH = 300


class _ThreadState(threading.local):
    """What this thread runs: read on every step, so unset slots are
    class attributes, not a missing attribute's exception."""

    context = None
    host = None


_local = _ThreadState()


def current():
    """The running workflow's `Context` on this thread, or None outside a run."""
    return _local.context


class _on_this_thread:
    """Context manager that sets this thread's `slot` to a value and
    restores the previous one on exit."""

    slot = None

    def __init__(self, value):
        self.value = value

    def __enter__(self):
        self.previous = getattr(_local, self.slot, None)
        setattr(_local, self.slot, self.value)
        return self.value

    def __exit__(self, *exc_info):
        setattr(_local, self.slot, self.previous)


class activated(_on_this_thread):
    """``with activated(context):`` — make `context` this thread's current
    one, restoring the previous one on exit."""

    slot = "context"


@dataclasses.dataclass(eq=False)
class RunState:
    """What all contexts of one run attempt share: the claim's `fence`
    (`everystep.core.fence.Fence`), held as the claim made it."""

    fence: Fence
    outcomes: dict = dataclasses.field(default_factory=dict)
    #: Step id → calls made so far, for the steps a retry policy called again.
    attempts: dict = dataclasses.field(default_factory=dict)
    #: A cancel was asked of the run: the step in flight was recorded, and
    #: no further step starts.
    cancel_asked: bool = False
    draining: threading.Event = dataclasses.field(default_factory=threading.Event)
    #: The run's id as text, made once: each step's record names it.
    run_text: str = dataclasses.field(init=False)

    def __post_init__(self):
        self.run_text = str(self.fence.run_id)


class Context:
    """One scope of a running workflow: the body, or one branch of a fork.

    While one of its steps' functions runs, the context stops `recording`:
    steps, forks and workflows called from inside a step are plain calls, so
    they move no step id and replay cannot serve them the wrong record.

    `outcomes` maps step id → ``{"name", "status", "result", "error"}`` for
    everything recorded so far in this run, values decoded.
    """

    def __init__(self, run, prefix=""):
        self.run = run
        self.prefix = prefix
        #: False while a step's function runs: what it calls is not recorded.
        self.recording = True
        #: Which call of its function the step running now makes: 1, then
        #: counting up as its retry policy calls it again.
        self.step_attempt = 1
        self._counter = 0
        self._names = set()

    @property
    def workflow_id(self):
        return self.run.fence.run_id

    @property
    def workflow_name(self):
        return self.run.fence.workflow

    @property
    def outcomes(self):
        return self.run.outcomes

    @property
    def draining(self):
        return self.run.draining.is_set()

    def next_step_id(self, name=None):
        """The id of the next step or fork in this scope (§2 of the contract).

        Unnamed calls take the scope's next number; a named call takes its
        name and leaves the counter alone. Raises `EverystepError` for a bad
        or repeated name, or an id longer than 300 characters.
        """
        if name is None:
            self._counter += 1
            step_id = f"{self.prefix}{self._counter}"
        else:
            self._check_name(name)
            self._names.add(name)
            step_id = f"{self.prefix}{name}"
        if len(step_id) > MAX_STEP_ID_LENGTH:
            raise EverystepError(
                f"step id {step_id[:40]}... is {len(step_id)} characters long; "
                f"the limit is {MAX_STEP_ID_LENGTH}"
            )
        return step_id

    def peek_step_id(self):
        """The id the next unnamed call in this scope will take, not taken."""
        return f"{self.prefix}{self._counter + 1}"

    def child(self, fork_id, index):
        """The context of branch `index` of the fork `fork_id`: a new scope
        sharing this run's state."""
        return Context(self.run, prefix=f"{fork_id}.{index}.")

    def _check_name(self, name):
        if not isinstance(name, str) or not _NAME.fullmatch(name) or name.isdigit():
            raise EverystepError(
                f"bad everystep_id {name!r}: use letters, digits, '_' and '-', "
                f"not digits alone (those are the positional ids)"
            )
        if name in self._names:
            raise EverystepError(
                f"everystep_id {name!r} is used twice in scope {self.prefix or '(body)'!r}: "
                f"names must be unique within a workflow body or branch"
            )


@dataclasses.dataclass(frozen=True)
class HostTransaction:
    """A transaction this thread runs workflows inside on purpose: a test's
    own (`everystep.testing`). Steps refuse only the atomic blocks opened
    beyond the `depths` it began with (database alias → atomic blocks open
    then), and `parallel()` runs its branches one after the other on this
    thread, the only one whose connection sees the transaction."""

    depths: dict


def host_transaction():
    """This thread's `HostTransaction`, or None (always, in a worker)."""
    return _local.host


class hosting(_on_this_thread):
    """``with hosting(host):`` — run this thread's workflows inside `host`,
    a `HostTransaction`, until the block exits."""

    slot = "host"
