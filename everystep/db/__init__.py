"""Every SQL statement everystep makes on its own tables: the engine's
fenced reads and writes of runs and steps (`store`), the operators' reads
(`operations`), the lock on a worker's name (`namelock`) and whether the
schema is migrated (`schema`).

May import: `everystep.core`, `everystep.resilience`, `everystep.models`,
`everystep.errors`, and itself.
"""
