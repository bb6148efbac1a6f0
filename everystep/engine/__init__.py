"""One attempt of one run: the per-thread execution context (`context`) and
the replay engine that runs a claimed body, recording every step
(`runner`).

May import: `everystep.db` and everything below it. Never `control` or
`observe`: the engine announces events (`everystep.core.events`) and its
observers subscribe to them.
"""
