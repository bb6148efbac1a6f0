"""The JSON encoding of everything everystep stores.

Arguments, results and errors are stored as JSON. Beyond plain JSON types,
these round-trip as tagged objects ``{"__es__": TAG, "v": VALUE}``:
`datetime`, `date` (ISO 8601), `timedelta` (seconds), `UUID`, `bytes` and
`bytearray` (base64), `tuple`, and `enum.Enum` members (class path + value).
A dict that itself holds the key ``"__es__"`` is tagged too, so no user value
is ever mistaken for a tag. Anything else is refused with `EverystepError`
naming the type, before anything is written, and so are values nested
deeper than `MAX_DEPTH`, strings PostgreSQL cannot store (a NUL character,
a lone surrogate) and records larger than `MAX_RECORD_BYTES` encoded.

Decoding calls nothing a stored tag names except `enum.Enum` classes and
exception classes: stored data cannot make everystep call an arbitrary
importable object.
"""

import base64
import datetime
import enum
import importlib
import json
import math
import traceback
import uuid

from everystep.errors import EverystepError, StepFailure

TAG = "__es__"
#: How deep lists and dicts may nest in a stored value.
MAX_DEPTH = 100
#: The most one step record (or a run's arguments, or its result) may take
#: encoded: far below MariaDB's default max_allowed_packet (16 MiB), and
#: more than any value a workflow should pass between steps.
MAX_RECORD_BYTES = 8 * 1024 * 1024


def _compact_encoder():
    """``json.dumps(data, separators=(",", ":"))`` for the plain JSON data
    `to_json` returns, which holds no cycle and no other type. A step
    encodes three values, and ``JSONEncoder.encode`` builds CPython's C
    encoder anew for each call, which costs more than the encoding: the C
    encoder is built once here, where the interpreter has it."""
    encoder = json.JSONEncoder(separators=(",", ":"))
    make_encoder = json.encoder.c_make_encoder
    if make_encoder is None:
        return encoder.encode
    encode = make_encoder(
        None,  # no circular check: to_json's data is a tree
        encoder.default,
        json.encoder.encode_basestring_ascii,
        None,  # no indent
        encoder.key_separator,
        encoder.item_separator,
        False,  # sort_keys
        False,  # skipkeys
        True,  # allow_nan: to_json has refused NaN and infinities already
    )
    return lambda data: "".join(encode(data, 0))


_compact = _compact_encoder()


#: Exact types of the values `to_json` meets most, none of them an Enum's.
_NEVER_ENUM = frozenset({int, list, dict})


def to_json(value, _depth=0):
    """Return `value` as plain JSON data (dicts, lists, str, numbers, None),
    tagging the extra types; raise `EverystepError` for anything else."""
    if isinstance(value, str):
        return _checked_string(value)
    if value is None or isinstance(value, bool):
        return value
    if _depth > MAX_DEPTH:
        raise EverystepError(f"cannot serialize a value nested deeper than {MAX_DEPTH} levels")
    # Most values are of one of these exact types, which no Enum member has:
    # they skip the Enum check that an IntEnum's members need first.
    if type(value) not in _NEVER_ENUM and isinstance(value, enum.Enum):
        return _tagged(
            "enum", {"class": _dotted_name(type(value)), "value": to_json(value.value, _depth + 1)}
        )
    if isinstance(value, list):
        return [to_json(item, _depth + 1) for item in value]
    if isinstance(value, dict):
        return _dict_to_json(value, _depth + 1)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise EverystepError(
                f"cannot serialize the float {value!r}: JSON has no NaN or infinity"
            )
        return value
    if isinstance(value, tuple):
        return _tagged("tuple", [to_json(item, _depth + 1) for item in value])
    if isinstance(value, datetime.datetime):
        return _tagged("datetime", value.isoformat())
    if isinstance(value, datetime.date):
        return _tagged("date", value.isoformat())
    if isinstance(value, datetime.timedelta):
        return _tagged("timedelta", value.total_seconds())
    if isinstance(value, uuid.UUID):
        return _tagged("uuid", str(value))
    if isinstance(value, bytes | bytearray):
        tag = "bytes" if isinstance(value, bytes) else "bytearray"
        return _tagged(tag, base64.b64encode(value).decode("ascii"))
    raise EverystepError(
        f"cannot serialize a value of type {_dotted_name(type(value))}: everystep stores JSON "
        f"types plus datetime, date, timedelta, UUID, bytes, tuple and Enum"
    )


def from_json(data):
    """Rebuild the Python value that `to_json` encoded as `data`."""
    if isinstance(data, list):
        return [from_json(item) for item in data]
    if not isinstance(data, dict):
        return data
    if TAG not in data:
        return {key: from_json(item) for key, item in data.items()}
    return _DECODERS[data[TAG]](data["v"])


def encode(value):
    """Serialize `value` to JSON text (see `to_json`)."""
    return _compact(to_json(value))


def dumps(data):
    """JSON text of data `to_json` returned, for a column: None stays None
    (SQL NULL)."""
    return None if data is None else _compact(data)


def check_size(what, *texts):
    """Raise `EverystepError` when the JSON `texts` of one record (None for
    an absent value) add up to more than `MAX_RECORD_BYTES`."""
    size = 0
    for text in texts:
        if text is not None:
            size += len(text)
    if size > MAX_RECORD_BYTES:
        raise EverystepError(
            f"{what} is {size / 1048576:.1f} MiB encoded; everystep stores at most "
            f"{MAX_RECORD_BYTES // 1048576} MiB per record: store large data elsewhere "
            f"(a file, an object store) and pass its key"
        )


def decode(text):
    """Parse JSON text written by `encode` back into Python values."""
    return from_json(json.loads(text))


#: How much of a traceback is stored with an error: its first quarter and
#: its end, when it is longer.
MAX_TRACEBACK_CHARS = 16_000


def encode_exception(exc):
    """Describe `exc` as ``{"type": "module.Class", "message": str, "args":
    list, "traceback": str | None}``.

    Arguments that cannot be serialized are replaced by the message, so that
    any exception can be recorded. The traceback is None for an exception
    never raised (an operator's cancel); a long one keeps its beginning and
    its end, `MAX_TRACEBACK_CHARS` in all.
    """
    try:
        args = to_json(list(exc.args))
    except EverystepError:
        args = [str(exc)]
    return {
        "type": _dotted_name(type(exc)),
        "message": str(exc),
        "args": args,
        "traceback": _traceback_text(exc),
    }


def _traceback_text(exc):
    if exc.__traceback__ is None and not getattr(exc, "__notes__", None):
        return None
    text = "".join(traceback.format_exception(exc))
    if len(text) > MAX_TRACEBACK_CHARS:
        # The first frames (where it was called from) and the end (the frame
        # that raised, and the message), whatever a long message pushes out.
        head = MAX_TRACEBACK_CHARS // 4
        text = f"{text[:head]}\n…\n{text[-(MAX_TRACEBACK_CHARS - head) :]}"
    # Storable everywhere: no NUL, no lone surrogate.
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def decode_exception(payload):
    """Rebuild the exception `encode_exception` described: the original class
    when it can be imported and built from its args, else `StepFailure`. Its
    recorded traceback comes along as a note, so a failure replayed from its
    record still shows, logged or stored again, where it first happened."""
    type_name = payload.get("type") or ""
    message = payload.get("message", "")
    try:
        cls = import_dotted(type_name)
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            raise TypeError(f"{type_name} is not an exception class")
        exc = cls(*from_json(payload.get("args", [message])))
    except Exception:
        exc = StepFailure(message, type_name)
    if payload.get("traceback"):
        exc.add_note(f"Recorded when it first happened:\n{payload['traceback'].rstrip()}")
    return exc


def import_dotted(path):
    """Import ``module.Qual.Name``: the longest importable module prefix, then
    attributes. Raises ImportError or AttributeError when it is not there."""
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            obj = getattr(obj, attribute)
        return obj
    raise ImportError(f"cannot import {path!r}")


def _dotted_name(cls):
    return f"{cls.__module__}.{cls.__qualname__}"


def _tagged(tag, value):
    return {TAG: tag, "v": value}


def _dict_to_json(value, depth):
    encoded = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise EverystepError(
                f"cannot serialize a dict key of type {_dotted_name(type(key))}: "
                f"JSON object keys are strings"
            )
        encoded[_checked_string(key)] = to_json(item, depth)
    return _tagged("dict", encoded) if TAG in encoded else encoded


def _checked_string(value):
    """`value`, if every database can store it: no NUL character (PostgreSQL
    refuses it) and valid UTF-8 (no lone surrogate)."""
    if "\x00" in value:
        raise EverystepError("cannot store a string holding a NUL character (\\x00)")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise EverystepError("cannot store a string that is not valid UTF-8") from None
    return value


def _decode_enum(value):
    cls = import_dotted(value["class"])
    if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
        raise EverystepError(f"stored enum class {value['class']!r} is not an Enum")
    return cls(from_json(value["value"]))


_DECODERS = {
    "dict": lambda v: {key: from_json(item) for key, item in v.items()},
    "tuple": lambda v: tuple(from_json(item) for item in v),
    "datetime": datetime.datetime.fromisoformat,
    "date": datetime.date.fromisoformat,
    "timedelta": lambda v: datetime.timedelta(seconds=v),
    "uuid": uuid.UUID,
    "bytes": base64.b64decode,
    "bytearray": lambda v: bytearray(base64.b64decode(v)),
    "enum": _decode_enum,
}


def readable(value):
    """A ``json.dumps`` default for showing decoded values to a person
    (``show --json``, the operator UI): ISO dates, UUID strings, seconds,
    base64 bytes, an enum's value. Not an encoding: nothing reads it back."""
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"cannot show a {type(value).__name__}")


def readable_json(value, **options):
    """`value` as JSON text for a person to read (see `readable`)."""
    return json.dumps(value, default=readable, **options)
