"""Run ids as operators type them: the one parser every front end uses."""

import uuid

from everystep.errors import EverystepError


def parse_run_id(text):
    """The run id `text` names (a UUID, in any of its usual spellings);
    `EverystepError` naming the text otherwise."""
    if isinstance(text, uuid.UUID):
        return text
    try:
        return uuid.UUID(str(text).strip())
    except ValueError:
        raise EverystepError(f"{text!r} is not a run id") from None
