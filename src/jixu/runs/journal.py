"""A run's journal in a store: loading, syncing, appending, and the resolver's analysis. No decisions."""

from __future__ import annotations

from jixu.errors import InvalidInput, KeyUnavailable, RunCorrupt, RunNotFound
from jixu.kernel import StreamWriter, chain_with_recorded_break
from jixu.ledger import Event, Fence, NewEvent, Store, VerifyReport, project
from jixu.ledger.encoding import JSONObject
from jixu.ledger.ids import is_valid_id
from jixu.ledger.projection import make_checkpoint
from jixu.ledger.store import Lease
from jixu.ledger.trust import record_break, verdict
from jixu.recovery import Analysis, RecoveryResolver
from jixu.recovery.corruption import Corruption, corruption
from jixu.runs.model import run_stream
from jixu.runs.projection import RunProjection, RunRecord

CHECKPOINT_EVERY = 100
"""Events between two checkpoints of a run's record (one is also written when the run finishes)."""


class RunLog:
    """One run's journal and projected record in a store: loading, syncing, appending. No decisions.

    Loading starts from the run's latest sealed checkpoint (a disposable cache,
    used only when its seal, reducer version and anchor event hold) and applies
    the events after it, so listing many finished runs does not replay each one.
    The whole chain is still verified (the ledger's verdict, hashing only), so
    every run is *established* when loaded: a history changed before the
    checkpoint is replayed, the record stops at the first bad event, and the
    run is ``corrupt`` (:meth:`corruption`); nothing acts on it
    (:meth:`open_to_act`).
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
        report: VerifyReport = projected.chain
        if projected.checkpoint == "used":
            # Opening trusted the checkpoint for the events before it: the verdict reads them too.
            report = verdict(store, self.stream, checkpoints=(RunProjection.name,))
            if not report.valid:
                # The history changed under the checkpoint: replay, so the record stops at the first bad event.
                projected = project(store, self.stream, RunProjection(), use_checkpoint=False)
        elif not report.valid:
            record_break(store, report)  # the whole chain was read: keep the break for every later opening
        if projected.state.run_id != run_id:
            # Its first event does not hold (the record stops before it): the run is the stream's, not nobody's.
            projected.state.run_id = run_id
        self.chain = report
        """The ledger's verdict on the journal's chain when it was loaded."""
        self._projection = RunProjection()
        self.writer: StreamWriter[RunRecord] = StreamWriter(
            store, self.stream, self._projection, projected.state,
            chain_break=None if report.valid else report.first_bad_seq)
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

    def append(self, events: list[NewEvent], fence: Fence | None = None, *, enqueue: tuple[str, str] | None = None,
               delay: float = 0.0) -> list[Event]:
        """Append after this record's head and project (see :class:`~jixu.kernel.StreamWriter`: receipts are
        kept across another writer's events; anything else meets :class:`~jixu.errors.ConcurrencyError`).
        ``enqueue`` = ``(key, group)``: the work item is enqueued in the same transaction (ready in ``delay`` s).

        Nothing is appended to a journal whose chain broke or whose record contradicts itself
        (:class:`~jixu.errors.RunCorrupt`)."""
        if self.chain_break is not None or self.record.problems:
            self.open_to_act()
        stored = self.writer.append(events, fence, enqueue=enqueue, delay=delay)
        if any(e.type == "run.finished" for e in stored) or self.record.seq - self._checkpoint_seq >= CHECKPOINT_EVERY:
            self.checkpoint()
        return stored

    def checkpoint(self) -> bool:
        """Write a checkpoint of the record if it moved since the last one and the journal is sound."""
        record = self.record
        if record.seq <= self._checkpoint_seq or record.problems or self.chain_break is not None:
            return False
        try:
            checkpoint = make_checkpoint(self.stream, self._projection, record, record.seq, record.head_hash)
        except KeyUnavailable:
            return False  # no key to seal it with: opening replays instead
        self.store.write_checkpoint(checkpoint)
        self._checkpoint_seq = record.seq
        return True

    def corruption(self) -> Corruption | None:
        """The journal's corruption verdict (:func:`jixu.recovery.corruption.corruption`), or ``None``."""
        analysis = self.analysis()
        if self.chain.valid and self.chain_break is None and not self.record.problems and not analysis.has_corruption:
            return None

        def seq_of(event_id: str) -> int | None:
            event = self.store.get_event(event_id)
            return event.seq if event is not None and event.stream == self.stream else None

        return corruption(self.stream, chain=self.chain, analysis=analysis, chain_break_seq=self.chain_break,
                          problems=self.record.problems, seq_of=seq_of)

    def open_to_act(self) -> None:
        """The line every operation on the run crosses first (execute, resume, handoff, cancel, retry, resolve,
        admitting or settling an execution request): :class:`~jixu.errors.RunCorrupt` (first bad seq, reason)
        when the journal is corrupt (a break another process recorded since it was loaded included); nothing is
        appended."""
        self.chain = chain_with_recorded_break(self.writer, self.chain)
        found = self.corruption()
        if found is not None:
            raise run_corrupt(self.run_id, found)

    def analysis(self) -> Analysis:
        """The RecoveryResolver's answer for every task effect of the run."""
        return RecoveryResolver.analyze(self.record.lifecycle, check_links=False, chain_break_seq=self.chain_break)

    def meta(self, actor: str) -> JSONObject:
        return {"actor": actor, "run_id": self.run_id}

    def holder_process(self, lease: Lease) -> object:
        """The process identity that the claim of ``lease``'s holder recorded (``run.claimed``), or None: what
        :func:`~jixu.kernel.ownership.dead_holder` needs to prove that holder gone."""
        for claim in reversed(self.record.claims):
            if claim.get("owner") == lease.owner and claim.get("epoch") == lease.epoch:
                return claim.get("process")
        return None


def run_corrupt(run_id: str, found: Corruption) -> RunCorrupt:
    """The error every refusal of a corrupt run raises."""
    return RunCorrupt(f"run {run_id}'s journal is corrupt: {found.summary()}. No operation acts on it; inspect it "
                      f"with `jixu runs journal STORE {run_id}`", run_id=run_id, stream=found.stream_name,
                      first_bad_seq=found.first_bad_seq, reason=found.reason, detail=found.detail)


__all__ = ["CHECKPOINT_EVERY", "RunLog", "run_corrupt"]
