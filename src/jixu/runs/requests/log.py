"""One execution request's stream in a store: load, sync, append, the corruption verdict, the analysis."""

from __future__ import annotations

from jixu.errors import (
    InvalidInput,
    RequestCorrupt,
    RequestNotFound,
)
from jixu.kernel import StreamWriter, chain_with_recorded_break, live_claim
from jixu.ledger import Event, NewEvent, Store
from jixu.ledger.encoding import JSONObject
from jixu.ledger.ids import is_valid_id
from jixu.ledger.projection import fold_verified
from jixu.ledger.store import Lease
from jixu.recovery import Analysis, EffectDecision, RecoveryResolver
from jixu.recovery.corruption import Corruption, corruption
from jixu.runs.requests.status import (
    ExecutionRequestView,
    RequestProjection,
    RequestRecord,
    request_lease_key,
    request_status,
    request_stream,
)


class RequestLog:
    """One request's stream in a store: load, sync, append, analyse."""

    def __init__(self, store: Store, request_id: str) -> None:
        if not isinstance(request_id, str) or not is_valid_id(request_id):
            raise InvalidInput(f"request id {request_id!r} is not a valid id", field="request_id")
        self.store, self.request_id, self.stream = store, request_id, request_stream(request_id)
        if store.stream_info(self.stream) is None:
            raise RequestNotFound(f"no execution request {request_id} in {store.url}", request_id=request_id)
        projected = fold_verified(store, self.stream, RequestProjection())  # the whole chain, a break kept
        self.chain = projected.chain
        """The ledger's verdict on the request's chain when it was loaded (it is read whole: no checkpoint)."""
        self.writer: StreamWriter[RequestRecord] = StreamWriter(
            store, self.stream, RequestProjection(), projected.state,
            chain_break=None if projected.chain.valid else projected.chain.first_bad_seq)
        """The kernel's writer of the request's stream."""

    @property
    def record(self) -> RequestRecord:
        """The projected record (durable events only)."""
        return self.writer.state

    @property
    def chain_break(self) -> int | None:
        """The first seq whose hash link is broken, once one was seen."""
        return self.writer.chain_break

    def sync(self) -> None:
        """Apply events appended since this record's head."""
        self.writer.sync()

    def append(self, events: list[NewEvent]) -> list[Event]:
        """Append after this record's head (receipts kept across another writer's events; anything else meets
        :class:`~jixu.errors.ConcurrencyError`). Nothing is appended to a corrupt request."""
        self.open_to_act()
        return self.writer.append(events)

    def holder_process(self, lease: Lease) -> object:
        """The process identity the dispatch marker of ``lease``'s holder recorded (its ``owner`` and ``epoch``), or
        None: what proves that holder gone (:func:`~jixu.kernel.ownership.dead_holder`)."""
        for event in reversed(self.record.lifecycle):
            data = event.data
            if event.type.endswith(".dispatched") and data.get("owner") == lease.owner \
                    and data.get("epoch") == lease.epoch:
                return data.get("process")
        return None

    def carried_out_elsewhere(self) -> str | None:
        """Why the request is being carried out by a live process now (its claim on the request, taken before the
        dispatch marker and renewed until the receipt), or None: what it has in flight settles there."""
        claim = live_claim(self.store, request_lease_key(self.request_id), self.holder_process)
        if claim is None:
            return None
        return (f"being carried out by {claim.lease.owner} (epoch {claim.lease.epoch}, {claim.held_for()}): its "
                "outcome settles there")

    def corruption(self) -> Corruption | None:
        """The request's corruption verdict (:func:`jixu.recovery.corruption.corruption`), or ``None``."""
        analysis = self.analysis()
        if self.chain.valid and self.chain_break is None and not self.record.problems and not analysis.has_corruption:
            return None
        seqs = {event.id: event.seq for event in self.record.lifecycle}
        return corruption(self.stream, chain=self.chain, analysis=analysis, chain_break_seq=self.chain_break,
                          problems=self.record.problems, seq_of=seqs.get)

    def open_to_act(self) -> None:
        """The line every operation on the request crosses first (execute, inspect, resolve, reconcile):
        :class:`~jixu.errors.RequestCorrupt` (first bad seq, reason) when it is corrupt (a break another process
        recorded since it was loaded included); nothing is appended."""
        self.chain = chain_with_recorded_break(self.writer, self.chain)
        found = self.corruption()
        if found is not None:
            raise RequestCorrupt(f"execution request {self.request_id} is corrupt: {found.summary()}. Nothing acts "
                                 "on it", request_id=self.request_id, stream=found.stream_name,
                                 first_bad_seq=found.first_bad_seq, reason=found.reason, detail=found.detail)

    def analysis(self) -> Analysis:
        """The resolver's answer for the request's effect."""
        return RecoveryResolver.analyze(self.record.lifecycle, check_links=False, chain_break_seq=self.chain_break)

    def decision(self) -> EffectDecision | None:
        return self.analysis().decisions.get(self.record.effect_id or "")

    def status(self) -> tuple[str, str]:
        found = self.corruption()
        if found is not None:
            return "corrupt", found.summary()
        return request_status(self.record, self.analysis())

    def view(self) -> ExecutionRequestView:
        """The request as users see it."""
        analysis = self.analysis()
        found = self.corruption()
        status, reason = ("corrupt", f"{found.summary()}; nothing acts on it") if found is not None else (
            request_status(self.record, analysis))
        admitted = self.record.admitted or {}
        decision = analysis.decisions.get(self.record.effect_id or "")
        return ExecutionRequestView(
            request_id=self.request_id, run_id=self.record.run_id, kind=self.record.kind,
            attempt=int(admitted.get("attempt") or 1), status=status, reason=reason,
            actor=str(admitted.get("actor", "")), admitted_source=dict(admitted.get("source") or {}),
            target=dict(admitted.get("target") or {}), intent=self.record.intent, receipt=self.record.receipt,
            reconciliations=tuple(self.record.reconciliations), inspections=tuple(self.record.inspections),
            decision=None if decision is None else decision.to_dict(), seq=self.record.seq,
            head_hash=self.record.head_hash, chain_valid=self.chain.valid and self.chain_break is None,
            corruption=None if found is None else found.to_dict())

    @staticmethod
    def meta(actor: str, run_id: str, request_id: str) -> JSONObject:
        return {"actor": actor, "run_id": run_id, "request_id": request_id}

