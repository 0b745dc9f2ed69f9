"""Projections (pure reducers over a stream) and the checkpoints that speed them up.

A checkpoint is a disposable cache: it is used only when its reducer name and
version match, the event at its ``seq`` still has its recorded ``head_hash``,
and its own digest checks out. Otherwise it is ignored and the reason is
reported; the state is then rebuilt by replaying the whole stream. Either way
the events after the checkpoint are chain-checked against it, so opening a
stream costs O(events after the checkpoint).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar

from jixu.errors import InvalidInput, NotFound
from jixu.ledger.chain import VerifyReport, verify_rows
from jixu.ledger.encoding import JSONObject, canonical_text
from jixu.ledger.event import Event, check_stream, utc_now_text
from jixu.ledger.store import Checkpoint, Store

S = TypeVar("S")

CheckpointStatus = Literal["used", "none", "version_mismatch", "head_mismatch", "digest_mismatch", "undecodable"]


class Projection(Protocol[S]):
    """A pure reducer: ``apply`` folds one event into the state and does no I/O."""

    name: str
    version: int

    def initial(self) -> S:
        """The state of an empty stream."""
        ...

    def apply(self, state: S, event: Event) -> S:
        """The state after ``event`` (may mutate and return ``state``)."""
        ...

    def dump(self, state: S) -> JSONObject:
        """The state as a JSON object, for a checkpoint."""
        ...

    def load(self, data: JSONObject) -> S:
        """The state back from :meth:`dump`'s output."""
        ...


@dataclass(frozen=True, slots=True)
class Projected(Generic[S]):
    """The result of :func:`project`."""

    state: S
    seq: int
    head_hash: str
    checkpoint: CheckpointStatus
    checkpoint_seq: int | None
    events_applied: int
    chain: VerifyReport

    def to_dict(self) -> dict[str, Any]:
        """Everything but the state, JSON-ready."""
        return {
            "seq": self.seq,
            "head_hash": self.head_hash,
            "checkpoint": self.checkpoint,
            "checkpoint_seq": self.checkpoint_seq,
            "events_applied": self.events_applied,
            "chain": self.chain.to_dict(),
        }


def checkpoint_digest(stream: str, name: str, seq: int, reducer_version: int, head_hash: str, state_json: str) -> str:
    """The digest that seals a checkpoint's fields together.

    ``sha256("jixu.checkpoint.v2\\0" ‖ canonical(fields but the state) ‖ "\\0" ‖ state text)``: the
    state text is hashed as it is, not re-encoded as a JSON string (that escaping cost as much as
    reading a large checkpoint). A checkpoint sealed by v1 no longer matches and is rebuilt by replay.
    """
    header = canonical_text(
        {"stream": stream, "name": name, "seq": seq, "reducer_version": reducer_version, "head_hash": head_hash}
    )
    digest = hashlib.sha256(b"jixu.checkpoint.v2\x00")
    digest.update(header.encode("utf-8"))
    digest.update(b"\x00")
    digest.update(state_json.encode("utf-8"))
    return digest.hexdigest()


def make_checkpoint(stream: str, projection: Projection[S], state: S, seq: int, head_hash: str) -> Checkpoint:
    """A sealed checkpoint of ``state`` as of the event ``seq`` whose hash is ``head_hash``."""
    state_json = canonical_text(projection.dump(state), path="state")
    return Checkpoint(
        stream=stream,
        name=projection.name,
        seq=seq,
        reducer_version=projection.version,
        head_hash=head_hash,
        state_json=state_json,
        digest=checkpoint_digest(stream, projection.name, seq, projection.version, head_hash, state_json),
        created_at=utc_now_text(),
    )


def save_checkpoint(store: Store, stream: str, projection: Projection[S], projected: Projected[S]) -> Checkpoint:
    """Write a checkpoint of ``projected`` (which must come from a valid chain)."""
    if not projected.chain.valid:
        raise InvalidInput(f"stream {stream!r} failed verification; refusing to checkpoint it")
    if projected.seq == 0:
        raise InvalidInput(f"stream {stream!r} is empty; there is nothing to checkpoint")
    checkpoint = make_checkpoint(stream, projection, projected.state, projected.seq, projected.head_hash)
    store.write_checkpoint(checkpoint)
    return checkpoint


def _usable(store: Store, stream: str, projection: Projection[S], checkpoint: Checkpoint) -> tuple[
        CheckpointStatus, S | None]:
    if checkpoint.reducer_version != projection.version:
        return "version_mismatch", None
    expected = checkpoint_digest(stream, checkpoint.name, checkpoint.seq, checkpoint.reducer_version,
                                 checkpoint.head_hash, checkpoint.state_json)
    if expected != checkpoint.digest:
        return "digest_mismatch", None
    anchor = next(iter(store.read_rows(stream, checkpoint.seq, checkpoint.seq)), None)
    if anchor is None or anchor.hash != checkpoint.head_hash:
        return "head_mismatch", None
    try:
        data = json.loads(checkpoint.state_json)
        if not isinstance(data, dict):
            return "undecodable", None
        return "used", projection.load(data)
    except (ValueError, KeyError, TypeError):
        return "undecodable", None


def project(store: Store, stream: str, projection: Projection[S], *, use_checkpoint: bool = True) -> Projected[S]:
    """Fold ``stream`` through ``projection``, starting from a valid checkpoint if there is one.

    The events read are chain-checked; projection stops at the first bad
    event and ``chain`` reports it (the state then reflects only the events
    before it). Raises :class:`~jixu.errors.NotFound` for a stream with no events.
    """
    check_stream(stream)
    info = store.stream_info(stream)
    if info is None:
        raise NotFound(f"stream {stream!r} has no events", stream=stream)
    status: CheckpointStatus = "none"
    state = projection.initial()
    start_seq, anchor_hash, checkpoint_seq = 1, info.genesis_hash, None
    if use_checkpoint:
        checkpoint = store.read_checkpoint(stream, projection.name)
        if checkpoint is not None and checkpoint.seq <= info.head_seq:
            usable = _usable(store, stream, projection, checkpoint)
            status, loaded = usable
            if loaded is not None:
                state = loaded
                start_seq, anchor_hash, checkpoint_seq = checkpoint.seq + 1, checkpoint.head_hash, checkpoint.seq
        elif checkpoint is not None:
            status = "head_mismatch"
    applied = 0
    apply = projection.apply
    rows = []

    def counted() -> Any:
        for row in store.read_rows(stream, start_seq, info.head_seq):
            rows.append(row)
            yield row

    # Verify and fold in one pass over the rows read, stopping at the first bad one.
    report = verify_rows(stream, counted(), genesis_hash=anchor_hash, first_seq=start_seq,
                         recorded_head=(info.head_seq, info.head_hash))
    good = rows if report.valid else [r for r in rows if r.seq < (report.first_bad_seq or 0)]
    for row in good:
        state = apply(state, row.to_event())
        applied += 1
    seq = good[-1].seq if good else start_seq - 1
    head = good[-1].hash if good else anchor_hash
    return Projected(state, seq, head, status, checkpoint_seq, applied, report)


class Followed(Protocol):
    """A projected state that knows the seq and hash of the last event applied to it."""

    seq: int
    head_hash: str


F = TypeVar("F", bound=Followed)


def follow(store: Store, stream: str, projection: Projection[F], record: F,
           chain_break: int | None) -> tuple[F, int | None]:
    """``record`` with the events appended after its head applied, and the first seq whose link is broken."""
    for event in store.read(stream, record.seq + 1):
        if event.prev_hash != record.head_hash:
            return record, chain_break or event.seq
        record = projection.apply(record, event)
    return record, chain_break


__all__ = [
    "CheckpointStatus",
    "Followed",
    "Projected",
    "Projection",
    "checkpoint_digest",
    "follow",
    "make_checkpoint",
    "project",
    "save_checkpoint",
]
