"""The runs list's query parameters, read into an `reads.RunFilter`.

``status``, ``workflow``, ``worker``, ``queue``, ``after`` and ``before`` (ISO 8601
times; without a zone, UTC), ``q`` (a run id or an idempotency key) and
``cursor`` (the id the next page starts after). A bad value raises
`EverystepError` naming the parameter: the page says so, it never fails.
"""

import datetime

from everystep.core import ids
from everystep.db import reads
from everystep.errors import EverystepError

PARAMETERS = ("status", "workflow", "worker", "queue", "after", "before", "q", "waiting")
MAX_LENGTH = 300


def run_filter(query):
    """The `RunFilter` the query parameters describe."""
    given = {name: _text(query, name) for name in PARAMETERS}
    return reads.RunFilter(
        status=given["status"],
        workflow=given["workflow"],
        worker=given["worker"],
        queue=given["queue"],
        created_after=moment("after", given["after"]),
        created_before=moment("before", given["before"]),
        search=given["q"],
        waiting=given["waiting"] is not None,
    )


def cursor(query):
    """The ``cursor`` parameter checked as a run id, or None."""
    text = _text(query, "cursor")
    if text is None:
        return None
    try:
        ids.parse_run_id(text)
    except EverystepError:
        raise EverystepError(
            f"cursor {text!r} is not a run id: start again from page one"
        ) from None
    return text


def active(query):
    """The filter parameters given, for links that keep them."""
    return {name: query[name] for name in PARAMETERS if _text(query, name)}


def _text(query, name):
    value = query.get(name, "").strip()
    if len(value) > MAX_LENGTH:
        raise EverystepError(f"{name} is longer than {MAX_LENGTH} characters")
    if "\x00" in value:
        raise EverystepError(f"{name} holds a NUL character")
    return value or None


def moment(name, text):
    """`text` as an aware datetime: ISO 8601, UTC when it gives no zone;
    None for None. `EverystepError` naming `name` otherwise."""
    if text is None:
        return None
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise EverystepError(
            f"{name} {text!r} is not a time: use ISO 8601, such as 2026-12-03T14:30"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)
