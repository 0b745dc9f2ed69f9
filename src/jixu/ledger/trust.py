"""What the ledger vouches for: sealed checkpoints, a stream's verdict, and a break once found (decision 0025).

* **Sealed checkpoints.** A checkpoint's ``digest`` is an HMAC-SHA256 seal
  (:mod:`jixu.ledger.keys`) over its fields. Only a process holding the key
  could have written it, from a state it had projected from verified events,
  so a sealed checkpoint whose anchor event no longer hashes to its
  ``head_hash`` (or whose seq is past the head) proves the events changed
  after it was written: the stream is corrupt (``rewritten``), even when an
  attacker recomputed every hash after the change.
* **The verdict.** :func:`verdict` is the one full answer to "does this
  stream's history hold?": the whole chain recomputed (O(history), hashing
  only), the sealed checkpoints' anchors, and an earlier recorded break.
* **A break, once found, is kept.** :func:`verdict` records the first break it
  finds as a sealed row in the checkpoint table (name ``jixu/verdict``), and
  :func:`~jixu.ledger.projection.project` (every cheap opening) reads it: a
  stream once found broken is corrupt for every process holding the key,
  even if the events are put back. Nothing is appended to the broken stream.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from jixu.errors import StoreError
from jixu.ledger.chain import Reason, VerifyReport, row_hash
from jixu.ledger.encoding import canonical_text
from jixu.ledger.event import utc_now_text
from jixu.ledger.keys import Keyring, SealStatus, keyring, sealing_key, sealing_keyring
from jixu.ledger.store import STREAMS_AT_ONCE, Checkpoint, Store

CHECKPOINT_TAG = b"jixu.checkpoint.v3\x00"
"""What a checkpoint seal covers first (v2 was an unkeyed SHA-256: no longer trusted)."""
VERDICT_NAME = "jixu/verdict"
"""The checkpoint-table row that keeps a stream's first recorded break."""
VERDICT_TAG = b"jixu.verdict.v1\x00"
_REASONS: tuple[Reason, ...] = ("payload_changed", "reordered", "gap", "bad_link", "head_mismatch", "rewritten")


def checkpoint_parts(stream: str, name: str, seq: int, reducer_version: int, head_hash: str,
                     state_json: str) -> list[bytes]:
    """The bytes a checkpoint seal covers: canonical(fields but the state) ‖ NUL ‖ the state text."""
    header = canonical_text(
        {"stream": stream, "name": name, "seq": seq, "reducer_version": reducer_version, "head_hash": head_hash})
    return [header.encode("utf-8"), b"\x00", state_json.encode("utf-8")]


def seal_checkpoint(keys: Keyring, stream: str, name: str, seq: int, reducer_version: int, head_hash: str,
                    state_json: str) -> str:
    """The seal of a checkpoint's fields with the current key (:class:`~jixu.errors.KeyUnavailable` if none)."""
    return keys.seal(CHECKPOINT_TAG, checkpoint_parts(stream, name, seq, reducer_version, head_hash, state_json))


def seal_status(keys: Keyring, checkpoint: Checkpoint) -> SealStatus:
    """Whether ``checkpoint``'s digest is its seal by a key held here."""
    return keys.check(checkpoint.digest, CHECKPOINT_TAG, checkpoint_parts(
        checkpoint.stream, checkpoint.name, checkpoint.seq, checkpoint.reducer_version, checkpoint.head_hash,
        checkpoint.state_json))


def anchor_holds(store: Store, checkpoint: Checkpoint) -> bool:
    """True when the event at the checkpoint's seq exists and its *recomputed* hash is the checkpoint's
    ``head_hash`` (the stored hash column alone proves nothing: it can be edited with the row)."""
    anchor = next(iter(store.read_rows(checkpoint.stream, checkpoint.seq, checkpoint.seq)), None)
    return anchor is not None and anchor.hash == checkpoint.head_hash and row_hash(anchor) == anchor.hash


def rewritten(checkpoint: Checkpoint, head_seq: int, count: int, head_hash: str) -> VerifyReport:
    """The report for a sealed checkpoint the events no longer match."""
    if checkpoint.seq > head_seq:
        seq, what = head_seq + 1, f"ends at seq {head_seq}"
    else:
        seq, what = checkpoint.seq, f"holds another event at seq {checkpoint.seq}"
    return VerifyReport(
        stream=checkpoint.stream, valid=False, count=min(count, seq - 1), head_hash=head_hash, first_bad_seq=seq,
        reason="rewritten",
        detail=f"checkpoint {checkpoint.name!r}, sealed at seq {checkpoint.seq} with head {checkpoint.head_hash[:16]}…, "
               f"no longer matches the events: the stream {what}; events up to seq {min(seq, checkpoint.seq)} may have "
               "been rewritten")


def contradicted(store: Store, stream: str, names: Iterable[str], keys: Keyring, head_seq: int, count: int,
                 head_hash: str, *, read: Mapping[str, Checkpoint] | None = None) -> VerifyReport | None:
    """The earliest of the sealed checkpoints ``names`` of ``stream`` that the events contradict, as a report
    (``read``: those checkpoints as already read, by name; else they are read here)."""
    wanted = list(names)
    checkpoints = read if read is not None else store.read_checkpoints(stream, wanted)
    found: VerifyReport | None = None
    for name in wanted:
        checkpoint = checkpoints.get(name)
        if checkpoint is None or seal_status(keys, checkpoint) != "sealed":
            continue
        if checkpoint.seq <= head_seq and anchor_holds(store, checkpoint):
            continue
        report = rewritten(checkpoint, head_seq, count, head_hash)
        if found is None or (report.first_bad_seq or 0) < (found.first_bad_seq or 0):
            found = report
    return found


def behind_break(store: Store, report: VerifyReport, names: Iterable[str], keys: Keyring,
                 read: Mapping[str, Checkpoint]) -> VerifyReport:
    """What the sealed checkpoints ``names`` (as ``read``) say about the events before the break ``report``
    names: a checkpoint before the break that they contradict is a rewrite there (the earlier finding); a sealed
    checkpoint at or after the break can no longer vouch for them (``vouched_before`` 1). Breaking one event
    more must not turn a rewrite the seal would catch into a history trusted up to that event."""
    bad = report.first_bad_seq
    if bad is None:
        return report
    checkpoints = [(name, read[name]) for name in names if name in read]
    before = [name for name, checkpoint in checkpoints if checkpoint.seq < bad]
    rewrite = contradicted(store, report.stream, before, keys, bad - 1, report.count, report.head_hash, read=read)
    if rewrite is not None:
        return rewrite
    beyond = [(name, checkpoint) for name, checkpoint in checkpoints
              if checkpoint.seq >= bad and seal_status(keys, checkpoint) == "sealed"]
    if not beyond:
        return report
    name, checkpoint = beyond[0]
    return replace(report, vouched_before=1, detail=f"{report.detail or report.reason}; checkpoint {name!r}, sealed at "
                                                    f"seq {checkpoint.seq}, can no longer vouch for the events before "
                                                    "the break: none of them is trusted")


def _verdict_parts(stream: str, text: str) -> list[bytes]:
    return [canonical_text({"stream": stream}).encode("utf-8"), b"\x00", text.encode("utf-8")]


def recorded_break(store: Store, stream: str, keys: Keyring | None = None) -> VerifyReport | None:
    """The break recorded for ``stream``, if any (see :func:`break_of`: one no key held here checks counts too)."""
    return break_of(stream, store.read_checkpoint(stream, VERDICT_NAME), keys)


def recorded_breaks(store: Store, streams: Sequence[str], keys: Keyring | None = None) -> dict[str, VerifyReport]:
    """:func:`recorded_break` of each of ``streams`` that has one, by stream, in one read per
    :data:`~jixu.ledger.store.STREAMS_AT_ONCE` streams."""
    found: dict[str, VerifyReport] = {}
    wanted = list(streams)
    for start in range(0, len(wanted), STREAMS_AT_ONCE):
        for stream, row in store.checkpoints_named(VERDICT_NAME, wanted[start:start + STREAMS_AT_ONCE]).items():
            report = break_of(stream, row, keys)
            if report is not None:
                found[stream] = report
    return found


def break_of(stream: str, row: Checkpoint | None, keys: Keyring | None = None) -> VerifyReport | None:
    """The break ``row`` (``stream``'s :data:`VERDICT_NAME` row as read, or None) records.

    A row whose seal a key held here checks gives its break as recorded. Any other row still means that a break
    was recorded (decision 0069): its seal made by a key not held here (the key file lost, replaced or retired),
    forged, or its text edited, it is ``break_unchecked``, vouching for none of the stream's events, so losing a
    key never turns a stream found broken back into one that is acted on.
    """
    if row is None:
        return None
    keys = keys if keys is not None else keyring()
    text, seal = row.state_json, row.digest
    try:
        status = keys.check(seal, VERDICT_TAG, _verdict_parts(stream, text)) if isinstance(text, str) else "unsealed"
    except (TypeError, ValueError, UnicodeError):  # a row edited into what no seal is: never raised into a read
        status = "unsealed"
    if status == "sealed":
        found = _recorded(stream, text)
        if found is not None:
            return found
    return _unchecked(stream, row, status, keys)


def _recorded(stream: str, text: str) -> VerifyReport | None:
    """The break a sealed verdict text records (None when the text is not one: a seal over garbage)."""
    try:
        data = json.loads(text)
        reason = data["reason"]
        seq = int(data["first_bad_seq"])
        if reason not in _REASONS or seq < 1:
            return None
        vouched = data.get("vouched_before")
        return VerifyReport(stream=stream, valid=False, count=int(data["count"]), head_hash=str(data["head_hash"]),
                            first_bad_seq=seq, reason=reason,
                            detail=f"{data['detail']} (found {data['found_at']}; a stream once found broken stays "
                                   "corrupt)", vouched_before=int(vouched) if vouched is not None else None)
    except (ValueError, KeyError, TypeError):
        return None


def _unchecked(stream: str, row: Checkpoint, status: str, keys: Keyring) -> VerifyReport:
    """A recorded break no key held here can check: its seq as the row says (at least 1), trusting nothing."""
    seq = row.seq if isinstance(row.seq, int) and not isinstance(row.seq, bool) and row.seq >= 1 else 1
    key = sealing_key(row.digest)
    why = {"unknown_key": f"sealed by key {key}, which is not held here"
                          + (f" ({keys.problem})" if keys.problem else ""),
           "forged": f"its seal is not key {key}'s: the record was changed"}.get(status, "its record is not sealed")
    return VerifyReport(stream=stream, valid=False, count=0, head_hash="", first_bad_seq=seq,
                        reason="break_unchecked", vouched_before=1,
                        detail=f"a break is recorded for this stream at seq {seq} ({why}): it cannot be checked, so "
                               "the stream stays corrupt and none of its events is trusted; give this process the "
                               "key file that sealed it, or let `jixu keys retire --store` seal recorded breaks "
                               "again before retiring a key")


def reseal_break(store: Store, stream: str, keys: Keyring) -> bool:
    """Seal ``stream``'s recorded break again with the current key of ``keys`` when another key of ``keys``
    sealed it (before the others are retired, decision 0069); True if it was sealed again."""
    row = store.read_checkpoint(stream, VERDICT_NAME)
    current = keys.current
    if row is None or current is None or not isinstance(row.state_json, str) or not isinstance(row.digest, str):
        return False
    parts = _verdict_parts(stream, row.state_json)
    if sealing_key(row.digest) == current or keys.check(row.digest, VERDICT_TAG, parts) != "sealed":
        return False
    store.write_checkpoint(replace(row, digest=keys.seal(VERDICT_TAG, parts)))
    return True


def reseal_checkpoints(store: Store, stream: str, names: Iterable[str], keys: Keyring) -> int:
    """Seal again with the current key of ``keys`` each of ``stream``'s checkpoints ``names`` that another key of
    ``keys`` sealed and whose anchor still holds (before the others are retired: a checkpoint retired unsealed no
    longer vouches for the events before it); how many were."""
    current = keys.current
    if current is None:
        return 0
    count = 0
    for checkpoint in store.read_checkpoints(stream, list(names)).values():
        if sealing_key(checkpoint.digest) == current or seal_status(keys, checkpoint) != "sealed" \
                or not anchor_holds(store, checkpoint):
            continue
        store.write_checkpoint(replace(checkpoint, digest=seal_checkpoint(
            keys, checkpoint.stream, checkpoint.name, checkpoint.seq, checkpoint.reducer_version,
            checkpoint.head_hash, checkpoint.state_json)))
        count += 1
    return count


def record_break(store: Store, report: VerifyReport, keys: Keyring | None = None) -> bool:
    """Keep ``report`` (a break) as the stream's recorded break unless an earlier one is kept; True if written.

    Best effort: a store that refuses the write (read-only, a role without the right, trouble), or no key to
    seal with, records nothing, and the read that found the break goes on (the next verification finds it
    again).
    """
    if report.valid or report.first_bad_seq is None or report.reason is None:
        return False
    earlier = recorded_break(store, report.stream, keys)
    if earlier is not None and (earlier.first_bad_seq or 0) <= report.first_bad_seq:
        return False
    text = canonical_text({"first_bad_seq": report.first_bad_seq, "reason": report.reason, "detail": report.detail,
                           "count": report.count, "head_hash": report.head_hash, "found_at": utc_now_text(),
                           **({"vouched_before": report.vouched_before} if report.vouched_before is not None else {})})
    try:
        seal_keys = keys if keys is not None and keys.keys else sealing_keyring(keys.path if keys else None)
        seal = seal_keys.seal(VERDICT_TAG, _verdict_parts(report.stream, text))
        store.write_checkpoint(Checkpoint(stream=report.stream, name=VERDICT_NAME, seq=report.first_bad_seq,
                                          reducer_version=1, head_hash=report.head_hash, state_json=text, digest=seal,
                                          created_at=utc_now_text()))
    except StoreError:  # KeyUnavailable and StoreReadOnly among them
        return False
    return True


def verdict(store: Store, stream: str, *, checkpoints: Iterable[str] = (), keys: Keyring | None = None,
            record: bool = True) -> VerifyReport:
    """The one full answer to whether ``stream``'s history holds, and its first bad seq and reason if not.

    The whole chain is recomputed (:meth:`Store.verify`, one consistent
    snapshot); if it holds, the sealed checkpoints named in ``checkpoints``
    must still match their anchor events (``rewritten`` otherwise); a break
    recorded earlier stays (the earliest is reported). With ``record``, a break
    found is recorded (:func:`record_break`), so every later opening sees it.
    """
    keys = keys if keys is not None else keyring()
    names = list(checkpoints)
    # The checkpoints and the break in one read, before the chain: a checkpoint is written after its events, so the
    # snapshot verified next reaches it (one written after a verify would lie past its head: no rewrite, a race).
    read = store.read_checkpoints(stream, [*names, VERDICT_NAME])
    report = store.verify(stream)
    if report.valid:
        # A valid chain ends at the head the store recorded in the snapshot verified (Store.verify reports events
        # beyond it or a head without them), so its count is that head's seq: no second read of the head.
        report = contradicted(store, stream, names, keys, report.count, report.count, report.head_hash,
                              read=read) or report
    else:
        report = behind_break(store, report, names, keys, read)
    earlier = break_of(stream, read.get(VERDICT_NAME), keys)
    if earlier is not None and (report.valid or (earlier.first_bad_seq or 0) < (report.first_bad_seq or 0)):
        return earlier
    if record and not report.valid:
        record_break(store, report, keys)
    return report


__all__ = ["CHECKPOINT_TAG", "VERDICT_NAME", "anchor_holds", "behind_break", "break_of", "checkpoint_parts", "contradicted", "record_break",
           "recorded_break", "recorded_breaks", "reseal_break", "reseal_checkpoints", "rewritten", "seal_checkpoint", "seal_status", "verdict"]
