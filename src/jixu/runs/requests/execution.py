"""Execution: a request's intent, dispatch marker, effect and receipt, in both streams; a cancellation's drain."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from datetime import UTC, datetime
from pathlib import Path

from jixu.errors import (
    ConcurrencyError,
    GitError,
    JixuError,
    LeaseHeld,
    OwnershipLost,
    ReceiptConflict,
    RequestNotFound,
    RequestOwned,
)
from jixu.kernel import DEFAULT_LEASE_TTL, Outcome, Session, acquire_claim, marker, perform, process_identity
from jixu.ledger import NewEvent, new_id
from jixu.ledger.encoding import JSONObject, content_hash
from jixu.ledger.store import Fence
from jixu.runs.journal import RunLog
from jixu.runs.model import REQUEST_TASK_KINDS
from jixu.runs.publication import PublicationContext, Publisher, RemoteRejected
from jixu.runs.remote import RemoteContext, RemoteProvider
from jixu.runs.requests.base import RequestService
from jixu.runs.requests.drain import drained_receipt, finished_by, record_drain, stop_leftovers
from jixu.runs.requests.log import RequestLog
from jixu.runs.requests.status import REMOTE_REQUEST_KINDS, ExecutionRequestView, request_lease_key
from jixu.runs.workspace import commit_tree


def _intent(name: str, args: JSONObject, effect_id: str) -> JSONObject:
    """An unsafe intent's data: a retry could repeat the effect, so an unknown outcome waits for evidence."""
    return {"effect_id": effect_id, "name": name, "args": args, "args_hash": content_hash(args),
            "semantics": "unsafe", "idempotency_key": f"jixu:{effect_id}", "requires_approval": False}


def _git_time(recorded_at: str) -> str:
    """An event's ``recorded_at`` as a git date (seconds since the epoch, UTC)."""
    moment = datetime.fromisoformat(recorded_at.replace("Z", "+00:00"))
    return f"{int(moment.replace(tzinfo=moment.tzinfo or UTC).timestamp())} +0000"




class Execution(RequestService):
    """Carry requests out (what a worker does with ``request/<id>`` work)."""

    async def execute(self, request_id: str, *, drain_timeout: float | None = None) -> ExecutionRequestView:
        """Carry a pending request out: intent, dispatch marker, effect, receipt. Anything else: its view.

        A cancellation whose effect is recorded (the run finished by it) but
        whose drain receipt is missing is *observed* again, never redone: it
        waits up to ``drain_timeout`` (default: the service's) for the run's
        executor to stop and then records the receipt. A cancellation
        dispatched whose run's journal shows no ``run.finished`` at all (its
        dispatcher stopped before that one write) is completed: the journal
        proves the effect did not happen, and a run finishes only once, so
        it cannot happen twice. A corrupt request answers its ``corrupt`` view; a
        request of a corrupt run is refused (:class:`~jixu.errors.RunCorrupt`). Neither writes anything.
        """
        log = RequestLog(self.store, request_id)
        run = RunLog(self.store, log.record.run_id)
        run.open_to_act()  # the request's own view cannot show its run's corruption: it would say "pending"
        if log.corruption() is not None:
            return self.view(log)  # nothing acts on a history that does not hold
        if request_id not in run.record.requests:
            raise RequestNotFound(f"request {request_id} is not named by run {log.record.run_id}'s journal; it was "
                                  "never admitted completely and is not executed", request_id=request_id)
        timeout = self.drain_timeout if drain_timeout is None else float(drain_timeout)
        status = log.status()[0]
        try:
            if status == "pending" and log.record.kind in REMOTE_REQUEST_KINDS:
                await self._remote(run, log)
            elif status == "pending":
                await self._cancel(run, log, timeout)
            elif log.record.kind == "cancellation" and status == "needs_reconciliation" \
                    and finished_by(run, request_id):
                await self._finish_drain(run, log, timeout)
            elif log.record.kind == "cancellation" and status == "needs_reconciliation" \
                    and run.record.finished is None:
                # Dispatched, and the run's journal shows it never finished: the dispatcher stopped before the
                # cancellation's one write. Completed now, never doubled (a run finishes once).
                self._finish_run(run, log, completed_by={"by": self.owner, "trigger": "execute"})
                if finished_by(run, request_id):
                    await self._finish_drain(run, log, timeout)
        except ConcurrencyError:
            pass  # another worker moved the request first: it owns the dispatch, we stop
        log.sync()
        return self.view(log)


    async def _preflight(self, provider: Publisher | RemoteProvider,
                         context: PublicationContext | RemoteContext) -> None:
        # A publication's context always goes to a publisher and a remote one to a remote provider (_provider).
        await provider.preflight(context)  # type: ignore[arg-type]

    async def _perform(self, provider: Publisher | RemoteProvider,
                       context: PublicationContext | RemoteContext) -> JSONObject:
        if isinstance(context, PublicationContext):
            return await provider.publish(context)  # type: ignore[union-attr]
        return await provider.perform(context)  # type: ignore[union-attr]

    def _journal_intent(self, run: RunLog, request_id: str) -> JSONObject | None:
        task_id = run.record.requests[request_id].get("task_id")
        effects = run.record.task_effects.get(str(task_id), [])
        return run.record.effects.get(effects[0]) if effects else None

    async def _intent_args(self, run: RunLog, log: RequestLog, provider_name: str) -> tuple[JSONObject, str | None]:
        """The intent's args for a new remote request, and a rejection reason if it cannot even be formed."""
        admitted = log.record.admitted or {}
        source, target = admitted.get("source") or {}, admitted.get("target") or {}
        if log.record.kind != "publication":
            return {"run_id": run.run_id, "request_id": log.request_id, "kind": log.record.kind,
                    "source_commit": source.get("commit"), "tree": source.get("tree"),
                    "parameters": target.get("parameters") or {}, "provider": provider_name}, None
        reject: str | None = None
        try:
            commit = await asyncio.to_thread(
                commit_tree, Path(run.record.workspace), str(source["tree"]), str(source["commit"]),
                str(target.get("title") or f"jixu run {run.run_id}"), _git_time(log.record.admitted_at))
        except (GitError, OSError, KeyError, TypeError) as error:
            commit, reject = "", f"the verified tree cannot be committed: {error}"
        return {"run_id": run.run_id, "request_id": log.request_id, "origin": source.get("origin"),
                "branch": target.get("branch"), "base_branch": target.get("base_branch"), "commit": commit,
                "tree": source.get("tree"), "publisher": provider_name}, reject

    async def _remote(self, run: RunLog, log: RequestLog) -> None:
        """A remote request: intents (run journal, then request), preflight, dispatch markers, effect, receipts."""
        provider = self._provider(log)
        kind = log.record.kind
        task_kind = REQUEST_TASK_KINDS[kind]
        meta = RequestLog.meta(self.owner, run.run_id, log.request_id)
        reject: str | None = None
        if log.record.intent is None:
            args, reject = await self._intent_args(run, log, provider.name)
            journal = self._journal_intent(run, log.request_id)
            if journal is None:
                task_id = str(run.record.requests[log.request_id]["task_id"])
                journal_effect = new_id()
                run.append([NewEvent("task.requested", {
                    **_intent(task_kind, {**args, "task_id": task_id}, journal_effect),
                    "task_id": task_id, "attempt": 1}, meta)])
                journal = run.record.effects[journal_effect]
            log.append([NewEvent(f"{kind}.requested", _intent(
                provider.name, {**args, "journal_effect_id": journal["effect_id"]}, new_id()), meta)])
        intent = log.record.intent or {}
        args = dict(intent.get("args") or {})
        journal_effect_id = str(args.get("journal_effect_id"))
        context = self._context(run, log, args)
        if reject is None:
            try:
                await self._preflight(provider, context)
            except RemoteRejected as error:
                reject = error.message
        if reject is not None:
            rejected = Outcome.failed({"type": "rejected", "message": reject}, indeterminate=False)
            log.append([rejected.receipt(kind, intent["effect_id"], None, meta)])
            run.append([rejected.receipt("task", journal_effect_id, None, meta)])
            return
        journal = run.record.effects[journal_effect_id]
        fence = self._claim(log)

        async def dispatch() -> None:
            # The dispatch marker of the request decides who performs it: appended after the head we read, it
            # fails with ConcurrencyError for every other worker. It names the claim (and the process holding it)
            # that keeps the request in progress until its receipt. Then the run's own marker.
            log.append([marker(kind, intent["effect_id"], 1, intent, meta, owner=fence.owner, epoch=fence.epoch,
                               process=process_identity())])
            run.append([marker("task", journal_effect_id, 1, {**journal, "name": task_kind}, meta,
                               task_id=journal["task_id"])])

        async def call() -> Outcome:
            evidence = await self._perform(provider, context)
            return Outcome.completed({"result": {**evidence, "observed_at": time.time()}})

        def classify(error: Exception) -> Outcome:
            # After dispatch nothing the provider says proves absence: the outcome stays unknown.
            return Outcome.failed({"type": f"{task_kind}_failed", "exception": type(error).__name__,
                                   "message": (error.message if isinstance(error, JixuError) else str(error))[:2000]},
                                  indeterminate=True)

        async def receipts(outcome: Outcome) -> None:
            run.append([outcome.receipt("task", journal_effect_id, 1, meta)])  # the journal first, then the request
            log.append([outcome.receipt(kind, intent["effect_id"], 1, meta)])

        session, me = Session(self.store, fence, DEFAULT_LEASE_TTL), asyncio.current_task()
        try:
            async with session:  # renewed while it runs, given back at its end
                await perform(dispatch=dispatch, call=call, classify=classify, record=receipts)
        except asyncio.CancelledError:
            lost = session.cancelled_by_loss(me)
            if lost is None:
                raise
            # The claim lapsed (this process was held past it) and the heartbeat cut the call off: it is recorded
            # with an unknown outcome, and this process says so instead of a bare cancellation.
            raise OwnershipLost(f"request {log.request_id}: this process lost its claim on the request while the "
                                f"provider worked ({lost.message}); the call was cut off and its outcome is unknown: "
                                "inspect the provider, then resolve or reconcile it", request_id=log.request_id) from lost

    def _claim(self, log: RequestLog) -> Fence:
        """This process's claim on carrying the request out (:class:`~jixu.errors.RequestOwned` while another's is
        live): while it lives, the request shows in progress and nothing inspects, resolves or reconciles it."""
        # Named for this process alone: two processes under one owner name (the default --owner) would share one
        # claim, and the one whose dispatch lost the race would give back the other's.
        holder = f"{self.owner}:{os.getpid()}"
        try:
            return acquire_claim(self.store, request_lease_key(log.request_id), holder, DEFAULT_LEASE_TTL)
        except LeaseHeld as error:
            raise RequestOwned(f"request {log.request_id} is being carried out by another process: "
                               f"{error.message}", request_id=log.request_id) from error

    async def _cancel(self, run: RunLog, log: RequestLog, timeout: float) -> None:
        meta = RequestLog.meta(self.owner, run.run_id, log.request_id)
        if log.record.intent is None:
            log.append([NewEvent("cancellation.requested", _intent(
                "cancel_run", {"run_id": run.run_id, "request_id": log.request_id}, new_id()), meta)])
        intent = log.record.intent or {}
        if run.record.finished is not None and not finished_by(run, log.request_id):
            log.append([Outcome.failed({"type": "rejected", "message": "the run already finished as "
                                        f"{run.record.finished.get('outcome')}"}, indeterminate=False).receipt(
                "cancellation", intent["effect_id"], None, meta)])
            return
        log.append([marker("cancellation", intent["effect_id"], 1, intent, meta)])
        self._finish_run(run, log)
        await self._finish_drain(run, log, timeout)

    async def _finish_drain(self, run: RunLog, log: RequestLog, timeout: float) -> None:
        drained = await self._await_drain(run, log.request_id, timeout)
        if drained is not None:
            self.complete_cancellation(run, log)

    def complete_cancellation(self, run: RunLog, log: RequestLog | None = None) -> None:
        """Record the cancellation request's receipt once the run's journal holds its drain receipt."""
        request_id = (run.record.finished or {}).get("request_id")
        drained = None if not request_id else drained_receipt(run, str(request_id))
        if drained is None:
            return
        log = log or RequestLog(self.store, str(request_id))
        log.sync()
        intent = log.record.intent
        if intent is None or log.record.receipt is not None:
            return
        finished = run.record.finished or {}
        with contextlib.suppress(ConcurrencyError, ReceiptConflict):  # someone recorded its receipt meanwhile
            log.append([Outcome.completed({"result": {
                "drained": True, "drained_seq": drained["seq"], "drained_by": drained.get("by"),
                "run_outcome": finished.get("outcome"), "finished_by_request": finished.get("request_id")}}).receipt(
                "cancellation", intent["effect_id"], 1, RequestLog.meta(self.owner, run.run_id, log.request_id))])

    async def _await_drain(self, run: RunLog, request_id: str, timeout: float) -> JSONObject | None:
        """Until ``timeout``: stop what the run's recorded processes still run (a cancellation ends them,
        whoever executes the run), and record ``run.drained`` once the executor is provably gone and nothing
        of the run remains (:mod:`jixu.runs.requests.drain`); the receipt, or None."""
        deadline = time.monotonic() + timeout
        while True:
            run.sync()
            drained = drained_receipt(run, request_id)
            if drained is not None:
                return drained
            stopped = await asyncio.to_thread(stop_leftovers, run, by=self.owner, trigger="cancellation",
                                            grace=self.stop_grace)
            drained, _why = record_drain(self.store, run, request_id, by=self.owner, trigger="execute",
                                         stopped=stopped)
            if drained is not None:
                return drained
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(self.poll_interval)

