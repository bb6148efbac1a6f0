"""Pure rules, no database: how values are encoded (`serde`), what time it
is and when a run is due (`clock`), which workflows exist (`registry`),
cron ticks (`cron`), a step's retry policy (`retry_policy`), the table of
events and `announce` (`events`), and the names of the operator's commands
(`command_names`).

May import: the standard library, Django's settings-free utilities,
`everystep.errors`, and itself. Nothing here opens a connection.
"""
