"""Run ids — new ones, and as operators type them — and the names users
give to steps, topics and event keys: the one check of each that every
front end uses."""

import re
import uuid

from everystep.errors import EverystepError


def new_run_id():
    """A new run id: a UUIDv7 (RFC 9562), ordered by the time it was made.
    uuid6's, imported at the first id: its import reads every installed
    distribution's metadata (for its version), a twentieth of a second
    that a worker's start, which makes no id, does not need."""
    from uuid6 import uuid7

    return uuid7()


def parse_run_id(text):
    """The run id `text` names (a UUID, in any of its usual spellings);
    `EverystepError` naming the text otherwise."""
    if isinstance(text, uuid.UUID):
        return text
    try:
        return uuid.UUID(str(text).strip())
    except ValueError:
        raise EverystepError(f"{text!r} is not a run id") from None


#: A step's ``everystep_id``, a message's topic, an event's key.
NAME = re.compile(r"[A-Za-z0-9_-]+")


def check_name(name, what, max_length=255):
    """`name` if it is a name as a step's ``everystep_id`` is: letters,
    digits, ``_`` and ``-``, at most `max_length` of them; `EverystepError`
    naming `what` otherwise."""
    if not isinstance(name, str) or not NAME.fullmatch(name) or len(name) > max_length:
        raise EverystepError(
            f"{what} must be 1 to {max_length} letters, digits, '_' or '-', not {name!r}"
        )
    return name


def check_idempotency_key(key):
    """`key` if it is None or an idempotency key (a non-empty string of at
    most 255 characters); `EverystepError` otherwise."""
    if key is not None and not (isinstance(key, str) and 0 < len(key) <= 255):
        raise EverystepError("idempotency_key must be a non-empty string of at most 255 characters")
    return key
