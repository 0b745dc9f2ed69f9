"""What every part of the execution-request service shares: the store, the providers, reading a run's
requests, the project's current authority, and a request's provider and context."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from jixu.errors import (
    ConcurrencyError,
    InvalidInput,
    ProjectNotFound,
    RequestNotFound,
    RequestOwned,
    UnknownProvider,
)
from jixu.ledger import NewEvent, Store
from jixu.ledger.encoding import JSONObject
from jixu.ledger.ids import is_valid_id
from jixu.runs.journal import RunLog
from jixu.runs.model import get_project
from jixu.runs.processes import DEFAULT_GRACE_S
from jixu.runs.projection import derive_status
from jixu.runs.publication import PublicationContext, Publisher
from jixu.runs.remote import RemoteContext, RemoteProvider
from jixu.runs.requests.drain import executor, finished_by
from jixu.runs.requests.log import RequestLog
from jixu.runs.requests.status import DEFAULT_DRAIN_TIMEOUT, REMOTE_REQUEST_KINDS, ExecutionRequestView


class RequestService:
    """The state and the reading every part of :class:`~jixu.runs.requests.ExecutionRequests` shares."""

    def __init__(self, store: Store, publishers: Mapping[str, Publisher], *, owner: str, actor: str,
                 remotes: Mapping[str, RemoteProvider] | None = None, drain_timeout: float = DEFAULT_DRAIN_TIMEOUT,
                 poll_interval: float = 0.2, stop_grace: float = DEFAULT_GRACE_S) -> None:
        self.store = store
        self.publishers = dict(publishers)
        self.remotes = dict(remotes or {})
        self.owner = owner
        self.actor = actor
        self.drain_timeout = float(drain_timeout)
        self.poll_interval = float(poll_interval)
        self.stop_grace = float(stop_grace)
        """Seconds between SIGTERM and SIGKILL when a drain stops what a run's processes still run."""

    # --- reading -------------------------------------------------------------------------------

    def _acting(self, run_id: str, request_id: str) -> tuple[RunLog, RequestLog]:
        """:meth:`_request`, for an operation that writes: both streams must hold (RunCorrupt, RequestCorrupt)."""
        run, log = self._request(run_id, request_id)
        run.open_to_act()
        log.open_to_act()
        elsewhere = log.carried_out_elsewhere()
        if elsewhere is not None:  # an inspection now could miss what is still being done; a resolution repeat it
            raise RequestOwned(f"request {request_id} is {elsewhere}; inspect, resolve or reconcile it once that "
                               "process stopped (its claim released or expired)", request_id=request_id)
        return run, log

    def _request(self, run_id: str, request_id: str) -> tuple[RunLog, RequestLog]:
        run = RunLog(self.store, run_id)
        if not isinstance(request_id, str) or request_id not in run.record.requests:
            if isinstance(request_id, str) and not is_valid_id(request_id):
                raise InvalidInput(f"request id {request_id!r} is not a valid id", field="request_id")
            # A corrupt journal's record stops before its first bad event, and may not name the request for that
            # reason alone: say the run is corrupt (RunCorrupt), not that the request does not exist.
            run.open_to_act()
            raise RequestNotFound(f"run {run_id} has no execution request {request_id!r}", run_id=run_id,
                                  request_id=request_id)
        return run, RequestLog(self.store, request_id)

    def of_run(self, run_id: str) -> list[ExecutionRequestView]:
        """The run's execution requests, oldest first."""
        return self.of_log(RunLog(self.store, run_id))

    def of_log(self, run: RunLog) -> list[ExecutionRequestView]:
        """The execution requests of a run already loaded, oldest first."""
        return [self.view(RequestLog(self.store, request_id)) for request_id in run.record.requests]

    def get(self, run_id: str, request_id: str) -> ExecutionRequestView:
        """One request of the run."""
        return self.view(self._request(run_id, request_id)[1])


    def _default_branch(self, run: RunLog) -> str:
        try:
            return get_project(self.store, run.record.project).default_branch
        except ProjectNotFound:
            return "main"

    def _authority(self, run: RunLog) -> JSONObject:
        """Does the project still authorize the run's origin? (Read from the project's stream now.)"""
        try:
            found = get_project(self.store, run.record.project)
        except ProjectNotFound:
            return {"ok": False, "reason": f"project {run.record.project!r} no longer exists"}
        origin = run.record.source.get("origin")
        if found.origin != origin:
            return {"ok": False, "reason": f"project {found.name!r} now authorizes origin {found.origin!r}, not the "
                                           f"run's {origin!r}", "origin": found.origin}
        return {"ok": True, "origin": origin, "project": found.name}


    def view(self, log: RequestLog) -> ExecutionRequestView:
        """The request's view; ``in_progress`` while a live process carries a remote request out (its claim), and
        for a cancellation that finished the run and waits for a live executor to drain (one whose run never
        finished stays ``needs_reconciliation``)."""
        view = log.view()
        if view.kind in REMOTE_REQUEST_KINDS and view.status in ("pending", "needs_reconciliation"):
            elsewhere = log.carried_out_elsewhere()
            if elsewhere is not None:
                return replace(view, status="in_progress", reason=elsewhere)
        if view.kind == "cancellation" and view.status == "needs_reconciliation" and view.decision \
                and view.decision.get("reason") == "dispatched_without_receipt":
            run = RunLog(self.store, view.run_id)
            if finished_by(run, view.request_id) and executor(self.store, run)[0]:
                return replace(view, status="in_progress",
                               reason="the run is finished; waiting for the process executing it to stop")
        return view

    def open_cancellation(self, run: RunLog) -> ExecutionRequestView | None:
        """The run's cancellation request that is admitted and not settled while the run is unfinished
        (``pending``, ``needs_reconciliation`` or ``corrupt``), or ``None``: while there is one, nothing may act
        on the run as if it were not cancelled (:meth:`~jixu.runs.Runs.execute`, ``resume`` and ``handoff``
        refuse)."""
        if run.record.finished is not None:
            return None
        for request_id, data in run.record.requests.items():
            if data.get("kind") == "cancellation":
                view = self.view(RequestLog(self.store, request_id))
                if view.status in ("pending", "needs_reconciliation", "corrupt"):
                    return view
        return None

    def _finish_run(self, run: RunLog, log: RequestLog, *, completed_by: JSONObject | None = None) -> None:
        """The cancellation's effect: ``run.finished`` (``cancelled``, naming the request) at the journal's head,
        unless the run finished already (a run finishes once, so this never happens twice). ``completed_by``
        names who completed a cancellation whose dispatcher stopped before this write (recorded in the evidence)."""
        admitted = log.record.admitted or {}
        reason = str((admitted.get("target") or {}).get("reason") or "cancelled")
        actor = str(admitted.get("actor") or self.actor)
        for _ in range(20):
            if run.record.finished is not None:
                return
            before, why = derive_status(run.record, run.analysis(), self._ownership(run))
            evidence: JSONObject = {"request_id": log.request_id, "status_before": before, "reason_before": why}
            if completed_by is not None:
                evidence["completed_by"] = completed_by
            try:
                run.append([NewEvent("run.finished", {
                    "outcome": "cancelled", "reason": reason, "actor": actor, "request_id": log.request_id,
                    "evidence": evidence}, RequestLog.meta(actor, run.run_id, log.request_id))])
            except ConcurrencyError:
                run.sync()
        if run.record.finished is None:  # never silently: the cancellation stays in doubt for the next attempt
            raise ConcurrencyError(f"run {run.run_id}'s journal kept moving while finishing it as cancelled by "
                                   f"request {log.request_id}; try again", run_id=run.run_id,
                                   request_id=log.request_id)

    def _ownership(self, run: RunLog) -> str:
        """Who holds the run's lease, in :data:`~jixu.runs.projection.OWNERSHIP` terms (as seen from outside)."""
        live, seen = executor(self.store, run)
        if live:
            return "live"
        if seen.get("owner") is None:
            return "stale" if run.record.claims else "none"
        return "released" if seen.get("released") else "stale"

    def _context(self, run: RunLog, log: RequestLog, args: JSONObject) -> PublicationContext | RemoteContext:
        admitted = log.record.admitted or {}
        target = admitted.get("target") or {}
        if log.record.kind != "publication":
            return RemoteContext(
                run_id=run.run_id, request_id=log.request_id, kind=log.record.kind,
                workspace=Path(run.record.workspace), source_commit=str(args["source_commit"]),
                tree=str(args["tree"]), parameters=dict(args.get("parameters") or {}),
                idempotency_key=str((log.record.intent or {}).get("idempotency_key") or f"jixu:{log.request_id}"))
        return PublicationContext(
            run_id=run.run_id, request_id=log.request_id, workspace=Path(run.record.workspace),
            origin=str(args["origin"]), branch=str(args["branch"]), base_branch=str(args["base_branch"]),
            commit=str(args["commit"]), tree=str(args["tree"]), title=str(target.get("title", "")),
            body=str(target.get("body", "")))

    def _provider(self, log: RequestLog) -> Publisher | RemoteProvider:
        target = (log.record.admitted or {}).get("target") or {}
        provider: Publisher | RemoteProvider | None
        if log.record.kind == "publication":
            name, what = target.get("publisher"), "publisher"
            provider = self.publishers.get(str(name))
        else:
            name, what = target.get("provider"), "remote provider"
            provider = self.remotes.get(str(name))
        if provider is None:
            raise UnknownProvider(f"request {log.request_id} uses {what} {name!r}, which is not configured here",
                                  provider=name)
        return provider

