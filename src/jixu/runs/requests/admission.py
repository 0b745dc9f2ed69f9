"""Admission: the rules a publication, a remote task or a cancellation must pass before it is recorded."""

from __future__ import annotations

from jixu.errors import (
    ConcurrencyError,
    InvalidInput,
    RequestStateError,
    RunStateError,
    UnknownProvider,
)
from jixu.kernel import record
from jixu.ledger import NewEvent, new_id
from jixu.ledger.encoding import JSONObject, canonical_text
from jixu.ledger.store import check_delay, check_text
from jixu.runs.journal import RunLog
from jixu.runs.remote import REMOTE_TASK_KINDS
from jixu.runs.requests.base import RequestService
from jixu.runs.requests.log import RequestLog
from jixu.runs.requests.status import (
    MAX_PUBLICATION_ATTEMPTS,
    REMOTE_REQUEST_KINDS,
    request_stream,
    request_work_key,
)
from jixu.runs.workspace import check_branch


class Admission(RequestService):
    """Admit execution requests (the part of :class:`~jixu.runs.requests.ExecutionRequests` that records them)."""

    def _admit(self, run: RunLog, kind: str, actor: str, source: JSONObject, target: JSONObject,
               attempt: int, extra: JSONObject | None = None, *, delay: float = 0.0) -> str:
        request_id = new_id()
        task_id = new_id() if kind in REMOTE_REQUEST_KINDS else None
        meta = RequestLog.meta(actor, run.run_id, request_id)
        admitted: JSONObject = {"request_id": request_id, "run_id": run.run_id, "project": run.record.project,
                                "kind": kind, "attempt": attempt, "actor": actor, "source": source,
                                "target": target, **(extra or {})}
        # The request's own stream first: if the process stops before the journal names it, the orphan
        # stream is never executed or listed (everything starts from the run's journal).
        record(self.store, request_stream(request_id), [NewEvent("request.admitted", admitted, meta)], 0)
        # Named by the journal and queued in one transaction: an admitted request is never left without its
        # queue row (a worker carries it out even if this process stops now).
        run.append([NewEvent("run.request_admitted", {
            "request_id": request_id, "kind": kind, "attempt": attempt, "actor": actor, "task_id": task_id,
            "target": target}, meta)], enqueue=(request_work_key(request_id), run.record.project), delay=delay)
        return request_id

    def _history(self, run: RunLog, kind: str) -> list[tuple[str, str]]:
        return [(request_id, RequestLog(self.store, request_id).status()[0])
                for request_id, data in run.record.requests.items() if data.get("kind") == kind]

    def _admission_guard(self, run: RunLog, kind: str) -> tuple[list[tuple[str, str]], JSONObject]:
        """The rules every remote request shares; the kind's history and the admitted source."""
        record, run_id = run.record, run.run_id
        finished = record.finished or {}
        if finished.get("outcome") != "succeeded" or record.problems:
            raise RequestStateError(f"run {run_id} has not succeeded ({finished.get('outcome') or 'unfinished'}); "
                                    f"only a succeeded run's verified source is used for a {kind}", run_id=run_id)
        authority = self._authority(run)
        if not authority["ok"]:
            raise RequestStateError(f"run {run_id} cannot be used for a {kind}: {authority['reason']}",
                                    run_id=run_id)
        history = self._history(run, kind)
        open_ = [(rid, status) for rid, status in history if status in ("pending", "needs_reconciliation", "corrupt")]
        if open_:
            request_id, status = open_[0]
            what = ("is corrupt: it may have taken effect and nothing acts on it, so no other attempt is admitted; "
                    "an operator checks the outside system (a corrupt stream is evidence for no one)"
                    if status == "corrupt" else "is still unresolved; reconcile it before admitting another attempt")
            raise RequestStateError(f"{kind} request {request_id} of run {run_id} {what}", run_id=run_id,
                                    request_id=request_id, request_status=status)
        done = [rid for rid, status in history if status == "succeeded"]
        if done:
            raise RequestStateError(f"run {run_id} already had a successful {kind} (request {done[0]}); it was "
                                    f"already {'published' if kind == 'publication' else 'done'}", run_id=run_id,
                                    request_id=done[0])
        if len(history) >= MAX_PUBLICATION_ATTEMPTS:
            raise RequestStateError(f"run {run_id} already had {len(history)} {kind} attempts (the limit is "
                                    f"{MAX_PUBLICATION_ATTEMPTS}); retry the run instead", run_id=run_id)
        evidence = finished.get("evidence") or {}
        verified = evidence.get("source") or {}
        source = {"origin": record.source.get("origin"), "commit": record.source.get("commit"),
                  "tree": verified.get("tree"), "verify_effect_id": evidence.get("verify_effect_id")}
        return history, source

    def admit_remote(self, run_id: str, kind: str, *, provider: str, parameters: JSONObject | None = None,
                     actor: str | None = None) -> str:
        """Admit a ``deploy``, ``rollback`` or ``knowledge_write`` of a succeeded run; the request id.

        The same rules as a publication: the project's current authority, no
        unresolved or successful earlier request of that kind, at most
        :data:`MAX_PUBLICATION_ATTEMPTS`. ``parameters`` (a JSON object, e.g.
        the environment or the version to roll back to) reach the provider.
        """
        actor = actor or self.actor
        check_text(actor, "actor", 200, required=True)
        if kind not in REMOTE_TASK_KINDS:
            raise InvalidInput(f"kind {kind!r} must be one of {list(REMOTE_TASK_KINDS)}", field="kind")
        chosen = self.remotes.get(provider) if isinstance(provider, str) else None
        if chosen is None:
            raise UnknownProvider(f"no remote provider named {provider!r} is configured; configured: "
                                  f"{sorted(self.remotes)}", field="provider", provider=provider)
        if parameters is not None and not isinstance(parameters, dict):
            raise InvalidInput("parameters must be a JSON object", field="parameters")
        canonical_text(parameters or {}, path="parameters")
        run = RunLog(self.store, run_id)
        run.open_to_act()
        for _ in range(5):
            history, source = self._admission_guard(run, kind)
            target = {"provider": provider, "provider_kind": chosen.kind, "settings": chosen.settings(),
                      "parameters": parameters or {}}
            try:
                return self._admit(run, kind, actor, source, target, len(history) + 1,
                                   {"retry_of": history[-1][0] if history else None,
                                    "earlier_unknown": [rid for rid, status in history if status == "abandoned"]})
            except ConcurrencyError:
                run.sync()
        raise RequestStateError(f"run {run_id}'s journal kept moving while admitting a {kind}; try again",
                                run_id=run_id)

    def admit_publication(self, run_id: str, *, publisher: str, branch: str | None = None,
                          base_branch: str | None = None, title: str | None = None, body: str | None = None,
                          actor: str | None = None) -> str:
        """Admit publishing a succeeded run's verified source; the request id (a worker executes it).

        :class:`~jixu.errors.RequestStateError` when the run did not succeed,
        the project's authority changed, an earlier publication is unresolved
        or succeeded, or :data:`MAX_PUBLICATION_ATTEMPTS` were admitted.
        """
        actor = actor or self.actor
        check_text(actor, "actor", 200, required=True)
        check_text(title, "title", 500)
        check_text(body, "body", 20_000)
        if publisher not in self.publishers:
            raise UnknownProvider(f"no publisher named {publisher!r} is configured; configured: "
                                  f"{sorted(self.publishers)}", field="publisher", publisher=publisher)
        run = RunLog(self.store, run_id)
        run.open_to_act()
        branch = check_branch(branch or f"jixu/{run_id}")
        for _ in range(5):
            record = run.record
            history, source = self._admission_guard(run, "publication")
            chosen = self.publishers[publisher]
            target = {"publisher": publisher, "publisher_kind": chosen.kind, "settings": chosen.settings(),
                      "branch": branch, "base_branch": base_branch or str(self._default_branch(run)),
                      "title": title or f"jixu run {run_id}: {record.brief[:200]}",
                      "body": body or f"Published by jixu from run {run_id}.\n\nBrief:\n{record.brief[:5000]}"}
            try:
                return self._admit(run, "publication", actor, source, target, len(history) + 1,
                                   {"retry_of": history[-1][0] if history else None,
                                    "earlier_unknown": [rid for rid, status in history if status == "abandoned"]})
            except ConcurrencyError:
                run.sync()  # another admission raced this one: look at the history again
        raise RequestStateError(f"run {run_id}'s journal kept moving while admitting a publication; try again",
                                run_id=run_id)

    def admit_cancellation(self, run_id: str, *, reason: str | None = None, actor: str | None = None,
                           delay: float = 0.0) -> str:
        """Admit cancelling an unfinished run; the request id.

        ``delay``: seconds of store time before a worker may take the request from the queue. A caller that
        carries the request out at once gives itself that head start (so its answer is the cancellation's,
        not a worker's half-done one); the queue row is the backstop should it stop first.
        """
        actor = actor or self.actor
        check_text(actor, "actor", 200, required=True)
        check_text(reason, "reason", 10_000)
        delay = check_delay(delay)  # before anything is written (the request's stream comes first)
        run = RunLog(self.store, run_id)
        run.open_to_act()
        for _ in range(5):
            finished = run.record.finished
            if finished is not None:
                raise RunStateError(f"run {run_id} is already {finished.get('outcome')} "
                                    f"({finished.get('reason')})", run_id=run_id, status=finished.get("outcome"))
            for request_id, data in run.record.requests.items():
                status = RequestLog(self.store, request_id).status()[0] if data.get("kind") == "cancellation" else ""
                if status in ("pending", "needs_reconciliation"):
                    settle = (f"jixu runs execute-request STORE {run_id} {request_id}" if status == "pending" else
                              f"jixu runs reconcile-execution-request STORE {run_id} {request_id} "
                              "--reconciliation-id HEX")
                    raise RequestStateError(f"cancellation request {request_id} of run {run_id} is still open "
                                            f"({status}); carry it out instead of admitting another: `{settle}`",
                                            run_id=run_id, request_id=request_id, command=settle)
            try:
                return self._admit(run, "cancellation", actor, {"origin": run.record.source.get("origin"),
                                                                "commit": run.record.source.get("commit")},
                                   {"reason": reason or f"cancelled by {actor}"}, 1, delay=delay)
            except ConcurrencyError:
                run.sync()
        raise RequestStateError(f"run {run_id}'s journal kept moving while admitting a cancellation; try again",
                                run_id=run_id)

