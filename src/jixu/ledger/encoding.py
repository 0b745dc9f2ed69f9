"""The canonical byte encoding of JSON values and the hashes built on it.

One value has exactly one encoding: keys sorted by code point, no whitespace,
UTF-8 (non-ASCII characters written as themselves, not escaped), no NaN or
Infinity, integers written exactly (at most :data:`MAX_INT_DIGITS` digits),
floats in Python's shortest round-trip form. Only plain JSON types are accepted (``dict`` with ``str`` keys, ``list``,
``str``, ``int``, ``float``, ``bool``, ``None``), so nothing is converted
silently: a tuple or a subclass would not read back as what was written.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Callable
from typing import Any, TypeAlias

from jixu.errors import MalformedEvent

JSONValue: TypeAlias = Any
"""A value made only of dict/list/str/int/float/bool/None."""

JSONObject: TypeAlias = dict[str, Any]

_ENCODER = json.JSONEncoder(
    ensure_ascii=False,
    allow_nan=False,
    sort_keys=True,
    separators=(",", ":"),
    check_circular=True,
)



def _refuse(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _make_encode() -> Callable[[JSONValue], str]:
    """``_ENCODER.encode``, through one C encoder made once when the interpreter has it.

    ``JSONEncoder.encode`` builds a new C encoder on every call (about half
    the cost of encoding an event's small payload). Made here once, without
    its circular-reference markers: :func:`canonical_text` has checked the
    value (plain JSON, finite, not circular) before it encodes. The text is
    the same (a property test compares the two).
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - an interpreter without the C accelerator
        return _ENCODER.encode
    encoder = make(None, _refuse, json.encoder.encode_basestring, None, ":", ",", True, False, False)

    def encode(value: JSONValue) -> str:
        return "".join(encoder(value, 0))

    return encode


_encode = _make_encode()


def encode_plain(value: JSONValue) -> str:
    """The canonical text of ``value`` already known to be plain, finite, acyclic JSON (nothing is checked).

    For a caller that has just walked the value itself; anything else uses :func:`canonical_text`.
    The text may hold a lone surrogate, which ``.encode("utf-8")`` then refuses.
    """
    return _encode(value)

_SCALARS = (str, int, float, bool, type(None))


MAX_NESTING = 100
"""How many objects and arrays deep a stored value may nest. Every reader decodes it whatever its own stack
depth (the decoder recurses once per level); deeper values are refused when written, with the path."""


VALUE_NESTING = MAX_NESTING - 10
"""How deeply a free-form value (a tool's arguments or result, a model's answer, a ToolError's data) may nest:
it is stored a few levels inside its event, and deeper still in a checkpoint's state."""


def _check(value: JSONValue, path: str, room: int = MAX_NESTING) -> None:
    kind = type(value)
    if (kind is dict or kind is list) and room <= 0:
        raise MalformedEvent(f"value at {path} is nested too deeply to store (objects and arrays nest at most "
                             f"{MAX_NESTING} levels in an event, {VALUE_NESTING} in a free-form value)", path=path)
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise MalformedEvent(
                    f"object key {key!r} at {path} is a {type(key).__name__}; "
                    "JSON object keys must be str",
                    path=path,
                )
            _check(item, f"{path}.{key}", room - 1)
    elif kind is list:
        for index, item in enumerate(value):
            _check(item, f"{path}[{index}]", room - 1)
    elif kind not in _SCALARS:
        raise MalformedEvent(
            f"value at {path} is a {kind.__name__}; only dict, list, str, int, "
            "float, bool and None can be stored",
            path=path,
        )
    elif kind is float and not math.isfinite(value):
        raise MalformedEvent(f"value at {path} is {value!r}; NaN and Infinity are not JSON", path=path)


_PLAIN_SCALARS = frozenset({str, int, bool, type(None)})


def _plain(value: JSONValue, room: int = MAX_NESTING) -> bool:
    """True when ``value`` is plain JSON nested at most ``room`` levels (the common case, checked without
    building error paths)."""
    kind = type(value)
    if kind in _PLAIN_SCALARS:
        return True
    # Plain loops, not all(...): one frame per nesting level, and no generator per container.
    # Scalars inside a container are checked in place: no call per string or number.
    if kind is dict:
        if room <= 0:
            return False
        room -= 1
        for key, item in value.items():
            if type(key) is not str:
                return False
            if type(item) not in _PLAIN_SCALARS and not _plain(item, room):
                return False
        return True
    if kind is list:
        if room <= 0:
            return False
        room -= 1
        for item in value:  # noqa: SIM110
            if type(item) not in _PLAIN_SCALARS and not _plain(item, room):
                return False
        return True
    return kind is float and math.isfinite(value)


MAX_INT_DIGITS = 4300
"""The most digits an integer may have: CPython's default limit on converting between ``int`` and ``str``
(``sys.int_info.default_max_str_digits``), so every reader with default settings parses what is stored."""
_INT_BOUND = 10**MAX_INT_DIGITS


def _long_int(value: JSONValue, path: str, bound: int) -> str | None:
    """The path of the first integer in plain ``value`` whose magnitude reaches ``bound``, or ``None``."""
    kind = type(value)
    if kind is int:
        return path if not -bound < value < bound else None
    if kind is dict:
        items: Any = ((f"{path}.{key}", item) for key, item in value.items())
    elif kind is list:
        items = ((f"{path}[{index}]", item) for index, item in enumerate(value))
    else:
        return None
    for where, item in items:
        found = _long_int(item, where, bound)
        if found is not None:
            return found
    return None


def _too_long(value: JSONValue, path: str, limit: int) -> MalformedEvent:
    where = _long_int(value, path, 10**limit if limit != MAX_INT_DIGITS else _INT_BOUND) or path
    return MalformedEvent(f"integer at {where} has more than {limit} digits; store it as a string", path=where)


def canonical_text(value: JSONValue, *, path: str = "$", max_nesting: int = MAX_NESTING) -> str:
    """Return the canonical JSON text of ``value`` (raises :class:`MalformedEvent`).

    ``value`` may nest objects and arrays ``max_nesting`` levels deep (the value itself is the first).
    """
    try:
        if not _plain(value, max_nesting):
            _check(value, path, max_nesting)  # walks again, naming the offending path
        text = _encode(value)
    except RecursionError:
        raise MalformedEvent(f"value at {path} is nested too deeply to store", path=path) from None
    except ValueError:
        # The only ValueError of a checked value: an integer beyond this interpreter's digit limit.
        raise _too_long(value, path, sys.get_int_max_str_digits() or MAX_INT_DIGITS) from None
    # Only a text this long can hold a longer integer, and only an interpreter whose limit was raised
    # (sys.set_int_max_str_digits) writes one: jixu's limit holds anyway, or another process could not
    # read the event back.
    if (len(text) > MAX_INT_DIGITS and not 0 < sys.get_int_max_str_digits() <= MAX_INT_DIGITS
            and _long_int(value, path, _INT_BOUND) is not None):
        raise _too_long(value, path, MAX_INT_DIGITS)
    if text.isascii():  # O(1) in CPython; an ASCII text holds no lone surrogate
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise MalformedEvent(
            f"value at {path} contains a lone surrogate and is not valid UTF-8", path=path
        ) from exc
    return text


def canonical_bytes(value: JSONValue) -> bytes:
    """Return the canonical UTF-8 bytes of ``value``."""
    return canonical_text(value).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    """Lower-case hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def content_hash(value: JSONValue) -> str:
    """SHA-256 of the canonical encoding, e.g. for tool arguments (``args_hash``)."""
    return sha256_hex(canonical_bytes(value))


__all__ = [
    "MAX_INT_DIGITS",
    "MAX_NESTING",
    "VALUE_NESTING",
    "JSONObject",
    "JSONValue",
    "canonical_bytes",
    "canonical_text",
    "content_hash",
    "encode_plain",
    "sha256_hex",
]
