"""The two ways a command ends badly, and their exit statuses."""


class UsageError(Exception):
    """The command cannot start: bad flag, variable, module or database state (exit 2)."""


class Failure(Exception):
    """The command started and failed (exit 1)."""
