"""The Store contract every backend (memory, SQLite, PostgreSQL) fulfils.

A store keeps streams of immutable events, leases that fence writers,
disposable checkpoints, and a work queue (durable rows, not events: which
aggregates are ready to run, in which group, who claimed each, under which epoch). The queue is storage only:
a claim is atomic and counted per group, and the order groups are tried in is the caller's (the scheduling
layer's projects, limits and fairness, :mod:`jixu.scheduling.queue`). The contract is written once as a test
suite (``tests/ledger/test_store_contract.py``, ``tests/ledger/test_queue_contract.py``) and run against every
backend.

Backends implement the ``_``-prefixed primitives; the public methods here
validate input first, so bad input raises a typed error and writes nothing.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import Any, Self, TypeVar, cast

from jixu.errors import (
    ConcurrencyError,
    FencingError,
    IdempotencyConflict,
    InvalidInput,
    JixuError,
    LeaseHeld,
    StoreError,
)
from jixu.ledger.chain import VerifyReport, verify_rows
from jixu.ledger.event import (
    GENESIS_HASH,
    MAX_PAYLOAD_BYTES,
    Event,
    NewEvent,
    PreparedEvent,
    StoredRow,
    check_hash,
    check_prepared,
    check_stream,
    prepare,
    seal_batch,
)

_MAX_LEASE_KEY = 200


@dataclass(frozen=True, slots=True)
class Fence:
    """Proof of holding a lease: only this owner at this epoch may append."""

    key: str
    owner: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Lease:
    """The current state of a lease, read from the store.

    ``expires_at`` and ``heartbeat_at`` are seconds since the Unix epoch on the
    *store's* clock (:meth:`Store.now`), never the caller's.
    """

    key: str
    owner: str | None
    epoch: int
    expires_at: float
    heartbeat_at: float
    released: bool

    def fence(self) -> Fence:
        """The fence a holder of this lease appends with."""
        return Fence(key=self.key, owner=self.owner or "", epoch=self.epoch)


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """A stream's head and origin."""

    stream: str
    head_seq: int
    head_hash: str
    genesis_hash: str
    created_at: str
    group: str | None = None
    """The stream's group (:func:`group_of_meta`), or ``None``: the index :meth:`Store.list_streams` finds a
    group's streams by."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return {
            "stream": self.stream,
            "head_seq": self.head_seq,
            "head_hash": self.head_hash,
            "genesis_hash": self.genesis_hash,
            "created_at": self.created_at,
            "group": self.group,
        }


def group_of_meta(meta_json: str) -> str | None:
    """A stream's group: what its first event names in ``meta.project`` when that is a string of 1-100 characters
    (the index :meth:`Store.list_streams` finds a group's streams by; PostgreSQL's ``jixu_project_of`` is the
    same rule in SQL). The ledger knows the key, not what a project is."""
    if '"project"' not in meta_json:  # most first events name none: no parse
        return None
    found = json.loads(meta_json).get("project")
    return found if isinstance(found, str) and 0 < len(found) <= _MAX_GROUP else None


@dataclass(frozen=True, slots=True)
class Session:
    """A server-side login session (rows, not events: sessions are credentials, and they end).

    ``key`` is what the store keeps to find it (the server keeps a digest of the cookie's secret, never the
    secret), ``subject`` whom it authenticates (a token id). Times are seconds on the store's clock;
    ``active`` is whether it was neither revoked nor expired by that clock when it was read.
    """

    key: str
    subject: str
    created_at: float
    expires_at: float
    revoked_at: float | None
    active: bool

    @staticmethod
    def of_row(key: str, subject: str, created_at: float, expires_at: float, revoked_at: float | None,
               now: float) -> Session:
        """The session a stored row is at store time ``now``."""
        return Session(str(key), str(subject), float(created_at), float(expires_at),
                       None if revoked_at is None else float(revoked_at),
                       revoked_at is None and float(expires_at) > now)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A disposable snapshot of a projection's state at ``seq``.

    ``state_json`` is the canonical JSON text of the state, ``head_hash`` the
    hash of the event at ``seq`` and ``digest`` a hash over all other fields,
    so a stale, foreign or damaged checkpoint is recognised and ignored (see
    :mod:`jixu.ledger.projection`).
    """

    stream: str
    name: str
    seq: int
    reducer_version: int
    head_hash: str
    state_json: str
    digest: str
    created_at: str = ""


def check_lease_key(key: object) -> str:
    """Return ``key`` if it is a usable lease key (1-200 printable characters)."""
    if not isinstance(key, str) or not key or len(key) > _MAX_LEASE_KEY or not key.isprintable():
        raise InvalidInput(f"lease key {key!r} must be 1-200 printable characters", field="key")
    return key


def check_text(value: object, name: str, limit: int, *, required: bool = False) -> None:
    """Raise :class:`InvalidInput` unless ``value`` is ``None`` (when allowed) or a string of at most ``limit``
    characters (with ``required``: not blank)."""
    if value is None and not required:
        return
    if not isinstance(value, str) or (required and not value.strip()) or len(value) > limit:
        raise InvalidInput(f"{name} must be a {'non-empty ' if required else ''}string of at most {limit} "
                           "characters", field=name)


def check_owner(owner: object) -> str:
    """Return ``owner`` if it is a non-empty printable name of at most 200 characters."""
    if not isinstance(owner, str) or not owner or len(owner) > 200 or not owner.isprintable():
        raise InvalidInput(f"lease owner {owner!r} must be 1-200 printable characters", field="owner")
    return owner


def check_ttl(ttl: object) -> float:
    """Return ``ttl`` (seconds) if it is a positive finite number."""
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl < 10**7:
        raise InvalidInput(f"lease ttl {ttl!r} must be a number of seconds > 0", field="ttl")
    return float(ttl)


def check_fence(fence: object) -> Fence:
    """Return ``fence`` if it is a well-formed :class:`Fence`."""
    if not isinstance(fence, Fence):
        raise InvalidInput(f"fence must be a jixu Fence, got {type(fence).__name__}", field="fence")
    check_lease_key(fence.key)
    check_owner(fence.owner)
    if isinstance(fence.epoch, bool) or not isinstance(fence.epoch, int) or fence.epoch < 1:
        raise InvalidInput(f"fence epoch {fence.epoch!r} must be an integer >= 1", field="fence")
    return fence


class AlreadyStored(list[StoredRow]):
    """The rows of a batch stored already with identical content: appending it again is a no-op.

    A verdict of :func:`decide_append`, told apart from the plain list of
    rows to insert by its type (no verdict object is made per append).
    """

    __slots__ = ()


def existing_batch(
    stream: str, batch: Sequence[PreparedEvent], found: dict[str, StoredRow]
) -> AlreadyStored | IdempotencyConflict | None:
    """Step 1 of the append contract: what the ids of ``batch`` already stored (``found``) make of it (pure).

    The stored rows when the whole batch is already there with identical
    content (the append is a no-op), ``None`` when none of it is, and the
    :class:`IdempotencyConflict` to raise otherwise. Only :func:`judge_append`
    calls it.
    """
    if not found:
        return None
    for prepared in batch:
        row = found.get(prepared.id)
        if row is None:
            return IdempotencyConflict(
                f"part of this batch is already stored (e.g. {next(iter(found))}) but event "
                f"{prepared.id} is not: a retried append must repeat the same batch",
                event_id=prepared.id,
            )
        if row.stream != stream or not prepared.same_content(row.data_json, row.meta_json, row.type):
            return IdempotencyConflict(
                f"event id {prepared.id} is already stored in stream {row.stream!r} with "
                "different content; use a new id for a new event",
                event_id=prepared.id,
            )
    return AlreadyStored(sorted(found.values(), key=lambda r: r.seq))


def next_lease(current: Lease | None, key: str, owner: str, now: float, ttl: float) -> Lease:
    """The lease after ``owner`` asks for ``key`` at store time ``now`` (pure).

    Raises :class:`LeaseHeld` when another owner holds it unexpired.
    """
    if current is None:
        return Lease(key, owner, 1, now + ttl, now, False)
    live = not current.released and current.expires_at > now
    if live and current.owner == owner:
        return Lease(key, owner, current.epoch, now + ttl, now, False)
    if live:
        raise LeaseHeld(
            f"lease {key!r} is held by {current.owner!r} (epoch {current.epoch}) for another "
            f"{current.expires_at - now:.1f}s",
            key=key,
            owner=current.owner,
            epoch=current.epoch,
        )
    return Lease(key, owner, current.epoch + 1, now + ttl, now, False)


def taken_over_lease(current: Lease | None, key: str, owner: str, now: float, ttl: float, expected_epoch: int,
                     require_expired: bool) -> Lease:
    """The lease after ``owner`` takes it over from the holder at ``expected_epoch`` (pure)."""
    epoch = current.epoch if current is not None else 0
    if epoch != expected_epoch:
        raise FencingError(
            f"lease {key!r} is at epoch {epoch}, not the expected {expected_epoch}: it changed hands since "
            "you looked; look again", key=key, epoch=epoch)
    if require_expired and current is not None and not current.released and current.expires_at > now:
        raise LeaseHeld(
            f"lease {key!r} held by {current.owner!r} (epoch {epoch}) is still valid for "
            f"{current.expires_at - now:.1f}s by the store's clock", key=key, owner=current.owner, epoch=epoch)
    return Lease(key, owner, epoch + 1, now + ttl, now, False)


def head_moved(stream: str, expected_seq: int, actual_seq: int) -> ConcurrencyError:
    """The error of an append that expected ``stream`` at ``expected_seq`` and found it at ``actual_seq``."""
    return ConcurrencyError(
        f"stream {stream!r} is at seq {actual_seq}, not the expected {expected_seq}; "
        "read the new events and decide again",
        stream=stream,
        expected_seq=expected_seq,
        actual_seq=actual_seq,
    )


def renewed_lease(current: Lease | None, fence: Fence, ttl: float, now: float) -> Lease:
    """The lease ``fence`` holds, extended to ``now + ttl`` (pure); :class:`FencingError` if it lost it."""
    problem = fence_problem(current, fence, now)
    if problem:
        raise problem
    return Lease(fence.key, fence.owner, fence.epoch, now + ttl, now, False)


def fence_problem(current: Lease | None, fence: Fence, now: float) -> FencingError | None:
    """Why ``fence`` may not write at store time ``now``, or ``None`` if it may (pure)."""
    if current is None:
        return FencingError(f"no lease exists for key {fence.key!r}", key=fence.key)
    if current.owner != fence.owner or current.epoch != fence.epoch:
        return FencingError(
            f"fence ({fence.owner!r}, epoch {fence.epoch}) on {fence.key!r} is stale: the lease is "
            f"now held by {current.owner!r} at epoch {current.epoch}",
            key=fence.key,
            epoch=current.epoch,
        )
    if current.released:
        return FencingError(f"lease {fence.key!r} was released by its owner", key=fence.key)
    if current.expires_at <= now:
        return FencingError(
            f"lease {fence.key!r} (owner {fence.owner!r}, epoch {fence.epoch}) expired "
            f"{now - current.expires_at:.3f}s ago by the store's clock",
            key=fence.key,
        )
    return None


def judge_append(stream: str, batch: Sequence[PreparedEvent], expected_seq: int, fence: Fence | None, *,
                 found: dict[str, StoredRow], lease: Lease | None, now: float,
                 head_seq: int) -> AlreadyStored | JixuError | None:
    """Steps 1-3 of the append contract, in its order, with its wording (pure).

    Returns the stored rows of a repeated batch (a no-op), the error a
    refused append raises, or ``None`` when the append may go ahead. Every
    append is decided by :func:`decide_append`, which calls this; PostgreSQL's
    one-statement append, whose database seals the batch itself, calls it
    alone to word the database's refusals. The inputs are those of
    :func:`decide_append`.
    """
    if found:  # (1) ids already stored: the same batch is a no-op, anything else a conflict
        stored = existing_batch(stream, batch, found)
        if stored is not None:
            return stored
    if fence is not None:  # (2) only the current, live holder of the lease may write
        problem = fence_problem(lease, fence, now)
        if problem is not None:
            return problem
    if head_seq != expected_seq:  # (3) the head must be where the caller saw it
        return head_moved(stream, expected_seq, head_seq)
    return None


def decide_append(stream: str, batch: Sequence[PreparedEvent], expected_seq: int, fence: Fence | None, *,
                  found: dict[str, StoredRow], lease: Lease | None, now: float, head: tuple[int, str] | None,
                  genesis_hash: str, recorded_at: str) -> list[StoredRow] | AlreadyStored | JixuError:
    """The append contract, decided in one place for every store (pure).

    The store gathers the inputs inside the append's transaction, under its
    locks: ``found`` holds the stored rows whose ids are in ``batch`` (empty
    when none is), ``lease`` the current lease on ``fence.key`` and ``now``
    the store's clock (both unused without a fence), ``head`` the stream's
    ``(head_seq, head_hash)`` (``None``: no such stream yet, so it starts at
    ``genesis_hash``), ``recorded_at`` the time new rows are sealed with.
    In order: (1) ids already stored, (2) the fence, (3) the head, (4) seal.

    The verdict, which the store carries out in the same transaction: a
    :class:`~jixu.errors.JixuError` (raise it, write nothing), an
    :class:`AlreadyStored` list (a repeat: return it, write nothing), or else
    the list of sealed rows to insert (then move the head to the last of
    them, creating the stream's head record when ``head`` was ``None``).
    """
    head_seq = head[0] if head is not None else 0
    judged = judge_append(stream, batch, expected_seq, fence, found=found, lease=lease, now=now, head_seq=head_seq)
    if judged is not None:
        return judged
    # (4) seal the batch after the head
    return seal_batch(batch, stream=stream, head_seq=head_seq, prev_hash=head[1] if head is not None else genesis_hash,
                      recorded_at=recorded_at)


WORK_STATES = ("pending", "claimed", "expired", "done")
"""States of a work item as :meth:`Store.list_work` reports them (``claimed``/``expired`` by the store's clock)."""
_MAX_GROUP = 100
_MAX_GROUPS = 1000
CHECKPOINTS_AT_ONCE = 100
STREAMS_AT_ONCE = 10_000
"""The most streams :meth:`Store.checkpoints_named` reads at once."""
"""The most checkpoints :meth:`Store.read_checkpoints` reads and :meth:`Store.write_checkpoints` writes at once."""
SESSION_RETENTION = 86_400.0
"""Seconds a session is kept after it ended (then :meth:`Store.create_session` deletes it)."""


@dataclass(frozen=True, slots=True)
class WorkClaim:
    """Proof of holding a work item: only this owner at this epoch may renew or finish it.

    ``expires_at`` is on the store's clock. ``number`` is the store's number of the claim that made it
    (claims are numbered 1, 2, … per store, in the order they committed, whichever process made them; 0 when
    the proof was built by hand): logs of many processes sort by it into the true order of their claims.
    """

    key: str
    group: str
    owner: str
    epoch: int
    expires_at: float
    number: int = 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return {"key": self.key, "group": self.group, "owner": self.owner, "epoch": self.epoch,
                "expires_at": self.expires_at, "number": self.number}


@dataclass(frozen=True, slots=True)
class WorkItem:
    """A work item as the store sees it now (times in seconds on the store's clock).

    ``state`` is ``pending`` (waiting, ready from ``ready_at``), ``claimed`` (a
    live claim), ``expired`` (claimed, but the claim lapsed by the store's
    clock: claimable again) or ``done``. ``claimed_by``, ``expires_at`` and
    ``heartbeat_at`` describe the current claim (``None`` unless claimed or
    expired); ``epoch`` counts claims and never goes back. ``rerun`` means it
    was enqueued again while claimed: finishing it makes it pending again.
    """

    key: str
    group: str
    state: str
    ready_at: float
    enqueued_at: float
    claimed_by: str | None
    epoch: int
    expires_at: float | None
    heartbeat_at: float | None
    rerun: bool

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return {"key": self.key, "group": self.group, "state": self.state, "ready_at": self.ready_at,
                "enqueued_at": self.enqueued_at, "claimed_by": self.claimed_by, "epoch": self.epoch,
                "expires_at": self.expires_at, "heartbeat_at": self.heartbeat_at, "rerun": self.rerun}


@dataclass(frozen=True, slots=True)
class WorkRow:
    """A work item as stored (backends only): ``status`` is ``pending``, ``claimed`` or ``done``.

    ``position`` orders items enqueued at the same ``ready_at`` (assigned by
    the backend on insert; 0 until then).
    """

    key: str
    group: str
    status: str
    ready_at: float
    enqueued_at: float
    claimed_by: str | None
    epoch: int
    expires_at: float | None
    heartbeat_at: float | None
    rerun: bool
    position: int = 0

    def item(self, now: float) -> WorkItem:
        """The :class:`WorkItem` this row is at store time ``now``."""
        state = self.status
        if state == "claimed" and (self.expires_at is None or self.expires_at <= now):
            state = "expired"
        return WorkItem(self.key, self.group, state, self.ready_at, self.enqueued_at, self.claimed_by,
                        self.epoch, self.expires_at, self.heartbeat_at, self.rerun)

    def live(self, now: float) -> bool:
        """True while the row is claimed and the claim has not expired by the store's clock."""
        return self.status == "claimed" and self.expires_at is not None and self.expires_at > now

    def claimable(self, now: float) -> bool:
        """True when a claimer may take it: pending and ready, or claimed with an expired claim."""
        if self.status == "pending":
            return self.ready_at <= now
        return self.status == "claimed" and not self.live(now)


@dataclass(frozen=True, slots=True)
class QueueCensus:
    """The queue as one claim sees it inside its transaction: what a :data:`ClaimOrder` decides from.

    ``live`` counts each group's live claims (claimed, not expired by the store's clock); ``oldest`` gives
    every group that has a claimable item (pending and ready, or claimed with an expired claim) its oldest one
    as ``(ready_at, position)``; ``last_claimed`` the number of each group's latest claim (claims are numbered
    1, 2, … per store, so the order of claims is exact whatever the clock's resolution; a group never claimed
    from is absent).
    """

    live: Mapping[str, int]
    oldest: Mapping[str, tuple[float, int]]
    last_claimed: Mapping[str, int]


ClaimOrder = Callable[[QueueCensus], Sequence[str]]
"""The groups a claim tries, best first, for a census; an empty answer claims nothing. It runs inside the
claim's transaction, under the store's lock: it must be pure and quick, and never call the store."""


def groups_to_try(order: ClaimOrder, census: QueueCensus) -> list[str]:
    """The groups ``order`` names for ``census`` that have a claimable item, in its order (for backends)."""
    chosen = order(census)
    if isinstance(chosen, str) or not isinstance(chosen, Sequence) or not all(isinstance(g, str) for g in chosen):
        raise InvalidInput("a claim order must return a sequence of group names", field="order")
    return [group for group in chosen if group in census.oldest]


def check_group(group: object) -> str:
    """Return ``group`` if it is a usable name of a work group (1-100 printable characters)."""
    if not isinstance(group, str) or not group or len(group) > _MAX_GROUP or not group.isprintable():
        raise InvalidInput(f"work group {group!r} must be 1-100 printable characters", field="group")
    return group


def check_work_claim(claim: object) -> WorkClaim:
    """Return ``claim`` if it is a well-formed :class:`WorkClaim`."""
    if not isinstance(claim, WorkClaim):
        raise InvalidInput(f"claim must be a jixu WorkClaim, got {type(claim).__name__}", field="claim")
    check_lease_key(claim.key)
    check_owner(claim.owner)
    if isinstance(claim.epoch, bool) or not isinstance(claim.epoch, int) or claim.epoch < 1:
        raise InvalidInput(f"claim epoch {claim.epoch!r} must be an integer >= 1", field="claim")
    if isinstance(claim.number, bool) or not isinstance(claim.number, int) or claim.number < 0:
        raise InvalidInput(f"claim number {claim.number!r} must be an integer >= 0", field="claim")
    return claim


def check_delay(delay: object) -> float:
    """Return ``delay`` if it is a usable number of seconds to wait (0 up to ~115 days)."""
    if isinstance(delay, bool) or not isinstance(delay, int | float) or not 0 <= delay < 10**7:
        raise InvalidInput(f"delay {delay!r} must be a number of seconds >= 0", field="delay")
    return float(delay)


def _check_time(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 10**11:
        raise InvalidInput(f"{name} {value!r} must be seconds since the Unix epoch on the store's clock",
                           field=name)
    return float(value)


def enqueued_row(current: WorkRow | None, key: str, group: str, ready_at: float | None, now: float) -> WorkRow:
    """The row after ``key`` is enqueued at store time ``now`` (pure; ``current`` returned when unchanged).

    New -> pending; pending -> unchanged; done -> pending again; claimed (live
    or expired) -> ``rerun``, so finishing the claim makes it pending again.
    """
    if current is not None and current.group != group:
        raise InvalidInput(f"work item {key!r} belongs to group {current.group!r}, not {group!r}",
                           field="group")
    ready = now if ready_at is None else ready_at
    if current is None:
        return WorkRow(key, group, "pending", ready, now, None, 0, None, None, False)
    if current.status == "pending":
        return current
    if current.status == "done":
        return WorkRow(key, group, "pending", ready, now, None, current.epoch, None, None, False,
                       current.position)
    if current.rerun:
        return current
    return WorkRow(key, group, current.status, current.ready_at, current.enqueued_at, current.claimed_by,
                   current.epoch, current.expires_at, current.heartbeat_at, True, current.position)


def claimed_row(row: WorkRow, owner: str, ttl: float, now: float) -> WorkRow:
    """``row`` claimed by ``owner`` at store time ``now`` for ``ttl`` seconds (pure; epoch + 1)."""
    return WorkRow(row.key, row.group, "claimed", row.ready_at, row.enqueued_at, owner, row.epoch + 1,
                   now + ttl, now, False, row.position)


def next_claim_number(last_claimed: Mapping[str, int]) -> int:
    """The number the next claim of the store gets, from every group's latest (``QueueCensus.last_claimed``)."""
    return max(last_claimed.values(), default=0) + 1


def work_claim_of(row: WorkRow, number: int) -> WorkClaim:
    """The claim a freshly claimed (or renewed) ``row`` hands its owner; ``number`` is the claim's (see WorkClaim)."""
    assert row.claimed_by is not None and row.expires_at is not None
    return WorkClaim(row.key, row.group, row.claimed_by, row.epoch, row.expires_at, number)


def work_fence_problem(row: WorkRow | None, claim: WorkClaim, now: float, *, allow_expired: bool) -> FencingError | None:
    """Why ``claim`` may not renew (or finish) ``row`` at store time ``now``, or ``None`` (pure).

    A claim is stale once the item was finished or claimed again (another
    owner or epoch). An expired claim nobody took since may still finish
    (``allow_expired``) but never renew.
    """
    if row is None:
        return FencingError(f"no work item {claim.key!r}", key=claim.key)
    if row.status != "claimed" or row.claimed_by != claim.owner or row.epoch != claim.epoch:
        holder = f"claimed by {row.claimed_by!r} at epoch {row.epoch}" if row.status == "claimed" else (
            f"{row.status} at epoch {row.epoch}")
        return FencingError(f"work claim ({claim.owner!r}, epoch {claim.epoch}) on {claim.key!r} is stale: the "
                            f"item is now {holder}", key=claim.key, epoch=row.epoch)
    if not allow_expired and not row.live(now):
        return FencingError(f"work claim ({claim.owner!r}, epoch {claim.epoch}) on {claim.key!r} expired "
                            f"{now - (row.expires_at or now):.3f}s ago by the store's clock", key=claim.key,
                            epoch=row.epoch)
    return None


def renewed_row(row: WorkRow | None, claim: WorkClaim, ttl: float, now: float) -> WorkRow:
    """``row`` with ``claim`` extended to ``now + ttl`` (pure); :class:`FencingError` if it lost the item."""
    problem = work_fence_problem(row, claim, now, allow_expired=False)
    if problem:
        raise problem
    assert row is not None
    return WorkRow(row.key, row.group, "claimed", row.ready_at, row.enqueued_at, row.claimed_by, row.epoch,
                   now + ttl, now, row.rerun, row.position)


MAX_CLAIMS_AT_ONCE = 1000
"""The most claims :meth:`Store.claim_works` makes in one transaction."""
LeaseChange = Callable[[Lease | None, float], Lease]
"""A lease's change inside its transaction: ``change(current, store_now)`` -> the lease to store."""
WorkChange = Callable[[WorkRow | None, float], WorkRow]
"""A work item's change inside its transaction: ``change(current, store_now)`` -> the row to store."""


def _renew_with(fence: Fence, ttl: float, current: Lease | None, now: float) -> Lease:
    return renewed_lease(current, fence, ttl, now)


def _renew_row_with(claim: WorkClaim, ttl: float, current: WorkRow | None, now: float) -> WorkRow:
    return renewed_row(current, claim, ttl, now)


_Change = TypeVar("_Change")
_Changed = TypeVar("_Changed")


RENEWAL_REFUSALS: tuple[type[JixuError], ...] = (FencingError,)
"""What refuses one renewal of a claim (the claim was lost)."""
TAKE_REFUSALS: tuple[type[JixuError], ...] = (FencingError, LeaseHeld)
"""What refuses one take-over of a lease (it moved since it was read; its holder's lease is still live)."""


def each_change(changes: Sequence[tuple[str, _Change]], apply: Callable[[str, _Change], _Changed],
                refusals: tuple[type[JixuError], ...] = RENEWAL_REFUSALS) -> list[_Changed | JixuError]:
    """``apply(key, change)`` for each of ``changes`` (renewals or takes of claims), in key order, so that two
    processes changing overlapping sets lock their rows in one order; answered in the order given: the result,
    or the error of ``refusals`` the change raised (one refused change does not stop the others)."""
    results: list[_Changed | JixuError | None] = [None] * len(changes)
    for index in sorted(range(len(changes)), key=lambda i: changes[i][0]):
        key, change = changes[index]
        try:
            results[index] = apply(key, change)
        except refusals as error:
            results[index] = error
    return [result for result in results if result is not None]


def renewal_answers(answers: list[_Changed | JixuError]) -> list[_Changed | FencingError]:
    """Renewals' answers, typed as what they are: a renewal is refused only with a FencingError
    (:data:`RENEWAL_REFUSALS`; anything else was raised, not answered)."""
    return cast("list[_Changed | FencingError]", answers)


@dataclass(frozen=True)
class LeaseTake:
    """One take-over of :meth:`Store.take_over_leases`: the arguments :meth:`Store.take_over_lease` takes."""

    key: str
    owner: str
    ttl: float
    expected_epoch: int
    require_expired: bool = True


def check_take(take: object) -> LeaseTake:
    """``take`` checked (:class:`~jixu.errors.InvalidInput` for a bad one): key, owner, ttl, epoch."""
    if not isinstance(take, LeaseTake):
        raise InvalidInput(f"{take!r} is not a LeaseTake", field="takes")
    epoch = take.expected_epoch
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise InvalidInput(f"expected_epoch {epoch!r} must be an integer >= 0", field="expected_epoch")
    if not isinstance(take.require_expired, bool):
        raise InvalidInput("require_expired must be true or false", field="require_expired")
    return LeaseTake(check_lease_key(take.key), check_owner(take.owner), check_ttl(take.ttl), epoch,
                     take.require_expired)


def _take_with(take: LeaseTake, current: Lease | None, now: float) -> Lease:
    return taken_over_lease(current, take.key, take.owner, now, take.ttl, take.expected_epoch, take.require_expired)


ClaimFrom = Callable[[str, int], "tuple[WorkClaim, tuple[float, int] | None] | None"]
"""A backend's claim of a group's oldest claimable item, numbered as given: the claim and the group's next
oldest claimable item as ``(ready_at, position)`` (None: none left); None when it found none to claim."""


def served_groups(claims: Sequence[WorkClaim]) -> dict[str, tuple[int, int]]:
    """Each group ``claims`` served: its latest claim number and how many claims it had (what a backend records
    per project once per batch of claims)."""
    served: dict[str, tuple[int, int]] = {}
    for claim in claims:
        last, count = served.get(claim.group, (0, 0))
        served[claim.group] = (max(last, claim.number), count + 1)
    return served


def claims_up_to(count: int, census: QueueCensus, order: ClaimOrder, claim_from: ClaimFrom) -> list[WorkClaim]:
    """Up to ``count`` claims inside one transaction, each from the group ``order`` puts first for the queue as
    the claims before it left it.

    The census is read once per transaction and kept true here as each claim changes it (the claimed group has
    one live claim more, its next oldest item, the latest claim number), instead of being counted again from
    every row of the queue for each claim: that made a claim cost O(queue) and a batch of 16 at 500 queued
    items ~20 ms under the write lock. A group ``claim_from`` finds nothing in (another transaction holds its
    items) is passed over for the rest of this one.
    """
    claims: list[WorkClaim] = []
    while len(claims) < count:
        for group in groups_to_try(order, census):
            made = claim_from(group, next_claim_number(census.last_claimed))
            oldest = dict(census.oldest)
            if made is None:
                del oldest[group]
                census = QueueCensus(census.live, oldest, census.last_claimed)
                continue
            claim, next_oldest = made
            if next_oldest is None:
                del oldest[group]
            else:
                oldest[group] = next_oldest
            census = QueueCensus({**census.live, group: census.live.get(group, 0) + 1}, oldest,
                                 {**census.last_claimed, group: claim.number})
            claims.append(claim)
            break
        else:
            return claims
    return claims


def _sequence(values: object, field: str) -> Sequence[Any]:
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise InvalidInput(f"{field} must be a list", field=field)
    return values


def finished_row(row: WorkRow | None, claim: WorkClaim, now: float, *, requeue: bool, delay: float) -> WorkRow:
    """``row`` after ``claim`` finishes it (pure): done, or pending again when requeued or enqueued meanwhile.

    A requeued item keeps its place (its ``ready_at``) unless ``delay`` > 0
    puts it ``delay`` seconds after ``now``.
    """
    problem = work_fence_problem(row, claim, now, allow_expired=True)
    if problem:
        raise problem
    assert row is not None
    if requeue or row.rerun:
        ready = now + delay if delay > 0 else (row.ready_at if requeue else now)
        return WorkRow(row.key, row.group, "pending", ready, row.enqueued_at, None, row.epoch, None, None,
                       False, row.position)
    return WorkRow(row.key, row.group, "done", row.ready_at, row.enqueued_at, None, row.epoch, None, None,
                   False, row.position)


@dataclass(frozen=True, slots=True)
class AppendRequest:
    """One append of :meth:`Store.append_many`: the arguments :meth:`Store.append` takes."""

    stream: str
    events: Sequence[NewEvent | PreparedEvent]
    expected_seq: int
    fence: Fence | None = None
    genesis_hash: str | None = None


class Store(abc.ABC):
    """An event ledger: streams, leases and checkpoints (see the module docstring)."""

    url: str = ""
    max_payload_bytes: int = MAX_PAYLOAD_BYTES
    durability: str = ""
    """What a commit survives, in words for people (e.g. ``synchronous=FULL``); the CLI may print it."""

    # --- events ---------------------------------------------------------------------

    def append(
        self,
        stream: str,
        events: Sequence[NewEvent | PreparedEvent],
        expected_seq: int,
        fence: Fence | None = None,
        *,
        genesis_hash: str | None = None,
    ) -> list[Event]:
        """Append ``events`` atomically after seq ``expected_seq`` (0 for a new stream).

        All or nothing. Raises :class:`~jixu.errors.ConcurrencyError` when the
        head is not ``expected_seq``, :class:`~jixu.errors.FencingError` when
        ``fence`` is not the current holder of an unexpired lease (checked in the
        same transaction), :class:`~jixu.errors.IdempotencyConflict` when an id is
        reused with other content. Re-appending a stored batch is a no-op that
        returns the stored events. ``genesis_hash`` sets ``prev_hash`` of seq 1
        for a new (forked) stream. An event already encoded by
        :func:`~jixu.ledger.event.prepare` is appended as it is (not encoded again).
        """
        batch = self._prepare_append(stream, events, expected_seq, fence, genesis_hash)
        rows = self._append(stream, batch, expected_seq, fence, genesis_hash or GENESIS_HASH)
        return [row.to_event() for row in rows]

    def append_after(self, stream: str, expected_seq: int, fence: Fence | None,
                     build: Callable[[list[StoredRow]], Sequence[NewEvent | PreparedEvent]]
                     ) -> tuple[list[StoredRow], list[Event]]:
        """Append what ``build`` makes of the rows other writers appended after ``expected_seq``, at the head,
        in one write transaction: the head cannot move between reading those rows and appending, so this
        never meets a :class:`~jixu.errors.ConcurrencyError` however busy the stream is.

        ``build`` runs while the stream's head is locked: keep it short and free of I/O. It may return
        nothing (nothing is appended) or raise (nothing is appended; the error propagates). The fence is
        checked as :meth:`append` checks it. Returns the rows read (stored texts, unchecked: the caller
        verifies their links) and the events appended. The stream must exist.
        """
        check_stream(stream)
        if isinstance(expected_seq, bool) or not isinstance(expected_seq, int) or expected_seq < 1:
            raise InvalidInput(f"expected_seq {expected_seq!r} must be an integer >= 1", field="expected_seq")
        if fence is not None:
            check_fence(fence)

        def checked(rows: list[StoredRow], head: int) -> list[PreparedEvent]:
            events = build(rows)
            return self._prepare_append(stream, events, head, fence, None) if events else []

        read, appended = self._append_after(stream, expected_seq, fence, checked)
        return read, [row.to_event() for row in appended]

    def append_and_enqueue(self, stream: str, events: Sequence[NewEvent | PreparedEvent], expected_seq: int, *,
                           key: str, group: str, fence: Fence | None = None, delay: float = 0.0,
                           genesis_hash: str | None = None) -> list[Event]:
        """:meth:`append` (``genesis_hash`` as there), and :meth:`enqueue` of the work item ``key`` in ``group``
        (ready ``delay`` seconds of store time from now), in one transaction: both are durable, or neither (a
        queued turn is never left without its queue row)."""
        batch = self._prepare_append(stream, events, expected_seq, fence, genesis_hash)
        key, group, wait = check_lease_key(key), check_group(group), check_delay(delay)
        rows = self._append_and_enqueue(stream, batch, expected_seq, fence, lambda current, now: enqueued_row(
            current, key, group, now + wait if wait else None, now), key, genesis_hash or GENESIS_HASH)
        return [row.to_event() for row in rows]

    def append_many(self, requests: Sequence[AppendRequest]) -> list[list[Event] | JixuError]:
        """Several independent appends, each all or nothing, each answered with its events or its error.

        A store that can commits them together (SQLite: one transaction and one
        fsync for all of them); the others append one by one.
        Nothing is returned before every append of the call is durable.
        """
        results: list[list[Event] | JixuError] = []
        for request in requests:
            try:
                results.append(self.append(request.stream, request.events, request.expected_seq, request.fence,
                                           genesis_hash=request.genesis_hash))
            except JixuError as error:
                results.append(error)
        return results

    def _prepare_append(self, stream: str, events: Sequence[NewEvent | PreparedEvent], expected_seq: int, fence: Fence | None,
                        genesis_hash: str | None) -> list[PreparedEvent]:
        """Check an append's arguments and encode its events (raises; writes nothing)."""
        check_stream(stream)
        if isinstance(expected_seq, bool) or not isinstance(expected_seq, int) or expected_seq < 0:
            raise InvalidInput(f"expected_seq {expected_seq!r} must be an integer >= 0", field="expected_seq")
        if isinstance(events, NewEvent | PreparedEvent) or not isinstance(events, Sequence) or not events:
            raise InvalidInput("events must be a non-empty list of NewEvent", field="events")
        limit = self.max_payload_bytes
        batch = [check_prepared(event, limit) if isinstance(event, PreparedEvent) else prepare(event, limit)
                 for event in events]
        if len({p.id for p in batch}) != len(batch):
            raise InvalidInput("the batch contains the same event id twice", field="events")
        if fence is not None:
            check_fence(fence)
        if genesis_hash is not None:
            check_hash(genesis_hash, "genesis_hash")
            if expected_seq != 0:
                raise InvalidInput("genesis_hash can only be given when creating a stream (expected_seq=0)",
                                   field="genesis_hash")
        return batch

    def read(self, stream: str, from_seq: int = 1, to_seq: int | None = None) -> list[Event]:
        """Events of ``stream`` with ``from_seq <= seq <= to_seq``, in order (``[]`` if none)."""
        return list(self.iter_events(stream, from_seq, to_seq))

    def iter_events(self, stream: str, from_seq: int = 1, to_seq: int | None = None) -> Iterator[Event]:
        """The events :meth:`read` returns, read and decoded chunk by chunk as they are iterated."""
        check_stream(stream)
        _check_seq_range(from_seq, to_seq)
        return self._iter_events(stream, from_seq, to_seq)

    def _iter_events(self, stream: str, from_seq: int, to_seq: int | None) -> Iterator[Event]:
        # A backend may decode its rows into events directly (SQLite does).
        return map(StoredRow.to_event, self._read_rows(stream, from_seq, to_seq))

    def read_rows(self, stream: str, from_seq: int = 1, to_seq: int | None = None) -> Iterator[StoredRow]:
        """Stored rows (canonical texts, unparsed) of ``stream`` in seq order."""
        check_stream(stream)
        _check_seq_range(from_seq, to_seq)
        return self._read_rows(stream, from_seq, to_seq)

    def get_event(self, event_id: str) -> Event | None:
        """The event with this id, or ``None``."""
        from jixu.ledger.ids import check_id

        check_id(event_id, "event id")
        row = self._get_row(event_id)
        return row.to_event() if row else None

    def stream_info(self, stream: str) -> StreamInfo | None:
        """Head and origin of ``stream``, or ``None`` if it has no events."""
        check_stream(stream)
        return self._stream_info(stream)

    def list_streams(self, prefix: str = "", *, after: str = "", limit: int = 1000,
                     groups: Sequence[str] | None = None) -> list[StreamInfo]:
        """Streams whose name starts with ``prefix``, ordered by name, after ``after``.

        With ``groups``, only streams whose first event names one of them (in ``meta.project``: the ledger's
        group of a stream is the name a layer above records there), found by an index: the cost follows the
        streams of those groups, not the store.
        """
        if not isinstance(prefix, str) or not isinstance(after, str):
            raise InvalidInput("prefix and after must be strings")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100_000:
            raise InvalidInput(f"limit {limit!r} must be between 1 and 100000", field="limit")
        if groups is None:
            return self._list_streams(prefix, after, limit)
        if isinstance(groups, str) or not isinstance(groups, Sequence) or len(groups) > _MAX_GROUPS:
            raise InvalidInput(f"groups must be a list of at most {_MAX_GROUPS} group names", field="groups")
        wanted = sorted({check_group(group) for group in groups})
        return self._list_group_streams(prefix, after, limit, wanted) if wanted else []

    def verify(self, stream: str) -> VerifyReport:
        """Recompute ``stream``'s hash chain and report the first bad seq, if any.

        The head record and the events are read from one consistent snapshot,
        so appends running meanwhile never make a valid stream look broken.
        Events stored without a head record, or beyond it, are reported.
        """
        check_stream(stream)
        return self._verify_snapshot(stream)

    def _verify_snapshot(self, stream: str) -> VerifyReport:
        info = self._stream_info(stream)
        genesis = info.genesis_hash if info else GENESIS_HASH
        head = (info.head_seq, info.head_hash) if info else (0, GENESIS_HASH)
        return verify_rows(stream, self._read_rows(stream, 1, None), genesis_hash=genesis, recorded_head=head)

    # --- leases ---------------------------------------------------------------------

    def acquire_lease(self, key: str, owner: str, ttl: float) -> Fence:
        """Take the lease on ``key`` for ``ttl`` seconds of store time.

        A free, released or expired lease is taken with the epoch incremented;
        one held by the same owner is renewed at its epoch; one held by another
        owner and not expired raises :class:`~jixu.errors.LeaseHeld`.
        """
        key, owner, ttl = check_lease_key(key), check_owner(owner), check_ttl(ttl)
        return self._change_lease(key, lambda current, now: next_lease(current, key, owner, now, ttl)).fence()

    def renew_lease(self, fence: Fence, ttl: float) -> Lease:
        """Extend the lease ``fence`` holds; :class:`~jixu.errors.FencingError` if it lost it."""
        answer = self.renew_leases([fence], ttl)[0]  # one renewal path, alone or together
        if isinstance(answer, FencingError):
            raise answer
        return answer

    def renew_leases(self, fences: Sequence[Fence], ttl: float) -> list[Lease | FencingError]:
        """:meth:`renew_lease` of each of ``fences``, in one transaction: for each, its renewed lease or the
        :class:`~jixu.errors.FencingError` saying it was lost (a lost one does not stop the others).

        What a process holding many leases renews together (``kernel.batched``): one commit, not one each.
        """
        checked = [check_fence(fence) for fence in _sequence(fences, "fences")]
        ttl = check_ttl(ttl)
        return renewal_answers(self._change_leases([(fence.key, partial(_renew_with, fence, ttl)) for fence in checked],
                                                   durable=False, refusals=RENEWAL_REFUSALS))

    def take_over_lease(self, key: str, owner: str, ttl: float, *, expected_epoch: int,
                        require_expired: bool = True) -> Fence:
        """Take the lease from its holder at ``expected_epoch``, incrementing the epoch.

        With ``require_expired`` (the default) the holder's lease must have
        expired by the store's clock, or been released
        (:class:`~jixu.errors.LeaseHeld` otherwise); without it the caller
        asserts the holder has stopped. ``expected_epoch`` 0 means no lease
        exists yet. Any other epoch raises :class:`~jixu.errors.FencingError`:
        somebody else moved the lease since the caller looked.
        """
        answer = self.take_over_leases([LeaseTake(key, owner, ttl, expected_epoch, require_expired)])[0]
        if isinstance(answer, JixuError):  # one take-over path, alone or together
            raise answer
        return answer

    def take_over_leases(self, takes: Sequence[LeaseTake]) -> list[Fence | JixuError]:
        """:meth:`take_over_lease` of each of ``takes``, in one durable transaction: for each, its fence or
        the error refusing it (:class:`~jixu.errors.FencingError`, :class:`~jixu.errors.LeaseHeld`; one
        refused take does not stop the others).

        What the turns starting together on one event loop take at once (``kernel.batched``): one commit, not
        one each. Two takes of one key in one call are decided one after the other (the second sees the first).
        """
        checked = [check_take(take) for take in _sequence(takes, "takes")]
        answers = self._change_leases([(take.key, partial(_take_with, take)) for take in checked],
                                      durable=True, refusals=TAKE_REFUSALS)
        return [answer.fence() if isinstance(answer, Lease) else answer for answer in answers]

    def release_lease(self, fence: Fence) -> None:
        """Give the lease up (a no-op if ``fence`` no longer holds it)."""
        self._release_lease(check_fence(fence))

    def get_lease(self, key: str) -> Lease | None:
        """The lease on ``key`` as the store sees it now, or ``None``."""
        return self._get_lease(check_lease_key(key))

    # --- work queue -----------------------------------------------------------------

    def enqueue(self, key: str, group: str, *, ready_at: float | None = None) -> WorkItem:
        """Make the work item ``key`` of ``group`` pending (ready from ``ready_at``, store clock; default now).

        Idempotent per key: enqueueing a pending item changes nothing; a done
        item becomes pending again; a claimed item is marked to run again
        once its claim finishes (so no wake-up is lost). A key belongs to one
        group for good (:class:`~jixu.errors.InvalidInput` otherwise).
        """
        key, group = check_lease_key(key), check_group(group)
        ready = None if ready_at is None else _check_time(ready_at, "ready_at")
        return self._change_work(key, lambda current, now: enqueued_row(current, key, group, ready, now))[0]

    def claim_work(self, owner: str, ttl: float, order: ClaimOrder) -> WorkClaim | None:
        """Atomically claim one claimable item for ``owner`` for ``ttl`` seconds of store time, or ``None``.

        In one transaction serialised with every other claim on the store, so
        what it counts holds across every process and machine sharing it:
        take the :class:`QueueCensus`, ask ``order`` which groups to try
        (best first), and claim the oldest claimable item (``ready_at``, then
        ``position``) of the first of them that has one. Claimable means
        pending with ``ready_at`` reached, or claimed with a claim expired by
        the store's clock. The claim's epoch is the item's previous epoch + 1;
        the group's ``last_claimed`` becomes the store's next claim number, which the claim carries.
        Which groups there are, their limits and the fairness between them
        are the caller's (:func:`jixu.scheduling.queue.claim`).
        """
        claims = self.claim_works(owner, ttl, order, 1)
        return claims[0] if claims else None

    def claim_works(self, owner: str, ttl: float, order: ClaimOrder, count: int) -> list[WorkClaim]:
        """Up to ``count`` claims, each made as :meth:`claim_work` makes one (its own census, ``order`` asked
        again), one after another in one transaction: what a worker with ``count`` free slots takes at once.
        Fewer (or none) when fewer items are claimable or ``order`` names no group."""
        owner, ttl = check_owner(owner), check_ttl(ttl)
        if not callable(order):
            raise InvalidInput("order must be a function of a QueueCensus naming the groups to try",
                               field="order")
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_CLAIMS_AT_ONCE:
            raise InvalidInput(f"count must be an integer from 1 to {MAX_CLAIMS_AT_ONCE}, got {count!r}",
                               field="count")
        return self._claim_works(owner, ttl, order, count)

    def renew_work(self, claim: WorkClaim, ttl: float) -> WorkClaim:
        """Extend ``claim`` to ``ttl`` seconds from the store's now; :class:`~jixu.errors.FencingError`
        if the claim expired, or the item was finished or claimed again."""
        answer = self.renew_work_claims([claim], ttl)[0]  # one renewal path, as leases
        if isinstance(answer, FencingError):
            raise answer
        return answer

    def renew_work_claims(self, claims: Sequence[WorkClaim], ttl: float) -> list[WorkClaim | FencingError]:
        """:meth:`renew_work` of each of ``claims``, in one transaction: for each, the renewed claim or the
        :class:`~jixu.errors.FencingError` saying it was lost (a lost one does not stop the others)."""
        checked = [check_work_claim(claim) for claim in _sequence(claims, "claims")]
        ttl = check_ttl(ttl)
        rows = self._renew_works([(claim.key, partial(_renew_row_with, claim, ttl)) for claim in checked])
        return [row if isinstance(row, FencingError) else work_claim_of(row, claim.number)
                for claim, row in zip(checked, rows, strict=True)]

    def finish_work(self, claim: WorkClaim, *, requeue: bool = False, delay: float = 0.0) -> WorkItem:
        """Finish ``claim``: the item is done, or pending again with ``requeue`` (after ``delay`` seconds).

        Fenced by owner and epoch: a stale claim (the item was finished or
        claimed again since) raises :class:`~jixu.errors.FencingError`. A
        claim that expired but that nobody took since may still finish.
        An item enqueued again while claimed becomes pending, not done.
        """
        claim = check_work_claim(claim)
        if not isinstance(requeue, bool):
            raise InvalidInput("requeue must be true or false", field="requeue")
        wait = check_delay(delay)
        return self._change_work(claim.key, lambda current, now: finished_row(
            current, claim, now, requeue=requeue, delay=wait))[0]

    def list_work(self, group: str | None = None, state: str | None = None) -> list[WorkItem]:
        """Work items (of ``group``, in ``state``), oldest first; states judged by the store's clock."""
        if group is not None:
            check_group(group)
        if state is not None and state not in WORK_STATES:
            raise InvalidInput(f"state {state!r} must be one of {list(WORK_STATES)}", field="state")
        stored = {"expired": "claimed"}.get(state, state) if state is not None else None
        rows, now = self._list_work(group, stored)
        items = [row.item(now) for row in rows]
        return [item for item in items if state is None or item.state == state]

    def get_work(self, key: str) -> WorkItem | None:
        """The work item ``key`` as the store sees it now, or ``None``."""
        row, now = self._get_work(check_lease_key(key))
        return row.item(now) if row is not None else None

    @abc.abstractmethod
    def now(self) -> float:
        """The store's clock: seconds since the Unix epoch."""

    # --- checkpoints ----------------------------------------------------------------

    def write_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Store ``checkpoint``, replacing the earlier one of the same stream and name."""
        self.write_checkpoints([checkpoint])

    def write_checkpoints(self, checkpoints: Sequence[Checkpoint]) -> None:
        """Store ``checkpoints`` in one transaction (all or none), each replacing the earlier one of its stream
        and name: a chunked checkpoint's new chunks and its main row together (one commit instead of one each)."""
        if isinstance(checkpoints, Checkpoint) or not isinstance(checkpoints, Sequence) \
                or len(checkpoints) > CHECKPOINTS_AT_ONCE \
                or not all(isinstance(checkpoint, Checkpoint) for checkpoint in checkpoints):
            raise InvalidInput(f"checkpoints must be a list of at most {CHECKPOINTS_AT_ONCE} Checkpoint",
                               field="checkpoints")
        for checkpoint in checkpoints:
            check_stream(checkpoint.stream)
        if len({(checkpoint.stream, checkpoint.name) for checkpoint in checkpoints}) != len(checkpoints):
            raise InvalidInput("the same checkpoint (stream and name) is given twice", field="checkpoints")
        if checkpoints:
            self._write_checkpoints(list(checkpoints))

    def read_checkpoint(self, stream: str, name: str) -> Checkpoint | None:
        """The latest checkpoint of ``name`` for ``stream``, unchecked (see projection)."""
        return self.read_checkpoints(stream, (name,)).get(name)

    def read_checkpoints(self, stream: str, names: Sequence[str]) -> dict[str, Checkpoint]:
        """The latest checkpoints of ``names`` for ``stream`` (those that exist, by name; unchecked), in one
        read: what opening a stream needs (its projection's checkpoint and its recorded break) at once."""
        check_stream(stream)
        if isinstance(names, str) or not isinstance(names, Sequence) or len(names) > CHECKPOINTS_AT_ONCE \
                or not all(isinstance(name, str) for name in names):
            raise InvalidInput(f"names must be a list of at most {CHECKPOINTS_AT_ONCE} checkpoint names",
                               field="names")
        wanted = sorted(set(names))
        return self._read_checkpoints(stream, wanted) if wanted else {}

    def checkpoints_named(self, name: str, streams: Sequence[str]) -> dict[str, Checkpoint]:
        """The latest checkpoint of ``name`` of each of ``streams`` that has one (by stream; unchecked), in one
        read: what a process watching many streams for one kind of checkpoint (a recorded break) asks at once."""
        if not isinstance(name, str) or not name:
            raise InvalidInput("name must be a non-empty string", field="name")
        if isinstance(streams, str) or not isinstance(streams, Sequence) or len(streams) > STREAMS_AT_ONCE:
            raise InvalidInput(f"streams must be a list of at most {STREAMS_AT_ONCE} stream names", field="streams")
        wanted = sorted({check_stream(stream) for stream in streams})
        return self._checkpoints_named(name, wanted) if wanted else {}

    # --- sessions and credential use -------------------------------------------------

    def create_session(self, key: str, subject: str, ttl: float) -> Session:
        """Record a new session ``key`` of ``subject`` that lasts ``ttl`` seconds of store time.

        A key is used once (:class:`~jixu.errors.InvalidInput` if it exists). Sessions that expired more than
        :data:`SESSION_RETENTION` seconds ago are deleted on the way (they authenticate nothing any more).
        """
        key, subject, ttl = check_lease_key(key), check_owner(subject), check_ttl(ttl)
        return self._create_session(key, subject, ttl)

    def get_session(self, key: str) -> Session | None:
        """The session ``key`` (``active`` judged by the store's clock), or ``None``."""
        return self._get_session(check_lease_key(key))

    def revoke_session(self, key: str) -> bool:
        """End the session ``key`` now; True when it was active."""
        return self._revoke_sessions(check_lease_key(key), None) > 0

    def revoke_sessions(self, subject: str) -> int:
        """End every active session of ``subject`` now; how many there were."""
        return int(self._revoke_sessions(None, check_owner(subject)))

    def record_use(self, key: str) -> None:
        """Note that credential ``key`` was used now (store clock), replacing the earlier note.

        Not waited for on disk where the store can avoid it: a lost note only makes a last use look older.
        """
        self._record_use(check_lease_key(key))

    def last_used(self, keys: Sequence[str]) -> dict[str, float]:
        """When each of ``keys`` was last noted by :meth:`record_use` (keys never noted are absent)."""
        if isinstance(keys, str) or not isinstance(keys, Sequence):
            raise InvalidInput("keys must be a list of strings", field="keys")
        return self._last_used([check_lease_key(key) for key in keys]) if keys else {}

    # --- lifecycle ------------------------------------------------------------------

    @abc.abstractmethod
    def schema_version(self) -> int:
        """The schema version this store's database is at."""

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (a closed store answers nothing more)."""
        return bool(getattr(self, "_closed", False))

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections; the store cannot be used afterwards."""

    def opened_again(self) -> Store:
        """A new store over the same database, opened as this one was (whatever the process did since: a change
        of directory, a password the URL shows masked), for work that outlives this store's close: giving back
        a claim held while a call ran on (decision 0065). :class:`StoreError` when it cannot be."""
        raise StoreError(f"{type(self).__name__} cannot be opened again")

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- backend primitives ---------------------------------------------------------

    @abc.abstractmethod
    def _append(
        self,
        stream: str,
        batch: list[PreparedEvent],
        expected_seq: int,
        fence: Fence | None,
        genesis_hash: str,
    ) -> list[StoredRow]: ...

    @abc.abstractmethod
    def _append_after(self, stream: str, expected_seq: int, fence: Fence | None,
                      build: Callable[[list[StoredRow], int], list[PreparedEvent]]
                      ) -> tuple[list[StoredRow], list[StoredRow]]:
        """In one write transaction with the head locked: the rows after ``expected_seq``, then the append of
        ``build(rows, head_seq)`` (nothing if empty) at the head. Raises :class:`NotFound` for a stream with no
        events."""

    @abc.abstractmethod
    def _append_and_enqueue(self, stream: str, batch: list[PreparedEvent], expected_seq: int, fence: Fence | None,
                            change: Callable[[WorkRow | None, float], WorkRow], key: str,
                            genesis_hash: str = GENESIS_HASH) -> list[StoredRow]:
        """In one transaction: :meth:`_append` (from ``genesis_hash``) and :meth:`_change_work` of ``key``."""

    @abc.abstractmethod
    def _read_rows(self, stream: str, from_seq: int, to_seq: int | None) -> Iterator[StoredRow]: ...

    @abc.abstractmethod
    def _get_row(self, event_id: str) -> StoredRow | None: ...

    @abc.abstractmethod
    def _stream_info(self, stream: str) -> StreamInfo | None: ...

    @abc.abstractmethod
    def _list_streams(self, prefix: str, after: str, limit: int) -> list[StreamInfo]: ...

    @abc.abstractmethod
    def _list_group_streams(self, prefix: str, after: str, limit: int, groups: list[str]) -> list[StreamInfo]:
        """:meth:`_list_streams` of the streams indexed under ``groups`` (sorted, distinct, not empty)."""

    @abc.abstractmethod
    def _create_session(self, key: str, subject: str, ttl: float) -> Session: ...

    @abc.abstractmethod
    def _get_session(self, key: str) -> Session | None: ...

    @abc.abstractmethod
    def _revoke_sessions(self, key: str | None, subject: str | None) -> int:
        """End the active session ``key``, or every active one of ``subject``; how many were ended."""

    @abc.abstractmethod
    def _record_use(self, key: str) -> None: ...

    @abc.abstractmethod
    def _last_used(self, keys: list[str]) -> dict[str, float]: ...

    @abc.abstractmethod
    def _change_lease(self, key: str, change: Callable[[Lease | None, float], Lease]) -> Lease:
        """In one transaction: lock the lease row, call ``change(current, store_now)``, store its result."""

    def _change_leases(self, changes: list[tuple[str, LeaseChange]], *, durable: bool,
                       refusals: tuple[type[JixuError], ...]) -> list[Lease | JixuError]:
        """Changes of several leases (every renewal and every take-over comes here); in the list, for each
        change refused with one of ``refusals``, its error.

        ``durable=False`` (renewals) lets a backend commit without waiting for the disk: lost in a power
        failure, a lease expires as if its holder had died in it (decision 0042); a take-over is durable, since
        it is acted on at once. This default changes them one transaction each; SQLite and PostgreSQL override
        it with one."""
        return each_change(changes, self._change_lease, refusals)

    def _renew_works(self, changes: list[tuple[str, WorkChange]]) -> list[WorkRow | FencingError]:
        """Renewals of several work claims (as :meth:`_change_leases`; every renewal comes here): the renewed
        rows."""
        return renewal_answers(each_change(changes, lambda key, change: self._change_work(key, change)[1]))

    @abc.abstractmethod
    def _release_lease(self, fence: Fence) -> None: ...

    @abc.abstractmethod
    def _get_lease(self, key: str) -> Lease | None: ...

    @abc.abstractmethod
    def _write_checkpoints(self, checkpoints: list[Checkpoint]) -> None:
        """Store ``checkpoints`` (at least one; distinct streams and names) in one transaction."""

    @abc.abstractmethod
    def _read_checkpoints(self, stream: str, names: list[str]) -> dict[str, Checkpoint]:
        """The checkpoints of ``names`` (distinct, at least one) for ``stream`` that exist, by name."""

    @abc.abstractmethod
    def _checkpoints_named(self, name: str, streams: list[str]) -> dict[str, Checkpoint]:
        """The checkpoints of ``name`` of ``streams`` (distinct, at least one) that exist, by stream."""

    @abc.abstractmethod
    def _change_work(self, key: str, change: Callable[[WorkRow | None, float], WorkRow]) -> tuple[WorkItem, WorkRow]:
        """In one transaction: lock the item's row, call ``change(current, store_now)``, store its result
        (unless it returned ``current`` itself); return it as an item and as a row. (Claim renewals go through
        :meth:`_renew_works`, which must not overlap a claimer's count of live claims.)"""

    @abc.abstractmethod
    def _claim_works(self, owner: str, ttl: float, order: ClaimOrder, count: int) -> list[WorkClaim]:
        """In one transaction serialised with every other claim, up to ``count`` times: take the
        :class:`QueueCensus`, ask :func:`groups_to_try`, claim the oldest claimable item of the first group
        that has one (stop when none has)."""

    @abc.abstractmethod
    def _list_work(self, group: str | None, status: str | None) -> tuple[list[WorkRow], float]:
        """Rows (filtered by stored status) in (ready_at, position) order, and the store's now."""

    @abc.abstractmethod
    def _get_work(self, key: str) -> tuple[WorkRow | None, float]: ...


def _check_seq_range(from_seq: object, to_seq: object) -> None:
    if isinstance(from_seq, bool) or not isinstance(from_seq, int) or from_seq < 1:
        raise InvalidInput(f"from_seq {from_seq!r} must be an integer >= 1", field="from_seq")
    if to_seq is not None and (isinstance(to_seq, bool) or not isinstance(to_seq, int) or to_seq < 0):
        raise InvalidInput(f"to_seq {to_seq!r} must be an integer >= 0 or None", field="to_seq")


__all__ = [
    "CHECKPOINTS_AT_ONCE",
    "AppendRequest",
    "AlreadyStored",
    "WORK_STATES",
    "Checkpoint",
    "ClaimOrder",
    "Fence",
    "Lease",
    "LeaseTake",
    "QueueCensus",
    "SESSION_RETENTION",
    "Session",
    "Store",
    "StreamInfo",
    "WorkClaim",
    "WorkItem",
    "WorkRow",
    "check_fence",
    "check_group",
    "check_work_claim",
    "claimed_row",
    "enqueued_row",
    "finished_row",
    "groups_to_try",
    "renewed_row",
    "next_claim_number",
    "work_claim_of",
    "work_fence_problem",
    "check_lease_key",
    "check_owner",
    "check_text",
    "check_ttl",
    "decide_append",
    "existing_batch",
    "fence_problem",
    "head_moved",
    "judge_append",
    "next_lease",
    "group_of_meta",
    "taken_over_lease",
    "check_take",
    "each_change",
    "renewal_answers",
    "RENEWAL_REFUSALS",
    "TAKE_REFUSALS",
]
