"""The database as an unreliable peer: which errors are transient
(`classify`), the outage in progress (`outage`), retrying the engine's own
operations through them (`transient`), a deadline on every operation
(`deadline`), connection timeouts on by default (`timeouts`), and the
server sessions left behind by abandoned connections (`sessions`).

May import: `everystep.core`, `everystep.errors`, Django's database layer,
and itself. It knows no table of ours.
"""
