"""The run engine: the :class:`Runs` service that creates, executes and operates runs.

Durability rules (the same as threads'):

* Every task attempt is an effect of kind ``task``: its intent
  (``task.requested``) is recorded before anything happens, its dispatch marker
  (``task.dispatched``) immediately before the work, its receipt
  (``task.completed`` with the evidence observed, or ``task.failed``) after.
* What happens next is decided by the pure :func:`~jixu.runs.projection.decide`
  from the journal and the RecoveryResolver's analysis; status is derived the
  same way (:func:`~jixu.runs.projection.derive_status`), never stored.
* One process executes a run at a time: it holds the run's lease
  (``run/<id>/owner``: owner name, TTL, renewed every TTL/3 against the store's
  clock) and appends every event of its session fenced by it
  (``run.claimed`` opens the session). A process restarted under the same owner
  name reclaims the lease at once (epoch + 1); another owner only after it
  expired. A fenced-out process stops with :class:`~jixu.errors.OwnershipLost`.
* A session starts by checking the workspace against the journal; a mismatch
  is recorded (``run.reconciled``, outcome ``mismatch``) and nothing runs.
* Operator operations (:meth:`Runs.resume`, :meth:`Runs.handoff`,
  :meth:`Runs.retry`, :meth:`Runs.cancel`) validate everything first: bad input
  raises a typed error and writes nothing. They record decisions; running is
  :meth:`Runs.execute`'s job (or a worker's, for runs put in the work queue
  with :func:`jixu.scheduling.submit_run`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import socket
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from jixu.errors import (
    ConcurrencyError,
    FencingError,
    GitError,
    InvalidInput,
    JixuError,
    LeaseHeld,
    MalformedEvent,
    OwnershipLost,
    ProjectCorrupt,
    ProjectNotFound,
    ProviderMismatch,
    ProviderTestFailed,
    RunOwned,
    RunStateError,
    UnknownProvider,
    WorkspaceMismatch,
)
from jixu.kernel import (
    DEFAULT_LEASE_TTL,
    Outcome,
    Session,
    chain_with_recorded_break,
    check_backoff,
    claim_stream,
    dead_holder,
    drive,
    marker,
    own_lease,
    pause_delay,
    perform,
    record,
    sleep_until,
)
from jixu.ledger import Fence, NewEvent, Store, new_id
from jixu.ledger.encoding import JSONObject, canonical_text, content_hash
from jixu.ledger.ids import is_valid_id
from jixu.ledger.store import check_owner, check_text, check_ttl
from jixu.recovery import Analysis
from jixu.recovery.resolutions import admit_resolution, resolution_body
from jixu.runs.checks import run_checks
from jixu.runs.journal import RunLog
from jixu.runs.model import (
    FINISHED,
    LOCAL_TASKS,
    MAX_BRIEF_CHARS,
    RUN_PREFIX,
    TASK_SEMANTICS,
    PlanView,
    RunState,
    get_project,
    run_lease_key,
    run_stream,
    run_work_key,
)
from jixu.runs.orphans import still_running, stop_open, survey
from jixu.runs.processes import DEFAULT_GRACE_S, ProcessHook
from jixu.runs.projection import (
    AutoResume,
    Dispatch,
    Finish,
    Pause,
    RequestTask,
    Revise,
    RunRecord,
    Stop,
    build_state,
    compare,
    decide,
    derive_status,
    expected_workspace,
    plan_view,
)
from jixu.runs.providers import ImplementContext, ImplementResult, Provider, ProviderError, provider_snapshot
from jixu.runs.publication import GitPublisher, Publisher
from jixu.runs.remote import RemoteProvider
from jixu.runs.requests import DEFAULT_DRAIN_TIMEOUT, ExecutionRequests, ExecutionRequestView
from jixu.runs.workspace import changes, clone, inspect, resolve_source, tree_of

_CONFLICT_RETRIES = 5
CANCEL_HEAD_START = 10.0
"""Seconds a cancelling caller has to carry its request out before a worker may take it from the queue."""
_INTERRUPTED = Outcome.failed({"type": "interrupted", "message": "the worker stopped while the task ran"},
                              indeterminate=True)


def _unexpected(error: Exception) -> Outcome:
    """The receipt of a task whose work raised what it does not expect: it may have done part of it."""
    return Outcome.failed({"type": "exception", "exception": type(error).__name__, "message": str(error)[:2000]},
                          indeterminate=True)


def default_run_owner() -> str:
    """An owner name stable across restarts on this machine: ``runs@<hostname>``."""
    return f"runs@{socket.gethostname()}"


def _allowed(path: str, globs: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(path, glob) for glob in globs)


def _json_or_repr(value: Any) -> Any:
    try:
        canonical_text(value)
    except MalformedEvent:
        return {"unencodable": repr(value)[:2000]}
    return value


class Runs:
    """Create, execute, inspect and operate runs (async; one instance per process and owner name).

    ``providers`` maps each configured provider's name to it (the key must
    equal ``provider.name``), ``publishers`` each publication provider's
    (default: ``{"git": GitPublisher()}``), ``remotes`` each deploy /
    rollback / knowledge-write provider's (e.g. a :class:`~jixu.runs.remote.CommandRemote`). ``owner`` names this process for
    the run lease (stable across restarts, so a restarted process reclaims its
    runs). With ``wait_automatic_pauses=False`` :meth:`execute` returns at an
    automatic pause instead of sleeping it out (a worker requeues the run until
    the pause's ``resume_at``).
    """

    def __init__(self, store: Store, workspace_root: Path | str, providers: Mapping[str, Provider], *,
                 owner: str | None = None, lease_ttl: float = DEFAULT_LEASE_TTL, actor: str = "jixu",
                 retry_backoff: float = 1.0, retry_backoff_cap: float = 60.0,
                 check_env: Mapping[str, str] | None = None, publishers: Mapping[str, Publisher] | None = None,
                 remotes: Mapping[str, RemoteProvider] | None = None, wait_automatic_pauses: bool = True,
                 drain_timeout: float = DEFAULT_DRAIN_TIMEOUT, stop_grace: float = DEFAULT_GRACE_S) -> None:
        if not isinstance(store, Store):
            raise InvalidInput("store must be a jixu Store", field="store")
        for name, provider in providers.items():
            if getattr(provider, "name", None) != name:
                raise InvalidInput(f"provider configured as {name!r} calls itself {getattr(provider, 'name', None)!r};"
                                   " the key must be the provider's name", field="providers")
        self.store = store
        self.workspace_root = Path(workspace_root).expanduser().resolve()
        self.providers: dict[str, Provider] = dict(providers)
        self.owner = check_owner(owner or default_run_owner())
        self.lease_ttl = check_ttl(lease_ttl)
        check_text(actor, "actor", 200, required=True)
        self.actor = actor
        self.retry_backoff = check_backoff("retry_backoff", retry_backoff)
        self.retry_backoff_cap = check_backoff("retry_backoff_cap", retry_backoff_cap)
        self.check_env = dict(check_env) if check_env is not None else None
        self.wait_automatic_pauses = bool(wait_automatic_pauses)
        chosen = dict(publishers) if publishers is not None else {"git": GitPublisher()}
        for name, publisher in chosen.items():
            if getattr(publisher, "name", None) != name:
                raise InvalidInput(f"publisher configured as {name!r} calls itself {getattr(publisher, 'name', None)!r}",
                                   field="publishers")
        for name, remote in (remotes or {}).items():
            if getattr(remote, "name", None) != name:
                raise InvalidInput(f"remote provider configured as {name!r} calls itself "
                                   f"{getattr(remote, 'name', None)!r}", field="remotes")
        self.requests = ExecutionRequests(store, chosen, owner=self.owner, actor=actor, remotes=remotes,
                                          drain_timeout=drain_timeout, stop_grace=stop_grace)
        self.stop_grace = float(stop_grace)
        """Seconds between SIGTERM and SIGKILL when an earlier attempt's processes are stopped."""
        self._executing: set[str] = set()

    # --- reading ---------------------------------------------------------------------------------

    def _load(self, run_id: str) -> RunLog:
        return RunLog(self.store, run_id)

    def _ownership(self, log: RunLog) -> tuple[str, JSONObject | None]:
        lease = self.store.get_lease(run_lease_key(log.run_id))
        if lease is None:
            return ("live" if log.run_id in self._executing else "stale" if log.record.claims else "none"), None
        now = self.store.now()
        expired = lease.expires_at <= now
        info: JSONObject = {"owner": lease.owner, "epoch": lease.epoch, "expires_at": lease.expires_at,
                            "heartbeat_at": lease.heartbeat_at, "released": lease.released, "expired": expired,
                            "store_now": now}
        if log.run_id in self._executing:
            return "live", info
        if lease.released:
            return "released", info
        if not expired:
            # This very owner name is not executing it here: a restarted process whose claim is stale. Another
            # owner's claim is stale too once its process is proven gone (the proof goes into the info).
            if own_lease(lease, self.owner, log.holder_process):
                return "stale", info
            proof = dead_holder(lease, log.holder_process)
            if proof is None:
                return "live", info
            return "stale", {**info, "owner_gone": proof}
        return "stale", info

    def _status(self, log: RunLog) -> tuple[str, str, Analysis, JSONObject | None]:
        analysis = log.analysis()
        ownership, info = self._ownership(log)
        found = log.corruption()
        if found is not None:  # the one corruption verdict: corrupt, whatever else the journal says
            return "corrupt", f"{found.summary()}; no operation acts on it", analysis, info
        status, reason = derive_status(log.record, analysis, ownership)
        return status, reason, analysis, info

    def _state(self, log: RunLog) -> RunState:
        status, reason, analysis, info = self._status(log)
        corrupt = log.corruption()
        state = build_state(log.record, analysis, status, reason, info, corrupt)
        return state if corrupt is not None else replace(state, blocked=self.blocker(log))

    def blocker(self, log: RunLog) -> JSONObject | None:
        """What stops every operation that would move the run on (execute, resume, hand off, retry, queue), or
        None: its project's stream does not verify (nothing acts under it), or a cancellation of the unfinished
        run is admitted and not settled (nothing acts as if it did not happen). The one rule the operations
        refuse by (:meth:`refuse_if_blocked`) and every surface offers its controls by."""
        return self._blocked(log)[0]

    def _blocked(self, log: RunLog) -> tuple[JSONObject | None, ProjectCorrupt | None]:
        """:meth:`blocker`'s answer, and the project's own refusal when that is what blocks (read once)."""
        try:
            get_project(self.store, log.record.project)
        except ProjectCorrupt as error:
            return {"by": "project_corrupt", "reason": error.message, "project": log.record.project,
                    "first_bad_seq": error.details.get("first_bad_seq")}, error
        except ProjectNotFound:
            pass  # a run's project is registered before it: nothing to say about one that is not
        found = self.requests.open_cancellation(log)
        if found is None:
            return None, None
        run_id, request_id = log.run_id, found.request_id
        if found.status == "pending":
            command = f"jixu runs execute-request STORE {run_id} {request_id}"
            why = "was admitted and is not carried out yet; a worker carries it out, or"
        elif found.status == "needs_reconciliation":
            command = f"jixu runs reconcile-execution-request STORE {run_id} {request_id} --reconciliation-id HEX"
            why = ("was dispatched without a receipt (the process cancelling the run stopped) and may have taken "
                   "effect; settle it from the run's journal (it completes the cancellation if the run never "
                   "finished):")
        else:
            command = f"jixu runs cancel STORE {run_id}"
            why = "is corrupt (nothing acts on it) and may have taken effect; cancel the run again:"
        return {"by": "cancellation", "reason": f"its cancellation request {request_id} {why} `{command}`",
                "request_id": request_id, "request_status": found.status, "command": command}, None

    async def state(self, run_id: str) -> RunState:
        """The run as it stands: status (derived), plan, tasks with the resolver's decisions, pauses, outcome."""
        return self._state(self._load(run_id))

    async def plan(self, run_id: str) -> PlanView:
        """The current plan revision with its tasks' states, and every earlier revision."""
        log = self._load(run_id)
        return plan_view(log.record, log.analysis())

    async def journal(self, run_id: str) -> tuple[list[JSONObject], bool]:
        """The run's hash-chained entries and whether the whole chain verifies."""
        log = self._load(run_id)
        entries = [event.to_dict() for event in self.store.read(log.stream)]
        return entries, log.corruption() is None

    async def list_runs(self, *, project: str | None = None) -> list[RunState]:
        """Every run (of ``project``), oldest first."""
        states: list[RunState] = []
        after = ""
        while True:
            page = self.store.list_streams(RUN_PREFIX, after=after, limit=1000)
            for info in page:
                run_id = info.stream[len(RUN_PREFIX):]
                if not is_valid_id(run_id):
                    continue
                log = self._load(run_id)
                if project is None or log.record.project == project:
                    states.append(self._state(log))
            if len(page) < 1000:
                return states
            after = page[-1].stream

    # --- creating --------------------------------------------------------------------------------

    def _provider_named(self, name: object) -> Provider:
        provider = self.providers.get(name) if isinstance(name, str) else None
        if provider is None:
            raise UnknownProvider(f"no provider named {name!r} is configured; configured: {sorted(self.providers)}",
                                  provider=name)
        return provider

    async def create_run(self, project: str, brief: str, *, provider: str, commit: str | None = None,
                         parent_run_id: str | None = None, knowledge: JSONObject | None = None,
                         actor: str | None = None, queue: bool = False) -> str:
        """Record a new run of ``brief`` on ``project``'s source with ``provider``; its id (nothing runs yet).

        Freezes the source (origin, the commit resolved on the origin: the
        default branch's tip, or ``commit`` — a ref or commit id), the provider
        snapshot, the project's current policy and its digest, and the
        workspace path ``<workspace_root>/<run_id>``; the initial plan is
        prepare -> implement -> verify. With ``queue`` the run's work item
        (``run/<id>`` in the project's group) is enqueued in the same
        transaction: a worker given providers carries it out, and a crash never
        leaves the run created but not queued.
        """
        check_text(brief, "brief", MAX_BRIEF_CHARS, required=True)
        chosen = self._provider_named(provider)
        actor = actor or self.actor
        check_text(actor, "actor", 200, required=True)
        if knowledge is not None:
            if not isinstance(knowledge, dict):
                raise InvalidInput("knowledge must be a JSON object", field="knowledge")
            canonical_text(knowledge, path="knowledge")
        found = get_project(self.store, project)
        if parent_run_id is not None:
            self._load(parent_run_id).open_to_act()  # lineage to a journal that does not hold vouches for nothing
        source = await asyncio.to_thread(resolve_source, found.origin, commit, found.default_branch)
        return self._create(found.name, brief, source, found.policy, found.policy_digest, chosen, parent_run_id,
                            None if knowledge is None else {"content": knowledge, "digest": content_hash(knowledge)},
                            actor, queue=queue)

    def _create(self, project_name: str, brief: str, source: JSONObject, policy: JSONObject, digest: str,
                provider: Provider, parent_run_id: str | None, knowledge: JSONObject | None, actor: str,
                run_id: str | None = None, *, queue: bool = False) -> str:
        """Record a new run's journal (``run.created``, the initial plan) under ``run_id`` (default: a new id),
        with its work item when ``queue``; :class:`~jixu.errors.ConcurrencyError` if that journal exists already."""
        run_id = new_id() if run_id is None else run_id
        workspace = self.workspace_root / run_id
        snapshot = provider_snapshot(provider, 1)
        tasks = [{"task_id": new_id(), "kind": "prepare", "params": {}},
                 {"task_id": new_id(), "kind": "implement", "params": {}},
                 {"task_id": new_id(), "kind": "verify", "params": {"checks": [c["name"] for c in policy["checks"]]}}]
        meta = {"actor": actor, "run_id": run_id}
        created = NewEvent("run.created", {
            "run_id": run_id, "project": project_name, "brief": brief, "source": source, "provider": snapshot,
            "policy": policy, "policy_digest": digest, "workspace": str(workspace), "parent_run_id": parent_run_id,
            "knowledge": knowledge}, meta)
        plan = NewEvent("plan.revised", {"revision": 1, "provider_revision": 1, "reason": "initial",
                                         "tasks": tasks}, meta)
        record(self.store, run_stream(run_id), [created, plan], 0,
               enqueue=(run_work_key(run_id), project_name) if queue else None)
        return run_id

    # --- executing -------------------------------------------------------------------------------

    def _provider_of(self, record: RunRecord) -> Provider:
        """The configured provider matching the run's current snapshot (typed error, nothing written, if none)."""
        snapshot = record.provider
        name = snapshot.get("name")
        provider = self.providers.get(name) if isinstance(name, str) else None
        if provider is None:
            raise ProviderMismatch(f"run {record.run_id} uses provider {name!r} (revision {snapshot.get('revision')}),"
                                   " which is not configured here; configure it or hand the run off",
                                   run_id=record.run_id, provider=name)
        current = provider_snapshot(provider, int(snapshot.get("revision") or 1))
        if current["digest"] != snapshot.get("digest"):
            raise ProviderMismatch(f"provider {name!r} is configured differently from run {record.run_id}'s frozen "
                                   "snapshot; hand the run off to record a fresh snapshot", run_id=record.run_id,
                                   provider=name)
        return provider

    async def execute(self, run_id: str) -> RunState:
        """Drive the run until it succeeds, fails, pauses for an operator, needs reconciliation or is interrupted.

        Runs nothing (and writes nothing) when the run is finished, paused for
        an operator, interrupted (resume it first) or needs reconciliation;
        :class:`~jixu.errors.RunOwned` while another process executes it;
        :class:`~jixu.errors.RunStateError` (nothing written) while a
        cancellation request of the run is admitted and not settled.
        Automatic pauses are waited out here (their recorded delay); with
        ``wait_automatic_pauses=False`` one not due yet returns at once
        without claiming the run (nothing written).
        """
        log = self._load(run_id)
        status = self._status(log)[0]
        if status == "corrupt":
            return self._state(log)  # nothing acts on a journal that does not hold
        if status == "running":
            raise RunOwned(f"run {run_id} is being executed by another process", run_id=run_id)
        pause = log.record.open_pause
        if not (status == "queued" or (status == "paused" and pause is not None and pause.get("automatic"))):
            return self._state(log)
        self.refuse_if_blocked(log, "executed", status)
        if self._waits_for_pause(decide(log.record, log.analysis())):
            return self._state(log)  # nothing to do before the pause ends: no claim, nothing written
        provider = self._provider_of(log.record)
        running = await asyncio.to_thread(survey, log.record)
        if running:
            raise still_running(run_id, running, "executed")
        fence = await self._claim(log)
        if fence is None:
            return self._state(log)
        me = asyncio.current_task()
        self._executing.add(run_id)
        session = Session(self.store, fence, self.lease_ttl)
        try:
            async with session:  # the heartbeat; the lease is released at the end
                if await self._workspace_matches(log, fence):
                    await self._loop(log, fence, provider)
        except asyncio.CancelledError:
            lost = session.cancelled_by_loss(me)
            if lost is not None:
                raise OwnershipLost(f"run {run_id}: this process lost the run's lease ({lost.message}); "
                                    "it stopped without writing anything more", run_id=run_id) from lost
            raise
        except FencingError as error:
            raise OwnershipLost(f"run {run_id}: this process no longer owns the run ({error.message}); it stopped "
                                "without writing anything more", run_id=run_id) from error
        finally:
            self._executing.discard(run_id)
        return self._state(log)

    async def _claim(self, log: RunLog) -> Fence | None:
        """Take the run's lease and record ``run.claimed``; ``None`` if the run stopped being runnable meanwhile."""
        try:
            claim = await claim_stream(log.writer, run_lease_key(log.run_id), self.owner, self.lease_ttl,
                                       lambda c: NewEvent("run.claimed", c.record(), log.meta(self.owner)),
                                       still_wanted=lambda: self._wanted(decide(log.record, log.analysis())),
                                       tries=_CONFLICT_RETRIES, holder_process=log.holder_process)
        except (FencingError, LeaseHeld) as error:
            raise RunOwned(f"run {log.run_id} changed hands while claiming it: {error.message}",
                           run_id=log.run_id) from error
        return None if claim is None else claim.fence

    def _waits_for_pause(self, action: Any) -> bool:
        """Whether ``action`` is an automatic resume not due yet that this service does not wait for
        (``wait_automatic_pauses=False``): whoever requeued the run comes back at ``resume_at``."""
        return isinstance(action, AutoResume) and not self.wait_automatic_pauses and action.resume_at is not None \
            and action.resume_at > self.store.now()

    def _wanted(self, action: Any) -> bool:
        """Whether claiming the run for ``action`` does anything (a claim for nothing is never written)."""
        return not isinstance(action, Stop) and not self._waits_for_pause(action)

    def refuse_if_blocked(self, log: RunLog, what: str, status: str) -> None:
        """Refuse, writing nothing, an operation that would move the run on while :meth:`blocker` names what
        stops it: :class:`~jixu.errors.ProjectCorrupt` for its project, :class:`~jixu.errors.RunStateError` naming
        the cancellation request in doubt and the command that settles it."""
        found, refusal = self._blocked(log)
        if refusal is not None:
            raise refusal
        if found is not None:
            raise RunStateError(f"run {log.run_id} cannot be {what}: {found['reason']}", run_id=log.run_id,
                                status=status, request_id=found.get("request_id"),
                                request_status=found.get("request_status"), command=found.get("command"))

    async def _loop(self, log: RunLog, fence: Fence, provider: Provider) -> None:
        async def next_action() -> Any:
            log.chain = chain_with_recorded_break(log.writer, log.chain, fresh=False)  # found elsewhere meanwhile
            if not log.chain.valid or log.chain_break is not None:
                return None  # nothing more is carried out on a journal known to be broken
            action = decide(log.record, log.analysis())
            if isinstance(action, Stop):
                self._record_drained(log, fence)
                return None
            if self._waits_for_pause(action):
                return None  # the pause stays open; whoever requeued the run comes back at resume_at
            return action

        async def act(action: Any) -> None:
            if isinstance(action, AutoResume):
                await self._auto_resume(log, fence, action)
            elif isinstance(action, RequestTask):
                self._request(log, fence, action)
            elif isinstance(action, Dispatch):
                await self._dispatch(log, fence, provider, action)
            elif isinstance(action, Pause):
                self._pause(log, fence, action)
            elif isinstance(action, Revise):
                self._revise(log, fence, action)
            elif isinstance(action, Finish):
                await self._finish(log, fence, action)

        await drive(log.writer, next_action, act, what=f"run {log.run_id}", run_id=log.run_id)

    def _record_drained(self, log: RunLog, fence: Fence) -> None:
        """A cancellation request finished the run while this process executed it: record that it stopped."""
        request_id = (log.record.finished or {}).get("request_id")
        if not request_id or any(d.get("request_id") == request_id for d in log.record.drained):
            return
        with contextlib.suppress(ConcurrencyError):
            log.append([NewEvent("run.drained", {"request_id": request_id, "by": self.owner, "owner": fence.owner,
                                                 "epoch": fence.epoch, "how": "the executing process stopped"},
                                 log.meta(self.owner))], fence)
        self.requests.complete_cancellation(log)

    async def _workspace_matches(self, log: RunLog, fence: Fence | None, trigger: str = "execute") -> bool:
        """Check the workspace against the journal; record a mismatch (``run.reconciled``) and return False."""
        event, outcome = await self._reconciliation(log, self.owner, trigger)
        if outcome == "mismatch":
            log.append([event], fence)
            return False
        return True

    async def _reconciliation(self, log: RunLog, actor: str, trigger: str) -> tuple[NewEvent, str]:
        expected = expected_workspace(log.record, log.analysis())
        evidence = await asyncio.to_thread(inspect, Path(log.record.workspace))
        outcome, details = compare(evidence, expected)
        return NewEvent("run.reconciled", {"evidence": evidence, "expected": expected, "outcome": outcome,
                                           "details": details, "actor": actor, "trigger": trigger},
                        log.meta(actor)), outcome

    # --- actions ---------------------------------------------------------------------------------

    async def _auto_resume(self, log: RunLog, fence: Fence, action: AutoResume) -> None:
        await sleep_until(self.store, action.resume_at)
        log.append([NewEvent("run.resumed", {"reason": "automatic", "actor": self.owner},
                             log.meta(self.owner))], fence)

    def _request(self, log: RunLog, fence: Fence, action: RequestTask) -> None:
        plan = log.record.plan or {}
        effect_id = new_id()
        args = {"task_id": action.task_id, "revision": plan.get("revision"), "attempt": action.attempt}
        log.append([NewEvent("task.requested", {
            "effect_id": effect_id, "name": action.kind, "args": args, "args_hash": content_hash(args),
            "semantics": TASK_SEMANTICS[action.kind], "idempotency_key": f"jixu:{effect_id}",
            "requires_approval": False, "task_id": action.task_id, "attempt": action.attempt,
        }, log.meta(self.owner))], fence)

    def _pause(self, log: RunLog, fence: Fence, action: Pause) -> None:
        delay = pause_delay(action.retry_after, action.retries_used, backoff=self.retry_backoff,
                            cap=self.retry_backoff_cap) if action.automatic else None
        now = self.store.now()
        log.append([NewEvent("run.paused", {
            "reason": action.reason, "automatic": delay is not None, "retry_after": action.retry_after,
            "delay": delay, "resume_at": None if delay is None else now + delay, "task_id": action.task_id,
            "effect_id": action.effect_id, "automatic_retries_used": action.retries_used,
        }, log.meta(self.owner))], fence)

    def _revise(self, log: RunLog, fence: Fence, action: Revise) -> None:
        record = log.record
        plan = record.plan or {"revision": 0, "tasks": []}
        repair = record.repairs_used + 1
        implement = {"task_id": new_id(), "kind": "implement",
                     "params": {"repair_of": action.repair_of.get("task_id"), "repair": repair}}
        verify = {"task_id": new_id(), "kind": "verify",
                  "params": {"checks": [c["name"] for c in record.policy.get("checks") or []],
                             "after": implement["task_id"]}}
        log.append([NewEvent("plan.revised", {
            "revision": int(plan["revision"]) + 1, "provider_revision": len(record.providers), "reason": action.reason,
            "tasks": [*plan["tasks"], implement, verify], "repair_of": action.repair_of,
        }, log.meta(self.owner))], fence)

    async def _finish(self, log: RunLog, fence: Fence, action: Finish) -> None:
        evidence = dict(action.evidence)
        if action.outcome == "succeeded":
            # Success is claimed only for the snapshot that was verified: look at the workspace once more.
            event, outcome = await self._reconciliation(log, self.owner, "finish")
            if outcome == "mismatch":
                log.append([event], fence)
                return
            evidence["final_workspace"] = {k: event.data["evidence"].get(k) for k in ("head", "tree", "dirty")}
        log.append([NewEvent("run.finished", {"outcome": action.outcome, "reason": action.reason,
                                              "evidence": evidence, "actor": self.owner},
                             log.meta(self.owner))], fence)

    async def _dispatch(self, log: RunLog, fence: Fence, provider: Provider, action: Dispatch) -> None:
        """One task attempt through the kernel: its marker durable first, then exactly one receipt."""
        record = log.record
        effect = record.effects[action.effect_id]
        meta = log.meta(self.owner)
        if action.kind not in LOCAL_TASKS:
            # Remote effects are completed by the execution-requests work; refuse before dispatch (a receipt).
            log.append([Outcome.failed({"type": "not_supported", "message": f"{action.kind} tasks are not executed "
                                        "by this engine"}, indeterminate=False).receipt(
                "task", action.effect_id, None, meta)], fence)
            return

        async def dispatch() -> None:
            log.append([marker("task", action.effect_id, action.attempt, {**effect, "name": action.kind}, meta,
                               task_id=action.task_id)], fence)

        async def call() -> Outcome:
            if action.kind == "prepare":
                phase, body = await self._prepare(record)
            elif action.kind == "implement":
                phase, body = await self._implement(record, provider, action,
                                                    self._process_hook(log, fence, action, f"provider {provider.name}"))
            else:
                phase, body = await self._verify(record, lambda name: self._process_hook(log, fence, action,
                                                                                         f"check {name}"))
            return Outcome.completed(body) if phase == "completed" else Outcome("failed", {**body, "indeterminate": False})

        async def receipt(outcome: Outcome) -> None:
            event = outcome.receipt("task", action.effect_id, action.attempt, meta)
            if outcome is _INTERRUPTED:
                with contextlib.suppress(JixuError):  # a lost lease: the process stops without it
                    log.append([event], fence)
            else:
                log.append([event], fence)

        await perform(dispatch=dispatch, call=call, classify=_unexpected, record=receipt, interrupted=_INTERRUPTED)

    def _process_hook(self, log: RunLog, fence: Fence, action: Dispatch, what: str) -> ProcessHook:
        """The hook that records a process group the attempt starts (``run.process_started``) before its
        program runs; a finished run (a cancellation came in) starts nothing more."""
        async def started(identity: JSONObject) -> None:
            event = NewEvent("run.process_started", {"effect_id": action.effect_id, "task_id": action.task_id,
                                                     "kind": action.kind, "attempt": action.attempt, "what": what,
                                                     "process": identity}, log.meta(self.owner))
            for _ in range(_CONFLICT_RETRIES):
                finished = log.record.finished
                if finished is not None:
                    raise RunStateError(f"run {log.run_id} finished ({finished.get('outcome')}) while {action.kind} "
                                        f"task {action.task_id} ran: {what} is not started", run_id=log.run_id)
                try:
                    log.append([event], fence)
                    return
                except ConcurrencyError:
                    log.sync()  # another writer (a cancellation, say) moved the journal: look again
            raise RunStateError(f"run {log.run_id}'s journal kept moving; {what} is not started", run_id=log.run_id)

        return started

    async def _prepare(self, record: RunRecord) -> tuple[str, JSONObject]:
        workspace, source = Path(record.workspace), record.source

        def work() -> JSONObject:
            adopted = workspace.exists()
            if adopted:
                seen = inspect(workspace)
                if not (seen["git_root"] == str(workspace) and seen["origin"] == source["origin"]
                        and seen["head"] == source["commit"] and seen["dirty"] is False):
                    raise GitError(f"workspace {workspace} exists but is not a clean checkout of {source['commit']} "
                                   "from the authorized origin; refusing to touch it", evidence=seen)
            else:
                clone(str(source["origin"]), str(source["commit"]), workspace)
            seen = inspect(workspace)
            return {"git_root": seen["git_root"], "origin": seen["origin"], "head": seen["head"],
                    "tree": seen["tree"], "adopted": adopted}

        try:
            return "completed", {"result": await asyncio.to_thread(work)}
        except (GitError, OSError) as error:
            message = error.message if isinstance(error, GitError) else f"{type(error).__name__}: {error}"
            return "failed", {"error": {"type": "prepare_failed", "message": message}}

    def _repair_evidence(self, record: RunRecord, task_id: str) -> JSONObject | None:
        """For a repair implementation: the failed checks' evidence recorded in its plan revision."""
        repair_of = (record.tasks.get(task_id) or {}).get("params", {}).get("repair_of")
        if not repair_of:
            return None
        for revision in reversed(record.revisions):
            evidence = revision.get("repair_of")
            if isinstance(evidence, dict) and evidence.get("task_id") == repair_of:
                return dict(evidence)
        return None

    async def _implement(self, record: RunRecord, provider: Provider, action: Dispatch,
                         started: ProcessHook) -> tuple[str, JSONObject]:
        workspace = Path(record.workspace)
        context = ImplementContext(run_id=record.run_id, brief=record.brief,
                                   attempt=int(record.effects[action.effect_id]["attempt"]),
                                   repair_of=self._repair_evidence(record, action.task_id),
                                   knowledge=record.knowledge, process_started=started)
        try:
            outcome = await provider.implement(workspace, context)
            if not isinstance(outcome, ImplementResult):
                raise TypeError(f"provider {provider.name!r} returned {type(outcome).__name__}, not an ImplementResult")
        except ProviderError as error:
            return "failed", {"error": {"type": "provider_error", "kind": error.kind, "retry_after": error.retry_after,
                                        "message": error.message, "provider": provider.name},
                              "workspace": await asyncio.to_thread(self._observe, workspace)}
        except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
            raise
        except Exception as error:
            return "failed", {"error": {"type": "exception", "exception": type(error).__name__,
                                        "message": str(error)[:2000], "provider": provider.name},
                              "workspace": await asyncio.to_thread(self._observe, workspace)}
        base = str(record.source["commit"])
        globs = [str(g) for g in record.policy.get("allowed_paths") or ["*"]]

        def observe() -> JSONObject:
            seen = inspect(workspace)
            diff = changes(workspace, base, str(seen["tree"]))
            return {"head": seen["head"], "tree": seen["tree"], **diff,
                    "disallowed_paths": [p for p in diff["changed_paths"] if not _allowed(p, globs)]}

        try:
            seen = await asyncio.to_thread(observe)
        except GitError as error:
            return "failed", {"error": {"type": "workspace_unreadable", "message": error.message}}
        provider_record = record.provider
        return "completed", {"result": {
            "summary": str(outcome.summary)[:10_000], "details": _json_or_repr(outcome.details), **seen,
            "provider": {"name": provider_record.get("name"), "revision": provider_record.get("revision")}}}

    @staticmethod
    def _observe(workspace: Path) -> JSONObject:
        seen = inspect(workspace)
        return {"head": seen["head"], "tree": seen["tree"]}

    async def _verify(self, record: RunRecord, started: Callable[[str], ProcessHook]) -> tuple[str, JSONObject]:
        workspace = Path(record.workspace)
        before = await asyncio.to_thread(self._observe, workspace)
        if before["tree"] is None:
            return "failed", {"error": {"type": "workspace_unreadable",
                                        "message": f"cannot read the source tree of {workspace}"}}
        results = await run_checks(list(record.policy.get("checks") or []), workspace, env=self.check_env,
                                   started=started)
        try:
            after = await asyncio.to_thread(tree_of, workspace)
        except GitError:
            after = None
        return "completed", {"result": {"head": before["head"], "tree": before["tree"], "tree_after": after,
                                        "checks": results, "passed": all(c["passed"] for c in results)}}

    # --- operator operations ------------------------------------------------------------------

    def _work_item(self, log: RunLog, queue: bool) -> tuple[str, str] | None:
        """The run's work item ``(key, group)`` to enqueue in the transaction of an operator's record, so a worker
        picks the decision up: with ``queue`` always (in the run's project), else only when the run is in the work
        queue already; None otherwise."""
        key = run_work_key(log.run_id)
        if queue:
            return key, log.record.project
        queued = self.store.get_work(key)
        return None if queued is None else (key, queued.group)

    def _refuse_unless_operable(self, log: RunLog, status: str, reason: str, analysis: Analysis, what: str) -> None:
        log.open_to_act()
        if status in FINISHED:
            raise RunStateError(f"run {log.run_id} is {status} ({reason}); a finished run cannot be {what}"
                                + ("; retry creates a new run" if status != "succeeded" else ""),
                                run_id=log.run_id, status=status)
        if status == "running":
            raise RunOwned(f"run {log.run_id} is being executed by another process; it cannot be {what} now",
                           run_id=log.run_id, status=status)
        self.refuse_if_blocked(log, what, status)
        if log.record.problems or analysis.has_corruption:
            raise RunStateError(f"run {log.run_id}'s journal is broken or contradicts itself ({reason}); it cannot be "
                                f"{what}", run_id=log.run_id, status=status)
        if analysis.requires_resolution:
            raise RunStateError(f"run {log.run_id} has remote tasks with unknown outcomes; establish them first",
                                run_id=log.run_id, status=status)

    async def resume(self, run_id: str, actor: str = "operator", *, note: str | None = None,
                     stop_agents: bool = False, queue: bool = False) -> RunState:
        """Continue a paused, interrupted or unreconciled run in place (then :meth:`execute` or
        :func:`jixu.scheduling.submit_run`).

        First reconciles the workspace against the journal (git root,
        authorized origin, HEAD, source tree) and records it
        (``run.reconciled``); a mismatch raises
        :class:`~jixu.errors.WorkspaceMismatch` and the run needs
        reconciliation. Otherwise records ``run.resumed`` (explicit): the
        workspace, brief, policy and provider revision are kept, the automatic
        retry budget is renewed. Finished or queued runs: :class:`RunStateError`.

        While a process an earlier attempt started (an agent whose worker
        died) still runs, or cannot be checked from this machine, resume
        refuses with :class:`~jixu.errors.AgentStillRunning` and writes
        nothing. With ``stop_agents`` it stops them first (SIGTERM, ``stop_grace``
        seconds, SIGKILL; ``run.process_stopped`` records each) and waits
        until none remains. ``queue``: the run's work item is (re)enqueued with ``run.resumed``, in one
        transaction (a worker then continues it).
        """
        check_text(actor, "actor", 200, required=True)
        check_text(note, "note", 10_000)
        log = self._load(run_id)
        status, reason, analysis, _info = self._status(log)
        self._refuse_unless_operable(log, status, reason, analysis, "resumed")
        if status == "queued":
            raise RunStateError(f"run {run_id} is queued ({reason}); there is nothing to resume: execute it or "
                                "submit it to the work queue", run_id=run_id, status=status)
        await self._no_earlier_agent(log, actor, stop_agents, "resumed")
        reconciled, outcome = await self._reconciliation(log, actor, "resume")
        if outcome == "mismatch":
            self._operate(log, "resumed", [reconciled], enqueue=self._work_item(log, False))
            raise WorkspaceMismatch(f"run {run_id}'s workspace does not match its journal: "
                                    f"{'; '.join(reconciled.data['details'])}. Nothing was run; restore the "
                                    "workspace and resume again, or cancel and retry", run_id=run_id,
                                    details=reconciled.data["details"])
        self._operate(log, "resumed", [reconciled, NewEvent("run.resumed", {
            "reason": "explicit", "actor": actor, "note": note, "previous_status": status}, log.meta(actor))],
                      enqueue=self._work_item(log, queue))
        return self._state(log)

    def _operate(self, log: RunLog, what: str, events: list[NewEvent], *, enqueue: tuple[str, str] | None) -> None:
        """Append an operator's operation decided on the journal as read; another writer moved it meanwhile (a
        second operator, a worker): :class:`~jixu.errors.RunStateError`, nothing recorded (the operation was
        decided on a state that is gone: look at the run again)."""
        try:
            log.append(events, enqueue=enqueue)
        except ConcurrencyError as error:
            log.sync()
            status, reason, _analysis, _info = self._status(log)
            raise RunStateError(f"run {log.run_id} changed while it was being {what} (it is {status} now: {reason}); "
                                f"nothing was recorded: look at it again", run_id=log.run_id,
                                status=status) from error

    async def _no_earlier_agent(self, log: RunLog, actor: str, stop: bool, what: str) -> None:
        """Refuse (:class:`~jixu.errors.AgentStillRunning`) while an earlier attempt's process runs; with
        ``stop``, stop what this machine can reach first and record it."""
        if not stop:
            running = await asyncio.to_thread(survey, log.record)
            if running:
                raise still_running(log.run_id, running, what)
            return
        events, remaining = await asyncio.to_thread(stop_open, log, by=actor, trigger="resume",
                                                    grace=self.stop_grace)
        for _ in range(3):
            if not events:
                break
            try:
                log.append(events)  # facts (the processes stopped): kept whatever another writer appended meanwhile
                break
            except ConcurrencyError:
                log.sync()
        else:
            raise RunStateError(f"run {log.run_id}'s journal kept moving while recording the processes stopped "
                                f"before it was {what}; look at it again", run_id=log.run_id)
        if remaining:
            raise still_running(log.run_id, remaining, what)

    async def handoff(self, run_id: str, provider: str, actor: str = "operator", *,
                      note: str | None = None, queue: bool = False) -> RunState:
        """Hand the run to ``provider`` (tested first): a new provider snapshot and plan revision.

        Earlier revisions, partial files, checks and policy stay as they are;
        the workspace is reconciled first (as in :meth:`resume`). An unknown
        provider (:class:`~jixu.errors.UnknownProvider`) or one whose test fails
        (:class:`~jixu.errors.ProviderTestFailed`) writes nothing. ``queue``: as in :meth:`resume`.
        """
        check_text(actor, "actor", 200, required=True)
        check_text(note, "note", 10_000)
        chosen = self._provider_named(provider)
        log = self._load(run_id)
        status, reason, analysis, _info = self._status(log)
        self._refuse_unless_operable(log, status, reason, analysis, "handed off")
        if status == "needs_reconciliation":
            raise RunStateError(f"run {run_id} needs reconciliation ({reason}); resume it once the workspace is "
                                "restored, then hand it off", run_id=run_id, status=status)
        try:
            tested = await chosen.test()
        except Exception as error:
            raise ProviderTestFailed(f"provider {provider!r} failed its test: {type(error).__name__}: {error}",
                                     provider=provider) from error
        if not tested.ok:
            raise ProviderTestFailed(f"provider {provider!r} failed its test: {tested.message}", provider=provider)
        log.sync()
        status, reason, analysis, _info = self._status(log)
        self._refuse_unless_operable(log, status, reason, analysis, "handed off")
        await self._no_earlier_agent(log, actor, False, "handed off")
        reconciled, outcome = await self._reconciliation(log, actor, "handoff")
        if outcome == "mismatch":
            self._operate(log, "handed off", [reconciled], enqueue=None)
            raise WorkspaceMismatch(f"run {run_id}'s workspace does not match its journal: "
                                    f"{'; '.join(reconciled.data['details'])}; nothing was handed off",
                                    run_id=run_id, details=reconciled.data["details"])
        record = log.record
        snapshot = provider_snapshot(chosen, len(record.providers) + 1)
        plan = record.plan or {"revision": 0, "tasks": []}
        meta = log.meta(actor)
        self._operate(log, "handed off", [
            reconciled,
            NewEvent("run.handed_off", {"provider": snapshot, "previous_provider": record.provider,
                                        "tested": {"ok": tested.ok, "message": tested.message}, "actor": actor,
                                        "note": note, "previous_status": status}, meta),
            NewEvent("plan.revised", {"revision": int(plan["revision"]) + 1, "provider_revision": snapshot["revision"],
                                      "reason": "handoff", "tasks": list(plan["tasks"])}, meta),
        ], enqueue=self._work_item(log, queue))
        return self._state(log)

    async def cancel(self, run_id: str, actor: str = "operator", *, reason: str | None = None) -> RunState:
        """Cancel the run through a cancellation request (see :mod:`jixu.runs.requests`); does not wait.

        The run finishes as ``cancelled`` at once. The request completes when
        no process executes the run any more: at once if none does, else when
        the executing process stops at its next step (it records
        ``run.drained``); until then the request is ``in_progress``.
        """
        request_id = self.requests.admit_cancellation(run_id, reason=reason, actor=actor, delay=CANCEL_HEAD_START)
        await self.requests.execute(request_id, drain_timeout=0)
        return self._state(self._load(run_id))

    async def resolve_task_outcome(self, run_id: str, effect_id: str, resolution: str, *,
                                   resolution_id: str | None = None, note: str | None = None,
                                   actor: str = "operator", queue: bool = False) -> RunState:
        """Record an operator's decision about a task whose outcome is unknown (SPEC 4.4 rules).

        For a local task (prepare, implement, verify) ``not_occurred`` lets the
        run try it again under a new effect id and ``abandoned_unknown``
        finishes the run as failed; ``occurred`` is refused: a local task's
        result is observed by running it, never asserted. Idempotent by
        ``resolution_id``; a changed body for the same id is a
        :class:`~jixu.errors.ResolutionConflict`. ``queue``: as in :meth:`resume`.
        """
        log = self._load(run_id)
        body = resolution_body(effect_id, resolution, new_id() if resolution_id is None else resolution_id, actor=actor, note=note)
        log.open_to_act()
        status = self._status(log)[0]
        if status == "running":
            raise RunOwned(f"run {run_id} is being executed by another process", run_id=run_id, status=status)
        decision = admit_resolution(log.analysis(), body, where=f"run {run_id}")
        if decision is None:
            return self._state(log)
        kind = log.record.kind_of(effect_id)
        if kind in LOCAL_TASKS and resolution == "occurred":
            raise InvalidInput(f"{kind} task {effect_id} is local: its outcome is observed by running it again "
                               "(resolve it as not_occurred) or given up (abandoned_unknown), never asserted",
                               field="resolution")
        if "request_id" in (log.record.tasks.get(str(log.record.effects.get(effect_id, {}).get("task_id"))) or {}
                            ).get("params", {}):
            raise InvalidInput(f"effect {effect_id} belongs to an execution request: reconcile the request, or "
                               "inspect the provider and resolve the request's outcome", field="effect_id")
        log.append([NewEvent(f"{decision.kind}.outcome_resolved", body, log.meta(actor))],
                   enqueue=self._work_item(log, queue))
        return self._state(log)

    # --- execution requests (see jixu.runs.requests) -----------------------------------------

    async def request_publication(self, run_id: str, *, publisher: str = "git", branch: str | None = None,
                                  base_branch: str | None = None, title: str | None = None,
                                  body: str | None = None, actor: str | None = None) -> str:
        """Admit publishing a succeeded run (put in the work queue); the request id."""
        return self.requests.admit_publication(run_id, publisher=publisher, branch=branch, base_branch=base_branch,
                                               title=title, body=body, actor=actor)

    async def request_remote(self, run_id: str, kind: str, *, provider: str, parameters: JSONObject | None = None,
                             actor: str | None = None) -> str:
        """Admit a ``deploy``, ``rollback`` or ``knowledge_write`` of a succeeded run (queued); the request id."""
        return self.requests.admit_remote(run_id, kind, provider=provider, parameters=parameters, actor=actor)

    async def execute_request(self, request_id: str) -> ExecutionRequestView:
        """Carry out a pending execution request (what a worker does with ``request/<id>`` work)."""
        return await self.requests.execute(request_id)

    async def execution_requests(self, run_id: str) -> list[ExecutionRequestView]:
        """The run's execution requests, oldest first."""
        return self.requests.of_run(run_id)

    async def state_and_requests(self, run_id: str) -> tuple[RunState, list[ExecutionRequestView]]:
        """:meth:`state` and :meth:`execution_requests` from one loading of the journal (what a page shows
        together, and what the Studio's live updates poll)."""
        log = self._load(run_id)
        return self._state(log), self.requests.of_log(log)

    async def execution_request(self, run_id: str, request_id: str) -> ExecutionRequestView:
        """One execution request of the run."""
        return self.requests.get(run_id, request_id)

    async def reconcile_execution_request(self, run_id: str, request_id: str, reconciliation_id: str, *,
                                          actor: str | None = None) -> JSONObject:
        """Settle a request from retained evidence only (see :meth:`ExecutionRequests.reconcile`)."""
        return self.requests.reconcile(run_id, request_id, reconciliation_id, actor=actor)

    async def inspect_remote(self, run_id: str, request_id: str, *, actor: str | None = None) -> JSONObject:
        """Ask the publisher, read-only, what it shows for the request; the finding is retained."""
        return await self.requests.inspect_remote(run_id, request_id, actor=actor)

    async def resolve_request_outcome(self, run_id: str, request_id: str, resolution: str, *,
                                      resolution_id: str | None = None, note: str | None = None,
                                      actor: str | None = None) -> ExecutionRequestView:
        """An operator's resolution of an unknown request, citing the retained inspection."""
        return self.requests.resolve_outcome(run_id, request_id, resolution, resolution_id=resolution_id,
                                             note=note, actor=actor)

    async def retry(self, run_id: str, actor: str = "operator", *, provider: str | None = None,
                    queue: bool = False) -> str:
        """A fresh run (new id, fresh clone) of a failed or cancelled run, once: same project, brief, source commit
        and frozen policy, with ``parent_run_id`` lineage. Nothing the failed run did is rolled back. ``queue``:
        the new run is enqueued with its creation (see :meth:`create_run`).

        The retry is recorded in the failed run's journal first (``run.retried``, naming the new run's id),
        at the journal's head, so of two racing retries one conflicts; the new run's journal is created after
        it. Any later retry, and the loser of a race, gets :class:`~jixu.errors.RunStateError` naming the run it
        was retried as (``retried_as``); only when that run's journal was never created (the process stopped in
        between) does a later retry create exactly that run (with the provider recorded) and return its id.
        """
        check_text(actor, "actor", 200, required=True)
        log = self._load(run_id)
        raced = False
        for _ in range(_CONFLICT_RETRIES):
            log.open_to_act()  # a retry takes its brief, source and policy from this journal: it must hold
            self.refuse_if_blocked(log, "retried", str((log.record.finished or {}).get("outcome")))
            if log.record.retried is not None:
                # Having lost a race to it, the winner is creating its run now: this call is the second retry.
                return self._complete_retry(log, create=not raced, queue=queue)
            status, reason, _analysis, _info = self._status(log)
            if status not in ("failed", "cancelled"):
                raise RunStateError(f"run {run_id} is {status} ({reason}); only a failed or cancelled run is retried "
                                    "(resume continues a paused or interrupted one)", run_id=run_id, status=status)
            chosen = self._provider_named(provider if provider is not None else log.record.provider.get("name"))
            child_id = new_id()
            try:
                log.append([NewEvent("run.retried", {"child_run_id": child_id, "provider": chosen.name,
                                                     "actor": actor, "previous_status": status}, log.meta(actor))])
            except ConcurrencyError:
                log.sync()  # another writer moved the journal: a racing retry is then found above
                raced = True
                continue
            with contextlib.suppress(ConcurrencyError):  # a later retry completed it meanwhile: it is this one
                self._retry_child(log, queue=queue)
            return child_id
        raise RunStateError(f"run {run_id}'s journal kept moving while retrying it; try again", run_id=run_id)

    def _complete_retry(self, log: RunLog, *, create: bool, queue: bool) -> str:
        """For a run already retried: with ``create``, create the run its ``run.retried`` names if its journal was
        never created (and return its id); else :class:`~jixu.errors.RunStateError` naming it."""
        child_id = str((log.record.retried or {}).get("child_run_id"))
        if create and self.store.stream_info(run_stream(child_id)) is None:
            try:
                return self._retry_child(log, queue=queue)
            except ConcurrencyError:
                pass  # another caller created it first: this call is the second retry
        status = (log.record.finished or {}).get("outcome")
        raise RunStateError(f"run {log.run_id} was already retried as run {child_id}; a {status} run is retried "
                            f"once (retry {child_id} if it fails too)", run_id=log.run_id, status=status,
                            retried_as=child_id)

    def _retry_child(self, log: RunLog, *, queue: bool) -> str:
        """Create the run the journal's ``run.retried`` names, from the failed run's frozen brief, source and
        policy (:class:`~jixu.errors.ConcurrencyError` if its journal exists already)."""
        record, retried = log.record, log.record.retried or {}
        created = record.created or {}
        knowledge = created.get("knowledge")
        return self._create(record.project, record.brief, record.source, record.policy,
                            str(created.get("policy_digest")), self._provider_named(retried.get("provider")),
                            log.run_id, knowledge if isinstance(knowledge, dict) else None,
                            str(retried.get("actor") or self.actor), run_id=str(retried.get("child_run_id")),
                            queue=queue)


__all__ = ["DEFAULT_LEASE_TTL", "RunLog", "Runs", "default_run_owner"]
