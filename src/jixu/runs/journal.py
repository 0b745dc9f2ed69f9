"""A run's journal in a store: loading, syncing, appending, and the resolver's analysis. No decisions."""

from __future__ import annotations

from jixu.errors import InvalidInput, RunNotFound
from jixu.kernel import StreamWriter
from jixu.ledger import Event, Fence, NewEvent, Store, project
from jixu.ledger.encoding import JSONObject
from jixu.ledger.ids import is_valid_id
from jixu.ledger.projection import make_checkpoint
from jixu.recovery import Analysis, RecoveryResolver
from jixu.runs.model import run_stream
from jixu.runs.projection import RunProjection, RunRecord

CHECKPOINT_EVERY = 100
"""Events between two checkpoints of a run's record (one is also written when the run finishes)."""


class RunLog:
    """One run's journal and projected record in a store: loading, syncing, appending. No decisions.

    Loading starts from the run's latest valid checkpoint (a disposable cache,
    used only when its reducer version and head hash match) and applies the
    events after it, so listing many finished runs does not replay each one.
    The whole chain is still verified (hashing only): a history changed before
    the checkpoint is replayed, and the record stops at the first bad event.
    """

    def __init__(self, store: Store, run_id: str) -> None:
        if not isinstance(run_id, str) or not is_valid_id(run_id):
            raise InvalidInput(f"run id {run_id!r} is not a valid id", field="run_id")
        self.store = store
        self.run_id = run_id
        self.stream = run_stream(run_id)
        if store.stream_info(self.stream) is None:
            raise RunNotFound(f"no run {run_id} in {store.url}", run_id=run_id)
        projected = project(store, self.stream, RunProjection())
        if projected.checkpoint == "used" and not store.verify(self.stream).valid:
            # The checkpoint predates a change to the history: replay, so the record stops at the first bad event.
            projected = project(store, self.stream, RunProjection(), use_checkpoint=False)
        self._projection = RunProjection()
        self.writer: StreamWriter[RunRecord] = StreamWriter(
            store, self.stream, self._projection, projected.state,
            chain_break=None if projected.chain.valid else projected.chain.first_bad_seq)
        """The kernel's writer of the run's journal: the record and every append go through it."""
        self._checkpoint_seq = projected.checkpoint_seq or 0

    @property
    def record(self) -> RunRecord:
        """The projected record (durable events only)."""
        return self.writer.state

    @property
    def chain_break(self) -> int | None:
        """The first seq whose hash link is broken, once one was seen."""
        return self.writer.chain_break

    def sync(self) -> None:
        """Apply events other writers appended since this record's head."""
        self.writer.sync()

    def append(self, events: list[NewEvent], fence: Fence | None = None) -> list[Event]:
        """Append after this record's head and project (see :class:`~jixu.kernel.StreamWriter`: receipts are
        kept across another writer's events; anything else meets :class:`~jixu.errors.ConcurrencyError`)."""
        stored = self.writer.append(events, fence)
        if any(e.type == "run.finished" for e in stored) or self.record.seq - self._checkpoint_seq >= CHECKPOINT_EVERY:
            self.checkpoint()
        return stored

    def checkpoint(self) -> bool:
        """Write a checkpoint of the record if it moved since the last one and the journal is sound."""
        record = self.record
        if record.seq <= self._checkpoint_seq or record.problems or self.chain_break is not None:
            return False
        self.store.write_checkpoint(make_checkpoint(self.stream, self._projection, record, record.seq,
                                                    record.head_hash))
        self._checkpoint_seq = record.seq
        return True

    def analysis(self) -> Analysis:
        """The RecoveryResolver's answer for every task effect of the run."""
        return RecoveryResolver.analyze(self.record.lifecycle, check_links=False, chain_break_seq=self.chain_break)

    def meta(self, actor: str) -> JSONObject:
        return {"actor": actor, "run_id": self.run_id}


__all__ = ["CHECKPOINT_EVERY", "RunLog"]
