"""The runs vocabulary: projects and their policies, stream and key names, task kinds, public views.

A project (stream ``project/<name>``) names an authorized git origin and a
policy: the checks a run must pass, the paths it may change, its limits. A run
freezes the policy content it started with (``run.created``); later updates
(``project.policy_updated``) never change a run.

Policy (normalised by :func:`validate_policy`)::

    {"checks": [{"name": "tests", "argv": ["python", "-m", "pytest", "-q"], "timeout_s": 600}],
     "allowed_paths": ["*"],                       # fnmatch globs; "*" also crosses "/"
     "limits": {"max_repair_attempts": 1, "check_timeout_s": 600}}
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Final

from jixu.errors import InvalidInput, InvalidPolicy, ProjectCorrupt, ProjectExists, ProjectNotFound
from jixu.kernel import record
from jixu.kernel.loop import AUTOMATIC_PAUSES, MAX_AUTOMATIC_RETRIES, OPERATOR_PAUSES
from jixu.ledger import NewEvent, Store
from jixu.ledger.encoding import JSONObject, canonical_text, content_hash
from jixu.ledger.event import Event
from jixu.ledger.projection import fold_verified
from jixu.ledger.store import check_text
from jixu.recovery import Analysis
from jixu.recovery.corruption import Corruption, corruption
from jixu.runs.workspace import check_origin, origin_refs
from jixu.runs.workspace import default_branch as origin_branch

RUN_PREFIX: Final = "run/"
PROJECT_PREFIX: Final = "project/"

TASK_SEMANTICS: Final[dict[str, str]] = {
    "prepare": "idempotent",
    "implement": "idempotent",
    "verify": "read_only",
    "publish": "unsafe",
    "deploy": "unsafe",
    "rollback": "unsafe",
    "knowledge_write": "unsafe",
}
"""Every task kind and the effect semantics its intents declare."""
LOCAL_TASKS: Final = ("prepare", "implement", "verify")
REQUEST_TASK_KINDS: Final[dict[str, str]] = {"publication": "publish", "deploy": "deploy", "rollback": "rollback",
                                             "knowledge_write": "knowledge_write"}
"""Execution requests that are remote effects, and the kind of the task each records in the run's journal."""
"""The task kinds this engine executes; the remote ones come with execution requests."""

RUN_STATUSES: Final = ("queued", "running", "paused", "interrupted", "needs_reconciliation", "failed",
                       "succeeded", "cancelled", "corrupt")
FINISHED: Final = frozenset({"failed", "succeeded", "cancelled"})
MAX_DISPATCHES: Final = 3
"""Dispatches of one retry-safe task intent whose outcome stayed unknown before it needs an operator."""

DEFAULT_CHECK_TIMEOUT_S: Final = 600.0
MAX_TIMEOUT_S: Final = 86_400.0
DEFAULT_MAX_REPAIR_ATTEMPTS: Final = 1
MAX_REPAIR_ATTEMPTS: Final = 5
MAX_CHECKS: Final = 50
MAX_BRIEF_CHARS: Final = 100_000
PROJECT_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
CHECK_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def run_stream(run_id: str) -> str:
    """The stream holding a run's journal."""
    return f"{RUN_PREFIX}{run_id}"


def run_lease_key(run_id: str) -> str:
    """The lease that fences the process executing a run."""
    return f"{RUN_PREFIX}{run_id}/owner"


def run_work_key(run_id: str) -> str:
    """The work-queue key of a run (the same text as its stream's name)."""
    return f"{RUN_PREFIX}{run_id}"


def run_id_of(key: str) -> str | None:
    """The run id a work key names, or ``None`` for another kind of work."""
    return key[len(RUN_PREFIX):] if key.startswith(RUN_PREFIX) and len(key) > len(RUN_PREFIX) else None


def project_stream(name: str) -> str:
    """The stream holding a project's registration and policy updates."""
    return f"{PROJECT_PREFIX}{name}"


# --- policies ----------------------------------------------------------------------------------


def _timeout(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= MAX_TIMEOUT_S:
        raise InvalidPolicy(f"{where} {value!r} must be a number of seconds in (0, {MAX_TIMEOUT_S:.0f}]",
                            field=where)
    return float(value)


def _only(data: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise InvalidPolicy(f"{where} has unknown keys {unknown}; allowed: {sorted(allowed)}", field=where)


def validate_policy(policy: object) -> JSONObject:
    """The normalised policy (defaults filled in); :class:`~jixu.errors.InvalidPolicy` when malformed."""
    if not isinstance(policy, dict):
        raise InvalidPolicy("policy must be a JSON object with 'checks' (and optionally 'allowed_paths', "
                            "'limits')", field="policy")
    _only(policy, {"checks", "allowed_paths", "limits"}, "policy")
    limits = policy.get("limits", {})
    if not isinstance(limits, dict):
        raise InvalidPolicy("policy.limits must be an object", field="policy.limits")
    _only(limits, {"max_repair_attempts", "check_timeout_s"}, "policy.limits")
    repairs = limits.get("max_repair_attempts", DEFAULT_MAX_REPAIR_ATTEMPTS)
    if isinstance(repairs, bool) or not isinstance(repairs, int) or not 0 <= repairs <= MAX_REPAIR_ATTEMPTS:
        raise InvalidPolicy(f"policy.limits.max_repair_attempts {repairs!r} must be an integer 0-"
                            f"{MAX_REPAIR_ATTEMPTS}", field="policy.limits.max_repair_attempts")
    default_timeout = _timeout(limits.get("check_timeout_s", DEFAULT_CHECK_TIMEOUT_S), "policy.limits.check_timeout_s")
    checks = policy.get("checks")
    if not isinstance(checks, list) or not checks or len(checks) > MAX_CHECKS:
        raise InvalidPolicy(f"policy.checks must be a list of 1-{MAX_CHECKS} checks: a run succeeds only when "
                            "its checks pass", field="policy.checks")
    normalised: list[JSONObject] = []
    for index, check in enumerate(checks):
        where = f"policy.checks[{index}]"
        if not isinstance(check, dict):
            raise InvalidPolicy(f"{where} must be an object {{name, argv, timeout_s}}", field=where)
        _only(check, {"name", "argv", "timeout_s"}, where)
        name = check.get("name")
        if not isinstance(name, str) or not CHECK_NAME.match(name):
            raise InvalidPolicy(f"{where}.name {name!r} must be 1-100 of A-Z a-z 0-9 . _ -", field=f"{where}.name")
        argv = check.get("argv")
        if (not isinstance(argv, list) or not argv or len(argv) > 1000
                or not all(isinstance(a, str) and len(a) <= 10_000 and "\0" not in a for a in argv) or not argv[0]):
            raise InvalidPolicy(f"{where}.argv must be a non-empty list of strings (no shell: "
                                "['python', '-m', 'pytest'], not 'python -m pytest')", field=f"{where}.argv")
        timeout = _timeout(check["timeout_s"], f"{where}.timeout_s") if "timeout_s" in check else default_timeout
        normalised.append({"name": name, "argv": list(argv), "timeout_s": timeout})
    names = [c["name"] for c in normalised]
    if len(set(names)) != len(names):
        raise InvalidPolicy(f"policy.checks names must be unique, got {names}", field="policy.checks")
    allowed = policy.get("allowed_paths", ["*"])
    if (not isinstance(allowed, list) or not allowed or len(allowed) > 200
            or not all(isinstance(g, str) and g and len(g) <= 1000 for g in allowed)):
        raise InvalidPolicy("policy.allowed_paths must be a non-empty list of glob strings", field="policy.allowed_paths")
    for glob in allowed:
        if glob.startswith("/") or ".." in glob.split("/"):
            raise InvalidPolicy(f"allowed path {glob!r} must be relative to the repository, without '..'",
                                field="policy.allowed_paths")
    return {"checks": normalised, "allowed_paths": list(allowed),
            "limits": {"max_repair_attempts": repairs, "check_timeout_s": default_timeout}}


def policy_digest(policy: JSONObject) -> str:
    """The sha256 of the normalised policy's canonical JSON."""
    return content_hash(policy)


# --- projects ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Project:
    """A registered project as its stream says now."""

    name: str
    origin: str
    default_branch: str
    policy: JSONObject
    policy_digest: str
    policy_revision: int
    seq: int

    def to_dict(self) -> JSONObject:
        """A JSON-ready dict of every field."""
        return {"name": self.name, "origin": self.origin, "default_branch": self.default_branch,
                "policy": self.policy, "policy_digest": self.policy_digest,
                "policy_revision": self.policy_revision, "seq": self.seq}


def check_project_name(name: object) -> str:
    """Return ``name`` if it is a usable project name (1-100 of ``A-Z a-z 0-9 . _ -``)."""
    if not isinstance(name, str) or not PROJECT_NAME.match(name):
        raise InvalidInput(f"project name {name!r} must be 1-100 of A-Z a-z 0-9 . _ -, starting alphanumeric",
                           field="project")
    return name


class ProjectProjection:
    """The reducer from a project's events to the :class:`Project` they say (``None`` until it is registered)."""

    name = "project"
    version = 1

    def initial(self) -> Project | None:
        """Nothing before the registration."""
        return None

    def apply(self, state: Project | None, event: Event) -> Project | None:
        """Fold ``event`` into the project (only a registration at seq 1 starts one, as it always did)."""
        data = event.data
        if state is None:
            if event.type != "project.registered" or event.seq != 1:
                return None
            return Project(data["name"], data["origin"], data["default_branch"], data["policy"], data["policy_digest"],
                           1, event.seq)
        if event.type == "project.policy_updated":
            return replace(state, policy=data["policy"], policy_digest=data["policy_digest"],
                           policy_revision=state.policy_revision + 1, seq=event.seq)
        if event.type == "project.origin_changed":
            return replace(state, origin=data["origin"], seq=event.seq)
        return state

    def dump(self, state: Project | None) -> JSONObject:
        """The project as JSON (project streams are short: never checkpointed, but the protocol asks for it)."""
        return {"project": None if state is None else state.to_dict()}

    def load(self, data: JSONObject) -> Project | None:
        """The project back from :meth:`dump`."""
        found = data.get("project")
        return None if found is None else Project(**found)


def _established(store: Store, name: str) -> Project | None:
    """The project ``name`` as its *verified* events say (``None``: never registered).

    Read like an execution request's stream: the whole chain is verified in the
    read that is folded (decision 0025), a break found is kept for every later
    opening, and a project whose stream does not verify is refused with
    :class:`~jixu.errors.ProjectCorrupt` (first bad seq, reason): a run freezes
    its policy and an admission trusts its origin, so nothing acts on it.
    """
    stream = project_stream(check_project_name(name))
    if store.stream_info(stream) is None:
        return None
    projected = fold_verified(store, stream, ProjectProjection())
    found = corruption(stream, chain=projected.chain, analysis=None)
    if found is not None:
        raise ProjectCorrupt(f"project {name}'s stream is corrupt: {found.summary()}. Nothing acts on it (no run "
                             f"is created from it, no request admitted under it); inspect it with `jixu verify "
                             f"STORE --stream {stream}`", project=name, stream=stream,
                             first_bad_seq=found.first_bad_seq, reason=found.reason, detail=found.detail)
    return projected.state


def get_project(store: Store, name: str) -> Project:
    """The project ``name`` from its verified events; :class:`~jixu.errors.ProjectNotFound` if it was never
    registered, :class:`~jixu.errors.ProjectCorrupt` if its stream does not verify."""
    found = _established(store, name)
    if found is None:
        raise ProjectNotFound(f"no project {name!r} is registered; register it first", project=name)
    return found


def list_projects(store: Store) -> list[Project]:
    """Every registered project, by name (:class:`~jixu.errors.ProjectCorrupt` if one's stream does not verify:
    a listing never shows a changed origin or policy as the project's; :func:`survey_projects` lists the others)."""
    projects, corrupt = survey_projects(store)
    if corrupt:
        raise corrupt[0]
    return projects


def survey_projects(store: Store) -> tuple[list[Project], list[ProjectCorrupt]]:
    """The registered projects whose streams verify, and the refusal of each that does not, both by name: a
    listing shows a corrupt project as corrupt (not its origin or policy) and still lists the others."""
    projects: list[Project] = []
    corrupt: list[ProjectCorrupt] = []
    after = ""
    while True:
        page = store.list_streams(PROJECT_PREFIX, after=after, limit=1000)
        for info in page:
            name = info.stream[len(PROJECT_PREFIX):]
            if not PROJECT_NAME.match(name):
                continue
            try:
                found = _established(store, name)
            except ProjectCorrupt as error:
                corrupt.append(error)
                continue
            if found is not None:
                projects.append(found)
        if len(page) < 1000:
            return projects, corrupt
        after = page[-1].stream


def project_branch(origin: str, default_branch: str | None) -> str:
    """The branch a project's runs start from: ``default_branch``, or the origin's HEAD branch when ``None``.

    It must be a branch the origin has now (read with ``git ls-remote``): a
    name it does not have is :class:`~jixu.errors.InvalidInput` (every run
    created from it would fail), an origin that cannot be read
    :class:`~jixu.errors.SourceUnavailable`. Reads only.
    """
    if default_branch is not None and (not isinstance(default_branch, str) or not re.match(
            r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$", default_branch)):
        raise InvalidInput(f"default_branch {default_branch!r} is not a branch name", field="default_branch")
    branch = default_branch if default_branch is not None else origin_branch(origin)
    refs = origin_refs(origin)
    if f"refs/heads/{branch}" not in refs:
        branches = sorted(name[len("refs/heads/"):] for name in refs if name.startswith("refs/heads/"))
        shown = ", ".join(branches[:20]) + (f" and {len(branches) - 20} more" if len(branches) > 20 else "")
        raise InvalidInput(f"default_branch {branch!r} is not a branch of the origin {origin!r} (its branches: "
                           f"{shown or 'none'}); nothing was registered", field="default_branch", branch=branch,
                           branches=branches[:100])
    return branch


def register_project(store: Store, name: str, origin: str, policy: JSONObject, *,
                     default_branch: str | None = None, actor: str = "jixu") -> Project:
    """Register a project: its authorized git origin and policy (``project.registered``).

    The origin is read with ``git ls-remote`` (an unreachable origin raises
    :class:`~jixu.errors.SourceUnavailable`); an existing local path is
    recorded absolute. The default branch (given, or the origin's HEAD
    branch) must exist on the origin (:func:`project_branch`; else
    :class:`~jixu.errors.InvalidInput`). Registering the same name again with the same origin,
    branch and policy returns the project unchanged; with anything different,
    :class:`~jixu.errors.ProjectExists` (use :func:`update_policy`). Bad input
    writes nothing.
    """
    check_project_name(name)
    check_text(actor, "actor", 200, required=True)
    normalised = validate_policy(policy)
    origin = check_origin(origin)
    branch = project_branch(origin, default_branch)
    digest = policy_digest(normalised)
    stream = project_stream(name)
    current = _established(store, name)
    if current is not None:
        if (current.origin, current.default_branch, current.policy_digest) == (origin, branch, digest):
            return current
        raise ProjectExists(f"project {name!r} is already registered with origin {current.origin!r} and policy "
                            f"{current.policy_digest[:12]}; update its policy with update_policy", project=name)
    data = {"name": name, "origin": origin, "default_branch": branch, "policy": normalised, "policy_digest": digest}
    canonical_text(data)
    record(store, stream, [NewEvent("project.registered", data, {"actor": actor})], 0)
    return get_project(store, name)


def update_policy(store: Store, name: str, policy: JSONObject, *, actor: str = "jixu") -> Project:
    """Record a new policy for later runs (``project.policy_updated``); runs already created keep theirs."""
    check_text(actor, "actor", 200, required=True)
    normalised = validate_policy(policy)
    current = get_project(store, name)
    digest = policy_digest(normalised)
    if digest == current.policy_digest:
        return current
    record(store, project_stream(name), [NewEvent("project.policy_updated",
                                                 {"policy": normalised, "policy_digest": digest},
                                                 {"actor": actor})], current.seq)
    return get_project(store, name)


def change_origin(store: Store, name: str, origin: str, *, actor: str = "jixu") -> Project:
    """Authorize another origin for the project's later runs (``project.origin_changed``).

    Runs already created keep the origin they froze, but they lose the
    project's authority to publish there: admission and reconciliation of
    publications recheck the project's current origin.
    """
    check_text(actor, "actor", 200, required=True)
    current = get_project(store, name)
    origin = check_origin(origin)
    if origin == current.origin:
        return current
    record(store, project_stream(name), [NewEvent("project.origin_changed",
                                                 {"origin": origin, "previous_origin": current.origin},
                                                 {"actor": actor})], current.seq)
    return get_project(store, name)


# --- public views (built by jixu.runs.projection) ------------------------------------------------


@dataclass(frozen=True, slots=True)
class TaskView:
    """One task of the plan and every attempt at it, with the RecoveryResolver's decision on each."""

    task_id: str
    kind: str
    params: JSONObject
    revision: int
    """The plan revision that introduced the task."""
    status: str
    """``pending`` (no intent yet), ``ready`` (intent, not dispatched), ``unknown`` (dispatched, no receipt),
    ``done`` (a completion receipt: a verification may be done with failing checks), ``failed``
    (a determinate failure receipt), ``blocked`` (parked or corrupt)."""
    attempts: tuple[JSONObject, ...]
    """Per intent: ``effect_id``, ``attempt``, ``revision``, ``decision`` (the resolver's), ``receipt``."""
    evidence: JSONObject | None
    """The result of the latest completion receipt, if any."""

    def to_dict(self) -> JSONObject:
        """A JSON-ready dict of every field."""
        return {"task_id": self.task_id, "kind": self.kind, "params": self.params, "revision": self.revision,
                "status": self.status, "attempts": list(self.attempts), "evidence": self.evidence}


@dataclass(frozen=True, slots=True)
class PlanView:
    """The current plan revision with its tasks' states, and every earlier revision unchanged."""

    revision: int
    provider_revision: int
    reason: str
    tasks: tuple[TaskView, ...]
    revisions: tuple[JSONObject, ...]

    def to_dict(self) -> JSONObject:
        """A JSON-ready dict of every field."""
        return {"revision": self.revision, "provider_revision": self.provider_revision, "reason": self.reason,
                "tasks": [t.to_dict() for t in self.tasks], "revisions": list(self.revisions)}


@dataclass(frozen=True)
class RunState:
    """A run as users see it: derived from its journal, the resolver's analysis and its lease, never stored."""

    run_id: str
    project: str
    brief: str
    status: str
    """One of :data:`RUN_STATUSES`."""
    reason: str
    """Why (for ``paused``: the pause reason first, e.g. ``quota: …``)."""
    source: JSONObject
    provider: JSONObject
    """The current provider snapshot."""
    providers: tuple[JSONObject, ...]
    """Every provider snapshot, oldest first (revision 1, 2, …)."""
    policy: JSONObject
    policy_digest: str
    workspace: str
    plan: PlanView
    pauses: tuple[JSONObject, ...]
    automatic_retries_used: int
    repairs_used: int
    reconciliations: tuple[JSONObject, ...]
    finished: JSONObject | None
    lineage: JSONObject
    owner: JSONObject | None
    seq: int
    head_hash: str
    problems: tuple[str, ...]
    analysis: Analysis = field(repr=False)
    corruption: Corruption | None = None
    """Why the journal is corrupt (first bad seq, reason), when it is (``status`` is then ``corrupt``)."""
    blocked: JSONObject | None = None
    """What stops every operation that would move the run on (execute, resume, hand off, retry, queue), when
    something does: ``{"by": "project_corrupt" | "cancellation", "reason", ...}`` (see ``Runs.blocker``)."""

    @property
    def pause_reason(self) -> str | None:
        """The open pause's reason (``rate_limit``, ``transient``, ``quota``, ``authentication``), if paused."""
        if self.status != "paused" or not self.pauses:
            return None
        reason = self.pauses[-1].get("reason")
        return str(reason) if reason is not None else None

    def to_dict(self) -> JSONObject:
        """A JSON-ready dict (the analysis as its flags)."""
        return {"run_id": self.run_id, "project": self.project, "brief": self.brief, "status": self.status,
                "reason": self.reason, "pause_reason": self.pause_reason, "source": self.source,
                "provider": self.provider, "providers": list(self.providers), "policy": self.policy,
                "policy_digest": self.policy_digest, "workspace": self.workspace, "plan": self.plan.to_dict(),
                "pauses": list(self.pauses), "automatic_retries_used": self.automatic_retries_used,
                "repairs_used": self.repairs_used, "reconciliations": list(self.reconciliations),
                "finished": self.finished, "lineage": self.lineage, "owner": self.owner, "seq": self.seq,
                "head_hash": self.head_hash, "problems": list(self.problems),
                "safe_to_continue": self.analysis.safe_to_continue,
                "has_corruption": self.analysis.has_corruption,
                "corruption": None if self.corruption is None else self.corruption.to_dict(),
                "blocked": self.blocked}


__all__ = [
    "AUTOMATIC_PAUSES",
    "FINISHED",
    "LOCAL_TASKS",
    "MAX_AUTOMATIC_RETRIES",
    "MAX_DISPATCHES",
    "OPERATOR_PAUSES",
    "PROJECT_PREFIX",
    "RUN_PREFIX",
    "RUN_STATUSES",
    "TASK_SEMANTICS",
    "PlanView",
    "Project",
    "ProjectProjection",
    "RunState",
    "TaskView",
    "check_project_name",
    "survey_projects",
    "get_project",
    "list_projects",
    "policy_digest",
    "project_branch",
    "project_stream",
    "register_project",
    "run_id_of",
    "run_lease_key",
    "run_stream",
    "run_work_key",
    "update_policy",
    "validate_policy",
]
