"""`schedule`'s JSON arguments: each from the command line, standard input
(``-``) or a file (``@PATH``), decoded, or a one-line usage error."""

import json
import sys

from everystep_runtime.errors import UsageError


def decoded(texts):
    """`schedule`'s JSON_ARGs decoded: ``-`` is read from standard input
    (once at most), ``@PATH`` from the file PATH, any other from itself."""
    if texts.count("-") > 1:
        raise UsageError("only one JSON_ARG can be - (standard input)")
    return [
        _json_argument(_argument_text(text, index), index) for index, text in enumerate(texts, 1)
    ]


def _argument_text(text, index):
    if text == "-":
        if sys.stdin is None:
            raise UsageError(f"argument {index} is -, but standard input is closed")
        return _read(sys.stdin.buffer, "standard input", index)
    if not text.startswith("@"):
        return text
    path = text[1:]
    try:
        with open(path, "rb") as file:
            return _read(file, repr(path), index)
    except OSError as exc:
        raise UsageError(f"argument {index}: cannot read {path!r}: {exc.strerror or exc}") from None


def _read(file, source, index):
    """The text of `file`, up to the most a stored record can hold."""
    from everystep.core.serde import MAX_RECORD_BYTES

    data = file.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        raise UsageError(
            f"argument {index}: {source} holds more than {MAX_RECORD_BYTES // 1048576} MiB, "
            "the most a run's arguments can take: store large data elsewhere and pass a reference"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"argument {index}: {source} is not valid UTF-8") from None


def _json_argument(text, index):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"argument {index} is not valid JSON ({exc.msg}): {_excerpt(text)}"
        ) from None
    except RecursionError:
        raise UsageError(
            f"argument {index} is nested too deeply: pass a flatter JSON value"
        ) from None
    except ValueError as exc:  # a number too long for Python to convert
        raise UsageError(f"argument {index} is not valid JSON ({exc}): {_excerpt(text)}") from None


def _excerpt(text, length=60):
    """`text` quoted, cut short if long: an error names the value, it does
    not repeat a megabyte of it."""
    return repr(text) if len(text) <= length else f"{text[:length]!r}... ({len(text)} characters)"
