"""Projections (pure reducers over a stream) and the checkpoints that speed them up.

A checkpoint is a disposable cache, sealed with a key held outside the store
(:mod:`jixu.ledger.keys`, decision 0025). It is used only when its reducer name
and version match, its seal was made by a key held here, and the event at its
``seq`` still *recomputes* to its recorded ``head_hash``. Otherwise it is
ignored and the reason is reported; the state is then rebuilt by replaying the
whole stream. Either way the events after the checkpoint are chain-checked
against it, so opening a stream costs O(events after the checkpoint). A sealed
checkpoint the events no longer match proves they changed after it was
written: the stream is reported corrupt (``rewritten``). A break recorded by
:func:`jixu.ledger.trust.verdict` is reported by every opening.

Opening from a checkpoint does not re-read the events before it: a change to
them made after the checkpoint was written is found by
:func:`jixu.ledger.trust.verdict` (O(history)), which every operation that
acts on a stream runs first.

A :class:`ChunkedProjection` keeps the parts of its state that only grow with
history (a thread's settled decisions and older messages) out of the main
checkpoint, in immutable chunks named by the digest of their text
(:func:`chunk_digest`) and stored as checkpoints named
``<projection>/chunk/<digest>``. The main checkpoint names them, so its seal
covers them too; they are read lazily through a :class:`ChunkSource`, which
checks each text against its digest when it is first read. A chunk that is
missing or damaged is never trusted: the source rebuilds it by replaying the
stream up to the checkpoint and reports the reason (``chunk_missing``,
``chunk_mismatch``) like the other checkpoint statuses.
"""

from __future__ import annotations

import gc
import hashlib
import json
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar, runtime_checkable

from jixu.errors import InvalidInput, NotFound, StoreError
from jixu.ledger.chain import VerifyReport, row_hash, verify_rows
from jixu.ledger.encoding import MAX_NESTING, JSONObject, canonical_text
from jixu.ledger.event import Event, check_stream, utc_now_text
from jixu.ledger.keys import Keyring, keyring, sealing_keyring
from jixu.ledger.store import CHECKPOINTS_AT_ONCE, Checkpoint, Store
from jixu.ledger.trust import (
    VERDICT_NAME,
    anchor_holds,
    break_of,
    record_break,
    rewritten,
    seal_checkpoint,
    seal_status,
)

S = TypeVar("S")

CheckpointStatus = Literal["used", "none", "version_mismatch", "head_mismatch", "digest_mismatch", "unsealed",
                           "contradicted", "broken", "undecodable", "chunk_missing", "chunk_mismatch"]
"""How opening used the checkpoint: ``used``; ``none`` (there is none); or why it was not: another reducer
version, its anchor event gone or changed (``head_mismatch``, an unsealed one), its seal not made by the key it
names (``digest_mismatch``: forged or damaged), no key here can check it (``unsealed``: an older unkeyed digest,
another key, no key file), a sealed one the events contradict (``contradicted``: the stream is corrupt), the
stream's break was recorded (``broken``: replayed from the start), its state not loadable (``undecodable``), a
chunk missing or damaged."""

STATE_NESTING = MAX_NESTING + 32
"""How deeply a checkpoint's state may nest: an event's values sit a few levels deeper in a state."""

CHUNK_TAG = b"jixu.checkpoint.chunk.v1\x00"
"""Prefix of every hashed chunk text, so a chunk digest is never confused with another hash."""


def chunk_digest(text: str) -> str:
    """The name of a checkpoint chunk: ``sha256("jixu.checkpoint.chunk.v1\\0" ‖ text)``, hex."""
    return hashlib.sha256(CHUNK_TAG + text.encode("utf-8")).hexdigest()


def chunk_name(projection_name: str, digest: str) -> str:
    """The checkpoint name under which a chunk of ``projection_name`` is stored."""
    return f"{projection_name}/chunk/{digest}"


class Projection(Protocol[S]):
    """A pure reducer: ``apply`` folds one event into the state and does no I/O."""

    name: str
    version: int

    def initial(self) -> S:
        """The state of an empty stream."""
        ...

    def apply(self, state: S, event: Event) -> S:
        """The state after ``event`` (may mutate and return ``state``).

        A projection may also define ``apply_all(state, events)``, applying each of ``events`` in order
        exactly as ``apply`` does: :func:`fold` then calls it once instead of ``apply`` per event.
        """
        ...

    def dump(self, state: S) -> JSONObject:
        """The state as a JSON object, for a checkpoint."""
        ...

    def load(self, data: JSONObject) -> S:
        """The state back from :meth:`dump`'s output."""
        ...


@runtime_checkable
class ChunkedProjection(Projection[S], Protocol[S]):
    """A projection whose checkpoints keep history-sized parts in content-addressed chunks."""

    def dump_chunked(self, state: S) -> tuple[JSONObject, dict[str, str]]:
        """The main checkpoint object and the chunk texts (by :func:`chunk_digest`) it references."""
        ...

    def load_chunked(self, data: JSONObject, chunks: ChunkSource[S]) -> S:
        """The state back from :meth:`dump_chunked`'s main object; chunks are read through ``chunks``
        when (and if) they are needed. Must also accept :meth:`Projection.dump`'s output."""
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
    chunks: ChunkSource[S] | None = None
    """Where the state reads its checkpoint chunks from (a chunked checkpoint that was used)."""

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


class _GCPause:
    """Process-wide count of bulk folds running, so nested or concurrent folds pause the collector once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holders = 0
        self.disabled = False
        """True while the collector is off because of a fold (it was on when the first fold began)."""


_GC_PAUSE = _GCPause()


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a bulk fold; it is re-enabled when the block exits.

    A fold allocates an object graph that only grows (events, their data, the
    state) and frees no cycles, so every collection the allocations trigger
    walks the whole graph in vain: pausing makes a long replay about a third
    faster. Reference counting still frees everything as usual. Only a
    collector that was enabled is re-enabled, on any exit (exceptions too),
    once the last of the folds running in this process (in any thread) ends.
    """
    pause = _GC_PAUSE
    with pause.lock:
        if pause.holders == 0 and gc.isenabled():
            gc.disable()
            pause.disabled = True
        pause.holders += 1
    try:
        yield
    finally:
        with pause.lock:
            pause.holders -= 1
            if pause.holders == 0 and pause.disabled:
                pause.disabled = False
                gc.enable()


def fold(projection: Projection[S], events: Iterable[Event], state: S | None = None) -> S:
    """``state`` (``projection.initial()`` if not given) with ``events`` applied in order, the GC paused.

    Applies exactly what the loop ``for event in events: state = projection.apply(state, event)``
    applies; the events are taken as given (chain-check them first, or use :func:`project`).
    """
    current = projection.initial() if state is None else state
    apply_all: Callable[[S, Iterable[Event]], S] | None = getattr(projection, "apply_all", None)
    with gc_paused():
        if apply_all is not None:
            return apply_all(current, events)
        apply = projection.apply
        for event in events:
            current = apply(current, event)
    return current


def replay(store: Store, stream: str, projection: Projection[S], *, from_seq: int = 1, to_seq: int | None = None,
           state: S | None = None) -> S:
    """Fold ``stream``'s events ``from_seq..to_seq`` from ``store`` through ``projection`` (see :func:`fold`).

    Reads and applies chunk by chunk, so the events are not all held at once.
    The chain is not checked here: :func:`project` (checkpoint, chain check)
    or :meth:`Store.verify` do that.
    """
    return fold(projection, store.iter_events(stream, from_seq, to_seq), state)


def checkpoint_digest(stream: str, name: str, seq: int, reducer_version: int, head_hash: str, state_json: str,
                      keys: Keyring | None = None) -> str:
    """The seal of a checkpoint's fields: ``hmac-sha256:<key id>:<hex>`` over
    ``"jixu.checkpoint.v3\0" ‖ canonical(fields but the state) ‖ "\0" ‖ state text``, with the current key
    (made on first use; :class:`~jixu.errors.KeyUnavailable` when none can be had).

    The state text is hashed as it is, not re-encoded as a JSON string. Checkpoints sealed by v2 (an unkeyed
    SHA-256 anybody could recompute) are no longer trusted: they are rebuilt by replay.
    """
    return seal_checkpoint(keys if keys is not None else sealing_keyring(), stream, name, seq, reducer_version,
                           head_hash, state_json)


def make_checkpoint(stream: str, projection: Projection[S], state: S, seq: int, head_hash: str, *,
                    keys: Keyring | None = None) -> Checkpoint:
    """A sealed checkpoint of ``state`` as of the event ``seq`` whose hash is ``head_hash``.

    ``state`` must come from verified events. Raises :class:`~jixu.errors.KeyUnavailable` when no key can seal.
    """
    state_json = canonical_text(projection.dump(state), path="state", max_nesting=STATE_NESTING)
    return Checkpoint(
        stream=stream,
        name=projection.name,
        seq=seq,
        reducer_version=projection.version,
        head_hash=head_hash,
        state_json=state_json,
        digest=checkpoint_digest(stream, projection.name, seq, projection.version, head_hash, state_json, keys),
        created_at=utc_now_text(),
    )


def make_chunked_checkpoint(stream: str, projection: ChunkedProjection[S], state: S, seq: int,
                            head_hash: str, *, keys: Keyring | None = None) -> tuple[Checkpoint, dict[str, Checkpoint]]:
    """A sealed main checkpoint of ``state`` and its chunks (as checkpoints, by digest).

    Write the chunks the store does not have yet before the main checkpoint
    (:func:`write_chunked_checkpoint`), so a main checkpoint never names a chunk
    that was not written.
    """
    data, texts = projection.dump_chunked(state)
    state_json = canonical_text(data, path="state", max_nesting=STATE_NESTING)
    created = utc_now_text()
    main = Checkpoint(stream=stream, name=projection.name, seq=seq, reducer_version=projection.version,
                      head_hash=head_hash, state_json=state_json,
                      digest=checkpoint_digest(stream, projection.name, seq, projection.version, head_hash,
                                               state_json, keys),
                      created_at=created)
    chunks = {digest: Checkpoint(stream=stream, name=chunk_name(projection.name, digest), seq=seq,
                                 reducer_version=projection.version, head_hash=head_hash, state_json=text,
                                 digest=digest, created_at=created)
              for digest, text in texts.items()}
    return main, chunks


def write_chunked_checkpoint(store: Store, main: Checkpoint, chunks: dict[str, Checkpoint],
                             stored: set[str] | None = None) -> None:
    """Write the chunks not in ``stored`` (digests known to be in the store) and then the main checkpoint,
    together in one transaction (a state with very many new chunks: in a few, the main one in the last), so a
    main checkpoint never names a chunk that was not written.

    ``stored`` is updated with every chunk written.
    """
    new = {digest: chunk for digest, chunk in chunks.items() if stored is None or digest not in stored}
    rows = [*new.values(), main]
    for start in range(0, len(rows), CHECKPOINTS_AT_ONCE):
        store.write_checkpoints(rows[start:start + CHECKPOINTS_AT_ONCE])
    if stored is not None:
        stored.update(new)


def save_checkpoint(store: Store, stream: str, projection: Projection[S], projected: Projected[S], *,
                    keys: Keyring | None = None) -> Checkpoint:
    """Write a sealed checkpoint of ``projected`` (which must come from a valid chain); returns the main checkpoint.

    Raises :class:`~jixu.errors.KeyUnavailable` when no key can seal it (nothing is written).
    """
    if not projected.chain.valid:
        raise InvalidInput(f"stream {stream!r} failed verification; refusing to checkpoint it")
    if projected.seq == 0:
        raise InvalidInput(f"stream {stream!r} is empty; there is nothing to checkpoint")
    if isinstance(projection, ChunkedProjection):
        checkpoint, chunks = make_chunked_checkpoint(stream, projection, projected.state, projected.seq,
                                                     projected.head_hash, keys=keys)
        write_chunked_checkpoint(store, checkpoint, chunks)
        return checkpoint
    checkpoint = make_checkpoint(stream, projection, projected.state, projected.seq, projected.head_hash, keys=keys)
    store.write_checkpoint(checkpoint)
    return checkpoint


class ChunkSource(Generic[S]):
    """Reads the chunks of one used checkpoint from the store, each checked against its digest.

    ``source(digest)`` returns the chunk's text, or ``None`` when it is missing
    or its text does not match its digest: the checkpoint is then unusable for
    that part, :attr:`problem` says why (``on_problem`` callbacks are told) and
    the caller takes the part from :meth:`replayed`, the state rebuilt by
    replaying the stream up to the checkpoint. Decisions or messages are never
    silently lost.
    """

    def __init__(self, store: Store, stream: str, projection: Projection[S], checkpoint: Checkpoint) -> None:
        self.store = store
        self.stream = stream
        self.projection = projection
        self.checkpoint = checkpoint
        self.problem: CheckpointStatus | None = None
        """``chunk_missing`` or ``chunk_mismatch`` once a chunk could not be used."""
        self.on_problem: list[Callable[[CheckpointStatus], None]] = []
        self._replayed: S | None = None
        self._lock = threading.Lock()

    def __call__(self, digest: str) -> str | None:
        found = self.store.read_checkpoint(self.stream, chunk_name(self.projection.name, digest))
        if found is not None and chunk_digest(found.state_json) == digest:
            return found.state_json
        self.report("chunk_missing" if found is None else "chunk_mismatch")
        return None

    def report(self, problem: CheckpointStatus) -> None:
        """Record that a chunk could not be used (the first reason is kept) and tell the callbacks."""
        if self.problem is None:
            self.problem = problem
        for callback in list(self.on_problem):
            callback(problem)

    def replayed(self) -> S:
        """The state at the checkpoint's ``seq``, rebuilt from the events alone (once; chain-checked).

        Raises :class:`~jixu.errors.StoreError` if the events up to there no
        longer verify against the checkpoint's ``head_hash``.
        """
        with self._lock:
            if self._replayed is None:
                checkpoint = self.checkpoint
                rows = list(self.store.read_rows(self.stream, 1, checkpoint.seq))
                info = self.store.stream_info(self.stream)
                report = verify_rows(self.stream, rows, genesis_hash=info.genesis_hash if info else "",
                                     recorded_head=(checkpoint.seq, checkpoint.head_hash))
                if not report.valid:
                    raise StoreError(
                        f"a checkpoint chunk of {self.stream!r} is missing or damaged, and the events up to seq "
                        f"{checkpoint.seq} do not verify, so it cannot be rebuilt", stream=self.stream)
                self._replayed = fold(self.projection, (row.to_event() for row in rows))
            return self._replayed


def _usable(store: Store, stream: str, projection: Projection[S], checkpoint: Checkpoint, keys: Keyring,
            head_seq: int) -> tuple[CheckpointStatus, S | None, ChunkSource[S] | None]:
    if checkpoint.reducer_version != projection.version:
        return "version_mismatch", None, None
    sealed = seal_status(keys, checkpoint)
    if sealed == "forged":
        return "digest_mismatch", None, None
    holds = checkpoint.seq <= head_seq and anchor_holds(store, checkpoint)
    if sealed != "sealed":
        return ("unsealed" if holds else "head_mismatch"), None, None
    if not holds:
        return "contradicted", None, None
    try:
        data = json.loads(checkpoint.state_json)
        if not isinstance(data, dict):
            return "undecodable", None, None
        if isinstance(projection, ChunkedProjection):
            source = ChunkSource(store, stream, projection, checkpoint)
            return "used", projection.load_chunked(data, source), source
        return "used", projection.load(data), None
    except (ValueError, KeyError, TypeError):
        return "undecodable", None, None


def project(store: Store, stream: str, projection: Projection[S], *, use_checkpoint: bool = True,
            keys: Keyring | None = None) -> Projected[S]:
    """Fold ``stream`` through ``projection``, starting from a usable sealed checkpoint if there is one.

    The events read are chain-checked; projection stops at the first bad
    event and ``chain`` reports it (the state then reflects only the events
    before it). A sealed checkpoint the events contradict, or a break recorded
    by :func:`jixu.ledger.trust.verdict`, makes the whole stream be read and
    ``chain`` report the break (the earliest). The events before a usable
    checkpoint are not read: :func:`jixu.ledger.trust.verdict` checks them.
    Raises :class:`~jixu.errors.NotFound` for a stream with no events.
    """
    check_stream(stream)
    # The projection's checkpoint and the recorded break, in one read, *before* the head: a checkpoint is written
    # after its events, so the head read next reaches it. Read the other way round, a checkpoint written in between
    # (another process appending and checkpointing) lies past the head read and looks like a rewrite.
    read = store.read_checkpoints(stream, [VERDICT_NAME, projection.name] if use_checkpoint else [VERDICT_NAME])
    info = store.stream_info(stream)
    if info is None:
        raise NotFound(f"stream {stream!r} has no events", stream=stream)
    keys = keys if keys is not None else keyring()
    status: CheckpointStatus = "none"
    state = projection.initial()
    start_seq, anchor_hash, checkpoint_seq = 1, info.genesis_hash, None
    source: ChunkSource[S] | None = None
    known = break_of(stream, read.get(VERDICT_NAME), keys)
    contradiction: Checkpoint | None = None
    if use_checkpoint:
        checkpoint = read.get(projection.name)
        if checkpoint is not None and known is not None:
            status = "broken"
        elif checkpoint is not None:
            status, loaded, source = _usable(store, stream, projection, checkpoint, keys, info.head_seq)
            if loaded is not None:
                state = loaded
                start_seq, anchor_hash, checkpoint_seq = checkpoint.seq + 1, checkpoint.head_hash, checkpoint.seq
            elif status == "contradicted":
                contradiction = checkpoint
    rows = []

    def counted() -> Any:
        for row in store.read_rows(stream, start_seq, info.head_seq):
            rows.append(row)
            yield row

    # Verify the rows read, then fold the good ones (up to the first bad one). The rows read are kept
    # until then: the collector stays paused from the first read on (see gc_paused).
    with gc_paused():
        report = verify_rows(stream, counted(), genesis_hash=anchor_hash, first_seq=start_seq,
                             recorded_head=(info.head_seq, info.head_hash))
        if report.valid and contradiction is not None:
            report = rewritten(contradiction, info.head_seq, report.count, report.head_hash)
        if known is not None and (report.valid or (known.first_bad_seq or 0) < (report.first_bad_seq or 0)):
            report = known
        good = rows if report.valid else [r for r in rows if r.seq < (report.first_bad_seq or 0)]
        state = fold(projection, (row.to_event() for row in good), state)
    applied = len(good)
    seq = good[-1].seq if good else start_seq - 1
    head = good[-1].hash if good else anchor_hash
    return Projected(state, seq, head, status, checkpoint_seq, applied, report, source)


def fold_verified(store: Store, stream: str, projection: Projection[S], *,
                  keys: Keyring | None = None) -> Projected[S]:
    """Fold every event of ``stream`` (no checkpoint), so its whole chain is verified in the read that is folded.

    A break found is recorded (:func:`~jixu.ledger.trust.record_break`), so every later opening heeds it: the
    read of the small streams whose state is authority (a token, a project, an execution request).
    """
    projected = project(store, stream, projection, use_checkpoint=False, keys=keys)
    if not projected.chain.valid:
        record_break(store, projected.chain, keys)
    return projected


AuditStatus = Literal["valid", "unsealed", "stale", "unchecked", "forged", "contradicted", "damaged"]
"""What re-projecting a checkpoint found: ``valid`` (sealed here, its anchor holds, its state is what the events
project to); ``unsealed`` (no key here can check it, but its state is the events' projection: harmless, and not
used); ``stale`` (another reducer version: not used); ``unchecked`` (the events up to it do not verify, so the
stream is corrupt and its state cannot be compared); ``forged`` (its seal fails, or its state or anchor is not
what the events say); ``contradicted`` (sealed here, but the events changed under it: the stream is corrupt);
``damaged`` (a chunk it names is missing or does not match its digest)."""

FAILED_AUDITS: tuple[AuditStatus, ...] = ("forged", "contradicted", "damaged")


@dataclass(frozen=True, slots=True)
class CheckpointAudit:
    """One checkpoint checked against the events it claims to summarise (see :func:`audit_checkpoint`)."""

    stream: str
    name: str
    seq: int
    status: AuditStatus
    detail: str

    @property
    def failed(self) -> bool:
        """True when the checkpoint is evidence of tampering or damage (forged, contradicted, damaged)."""
        return self.status in FAILED_AUDITS

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return {"stream": self.stream, "name": self.name, "seq": self.seq, "status": self.status,
                "detail": self.detail, "failed": self.failed}


def audit_checkpoint(store: Store, stream: str, projection: Projection[S], *,
                     keys: Keyring | None = None) -> CheckpointAudit | None:
    """Check ``stream``'s checkpoint of ``projection`` against the events: its seal, its anchor, and its state
    against a fresh projection of the events up to its seq (O(events up to it)). ``None`` when there is none."""
    checkpoint = store.read_checkpoint(stream, projection.name)
    if checkpoint is None:
        return None
    keys = keys if keys is not None else keyring()

    def audit(status: AuditStatus, detail: str) -> CheckpointAudit:
        return CheckpointAudit(stream, checkpoint.name, checkpoint.seq, status, detail)

    if checkpoint.reducer_version != projection.version:
        return audit("stale", f"made by reducer version {checkpoint.reducer_version}, this one is "
                              f"{projection.version}: not used, rebuilt when next written")
    sealed = seal_status(keys, checkpoint)
    if sealed == "forged":
        return audit("forged", "its seal is not the seal of the key it names over its fields: it was edited "
                               "(or damaged) in the store, and is not used")
    info = store.stream_info(stream)
    head_seq = info.head_seq if info is not None else 0
    if checkpoint.seq > head_seq or not anchor_holds(store, checkpoint):
        if sealed == "sealed":
            return audit("contradicted", f"sealed here, but the event at seq {checkpoint.seq} no longer hashes to "
                                         "its head hash: the events changed after it was written")
        return audit("forged", f"its head hash is not the hash of the event at seq {checkpoint.seq}")
    rows = list(store.read_rows(stream, 1, checkpoint.seq))
    chain = verify_rows(stream, rows, genesis_hash=info.genesis_hash if info is not None else "",
                        recorded_head=(checkpoint.seq, checkpoint.head_hash))
    if not chain.valid:
        return audit("unchecked", f"the events up to it do not verify (seq {chain.first_bad_seq}: {chain.reason}); "
                                  "its state cannot be compared with them")
    with gc_paused():
        expected = canonical_text(projection.dump(fold(projection, (row.to_event() for row in rows))),
                                  path="state", max_nesting=STATE_NESTING)
    del rows
    source: ChunkSource[S] | None = None
    try:
        data = json.loads(checkpoint.state_json)
        if not isinstance(data, dict):
            raise ValueError("not an object")
        if isinstance(projection, ChunkedProjection):
            source = ChunkSource(store, stream, projection, checkpoint)
            loaded = projection.load_chunked(data, source)
        else:
            loaded = projection.load(data)
        found = canonical_text(projection.dump(loaded), path="state", max_nesting=STATE_NESTING)
    except (ValueError, KeyError, TypeError, StoreError):
        return audit("forged", "its state does not load")
    if source is not None and source.problem is not None:
        return audit("damaged", f"a chunk it names is {'missing' if source.problem == 'chunk_missing' else 'damaged'}")
    if found != expected:
        return audit("forged", ("sealed here, but " if sealed == "sealed" else "")
                     + f"its state is not what the events up to seq {checkpoint.seq} project to")
    if sealed != "sealed":
        why = "an unkeyed digest of an older version" if sealed == "unsealed" else "another key"
        return audit("unsealed", f"sealed by {why}: not used (its state does match the events)")
    return audit("valid", f"sealed by key {checkpoint.digest.split(':')[1]}; its state is the events' projection")


class Followed(Protocol):
    """A projected state that knows the seq and hash of the last event applied to it."""

    seq: int
    head_hash: str


F = TypeVar("F", bound=Followed)


def follow(store: Store, stream: str, projection: Projection[F], record: F,
           chain_break: int | None) -> tuple[F, int | None]:
    """``record`` with the events appended after its head applied, and the first seq that does not verify
    (its link, or its recomputed hash)."""
    for row in store.read_rows(stream, record.seq + 1, None):
        if row.prev_hash != record.head_hash or row_hash(row) != row.hash:
            return record, chain_break or row.seq
        record = projection.apply(record, row.to_event())
    return record, chain_break


__all__ = [
    "CHUNK_TAG",
    "FAILED_AUDITS",
    "AuditStatus",
    "CheckpointAudit",
    "audit_checkpoint",
    "CheckpointStatus",
    "ChunkSource",
    "ChunkedProjection",
    "Followed",
    "Projected",
    "Projection",
    "checkpoint_digest",
    "chunk_digest",
    "chunk_name",
    "fold",
    "fold_verified",
    "follow",
    "gc_paused",
    "make_checkpoint",
    "make_chunked_checkpoint",
    "project",
    "replay",
    "save_checkpoint",
    "write_chunked_checkpoint",
]
