"""The fence of a claimed run: which run, of which workflow, held by which
worker under which claim.

A claim makes one `Fence` (`everystep.db.store.claim`) and everything
downstream holds that same value: the pool's job, the runner's state, every
fenced write (it lands only while the run is still held under
`claim_token`) and every announcement about the run, which names it whole
(`everystep.core.events.announce`).
"""

import dataclasses
import uuid


@dataclasses.dataclass(frozen=True, slots=True)
class Fence:
    """A run held under one claim. `claim_token` is None only outside a
    worker (a plain call of a workflow, which writes nothing)."""

    run_id: uuid.UUID
    workflow: str
    claim_token: uuid.UUID | None
    worker: str | None

    def fields(self):
        """The fields an announcement about the run carries."""
        return {"run_id": self.run_id, "workflow": self.workflow, "worker": self.worker}
