"""The event envelope and its hash chain.

An :class:`Event` is immutable once stored. Its ``hash`` is::

    sha256(DOMAIN_TAG || canonical({data, id, meta, prev_hash, recorded_at,
                                    seq, stream, type}))

and ``prev_hash`` is the hash of the event before it in the same stream (for
``seq`` 1: the stream's genesis value, :data:`GENESIS_HASH` unless the stream
was forked, in which case it is the parent's hash at the fork point).

Identifiers (``id``, ``stream``, ``type``) are restricted to ASCII characters
that JSON never escapes, so the envelope's canonical text can be assembled
from the stored canonical ``data`` and ``meta`` texts without re-encoding.
That keeps verification fast and byte-exact; a test proves the fast path
equals the general canonical encoder.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from jixu.errors import InvalidId, InvalidInput, MalformedEvent, PayloadTooLarge
from jixu.ledger.encoding import JSONObject, canonical_text
from jixu.ledger.ids import check_id, new_id

DOMAIN_TAG = b"jixu.event.v1\x00"
"""Prefix of every hashed envelope, so an event hash is never confused with another hash."""

GENESIS_HASH = "0" * 64
"""``prev_hash`` of seq 1 in a stream that was not forked."""

MAX_PAYLOAD_BYTES = 1024 * 1024
"""Default limit of an event's encoded ``data`` plus ``meta``."""

STREAM_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+=-]{0,199}$")
TYPE_PATTERN = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")
HASH_PATTERN = re.compile(r"^[0-9a-f]{64}$")
_MAX_TYPE_LENGTH = 100


def check_stream(stream: object) -> str:
    """Return ``stream`` if it is a valid stream name, else raise :class:`InvalidId`."""
    if not isinstance(stream, str) or not STREAM_PATTERN.match(stream):
        raise InvalidId(
            f"stream name {stream!r} is invalid: use 1-200 characters from "
            "A-Z a-z 0-9 . _ : / @ + = -, starting with a letter or digit",
            field="stream",
        )
    return stream


def check_type(event_type: object) -> str:
    """Return ``event_type`` if it is a dotted lower-case name like ``tool.requested``."""
    if (
        not isinstance(event_type, str)
        or len(event_type) > _MAX_TYPE_LENGTH
        or not TYPE_PATTERN.match(event_type)
    ):
        raise MalformedEvent(
            f"event type {event_type!r} is invalid: use dotted lower-case words, "
            "e.g. 'tool.requested' (at most 100 characters)",
            field="type",
        )
    return event_type


def check_hash(value: object, what: str = "hash") -> str:
    """Return ``value`` if it is 64 lower-case hex characters."""
    if not isinstance(value, str) or not HASH_PATTERN.match(value):
        raise InvalidId(f"{what} {value!r} is not a 64-character lower-case hex SHA-256", field=what)
    return value


def format_timestamp(moment: datetime) -> str:
    """The one textual form of ``recorded_at``: ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (UTC)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def utc_now_text() -> str:
    """The current UTC time in the ``recorded_at`` form."""
    return format_timestamp(datetime.now(UTC))


def envelope_text(
    *,
    id: str,
    stream: str,
    seq: int,
    type: str,
    data_json: str,
    meta_json: str,
    recorded_at: str,
    prev_hash: str,
) -> str:
    """Canonical text of the envelope without ``hash`` (keys in sorted order)."""
    return envelope_text_of(id, stream, seq, type, data_json, meta_json, recorded_at, prev_hash)


def envelope_text_of(id: str, stream: str, seq: int, type: str, data_json: str, meta_json: str,
                     recorded_at: str, prev_hash: str) -> str:
    """:func:`envelope_text` with positional arguments (the one definition of the text; for hot loops)."""
    return (
        f'{{"data":{data_json},"id":"{id}","meta":{meta_json},"prev_hash":"{prev_hash}",'
        f'"recorded_at":"{recorded_at}","seq":{seq},"stream":"{stream}","type":"{type}"}}'
    )


def compute_hash(
    *,
    id: str,
    stream: str,
    seq: int,
    type: str,
    data_json: str,
    meta_json: str,
    recorded_at: str,
    prev_hash: str,
) -> str:
    """The event hash over the canonical envelope (see the module docstring)."""
    text = envelope_text(
        id=id,
        stream=stream,
        seq=seq,
        type=type,
        data_json=data_json,
        meta_json=meta_json,
        recorded_at=recorded_at,
        prev_hash=prev_hash,
    )
    return hashlib.sha256(DOMAIN_TAG + text.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to append: the store assigns ``seq``, ``recorded_at`` and the hashes.

    ``id`` defaults to a fresh ULID; pass your own to make a retried append
    idempotent (same id and content: no-op; same id, other content: error).
    """

    type: str
    data: JSONObject = field(default_factory=dict)
    meta: JSONObject = field(default_factory=dict)
    id: str = field(default_factory=new_id)


@dataclass(frozen=True, slots=True)
class PreparedEvent:
    """A validated :class:`NewEvent` with its canonical data and meta texts, as made by :func:`prepare`.

    A store appends one as it is (its texts are not encoded again), so build
    it with :func:`prepare`, never by hand.
    """

    id: str
    type: str
    data_json: str
    meta_json: str
    size: int
    """UTF-8 bytes of ``data_json`` plus ``meta_json`` (what the payload limit counts)."""
    _made_by: object = field(default=None, repr=False, compare=False)
    """:data:`_PREPARE` when :func:`prepare` made it; a store refuses any other (see :func:`check_prepared`)."""
    _parsed: JSONObject | None = field(default=None, init=False, repr=False, compare=False)
    """``parse_json(data_json)`` when its maker already parsed it (see :func:`keep_parsed`), else None."""

    def same_content(self, data_json: str, meta_json: str, type: str) -> bool:
        """True when a stored event with this id carries exactly this content."""
        return self.type == type and self.data_json == data_json and self.meta_json == meta_json


def prepare(event: NewEvent, max_payload_bytes: int = MAX_PAYLOAD_BYTES) -> PreparedEvent:
    """Validate ``event`` and encode its payload canonically (writes nothing)."""
    if not isinstance(event, NewEvent):
        raise MalformedEvent(f"expected a NewEvent, got {type(event).__name__}")
    check_id(event.id, "event id")
    check_type(event.type)
    if type(event.data) is not dict:
        raise MalformedEvent(f"event {event.id}: data must be a JSON object (dict)", field="data")
    if type(event.meta) is not dict:
        raise MalformedEvent(f"event {event.id}: meta must be a JSON object (dict)", field="meta")
    data_json = canonical_text(event.data, path="data")
    meta_json = _meta_text(event.meta)
    size = utf8_size(data_json) + utf8_size(meta_json)
    # PreparedEvent(id=..., ..., _made_by=_PREPARE), its slots filled directly (see _new below): every append
    # prepares each of its events.
    prepared: PreparedEvent = _new(PreparedEvent)
    _prepared_id(prepared, event.id)
    _prepared_type(prepared, event.type)
    _prepared_data_json(prepared, data_json)
    _prepared_meta_json(prepared, meta_json)
    _prepared_size(prepared, size)
    _prepared_made_by(prepared, _PREPARE)
    _prepared_parsed(prepared, None)
    check_payload_size(prepared, max_payload_bytes)
    return prepared


def keep_parsed(prepared: PreparedEvent, data: JSONObject) -> None:
    """Remember ``data``, which must be ``parse_json(prepared.data_json)``, as the stored event's data.

    For a caller that parsed the text anyway (a staged receipt is projected before it is stored): the
    event the store returns then shares that object instead of parsing the same text again. Events are
    immutable; nobody may mutate ``data`` afterwards. Anything but a dict raises :class:`InvalidInput`.
    """
    if type(data) is not dict:
        raise InvalidInput(f"event {prepared.id!r}: the kept parse of its data must be the dict its text parses "
                           f"to, not a {type(data).__name__}", field="data")
    _prepared_parsed(prepared, data)


_PREPARE = object()
"""Marks the prepared events :func:`prepare` made (their texts are known canonical)."""


def check_prepared(prepared: PreparedEvent, max_payload_bytes: int) -> PreparedEvent:
    """Return ``prepared`` if :func:`prepare` made it and it fits ``max_payload_bytes`` (a store's limit may be
    lower than the one it was prepared under); else raise :class:`InvalidInput` or :class:`PayloadTooLarge`."""
    if prepared._made_by is not _PREPARE:
        raise InvalidInput(f"event {prepared.id!r}: a PreparedEvent must be made by prepare(), which checks and "
                           "encodes it; append the NewEvent instead", field="events")
    check_payload_size(prepared, max_payload_bytes)
    return prepared


def utf8_size(text: str) -> int:
    """The length of ``text`` in UTF-8 bytes (without encoding it when it is ASCII)."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def check_payload_size(prepared: PreparedEvent, max_payload_bytes: int) -> None:
    """Raise :class:`PayloadTooLarge` when ``prepared`` is over ``max_payload_bytes``."""
    if prepared.size > max_payload_bytes:
        raise PayloadTooLarge(
            f"event {prepared.id} ({prepared.type}) encodes to {prepared.size} bytes; the limit is "
            f"{max_payload_bytes}. Store large values as artifacts and reference them.",
            size=prepared.size,
            limit=max_payload_bytes,
        )


_META_TEXTS: dict[tuple[tuple[str, str], ...], str] = {}
"""Canonical texts of small all-string metas: every event of a thread carries the same few."""


def _meta_text(meta: JSONObject) -> str:
    """``canonical_text(meta)``, remembered for small metas whose values are all strings.

    Only ``str`` values are keys of the memo: ``True`` and ``1`` are equal
    as keys but encode differently.
    """
    if len(meta) > 4 or not all(type(value) is str for value in meta.values()):
        return canonical_text(meta, path="meta")
    key = tuple(meta.items())
    text = _META_TEXTS.get(key)
    if text is None:
        text = canonical_text(meta, path="meta")
        if len(_META_TEXTS) >= 4096:
            _META_TEXTS.clear()
        _META_TEXTS[key] = text
    return text


@dataclass(frozen=True, slots=True)
class Event:
    """A stored, immutable event. ``data`` and ``meta`` must not be mutated."""

    id: str
    stream: str
    seq: int
    type: str
    data: JSONObject
    meta: JSONObject
    recorded_at: str
    prev_hash: str
    hash: str

    def to_dict(self) -> dict[str, Any]:
        """The full envelope as a JSON-ready dict."""
        return {
            "id": self.id,
            "stream": self.stream,
            "seq": self.seq,
            "type": self.type,
            "data": self.data,
            "meta": self.meta,
            "recorded_at": self.recorded_at,
            "prev_hash": self.prev_hash,
            "hash": self.hash,
        }

    def computed_hash(self) -> str:
        """Recompute this event's hash from its fields (re-encoding data and meta)."""
        return compute_hash(
            id=self.id,
            stream=self.stream,
            seq=self.seq,
            type=self.type,
            data_json=canonical_text(self.data),
            meta_json=canonical_text(self.meta),
            recorded_at=self.recorded_at,
            prev_hash=self.prev_hash,
        )


@dataclass(frozen=True, slots=True)
class StoredRow:
    """An event as the stores keep it: canonical texts, not parsed objects."""

    id: str
    stream: str
    seq: int
    type: str
    data_json: str
    meta_json: str
    recorded_at: str
    prev_hash: str
    hash: str
    _parsed: JSONObject | None = field(default=None, init=False, repr=False, compare=False)
    """The parsed ``data_json`` its prepared event carried (see :func:`keep_parsed`), else None."""

    def to_event(self) -> Event:
        """Parse the stored texts into an :class:`Event`.

        ``meta`` texts repeat (one actor, one thread), so their parsed objects
        are shared between events (see :func:`shared_meta`); events are
        immutable and their ``meta`` must not be mutated.
        """
        event: Event = _new(Event)
        _event_id(event, self.id)
        _event_stream(event, self.stream)
        _event_seq(event, self.seq)
        _event_type(event, self.type)
        parsed = self._parsed
        _event_data(event, parsed if parsed is not None else parse_json(self.data_json))
        _event_meta(event, shared_meta(self.meta_json))
        _event_recorded_at(event, self.recorded_at)
        _event_prev_hash(event, self.prev_hash)
        _event_hash(event, self.hash)
        return event

    @classmethod
    def from_tuple(cls, row: tuple[Any, ...]) -> StoredRow:
        """A row from a database tuple in field order (what ``StoredRow(*row)`` builds, faster)."""
        stored: StoredRow = _new(cls)
        _row_id(stored, row[0])
        _row_stream(stored, row[1])
        _row_seq(stored, row[2])
        _row_type(stored, row[3])
        _row_data_json(stored, row[4])
        _row_meta_json(stored, row[5])
        _row_recorded_at(stored, row[6])
        _row_prev_hash(stored, row[7])
        _row_hash(stored, row[8])
        _row_parsed(stored, None)
        return stored


def event_from_stream_row(stream: str, row: tuple[Any, ...]) -> Event:
    """The event of a database row ``(id, seq, type, data, meta, recorded_at, prev_hash, hash)`` of ``stream``.

    Builds what ``StoredRow(id, stream, seq, ...).to_event()`` builds, without the intermediate row
    (``tests/ledger/test_event_decoding.py`` pins the equality); for a backend reading a whole stream.
    """
    return _stream_events(stream, (row,), (parse_json(row[3]),))[0]


def events_from_stream_rows(stream: str, rows: Sequence[tuple[Any, ...]]) -> list[Event]:
    """``[event_from_stream_row(stream, row) for row in rows]``, with all the rows' data parsed at once.

    The data texts are parsed as one JSON array: one decoder call for the chunk instead of one per event,
    and the decoder then makes each object key once for the chunk (its key memo lasts one call), not once
    per event (replay ~3 % faster; the events' data dicts share their key strings). When every text is
    one JSON object (every text a store writes), the events are exactly the row-by-row ones. The array
    is used only when it parses whole into one object per row and every text begins and ends as an
    object; anything else goes row by row, which then returns or raises exactly what it always does
    (``tests/ledger/test_event_decoding.py`` pins both). Only texts edited together on purpose, some
    split and others joined so that the counts still match, could pass those checks; like any other
    edit, that is for the hash chain to find (``verify``), not for a replay.
    """
    if not rows:
        return []
    datas = _objects_as_one_array([row[3] for row in rows])
    if datas is None:
        return [event_from_stream_row(stream, row) for row in rows]
    return _stream_events(stream, rows, datas)


def _objects_as_one_array(texts: list[str]) -> list[JSONObject] | None:
    """The JSON objects of ``texts``, parsed as one array; None unless it parses whole into one object per
    text and every text begins and ends as an object (one that only parses as a part of the array is not
    one object on its own)."""
    try:
        joined = "[" + ",".join(texts) + "]"
        datas, end = _scan(joined, 0)
    except (StopIteration, TypeError, ValueError):
        return None
    if (end != len(joined) or type(datas) is not list or len(datas) != len(texts)
            or not _OBJECT_ONLY.issuperset(map(type, datas))):
        return None
    for text in texts:
        if text[:1] != "{" or text[-1:] != "}":
            return None
    return datas


def _stream_events(stream: str, rows: Sequence[tuple[Any, ...]], datas: Sequence[JSONObject]) -> list[Event]:
    """The events of stream rows whose data texts parsed to ``datas`` (one loop: a replay builds every
    event here, and a call per event would cost ~3 % of it; :func:`shared_meta` inlined)."""
    events = []
    for (event_id, seq, event_type, _data_json, meta_json, recorded_at, prev_hash, event_hash), data in zip(
            rows, datas, strict=True):
        event: Event = _new(Event)
        _event_id(event, event_id)
        _event_stream(event, stream)
        _event_seq(event, seq)
        _event_type(event, event_type)
        _event_data(event, data)
        meta = _META_CACHE.get(meta_json)
        _event_meta(event, meta if meta is not None else shared_meta(meta_json))
        _event_recorded_at(event, recorded_at)
        _event_prev_hash(event, prev_hash)
        _event_hash(event, event_hash)
        events.append(event)
    return events


_OBJECT_ONLY = frozenset((dict,))


def parse_json(text: str) -> Any:
    """``json.loads(text)``, faster for text without surrounding whitespace (a stored canonical text).

    The decoder's scanner is called directly, which skips ``json.loads``'s argument checks and its two
    whitespace scans. Anything the scanner does not consume whole (surrounding whitespace, trailing
    data, invalid JSON) goes to ``json.loads``, which then returns or raises exactly as it always does.
    """
    try:
        value, end = _scan(text, 0)
    except (StopIteration, TypeError, ValueError):
        return _loads(text)
    if end != len(text):
        return _loads(text)
    return value


# Filling the slots of these frozen dataclasses through their slot descriptors builds an instance
# in about half the time of the generated ``__init__`` (which calls ``object.__setattr__`` per
# field); replay builds one row and one event per stored event.
_new = object.__new__
_loads = json.loads
# The scanner json.loads itself uses (json.scanner.make_scanner; typeshed does not declare the attribute).
_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
(_event_id, _event_stream, _event_seq, _event_type, _event_data, _event_meta, _event_recorded_at,
 _event_prev_hash, _event_hash) = (
    Event.__dict__[name].__set__
    for name in ("id", "stream", "seq", "type", "data", "meta", "recorded_at", "prev_hash", "hash"))
(_prepared_id, _prepared_type, _prepared_data_json, _prepared_meta_json, _prepared_size, _prepared_made_by,
 _prepared_parsed) = (
    PreparedEvent.__dict__[name].__set__
    for name in ("id", "type", "data_json", "meta_json", "size", "_made_by", "_parsed"))
(_row_id, _row_stream, _row_seq, _row_type, _row_data_json, _row_meta_json, _row_recorded_at,
 _row_prev_hash, _row_hash, _row_parsed) = (
    StoredRow.__dict__[name].__set__
    for name in ("id", "stream", "seq", "type", "data_json", "meta_json", "recorded_at", "prev_hash", "hash",
                 "_parsed"))

_META_CACHE: dict[str, JSONObject] = {}
_META_CACHE_ENTRIES = 1024
_META_CACHE_TEXT = 1024


def shared_meta(text: str) -> JSONObject:
    """``json.loads(text)``, shared for short texts seen before (meta repeats: actor, thread id)."""
    meta = _META_CACHE.get(text)
    if meta is None:
        meta = parse_json(text)
        if len(text) <= _META_CACHE_TEXT:
            if len(_META_CACHE) >= _META_CACHE_ENTRIES:
                _META_CACHE.clear()
            _META_CACHE[text] = meta
    return meta


def seal(prepared: PreparedEvent, *, stream: str, seq: int, prev_hash: str, recorded_at: str) -> StoredRow:
    """Give a prepared event its place in the chain: seq, time, prev_hash and hash."""
    digest = compute_hash(
        id=prepared.id,
        stream=stream,
        seq=seq,
        type=prepared.type,
        data_json=prepared.data_json,
        meta_json=prepared.meta_json,
        recorded_at=recorded_at,
        prev_hash=prev_hash,
    )
    row: StoredRow = _new(StoredRow)  # StoredRow(...) with its slots filled directly, as in from_tuple
    _row_id(row, prepared.id)
    _row_stream(row, stream)
    _row_seq(row, seq)
    _row_type(row, prepared.type)
    _row_data_json(row, prepared.data_json)
    _row_meta_json(row, prepared.meta_json)
    _row_recorded_at(row, recorded_at)
    _row_prev_hash(row, prev_hash)
    _row_hash(row, digest)
    _row_parsed(row, prepared._parsed)
    return row


def seal_batch(batch: Sequence[PreparedEvent], *, stream: str, head_seq: int, prev_hash: str,
               recorded_at: str) -> list[StoredRow]:
    """``batch`` sealed as the events after ``head_seq`` of ``stream``, each linked to the one before."""
    rows = []
    for offset, prepared in enumerate(batch, start=1):
        row = seal(prepared, stream=stream, seq=head_seq + offset, prev_hash=prev_hash, recorded_at=recorded_at)
        rows.append(row)
        prev_hash = row.hash
    return rows


__all__ = [
    "DOMAIN_TAG",
    "GENESIS_HASH",
    "MAX_PAYLOAD_BYTES",
    "Event",
    "NewEvent",
    "PreparedEvent",
    "StoredRow",
    "check_hash",
    "check_payload_size",
    "check_prepared",
    "check_stream",
    "check_type",
    "compute_hash",
    "envelope_text",
    "event_from_stream_row",
    "events_from_stream_rows",
    "format_timestamp",
    "keep_parsed",
    "parse_json",
    "prepare",
    "seal",
    "shared_meta",
    "utc_now_text",
]
