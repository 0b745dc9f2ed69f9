"""Reconciliation: settling a request's unknown outcome from retained evidence, never from an assertion."""

from __future__ import annotations

from jixu.errors import (
    AlreadyReconciled,
    ConcurrencyError,
    InvalidInput,
    ReconciliationNeedsProof,
    RequestStateError,
    ResolutionNeedsEvidence,
)
from jixu.ledger import NewEvent, new_id
from jixu.ledger.encoding import JSONObject
from jixu.ledger.store import check_text
from jixu.recovery.resolutions import admit_resolution, resolution_body
from jixu.runs.journal import RunLog
from jixu.runs.requests.base import RequestService
from jixu.runs.requests.drain import drained_receipt, executor, finished_by, record_drain, stop_leftovers
from jixu.runs.requests.evidence import matches
from jixu.runs.requests.log import RequestLog
from jixu.runs.requests.status import (
    MAX_PUBLICATION_ATTEMPTS,
    RECONCILIATION_ID,
    REMOTE_REQUEST_KINDS,
    SETTLED,
    ExecutionRequestView,
)


class Reconciliation(RequestService):
    """Inspect, resolve and reconcile requests whose outcome is unknown."""

    async def inspect_remote(self, run_id: str, request_id: str, *, actor: str | None = None) -> JSONObject:
        """Ask the provider, read-only, what it shows for the recorded remote effect; retain the finding.

        The inspection is the request's probe: when what it found matches the
        admitted source (:func:`~jixu.runs.requests.evidence.matches`) and the
        outcome is unknown, the same append settles it as ``occurred``,
        recorded by ``probe:<provider>`` with the inspection as its evidence.
        Anything else leaves the outcome unknown, with what is missing retained.
        """
        actor = actor or self.actor
        check_text(actor, "actor", 200, required=True)
        run, log = self._acting(run_id, request_id)
        intent = log.record.intent
        if log.record.kind not in REMOTE_REQUEST_KINDS or intent is None:
            raise RequestStateError(f"request {request_id} has no remote intent to inspect", request_id=request_id)
        provider = self._provider(log)
        args = dict(intent.get("args") or {})
        context = self._context(run, log, args)
        found = await provider.inspect(context)  # type: ignore[arg-type]
        keys = ("branch", "commit", "tree") if log.record.kind == "publication" else ("kind", "source_commit",
                                                                                      "tree", "parameters")
        shown, missing, compared = matches(log.record.kind, log.record.admitted or {}, intent, found)
        recorded = {"actor": actor, "provider": provider.name, "found": found,
                    "expected": {k: args.get(k) for k in keys},
                    "evidence": {"shown": shown, "missing": missing, "compared": compared}}
        meta = RequestLog.meta(actor, run_id, request_id)
        inspected = NewEvent("request.inspected", recorded, meta)
        events = [inspected]
        decision = log.decision()
        settles = shown and decision is not None and decision.state == "unknown" and decision.resolution is None
        if settles and decision is not None:
            body = resolution_body(log.record.effect_id or "", "occurred", new_id(), actor=f"probe:{provider.name}",
                                   note="the provider's inspection found the admitted source",
                                   evidence={"inspection_event_id": inspected.id, "compared": compared})
            events.append(NewEvent(f"{decision.kind}.outcome_resolved", body, meta))
        log.append(events)
        return {**recorded, "event_id": inspected.id, "settled": settles}

    def resolve_outcome(self, run_id: str, request_id: str, resolution: str, *, resolution_id: str | None = None,
                        note: str | None = None, actor: str | None = None) -> ExecutionRequestView:
        """Record an operator's resolution of an unknown request, citing the latest retained inspection.

        A remote request's outcome can only be resolved after
        :meth:`inspect_remote` retained what the provider shows (after the
        dispatch); the resolution cites that inspection as its evidence, and
        must not contradict it (:class:`~jixu.errors.ResolutionNeedsEvidence`,
        nothing written): ``occurred`` needs an inspection that found the
        admitted source, ``not_occurred`` is refused when it did.
        ``abandoned_unknown`` settles the request without claiming either; it
        counts as one of the admitted attempts.
        """
        actor = actor or self.actor
        run, log = self._acting(run_id, request_id)
        inspection = log.record.inspections[-1] if log.record.inspections else None
        dispatched = next((e.seq for e in log.record.lifecycle if e.type.endswith(".dispatched")), None)
        remote = log.record.kind in REMOTE_REQUEST_KINDS
        if remote and (inspection is None or dispatched is None or int(inspection["seq"]) < dispatched):
            raise RequestStateError(f"request {request_id}: inspect the provider first (jixu runs inspect-remote); "
                                    "its finding is retained before any resolution", request_id=request_id)
        evidence = None if inspection is None else {"inspection_event_id": inspection["event_id"],
                                                    "found": inspection.get("found")}
        body = resolution_body(log.record.effect_id or "", resolution,
                               new_id() if resolution_id is None else resolution_id, actor=actor, note=note,
                               evidence=evidence)
        if remote and inspection is not None:
            self._against_evidence(log, inspection, resolution)
        decision = admit_resolution(log.analysis(), body, where=f"request {request_id}")
        if decision is not None and log.record.kind == "cancellation":
            self._against_journal(run, log, resolution)
        if decision is not None:
            log.append([NewEvent(f"{decision.kind}.outcome_resolved", body,
                                 RequestLog.meta(actor, run.run_id, request_id))])
        return self.view(log)

    @staticmethod
    def _against_journal(run: RunLog, log: RequestLog, resolution: str) -> None:
        """Refuse a cancellation's resolution that the run's journal does not back: a cancellation's effect is
        a write to that journal (``run.finished`` naming the request), observed there, never asserted. While the
        run never finished, nothing is resolved: reconciling the request completes the cancellation instead."""
        request_id, finished = log.request_id, run.record.finished
        mine = finished_by(run, request_id)
        settle = (f"jixu runs reconcile-execution-request STORE {run.run_id} {request_id} --reconciliation-id HEX")
        if finished is None:
            raise RequestStateError(
                f"cancellation request {request_id}: run {run.run_id}'s journal shows the run never finished, so the "
                f"cancellation has not taken effect yet and its outcome is not for an operator to assert. Nothing was "
                f"recorded; `{settle}` completes it (the run finishes as cancelled)", request_id=request_id,
                run_id=run.run_id, command=settle)
        seen = {"run_finished_seq": finished.get("seq"), "outcome": finished.get("outcome"),
                "finished_by_request": finished.get("request_id")}
        if resolution == "occurred" and not (mine and drained_receipt(run, request_id) is not None):
            raise ResolutionNeedsEvidence(
                f"cancellation request {request_id}: 'occurred' needs the run's journal to hold the request's "
                f"run.finished and a run.drained receipt, and it "
                + ("does not prove the run's work drained" if mine else
                   f"shows the run finished as {finished.get('outcome')} without this request")
                + f". Nothing was recorded; `{settle}` settles it from the journal", request_id=request_id,
                resolution=resolution, missing=["run.drained" if mine else "run.finished naming the request"],
                journal=seen)
        if resolution == "not_occurred" and mine:
            raise ResolutionNeedsEvidence(
                f"cancellation request {request_id}: the run's journal holds its run.finished (seq "
                f"{finished.get('seq')}); 'not_occurred' contradicts it. Nothing was recorded", request_id=request_id,
                resolution=resolution, missing=[], journal=seen)

    @staticmethod
    def _against_evidence(log: RequestLog, inspection: JSONObject, resolution: str) -> None:
        """Refuse a resolution that the retained inspection does not back (see :meth:`resolve_outcome`)."""
        shown, missing, compared = matches(log.record.kind, log.record.admitted or {}, log.record.intent or {},
                                           inspection.get("found"))
        cited = {"event_id": inspection.get("event_id"), "seq": inspection.get("seq")}
        what = f"the inspection at seq {inspection.get('seq')} (event {inspection.get('event_id')})"
        if resolution == "occurred" and not shown:
            raise ResolutionNeedsEvidence(
                f"request {log.request_id}: 'occurred' needs retained evidence that matches the admitted source, "
                f"and {what} shows none: {'; '.join(missing)}. Nothing was recorded. Inspect again once the "
                "provider shows the effect (jixu runs inspect-remote: a matching finding settles it), or settle it "
                "without claiming success with 'abandoned_unknown' (it counts as one of the "
                f"{MAX_PUBLICATION_ATTEMPTS} attempts)", request_id=log.request_id, resolution=resolution,
                missing=missing, inspection=cited, compared=compared)
        if resolution == "not_occurred" and shown:
            raise ResolutionNeedsEvidence(
                f"request {log.request_id}: {what} found the admitted source ({compared}); 'not_occurred' "
                "contradicts it. Nothing was recorded", request_id=log.request_id, resolution=resolution,
                missing=[], inspection=cited, compared=compared)

    def reconcile(self, run_id: str, request_id: str, reconciliation_id: str, *,
                  actor: str | None = None) -> JSONObject:
        """Establish a request's outcome from retained evidence only; the retained result.

        A cancellation is observed in the run's journal: if the run never
        finished, the request's dispatcher stopped before the cancellation's one
        write, which is completed now (see :meth:`_drain`); if the run finished
        without it, the cancellation never took effect (``failed``, proved by
        that ``run.finished``).

        Raises :class:`~jixu.errors.ReconciliationNeedsProof` (the finding is
        retained first) when there is no proof, and
        :class:`~jixu.errors.AlreadyReconciled` when another reconciliation id
        settled the request already.
        """
        actor = actor or self.actor
        check_text(actor, "actor", 200, required=True)
        if not isinstance(reconciliation_id, str) or not RECONCILIATION_ID.match(reconciliation_id):
            raise InvalidInput("reconciliation_id must be 32 lowercase hexadecimal characters",
                               field="reconciliation_id")
        run, log = self._acting(run_id, request_id)
        for _ in range(5):
            retained = next((r for r in log.record.reconciliations
                             if r.get("reconciliation_id") == reconciliation_id), None)
            if retained is not None:
                return self._answer(retained)
            settled = log.record.settling_reconciliation
            if settled is not None:
                raise AlreadyReconciled(f"request {request_id} was already reconciled by "
                                        f"{settled.get('reconciliation_id')}; a different reconciliation id is "
                                        "refused", request_id=request_id,
                                        reconciliation_id=settled.get("reconciliation_id"))
            status, _reason = log.status()
            if status == "pending":
                raise RequestStateError(f"request {request_id} was not dispatched yet: there is nothing to reconcile",
                                        request_id=request_id)
            drain_why = self._drain(run, log, status, actor, reconciliation_id)
            finding, resolution = self._establish(run, log, status, drain_why)
            result: JSONObject = {"reconciliation_id": reconciliation_id, "request_id": request_id,
                                  "run_id": run_id, "actor": actor, "status_before": status, **finding}
            meta = RequestLog.meta(actor, run_id, request_id)
            events = [NewEvent("request.reconciled", result, meta)]
            decision = log.decision() if resolution is not None else None
            if resolution is not None and decision is not None:
                body = resolution_body(log.record.effect_id or "", resolution, reconciliation_id, actor=actor,
                                       note=f"established by reconciliation {reconciliation_id}",
                                       evidence={"proof": finding["proof"]})
                events.insert(0, NewEvent(f"{decision.kind}.outcome_resolved", body, meta))
            try:
                log.append(events)
            except ConcurrencyError:
                log.sync()
                run.sync()
                continue
            return self._answer(log.record.reconciliations[-1])
        raise RequestStateError(f"request {request_id} kept changing while reconciling it; try again",
                                request_id=request_id)

    @staticmethod
    def _answer(retained: JSONObject) -> JSONObject:
        result = {k: v for k, v in retained.items() if k not in ("seq",)}
        if not retained.get("settled"):
            raise ReconciliationNeedsProof(
                f"request {retained.get('request_id')}: no proof of its outcome ({retained.get('reason')}); it stays "
                "unknown and nothing was called or repeated", result=result)
        return result

    def _drain(self, run: RunLog, log: RequestLog, status: str, actor: str, reconciliation_id: str) -> str:
        """A cancellation dispatched without its receipt. If the run's journal shows the run never finished, the
        dispatcher stopped before the cancellation's one write: the journal proves it did not happen, and a run
        finishes once, so it is completed now (``run.finished`` naming the request and this reconciliation).
        Then, for a cancellation that finished the run and lacks its drain receipt: once the executor is provably
        gone, stop what the run's recorded processes still run and record ``run.drained`` (the receipt the
        evidence needs); why it was not recorded, or ``""``."""
        request_id = log.request_id
        if log.record.kind != "cancellation" or status != "needs_reconciliation":
            return ""
        if run.record.finished is None:
            self._finish_run(run, log, completed_by={"by": actor, "trigger": "reconciliation",
                                                     "reconciliation_id": reconciliation_id})
        if not finished_by(run, request_id) or drained_receipt(run, request_id) is not None:
            return ""
        live, _seen = executor(self.store, run)
        stopped = ([], []) if live else stop_leftovers(run, by=actor, trigger="reconciliation",
                                                       grace=self.stop_grace)
        return record_drain(self.store, run, request_id, by=actor, trigger="reconciliation", stopped=stopped)[1]

    def _establish(self, run: RunLog, log: RequestLog, status: str,
                   drain_why: str = "") -> tuple[JSONObject, str | None]:
        """What retained, immutable evidence proves (pure reading): the finding and the resolution it implies."""
        record = log.record
        receipt = record.receipt or {}
        proof: list[JSONObject] = []
        checked: JSONObject = {}
        if status in SETTLED:
            # Settled already by a terminal receipt or an operator resolution: reconciliation retains that.
            cited = receipt.get("event_id") or next(
                (e.id for e in reversed(record.lifecycle) if e.type.endswith(".outcome_resolved")), None)
            return {"settled": True, "outcome": status, "reason": f"already {status} by its own events",
                    "proof": [{"stream": log.stream, "event_id": cited}], "checked": checked}, None
        if status == "corrupt":
            return {"settled": False, "outcome": "unknown", "reason": "the request's events contradict each other",
                    "proof": [], "checked": checked}, None
        authority = self._authority(run)
        checked["project_authority"] = authority
        if not authority["ok"]:
            return {"settled": False, "outcome": "unknown", "reason": f"project authority: {authority['reason']}",
                    "proof": [], "checked": checked}, None
        if record.kind == "cancellation":
            drained = drained_receipt(run, log.request_id)
            finished = finished_by(run, log.request_id)
            checked.update({"run_finished_by_request": finished, "drained_receipt": drained is not None})
            if drained is not None and finished:
                proof.append({"stream": run.stream, "seq": drained["seq"], "type": "run.drained"})
                return {"settled": True, "outcome": "succeeded", "reason": "the run's journal holds the request's "
                        "run.finished and a run.drained receipt", "proof": proof, "checked": checked}, "occurred"
            other = run.record.finished
            if other is not None and not finished:
                # The run finished without it, and a run finishes once: the cancellation never took effect and
                # never can.
                proof.append({"stream": run.stream, "seq": other.get("seq"), "type": "run.finished"})
                return {"settled": True, "outcome": "failed", "reason": f"the run's journal shows the run finished "
                        f"as {other.get('outcome')} without this request: the cancellation never took effect",
                        "proof": proof, "checked": checked}, "not_occurred"
            return {"settled": False, "outcome": "unknown", "reason": "no terminal receipt proves the run's work "
                    "drained" + (f": {drain_why}" if drain_why else ""), "proof": [], "checked": checked}, None
        if record.kind == "publication":
            return self._establish_publication(run, log, checked)
        return self._establish_remote(run, log, checked)

    @staticmethod
    def _unknown(reason: str, checked: JSONObject) -> tuple[JSONObject, str | None]:
        return {"settled": False, "outcome": "unknown", "reason": reason, "proof": [], "checked": checked}, None

    def _journal_record(self, run: RunLog, log: RequestLog, checked: JSONObject
                        ) -> tuple[JSONObject, JSONObject, JSONObject, JSONObject] | str:
        """The run journal's intent, receipt, intent args and request args for a remote request, or why not."""
        record = log.record
        admitted = record.admitted or {}
        args = dict((record.intent or {}).get("args") or {})
        source = admitted.get("source") or {}
        evidence = (run.record.finished or {}).get("evidence") or {}
        current_tree = (evidence.get("source") or {}).get("tree")
        checked["admitted_tree"], checked["current_tree"], checked["intent_tree"] = (
            source.get("tree"), current_tree, args.get("tree"))
        if not (source.get("tree") and source.get("tree") == current_tree == args.get("tree")):
            return "the admitted source does not match the run's verified source and the intent"
        journal_id = str(args.get("journal_effect_id"))
        journal_intent = run.record.effects.get(journal_id)
        journal_receipt = run.record.receipts.get(journal_id)
        checked["journal_intent"], checked["journal_receipt"] = journal_intent is not None, journal_receipt is not None
        if journal_intent is None or journal_receipt is None or journal_receipt.get("phase") != "completed":
            return (f"no terminal receipt: neither the request nor the run's journal recorded the {record.kind}'s "
                    "observed result")
        journal_args = next((e.data.get("args") for e in run.record.lifecycle
                             if e.type == "task.requested" and e.data.get("effect_id") == journal_id), None) or {}
        return journal_intent, journal_receipt, dict(journal_args), args

    def _settled(self, run: RunLog, log: RequestLog, checked: JSONObject, matches: dict[str, bool],
                 journal_intent: JSONObject, journal_receipt: JSONObject,
                 keys: tuple[str, ...]) -> tuple[JSONObject, str | None]:
        checked["matches"] = matches
        if not all(matches.values()):
            failed = [k for k, ok in matches.items() if not ok]
            return self._unknown(f"the run's {log.record.kind} receipt does not match the intent: {failed}", checked)
        result = journal_receipt.get("result") or {}
        proof = [{"stream": run.stream, "seq": journal_intent["seq"], "type": "task.requested"},
                 {"stream": run.stream, "seq": journal_receipt["seq"], "type": "task.completed"}]
        return {"settled": True, "outcome": "succeeded", "reason": f"the run's journal holds the matching "
                f"{log.record.kind} intent and terminal receipt", "proof": proof, "checked": checked,
                "evidence": {k: result.get(k) for k in keys if k in result}}, "occurred"

    def _establish_publication(self, run: RunLog, log: RequestLog,
                               checked: JSONObject) -> tuple[JSONObject, str | None]:
        found = self._journal_record(run, log, checked)
        if isinstance(found, str):
            return self._unknown(found, checked)
        journal_intent, journal_receipt, journal_args, args = found
        result = journal_receipt.get("result") or {}
        wants_pr = (((log.record.admitted or {}).get("target") or {}).get("publisher_kind")) == "pull_request"
        matches = {
            "intent_branch": journal_args.get("branch") == args.get("branch"),
            "intent_commit": journal_args.get("commit") == args.get("commit"),
            "intent_tree": journal_args.get("tree") == args.get("tree"),
            "receipt_branch": result.get("branch") == args.get("branch"),
            "receipt_commit": result.get("pushed_commit") == args.get("commit"),
            "receipt_tree": result.get("tree") == args.get("tree"),
            "receipt_pull_request": (not wants_pr) or (isinstance(result.get("pr_number"), int)
                                                       and isinstance(result.get("pr_url"), str)),
        }
        return self._settled(run, log, checked, matches, journal_intent, journal_receipt,
                             ("branch", "pushed_commit", "tree", "pr_number", "pr_url"))

    def _establish_remote(self, run: RunLog, log: RequestLog, checked: JSONObject) -> tuple[JSONObject, str | None]:
        """A deploy / rollback / knowledge write: the provider-reported job id or version is the evidence."""
        found = self._journal_record(run, log, checked)
        if isinstance(found, str):
            return self._unknown(found, checked)
        journal_intent, journal_receipt, journal_args, args = found
        result = journal_receipt.get("result") or {}
        matches = {f"intent_{key}": journal_args.get(key) == args.get(key)
                   for key in ("kind", "source_commit", "tree", "parameters", "provider")}
        matches["receipt_kind"] = result.get("kind") == log.record.kind
        matches["receipt_job_or_version"] = any(isinstance(result.get(k), str) and bool(result.get(k))
                                                for k in ("job_id", "version"))
        return self._settled(run, log, checked, matches, journal_intent, journal_receipt,
                             ("kind", "job_id", "version"))


