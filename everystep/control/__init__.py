"""What an operator does to runs: cancel, retry, resolve a blocked step,
requeue a lost worker's runs (`actions`, `resolve`).

Every front end — the command line, ``manage.py`` and the operator UI —
calls these, so each refuses the same things in the same words.

May import: `everystep.db` and everything below it. Never `engine` or
`observe`.
"""
