"""One stream's writer in this process: its projected record, and the only way the process appends to it.

Threads, runs and execution requests keep their record through a
:class:`StreamWriter`. It holds three rules of the effect kernel:

* **One writer per stream at a time inside a process.** Appends to the
  stream are serialised and chained: an append made while another is queued
  or committing waits for it, and appends queued together go into one
  commit, each after the one before. Two appends are never submitted at one
  ``expected_seq``, so parallel calls of one model response cannot overtake
  each other.
* **The record moves only with durable events.** Events are applied to the
  state once their commit is durable. The one exception is :meth:`stage`:
  a call's receipt projected now and committed with the loop's next events
  (decision 0011), which is allowed only where no other task can run before
  that commit (the caller is the loop's only running user and the commit is
  made at once, without yielding), so no other task ever sees it before it
  is durable.
* **A receipt is never dropped.** When another writer moved the head (an
  operator's approval, a denial, a resolution, an input, an interruption
  from another connection or process), the writer reads the new events,
  folds them, and appends the receipts of the refused append again after
  them; whatever else the append carried was decided on an old head, so the
  caller gets the :class:`~jixu.errors.ConcurrencyError` and decides again.
  When the fence was lost (:class:`~jixu.errors.FencingError`) or the store
  failed, the receipts that could not be recorded travel in the error
  (:func:`unrecorded_receipts`) and the effect stays what the resolver says.
  A receipt is not appended after another writer's event of its own effect
  (an operator resolved it meanwhile): that would contradict the record, so
  :class:`~jixu.errors.ReceiptConflict` carries it instead.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from jixu.errors import (
    ConcurrencyError,
    FencingError,
    InvalidInput,
    JixuError,
    OutcomeUnknown,
    ReceiptConflict,
    StoreError,
    StreamBusy,
    StreamCorrupt,
)
from jixu.kernel.commits import Commitment, Commits, settle
from jixu.kernel.shutdown import ServingTask
from jixu.ledger.chain import VerifyReport, row_hash
from jixu.ledger.event import Event, NewEvent, PreparedEvent, StoredRow, parse_json, prepare
from jixu.ledger.projection import Followed, Projection
from jixu.ledger.store import Fence, Store
from jixu.ledger.trust import recorded_break, recorded_breaks

F = TypeVar("F", bound=Followed)

RECEIPT_SUFFIXES = (".completed", ".failed")
"""Event types that are receipts: what a call was observed to do (a fact, kept across conflicts)."""


FENCED_OUT_KEPT = 1000
"""The most receipts refused for a lost fence one writer keeps (:attr:`StreamWriter.fenced_out`): the oldest go."""


def is_receipt(event_type: str) -> bool:
    """Whether events of this type are receipts (``<kind>.completed`` / ``<kind>.failed``)."""
    return event_type.endswith(RECEIPT_SUFFIXES)


def unrecorded_receipts(error: BaseException) -> tuple[PreparedEvent, ...]:
    """The receipts an append that failed with ``error`` could not record (empty if none)."""
    return tuple(getattr(error, "unrecorded_receipts", ()))


def _keep_receipts(error: BaseException, events: Sequence[PreparedEvent]) -> None:
    """Attach the receipts among ``events`` to ``error`` (see :func:`unrecorded_receipts`)."""
    receipts = [event for event in events if is_receipt(event.type)]
    if receipts and isinstance(error, JixuError):
        kept = [*unrecorded_receipts(error), *receipts]
        error.unrecorded_receipts = tuple(kept)  # type: ignore[attr-defined]
        error.details.setdefault("unrecorded_receipts", [event.id for event in kept])


def _effect_of(event: PreparedEvent | Event) -> str | None:
    return effect_and_attempt(event)[0]


def effect_and_attempt(event: PreparedEvent | Event) -> tuple[str | None, object]:
    """The event's effect id (None when it names none) and its ``attempt`` as recorded, from one parse."""
    data = parse_json(event.data_json) if isinstance(event, PreparedEvent) else event.data
    if not isinstance(data, dict):
        return None, None
    effect_id = data.get("effect_id")
    return (effect_id if isinstance(effect_id, str) else None), data.get("attempt")


def _links(row: StoredRow, prev_hash: str) -> bool:
    """Whether a stored row links to ``prev_hash`` and hashes to what it says (the hash column alone can be
    edited): what every event read after the record must hold."""
    return row.prev_hash == prev_hash and row_hash(row) == row.hash


def _answered_by(event: PreparedEvent | Event) -> tuple[str | None, object]:
    """What a lifecycle event that is not a receipt stands for: ``(effect, "intent")`` for an intent,
    ``(effect, attempt)`` for a dispatch marker (other events: their effect and their type)."""
    effect, attempt = effect_and_attempt(event)
    if event.type.endswith(".requested"):
        return effect, "intent"
    if event.type.endswith(".dispatched"):
        return effect, attempt
    return effect, event.type


def _needs(receipt: PreparedEvent | Event) -> set[tuple[str | None, object]]:
    """What a receipt answers: its effect's intent and its attempt's dispatch marker."""
    effect, attempt = effect_and_attempt(receipt)
    return {(effect, "intent"), (effect, attempt)}


def record(store: Store, stream: str, events: Sequence[NewEvent], expected_seq: int, *,
           genesis_hash: str | None = None, enqueue: tuple[str, str] | None = None,
           fence: Fence | None = None) -> list[Event]:
    """Append events that belong to no effect (a new stream's first events, a project's policy) at
    ``expected_seq``; ``enqueue`` = ``(key, group)``: that work item too, in the same transaction; ``fence``: only
    while that lease holds. Receipts are refused (:class:`~jixu.errors.InvalidInput`): they go through the
    stream's :class:`StreamWriter`, which keeps them across other writers' events."""
    receipts = [event.type for event in events if is_receipt(event.type)]
    if receipts:
        raise InvalidInput(f"{stream}: {receipts[0]} is a receipt; record it through the stream's writer",
                           field="events")
    if enqueue is not None:
        if fence is not None:
            raise InvalidInput("an append that enqueues work is not fenced", field="fence")
        key, group = enqueue
        return store.append_and_enqueue(stream, events, expected_seq, key=key, group=group, genesis_hash=genesis_hash)
    return store.append(stream, events, expected_seq, fence, genesis_hash=genesis_hash)


@dataclass(slots=True)
class _Queued:
    events: list[PreparedEvent]
    fence: Fence | None
    user: bool
    future: Commitment = field(repr=False)
    in_doubt: bool = False
    """Committed before with an unknown outcome (see :data:`~jixu.kernel.commits.IN_DOUBT_SECONDS`)."""


class StreamWriter(Generic[F]):
    """The record of ``stream`` in this process and the one way it appends (see the module docstring).

    ``reload`` rebuilds the record from what the store holds (after a commit
    with staged events failed: the state must not keep them); ``seal`` puts
    the stored copies of staged events in place of their provisional ones.
    """

    def __init__(self, store: Store, stream: str, projection: Projection[F], state: F, *,
                 chain_break: int | None = None, reload: Callable[[], tuple[F, int | None]] | None = None,
                 seal: Callable[[F, list[Event]], F] | None = None,
                 on_applied: Callable[[list[Event]], None] | None = None) -> None:
        self.store = store
        self.stream = stream
        self.projection = projection
        self.state = state
        """The projected record: durable events only (plus staged ones, never visible across a yield)."""
        self.chain_break = chain_break
        """The first seq whose link is broken (``None`` while the chain holds)."""
        self._reload = reload
        self._seal = seal
        self._on_applied = on_applied
        self._watch: _BreakWatch | None = None
        """This process's watch of recorded breaks for ``store``, once a step asked it."""
        self._staged: list[PreparedEvent] = []
        self._staged_fence: Fence | None = None
        self._queue: list[_Queued] = []
        self._busy = False
        """An asynchronous append is queued or committing (see :meth:`idle`)."""
        self._pump: asyncio.Task[None] | None = None
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._commits: tuple[asyncio.AbstractEventLoop, Commits] | None = None
        """The loop's commit path, looked up once per event loop."""
        self.fenced_out: list[tuple[Fence | None, PreparedEvent]] = []
        """Receipts of queued appends the store refused because their fence was lost, with that fence: facts this
        process observed, kept for whoever may record them under a new claim (their callers may have been
        cancelled meanwhile)."""

    def _commits_here(self) -> Commits:
        loop = asyncio.get_running_loop()
        found = self._commits
        if found is None or found[0] is not loop:
            found = self._commits = (loop, Commits.of(self.store))
        return found[1]

    # --- reading --------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """True while an asynchronous append of this writer is queued or waits for its commit."""
        return self._busy

    async def idle(self) -> None:
        """Wait until no asynchronous append of this writer is queued or committing."""
        while self._busy:
            waiter = asyncio.get_running_loop().create_future()
            self._idle_waiters.append(waiter)
            await waiter

    def sync(self) -> list[Event]:
        """Apply the events other writers appended since this record's head; returns them.

        Staged events are committed first (they come before anything read now).
        """
        if self._busy:
            raise StreamBusy(f"{self.stream}: an append is waiting for its commit; wait for it first",
                             stream=self.stream)
        self.flush()
        return self._follow()

    def heed_recorded_break(self, *, fresh: bool = True) -> VerifyReport | None:
        """Take in a break of this stream that a process holding the key found and recorded since this record
        was read (:func:`~jixu.ledger.trust.recorded_break`: one row read, its seal checked only when there
        is one): once a stream is known to be broken, it is broken for every record of it, however long held.
        Returns the recorded report when it moved :attr:`chain_break` (to an earlier seq), else None.

        ``fresh=False`` (every step of a loop) asks this process's watch instead, which reads the breaks of
        every stream it is asked about at once, at most every :data:`BREAK_WATCH_INTERVAL_S` (decision 0066).
        """
        if fresh:
            found = recorded_break(self.store, self.stream)
        else:
            if self._watch is None:  # looked up once per record, not at every step
                self._watch = _watch_of(self.store)
            found = self._watch.recorded(self.store, self.stream)
        if found is None or found.first_bad_seq is None or (
                self.chain_break is not None and self.chain_break <= found.first_bad_seq):
            return None
        self.chain_break = found.first_bad_seq
        return found

    def _follow(self) -> list[Event]:
        state, chain_break = self.state, self.chain_break
        read: list[Event] = []
        for row in self.store.read_rows(self.stream, state.seq + 1, None):
            if not _links(row, state.head_hash):
                chain_break = chain_break or row.seq
                break
            event = row.to_event()
            state = self.projection.apply(state, event)
            read.append(event)
        self.state, self.chain_break = state, chain_break
        if read and self._on_applied is not None:
            self._on_applied(read)
        return read

    # --- staging (decision 0011) ----------------------------------------------------------------

    @property
    def has_staged(self) -> bool:
        """True while events are staged (projected, not yet committed)."""
        return bool(self._staged)

    def can_stage(self) -> bool:
        """Whether a receipt may be staged now: nothing of this writer is in flight, and the loop's next commit
        would be made at once by its only running user (so no other task runs before it is durable)."""
        return not self._busy and self._commits_here().alone()

    def stage(self, events: Sequence[NewEvent], fence: Fence | None, *,
              provisional: Callable[[PreparedEvent, int], Event]) -> None:
        """Project ``events`` now and commit them first in this writer's next append (decision 0011).

        Only when :meth:`can_stage` holds, and the caller appends (or
        :meth:`flush`\\ es) before it yields to anything else. ``provisional``
        makes the event the projection sees before the store has sealed it.
        """
        if self._busy:
            raise StreamBusy(f"{self.stream}: cannot stage while an append waits for its commit", stream=self.stream)
        prepared = [prepare(new, self.store.max_payload_bytes) for new in events]  # all valid, or nothing staged
        if self._staged and fence != self._staged_fence:
            self.flush()
        for encoded in prepared:
            event = provisional(encoded, self.state.seq + 1)
            self._staged.append(encoded)
            self.state = self.projection.apply(self.state, event)
        self._staged_fence = fence

    def flush(self) -> None:
        """Commit the staged events on their own (nothing if none are staged)."""
        if self._staged:
            self.append([], self._staged_fence)

    # --- appending ------------------------------------------------------------------------------

    def append(self, events: Sequence[NewEvent | PreparedEvent], fence: Fence | None = None, *,
               enqueue: tuple[str, str] | None = None, delay: float = 0.0) -> list[Event]:
        """Append after this record's head, now, in the caller (holding its event loop if it has one).

        Staged events go first in the same atomic append. Receipts are kept
        across another writer's events (see the module docstring); anything
        else meets :class:`~jixu.errors.ConcurrencyError`. ``enqueue`` =
        ``(key, group)``: the work item is enqueued in the same transaction, ready in ``delay`` seconds.
        """
        if self._busy:
            raise StreamBusy(f"{self.stream}: an append is waiting for its commit; wait for it first",
                             stream=self.stream)
        if enqueue is None:
            return self._commit_now(events, fence, self.store.append)
        key, group = enqueue

        def both(stream: str, batch: Sequence[NewEvent | PreparedEvent], expected: int,
                 held: Fence | None) -> list[Event]:
            return self.store.append_and_enqueue(stream, batch, expected, key=key, group=group, fence=held,
                                                 delay=delay)

        return self._commit_now(events, fence, both)

    async def append_async(self, events: Sequence[NewEvent | PreparedEvent], fence: Fence | None = None, *,
                           user: bool = False) -> list[Event]:
        """Append through the loop's shared commits (:class:`~jixu.kernel.commits.Commits`), serialised
        behind this writer's appends in flight; the state moves when the events are durable.

        ``user``: the caller is a running user of the loop's commits (an agent loop, a run session).
        """
        commits = self._commits_here()
        if self._staged:
            # Staged events may not be seen across a yield: commit at once (can_stage made sure it would be).
            held = self._fence_for(fence)
            staged = list(self._staged)
            try:
                return self._commit_now(events, held, commits.append_now)
            except OutcomeUnknown:
                # Unstaged (the record is what the store holds): the same events again, on the shared path, which
                # commits an append in doubt again without holding the loop (see Commits).
                return (await self._queued([*staged, *self._prepared(events)], held, user, commits,
                                           in_doubt=True))[len(staged):]
        if not self._busy and user and commits.alone():
            try:
                return self._commit_now(events, fence, commits.append_now)  # the store checks them, as alone
            except OutcomeUnknown:
                # In doubt (nothing was applied): the same events again, on the shared path.
                return await self._queued(self._prepared(events), fence, user, commits, in_doubt=True)
        prepared = self._prepared(events)  # a bad event joins nothing shared
        return await self._queued(prepared, fence, user, commits)

    async def _queued(self, prepared: list[PreparedEvent], fence: Fence | None, user: bool, commits: Commits, *,
                      in_doubt: bool = False) -> list[Event]:
        """Queue ``prepared`` behind this writer's appends in flight; its stored events once durable."""
        future = Commitment(loop=asyncio.get_running_loop())
        self._queue.append(_Queued(prepared, fence, user, future, in_doubt))
        if not self._busy:
            self._busy = True
            # A ServingTask: a loop's shutdown leaves it committing while a call is in flight (decision 0036).
            self._pump = ServingTask(self._drain(commits), name=f"jixu-writer {self.stream}")
            self._pump.add_done_callback(self._abandon_if_never_run)
        return await future

    def _abandon_if_never_run(self, task: asyncio.Task[None]) -> None:
        """A pump cancelled before its first step (``asyncio.run`` cancels every task on its way out) never ran,
        not even its ``finally``: nothing queued was started, so abandon it all and let later appends start anew."""
        if task is self._pump and self._busy and task.cancelled():
            self._settle_ended()

    def _settle_ended(self) -> None:
        """The pump ended: appends still queued were never started (nothing of them was written)."""
        for item in self._queue:
            item.future.abandon()
        self._queue = []
        self._busy = False
        waiters, self._idle_waiters = self._idle_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _prepared(self, events: Sequence[NewEvent | PreparedEvent]) -> list[PreparedEvent]:
        """``events`` encoded (for the rare paths that keep or re-append them)."""
        return [e if isinstance(e, PreparedEvent) else prepare(e, self.store.max_payload_bytes) for e in events]

    def _fence_for(self, fence: Fence | None) -> Fence | None:
        if self._staged and fence != self._staged_fence:
            self.flush()
        return fence

    def _commit_now(self, events: Sequence[NewEvent | PreparedEvent], fence: Fence | None,
                    commit: Callable[[str, Sequence[NewEvent | PreparedEvent], int, Fence | None], list[Event]],
                    ) -> list[Event]:
        """Commit ``events`` (after the staged events) in the caller; receipts kept across conflicts."""
        staged = self._staged
        batch: Sequence[NewEvent | PreparedEvent] = [*staged, *events] if staged else events
        expected = self.state.seq - len(staged)
        try:
            stored = commit(self.stream, batch, expected, fence)
        except BaseException as error:
            if staged:
                self._unstage()
            if isinstance(error, ConcurrencyError):
                return self._after_conflict(self._prepared(batch), fence, error, offset=len(staged),
                                            expected=expected)
            if isinstance(error, JixuError) and not isinstance(error, InvalidInput):  # bad input: nothing to keep
                _keep_receipts(error, self._prepared(batch))
            raise
        if staged:
            self._staged, self._staged_fence = [], None
            if self._seal is not None:
                self.state = self._seal(self.state, stored[:len(staged)])
            self._applied(stored[:len(staged)])
            self._apply(stored[len(staged):])
            return stored[len(staged):]
        self._apply(stored)
        return stored

    async def _drain(self, commits: Commits) -> None:
        """Commit what is queued, in order: the leading appends under one fence together, then the next."""
        try:
            while self._queue:
                fence = self._queue[0].fence
                count = 1
                while count < len(self._queue) and self._queue[count].fence == fence:
                    count += 1
                items, self._queue = self._queue[:count], self._queue[count:]
                await self._commit_queued(commits, items, fence)
        finally:
            self._settle_ended()

    async def _commit_queued(self, commits: Commits, items: list[_Queued], fence: Fence | None) -> None:
        """One shared commit of ``items`` (appends after one another); each gets its stored events or its error.

        Cancelled (the loop shutting down), it still settles every item before the cancellation goes on: the
        commit's verdict when it was made (the state takes in what it stored), an abandonment when it never
        started (nothing of it was written).
        """
        batch = [event for item in items for event in item.events]
        expected = self.state.seq
        pending = commits.submit(self.stream, batch, expected, fence, user=all(item.user for item in items),
                                 in_doubt=any(item.in_doubt for item in items))
        try:
            stored = await pending
        except asyncio.CancelledError:
            if pending.cancelled():  # abandoned: never started
                for item in items:
                    item.future.abandon()
            else:
                self._settle(items, batch, fence, expected, pending)
            raise
        except BaseException:
            self._settle(items, batch, fence, expected, pending)
            if pending.done():
                return
            raise
        self._deliver(items, stored)

    def _settle(self, items: list[_Queued], batch: list[PreparedEvent], fence: Fence | None, expected: int,
                pending: Commitment) -> None:
        """Hand every item what its commit came to (``pending`` done): its events, or the error."""
        error = pending.exception() if pending.done() and not pending.cancelled() else None
        if pending.done() and error is None:
            self._deliver(items, pending.result())
            return
        if isinstance(error, ConcurrencyError):
            try:
                kept = self._after_conflict(batch, fence, error, offset=0, expected=expected)
            except BaseException as refused:
                self._fail(items, refused)
                return
            by_id = {event.id: event for event in kept}
            for item in items:
                if all(event.id in by_id for event in item.events):
                    item.future.set_result([by_id[event.id] for event in item.events])
                else:
                    item.future.set_exception(error)
            return
        failure = error if error is not None else StoreError(
            f"{self.stream}: the commit of this append was interrupted; whether it is durable is not known",
            stream=self.stream)
        _keep_receipts(failure, batch)
        if isinstance(failure, FencingError):
            self.fenced_out.extend((fence, event) for event in batch if is_receipt(event.type))
            del self.fenced_out[:-FENCED_OUT_KEPT]
        self._fail(items, failure)

    def _deliver(self, items: list[_Queued], stored: list[Event]) -> None:
        # Only what the state does not hold yet: an append in doubt committed again finds its events stored, and a
        # record reloaded meanwhile (an unstaging) holds them already.
        self._apply([event for event in stored if event.seq > self.state.seq])
        start = 0
        for item in items:
            item.future.set_result(stored[start:start + len(item.events)])
            start += len(item.events)

    @staticmethod
    def _fail(items: list[_Queued], error: BaseException) -> None:
        for item in items:
            settle(item.future, error)

    def _after_conflict(self, batch: list[PreparedEvent], fence: Fence | None, conflict: ConcurrencyError, *,
                        offset: int, expected: int) -> list[Event]:
        """Another writer moved the head past ``expected``: fold its events and record the receipts of ``batch``
        after them.

        Returns the stored receipts when ``batch[offset:]`` held receipts only
        (the caller's append is then done); otherwise raises ``conflict``
        once the receipts are recorded, so the caller decides again.
        """
        self._follow()
        # A receipt whose own intent or own attempt's dispatch marker is in this batch answers what was not
        # recorded: alone it would be a receipt without an intent or a dispatch (corrupt for good). It goes with
        # them when the caller decides again; the other receipts (a staged one, an earlier attempt's before the
        # next attempt's marker) are facts of recorded calls, kept.
        unrecorded = {_answered_by(event) for event in batch if not is_receipt(event.type)}
        receipts = [event for event in batch if is_receipt(event.type) and not unrecorded & _needs(event)]
        if not receipts or any(event.type.endswith(".claimed") for event in batch):
            # Receipts appended with a claim (a lost claim's, decision 0070) stand on it: they go with it, or not.
            raise conflict
        self._refuse_if_broken(receipts)
        # Everything other writers appended since the refused append's head (a reload may have folded it).
        foreign = self.store.read(self.stream, expected + 1, self.state.seq) if self.state.seq > expected else []
        ids = {receipt.id for receipt in receipts}
        stored = {event.id: event for event in foreign if event.id in ids}
        touched = {_effect_of(event) for event in foreign} - {None}
        pending = [receipt for receipt in receipts if receipt.id not in stored]
        refused = [receipt for receipt in pending if _effect_of(receipt) in touched]
        recorded = self._record_all([receipt for receipt in pending if receipt not in refused], fence)
        stored.update(recorded)
        refused.extend(receipt for receipt in pending if receipt.id not in stored and receipt not in refused)
        if refused:
            # The others are recorded all the same; these are kept in the error.
            error = ReceiptConflict(
                f"{self.stream}: another writer recorded an event of effect {_effect_of(refused[0])} while its "
                "call ran; its receipt is not appended after it (it would contradict the record) and is "
                "kept in this error", stream=self.stream, effect_id=_effect_of(refused[0]))
            _keep_receipts(error, refused)
            raise error
        if all(is_receipt(event.type) for event in batch[offset:]):
            return [stored[event.id] for event in batch[offset:]]
        raise conflict

    def _record_all(self, receipts: list[PreparedEvent], fence: Fence | None) -> dict[str, Event]:
        """Append ``receipts`` after whatever other writers appended, in one transaction that holds the stream's
        head (:meth:`~jixu.ledger.Store.append_after`), so a busy stream never starves them. Returns the
        receipts now stored, by id: the appended ones and any another writer had already stored. One whose
        effect another writer's new event touched is not appended (absent from the answer: the caller's
        conflict); a link that does not hold appends nothing (:class:`~jixu.errors.StreamCorrupt`)."""
        if not receipts:
            return {}
        start_seq, start_hash = self.state.seq, self.state.head_hash
        ids = {receipt.id for receipt in receipts}
        broken: list[int] = []
        later: list[Event] = []

        def build(rows: list[StoredRow]) -> list[PreparedEvent]:
            # Under the store's lock: the new events must link to the record, as those sync() reads.
            prev = start_hash
            for row in rows:
                if not _links(row, prev):
                    broken.append(row.seq)
                    return []
                prev = row.hash
            later[:] = [row.to_event() for row in rows]  # the last build's (a store may run its transaction again)
            touched = {_effect_of(event) for event in later} - {None}
            present = {event.id for event in later}
            return [r for r in receipts if r.id not in present and _effect_of(r) not in touched]

        try:
            _rows, appended = self.store.append_after(self.stream, start_seq, fence, build)
        except BaseException as error:
            _keep_receipts(error, receipts)
            raise
        if broken:
            self.chain_break = self.chain_break or broken[0]
            self._follow()  # what links is applied, as sync() would
            self._refuse_if_broken(receipts)
        self._apply(later)
        self._apply(appended)
        stored = {event.id: event for event in later if event.id in ids}
        stored.update((event.id, event) for event in appended)
        return stored

    def _refuse_if_broken(self, receipts: list[PreparedEvent]) -> None:
        """Raise :class:`~jixu.errors.StreamCorrupt` (the receipts kept in it) when another writer's event does
        not link to the record: nothing is appended onto a chain that does not verify."""
        if self.chain_break is not None:
            error = StreamCorrupt(f"{self.stream}: the event at seq {self.chain_break} does not link to the one "
                                  "before it; nothing more is appended", stream=self.stream,
                                  first_bad_seq=self.chain_break)
            _keep_receipts(error, receipts)
            raise error

    def _unstage(self) -> None:
        """Forget staged events that were not committed: the record becomes what the store holds."""
        self._staged, self._staged_fence = [], None
        if self._reload is None:
            raise JixuError(f"{self.stream}: staged events failed to commit and this record cannot be reloaded")
        self.state, self.chain_break = self._reload()

    def _apply(self, stored: list[Event]) -> None:
        state, apply = self.state, self.projection.apply
        for event in stored:
            state = apply(state, event)
        self.state = state
        if self._on_applied is not None and stored:
            self._on_applied(stored)

    def _applied(self, stored: list[Event]) -> None:
        if stored and self._on_applied is not None:
            self._on_applied(stored)


BREAK_WATCH_INTERVAL_S = 0.5
"""At most this old is what a loop's step knows of breaks recorded elsewhere (see :class:`_BreakWatch`)."""
_FORGET_AFTER_S = 30.0
"""A stream no step asked about for this long is no longer read by the watch."""


class _BreakWatch:
    """The breaks recorded for the streams this process's loops act on, read for all of them in one read at
    most every :data:`BREAK_WATCH_INTERVAL_S`: a read per step cost a running loop ~10 % of its CPU per step
    (measured with 500 turns at once; more on PostgreSQL, a round trip on the event loop each)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asked: dict[str, float] = {}
        """Stream -> when a step last asked about it (monotonic)."""
        self._found: dict[str, VerifyReport] = {}
        self._read_at = -math.inf
        self._reads = 0
        """Reads started: a read's answer for a stream is kept unless a later read's was kept already."""
        self._answered: dict[str, int] = {}
        """Stream -> the number of the read whose answer is kept."""

    def recorded(self, store: Store, stream: str) -> VerifyReport | None:
        """The break recorded for ``stream`` as of at most :data:`BREAK_WATCH_INTERVAL_S` ago (a stream asked
        about for the first time is read at once)."""
        now = time.monotonic()
        with self._lock:
            first = stream not in self._asked
            self._asked[stream] = now
            if now - self._read_at >= BREAK_WATCH_INTERVAL_S:
                self._read_at = now
                for known, asked_at in list(self._asked.items()):
                    if now - asked_at > _FORGET_AFTER_S:
                        del self._asked[known]
                        self._found.pop(known, None)
                        self._answered.pop(known, None)
                streams = list(self._asked)
            elif first:
                streams = [stream]
            else:
                return self._found.get(stream)
            self._reads += 1
            number = self._reads
        found = recorded_breaks(store, streams)
        with self._lock:
            for read in streams:
                if self._answered.get(read, 0) < number:  # a slower, older read does not undo a newer one
                    self._answered[read] = number
                    if read in found:
                        self._found[read] = found[read]
                    else:
                        self._found.pop(read, None)
            return self._found.get(stream)


_WATCHES: weakref.WeakKeyDictionary[Store, _BreakWatch] = weakref.WeakKeyDictionary()
_WATCHES_LOCK = threading.Lock()


def _watch_of(store: Store) -> _BreakWatch:
    with _WATCHES_LOCK:
        watch = _WATCHES.get(store)
        if watch is None:
            watch = _WATCHES[store] = _BreakWatch()
        return watch


def chain_with_recorded_break(writer: StreamWriter[Any], chain: VerifyReport, *,
                              fresh: bool = True) -> VerifyReport:
    """``chain`` (a record's verdict as it was read), or the break another process recorded since when that one
    lies earlier (:meth:`StreamWriter.heed_recorded_break`, which moves the writer's ``chain_break`` too)."""
    recorded = writer.heed_recorded_break(fresh=fresh)
    if recorded is not None and (chain.valid or (chain.first_bad_seq or 0) > (recorded.first_bad_seq or 0)):
        return recorded
    return chain


__all__ = ["FENCED_OUT_KEPT", "RECEIPT_SUFFIXES", "StreamWriter", "chain_with_recorded_break", "effect_and_attempt", "is_receipt",
           "record", "unrecorded_receipts"]
