"""Hash-chain verification: recompute every link and name the first bad seq.

Verification detects changes made *inside* the store (a changed payload,
reordered or missing events, an altered link). It is not a signature: someone
who can rewrite the whole history, recomputing every hash, produces a chain
that verifies, unless a checkpoint sealed with a key held outside the store
recorded an event the rewrite changed (``rewritten``, see
:mod:`jixu.ledger.trust`). Anchor the head hash elsewhere if you need more.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from jixu.ledger.event import DOMAIN_TAG, StoredRow, envelope_text, envelope_text_of

Reason = Literal["payload_changed", "reordered", "gap", "bad_link", "head_mismatch", "rewritten", "break_unchecked"]

REASONS: dict[str, str] = {
    "payload_changed": "the event's content no longer matches its recorded hash",
    "reordered": "the event links to an event stored at another position",
    "gap": "an event is missing: seq numbers are not contiguous",
    "bad_link": "prev_hash does not match the hash of the event before it",
    "head_mismatch": "the stream's recorded head does not match its last event",
    "rewritten": "the events no longer match a sealed checkpoint: history before it was rewritten or removed",
    "break_unchecked": "a break is recorded for the stream, but no key held here can check its record: none of "
                       "its events is trusted",
}


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """The outcome of verifying one stream."""

    stream: str
    valid: bool
    count: int
    head_hash: str
    first_bad_seq: int | None = None
    reason: Reason | None = None
    detail: str | None = None
    vouched_before: int | None = None
    """Set when the report vouches for fewer events than the ones before ``first_bad_seq``: the first seq it
    does not vouch for. A sealed checkpoint at or after a break can no longer prove the events before it (the
    break may hide a rewrite that checkpoint would have caught)."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the chain's fields (``vouched_before`` travels in the stream's corruption)."""
        return {
            "stream": self.stream,
            "valid": self.valid,
            "count": self.count,
            "head_hash": self.head_hash,
            "first_bad_seq": self.first_bad_seq,
            "reason": self.reason,
            "detail": self.detail,
        }


def row_hash(row: StoredRow) -> str:
    """Recompute a stored row's hash from its stored canonical texts."""
    text = envelope_text(
        id=row.id,
        stream=row.stream,
        seq=row.seq,
        type=row.type,
        data_json=row.data_json,
        meta_json=row.meta_json,
        recorded_at=row.recorded_at,
        prev_hash=row.prev_hash,
    )
    return hashlib.sha256(DOMAIN_TAG + text.encode("utf-8")).hexdigest()


def verify_rows(
    stream: str,
    rows: Iterable[StoredRow],
    *,
    genesis_hash: str,
    first_seq: int = 1,
    recorded_head: tuple[int, str] | None = None,
) -> VerifyReport:
    """Verify ``rows`` (ordered by seq) of ``stream`` starting at ``first_seq``.

    ``genesis_hash`` is the expected ``prev_hash`` of the first row: the
    stream's genesis for a full verification, or a trusted hash (e.g. a
    checkpoint's) for a tail. ``recorded_head`` is the (seq, hash) the store's
    stream table claims, checked against the last row.
    """
    iterator: Iterator[StoredRow] = iter(rows)
    expected_seq = first_seq
    prev = genesis_hash
    count = 0
    seen: set[str] = set()
    for row in iterator:
        if row.seq != expected_seq:
            return _bad(stream, count, prev, expected_seq, "gap",
                        f"expected seq {expected_seq}, found seq {row.seq}")
        if row.prev_hash != prev:
            later = {r.hash for r in iterator}
            if row.prev_hash in seen or row.prev_hash in later:
                return _bad(stream, count, prev, row.seq, "reordered",
                            f"seq {row.seq} (event {row.id}) links to another position's event")
            return _bad(stream, count, prev, row.seq, "bad_link",
                        f"seq {row.seq} (event {row.id}) has prev_hash {row.prev_hash[:16]}…, "
                        f"expected {prev[:16]}…")
        if row_hash(row) != row.hash:
            return _bad(stream, count, prev, row.seq, "payload_changed",
                        f"seq {row.seq} (event {row.id}) does not match its hash")
        seen.add(row.hash)
        prev = row.hash
        count += 1
        expected_seq += 1
    if recorded_head is not None:
        head_seq, head_hash = recorded_head
        if head_seq > expected_seq - 1:
            return _bad(stream, count, prev, expected_seq, "gap",
                        f"the stream head is seq {head_seq} but the last stored event is seq "
                        f"{expected_seq - 1}")
        if head_seq < expected_seq - 1:
            return _bad(stream, count, prev, head_seq + 1, "head_mismatch",
                        f"events up to seq {expected_seq - 1} are stored beyond the recorded head "
                        f"(seq {head_seq})")
        if head_hash != prev:
            return _bad(stream, count, prev, head_seq, "head_mismatch",
                        f"the stream head records seq {head_seq} / {head_hash[:16]}…, the last "
                        f"event is seq {expected_seq - 1} / {prev[:16]}…")
    return VerifyReport(stream=stream, valid=True, count=count, head_hash=prev)


def verify_tuples(
    stream: str,
    rows_of: Callable[[], Iterable[tuple[Any, ...]]],
    *,
    genesis_hash: str,
    first_seq: int = 1,
    recorded_head: tuple[int, str] | None = None,
) -> VerifyReport:
    """:func:`verify_rows` over database tuples ``(id, stream, seq, type, data, meta, recorded_at, prev_hash,
    hash)``: the same report, faster for a stream that verifies (no row object is built, no row is kept).

    ``rows_of()`` reads the rows; it is called a second time, and must then give the same rows (one snapshot),
    only when something does not hold: :func:`verify_rows` then judges every row, so the report of a broken
    stream is exactly its. Keeping the rows instead would hold the whole stream in memory, and making that
    memory costs more than the hashing (a third of a 100k-event verification, measured).
    """
    expected_seq, prev = first_seq, genesis_hash
    sha256, tag, text_of = hashlib.sha256, DOMAIN_TAG, envelope_text_of
    broken = False
    for row in rows_of():
        row_id, row_stream, seq, kind, data, meta, recorded_at, prev_hash, row_hash_ = row
        if seq != expected_seq or prev_hash != prev or sha256(tag + text_of(
                row_id, row_stream, seq, kind, data, meta, recorded_at, prev_hash).encode("utf-8")
                ).hexdigest() != row_hash_:
            broken = True
            break
        prev = row_hash_
        expected_seq += 1
    if not broken and recorded_head is not None and recorded_head != (expected_seq - 1, prev):
        broken = True
    if not broken:
        return VerifyReport(stream=stream, valid=True, count=expected_seq - first_seq, head_hash=prev)
    return verify_rows(stream, map(StoredRow.from_tuple, rows_of()), genesis_hash=genesis_hash,
                       first_seq=first_seq, recorded_head=recorded_head)


def _bad(stream: str, count: int, head: str, seq: int, reason: Reason, detail: str) -> VerifyReport:
    return VerifyReport(
        stream=stream,
        valid=False,
        count=count,
        head_hash=head,
        first_bad_seq=seq,
        reason=reason,
        detail=detail,
    )


__all__ = ["REASONS", "Reason", "VerifyReport", "row_hash", "verify_rows", "verify_tuples"]
