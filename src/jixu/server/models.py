"""Request bodies and the documented response shapes of the HTTP API (pydantic models).

Bodies forbid unknown fields and are strict about types, so a typo is a 422
that names the field instead of a silently ignored value.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo

from jixu.errors import MalformedEvent
from jixu.ledger.encoding import VALUE_NESTING, canonical_text
from jixu.runs.model import MAX_BRIEF_CHARS
from jixu.server.problems import PROBLEM_MEDIA_TYPE

PROJECT = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
ID = r"^[0-7][0-9A-HJKMNP-TV-Z]{25}$"
MAX_NOTE = 10_000
MAX_INPUT = 200_000
Role = Literal["viewer", "editor", "operator"]

# Path parameters: every id is a ULID, so the published document says so and a malformed one is a 422 that names it.
ThreadId = Annotated[str, Path(pattern=ID, description="A thread id (ULID).")]
RunId = Annotated[str, Path(pattern=ID, description="A run id (ULID).")]
EffectId = Annotated[str, Path(pattern=ID, description="An effect id (ULID).")]
TurnId = Annotated[str, Path(pattern=ID, description="A turn id (ULID).")]
RequestId = Annotated[str, Path(pattern=ID, description="An execution request id (ULID).")]
TokenId = Annotated[str, Path(pattern=ID, description="A token id (ULID).")]
ProjectName = Annotated[str, Path(pattern=PROJECT, description="A project name.")]


def _storable(value: Any, info: ValidationInfo) -> Any:
    """A free-form value as the ledger will take it: JSON nested at most ``VALUE_NESTING`` levels (the rule every
    free-form value follows, whoever writes it), else a 422 naming the field and the path. Checked here, before
    anything copies or serialises the body (pydantic's own serialiser gives up, with a 500, past ~255 levels)."""
    try:
        canonical_text(value, path=info.field_name or "value", max_nesting=VALUE_NESTING)
    except MalformedEvent as error:
        raise ValueError(error.message) from None
    return value


FreeObject = Annotated[dict[str, Any], AfterValidator(_storable)]
"""A free JSON object in a body (metadata, evidence, policy, parameters, knowledge)."""
FreeValue = Annotated[Any, AfterValidator(_storable)]
"""Any free JSON value in a body (an observed result)."""


class Body(BaseModel):
    """A request body: unknown fields and loose types are refused."""

    model_config = ConfigDict(extra="forbid", strict=True)


class Problem(BaseModel):
    """An RFC 9457 problem document; ``code`` repeats the stable code ``type`` ends with."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str
    code: str
    instance: str | None = None
    field: str | None = None


# --- threads -----------------------------------------------------------------------------------


class CreateThread(Body):
    project: str = Field(pattern=PROJECT, description="The project the thread belongs to.")
    metadata: FreeObject | None = Field(default=None, description="Free JSON kept with the thread.")


class SendInput(Body):
    input: str = Field(min_length=1, max_length=MAX_INPUT, description="The user's message; starts a turn.")


class ForkThread(Body):
    at: str = Field(pattern=ID, description="The event of this thread to fork at.")
    input: str | None = Field(default=None, min_length=1, max_length=MAX_INPUT,
                              description="Start the child's first turn with this input.")


class ResolveOutcome(Body):
    resolution: Literal["occurred", "not_occurred", "abandoned_unknown"]
    note: str = Field(min_length=1, max_length=MAX_NOTE, description="Why: what you checked.")
    resolution_id: str | None = Field(default=None, min_length=1, max_length=100)
    evidence: FreeObject | None = None
    result: FreeValue = Field(default=None, description="With 'occurred': the result observed.")


class Decision(Body):
    note: str | None = Field(default=None, max_length=MAX_NOTE)


class InterruptTurn(Body):
    reason: str | None = Field(default=None, max_length=MAX_NOTE, description="Why (recorded).")


class RecoverTurn(Body):
    request_id: str = Field(pattern=r"^[0-9a-f]{32}$", description="32 lower-case hex characters.")
    expected_epoch: int = Field(ge=0, description="The claim epoch you observed (state.ownership.epoch).")
    legacy_confirmed_stopped: bool = False
    note: str | None = Field(default=None, max_length=MAX_NOTE, description="Why (recorded in the receipt).")


# --- runs --------------------------------------------------------------------------------------


class CreateRun(Body):
    project: str = Field(pattern=PROJECT)
    brief: str = Field(min_length=1, max_length=MAX_BRIEF_CHARS)  # the engine's own limit, stated in the schema
    provider: str = Field(min_length=1, max_length=200)
    commit: str | None = Field(default=None, min_length=1, max_length=200)
    knowledge: FreeObject | None = None


class ResumeRun(Body):
    note: str | None = Field(default=None, max_length=MAX_NOTE)
    stop_agents: bool = Field(default=False, description="Stop an earlier attempt's processes that still run "
                              "(SIGTERM, then SIGKILL after the grace period) before resuming; without it such a "
                              "process is a 409 agent_still_running.")


class Handoff(Body):
    agent: str = Field(min_length=1, max_length=200, description="The provider to hand the run to.")
    note: str | None = Field(default=None, max_length=MAX_NOTE)


class RetryRun(Body):
    provider: str | None = Field(default=None, min_length=1, max_length=200)


class CancelRun(Body):
    reason: str | None = Field(default=None, max_length=MAX_NOTE)


class Reconcile(Body):
    reconciliation_id: str = Field(pattern=r"^[0-9a-f]{32}$", description="32 lower-case hex characters.")


class Publish(Body):
    publisher: str = Field(default="git", min_length=1, max_length=200,
                           description="A publisher the server is configured with (default: git).")
    branch: str | None = Field(default=None, min_length=1, max_length=200, description="Default jixu/<run_id>.")
    base_branch: str | None = Field(default=None, min_length=1, max_length=200)
    title: str | None = Field(default=None, min_length=1, max_length=500)


class RemoteTask(Body):
    kind: Literal["deploy", "rollback", "knowledge_write"]
    provider: str = Field(min_length=1, max_length=200, description="A remote provider the server is configured with.")
    parameters: FreeObject = Field(default_factory=dict, description="Handed to the provider.")


class Inspect(Body):
    """No fields: the provider is asked, read-only, what it shows for the recorded effect."""


class ResolveRequest(Body):
    resolution: Literal["occurred", "not_occurred", "abandoned_unknown"]
    note: str = Field(min_length=1, max_length=MAX_NOTE, description="What the inspection showed.")
    resolution_id: str | None = Field(default=None, min_length=1, max_length=100)


class ResolveTask(Body):
    resolution: Literal["not_occurred", "abandoned_unknown"]
    note: str = Field(min_length=1, max_length=MAX_NOTE, description="What you checked in the workspace.")
    resolution_id: str | None = Field(default=None, min_length=1, max_length=100)


# --- projects and tokens ------------------------------------------------------------------------


class RegisterProject(Body):
    name: str = Field(pattern=PROJECT)
    origin: str = Field(min_length=1, max_length=2000, description="The authorized git origin (path or URL).")
    default_branch: str | None = Field(default=None, min_length=1, max_length=200)
    policy: FreeObject = Field(default_factory=dict)


class UpdatePolicy(Body):
    policy: FreeObject


class CreateToken(Body):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._@:-]{0,63}$")
    roles: dict[str, Role] = Field(default_factory=dict, description="Project name -> role.")
    admin: bool = False
    expires_in: int | None = Field(default=None, ge=1, le=3650 * 86400,
                                   description="Seconds until the token stops working (default: never).")


class RotateToken(Body):
    grace_seconds: int = Field(default=0, ge=0, le=7 * 86400,
                               description="How long the old secret keeps working (default 0: it stops now).")


class RevokeToken(Body):
    reason: str | None = Field(default=None, max_length=1000)


# --- responses ---------------------------------------------------------------------------------


class Out(BaseModel):
    """A response: the members listed are always there, with these types; more may be added later."""

    model_config = ConfigDict(extra="allow")


class Health(Out):
    status: Literal["ok"]
    version: str


class Caller(Out):
    token_id: str = Field(pattern=ID)
    name: str
    kind: Literal["admin", "project"]
    roles: dict[str, Role]
    actor: str
    expires_at: str | None = Field(description="When the token stops working; null: never.")


class Token(Out):
    token_id: str = Field(pattern=ID)
    name: str
    kind: Literal["admin", "project"]
    roles: dict[str, Role]
    created_at: str
    created_by: str
    revoked: bool
    revoked_at: str | None
    expires_at: str | None = Field(description="When the token stops working (UTC); null: never.")
    expired: bool
    rotated_at: str | None = Field(description="When its secret was last replaced.")
    last_used_at: str | None = Field(description="When a server last saw it used (to within a minute); null: "
                                                 "never seen.")
    corruption: JSON | None = Field(default=None, description=(
        "Set (first_bad_seq, reason, detail) when the token's stream does not verify: it authenticates nobody, "
        "and the fields above say only what its events before the break say."))


class TokenPage(Out):
    tokens: list[Token]


class ThreadRow(Out):
    thread_id: str = Field(pattern=ID)
    project: str
    events: int = Field(ge=1)
    head_hash: str
    created_at: str


class ThreadPage(Out):
    threads: list[ThreadRow]
    next_after: str | None = Field(description="Pass as `after` for the next page; null on the last one.")


class EventOut(Out):
    id: str = Field(pattern=ID)
    stream: str
    seq: int = Field(ge=1)
    type: str
    data: dict[str, Any]
    meta: dict[str, Any]
    recorded_at: str
    prev_hash: str
    hash: str


class EventPage(Out):
    thread_id: str = Field(pattern=ID)
    events: list[EventOut]
    next_after_seq: int = Field(ge=0)
    head_seq: int = Field(ge=0)
    corruption: JSON | None = Field(default=None, description=(
        "The thread's corruption verdict, as GET /threads/{thread_id} gives it (null: the history holds): the "
        "events from its first_bad_seq on are not to be trusted. Every page verifies the whole history "
        "(O(history)), so one answer holds on every surface: page a long thread with a large limit."))


class ThreadSummary(Out):
    thread_id: str = Field(pattern=ID)
    status: str
    reason: str | None
    seq: int = Field(ge=0)
    head_hash: str


class ThreadCreated(ThreadSummary):
    project: str
    agent: str | None


class TurnInterrupted(Out):
    thread_id: str = Field(pattern=ID)
    outcome: Literal["ended", "requested"] = Field(
        description="`ended`: no process ran the turn, it is ended; `requested`: the process running it ends it at "
                    "its next step.")
    status: str
    reason: str | None


class InputQueued(Out):
    thread_id: str = Field(pattern=ID)
    turn_id: str = Field(pattern=ID)
    queued: bool


class TokenCreated(Out):
    token: Token
    secret: str | None = Field(description="The bearer token, shown once (null when a request is replayed).")


JSON = dict[str, Any]


class Effect(Out):
    """The resolver's decision about one effect (a tool or model call)."""

    effect_id: str
    kind: str
    name: str | None
    state: str = Field(description="completed, not_dispatched, unknown, parked or corrupt (the resolver's word).")
    reason: str
    evidence: list[Any]
    retry_safe: bool
    semantics: str | None
    idempotency_key: str | None
    args_hash: str | None
    attempts: int = Field(ge=0)
    resolution: JSON | None
    requested_seq: int | None
    last_seq: int


class EffectDecided(Out):
    recorded: bool
    effect: Effect
    thread: ThreadSummary


class ThreadState(Out):
    """A thread's state as the projection and the resolver make it."""

    thread_id: str = Field(pattern=ID)
    status: str
    reason: str | None
    messages: list[JSON]
    turns: list[JSON]
    effects: dict[str, Effect]
    waiting_on: list[JSON]
    last_reply: str | None
    usage: JSON
    seq: int = Field(ge=0)
    head_hash: str
    parent: JSON | None
    agent: JSON
    safe_to_continue: bool
    has_corruption: bool
    corruption: JSON | None
    probes: dict[str, list[JSON]]
    revision: int = Field(ge=1)
    revisions: list[JSON]


class ThreadDetail(ThreadState):
    project: str
    ownership: JSON | None = Field(description="Who owns the active turn, by the store's clock (null: no turn).")


class ChainReport(Out):
    stream: str
    valid: bool
    count: int = Field(ge=0)
    head_hash: str
    first_bad_seq: int | None
    reason: str | None
    detail: str | None


class Verification(Out):
    thread_id: str = Field(pattern=ID)
    valid: bool = Field(description="The chain, the effects and the checkpoint all hold.")
    chain: ChainReport
    corruption: JSON | None
    checkpoint: JSON | None
    corrupt_effects: list[str]
    unattributed_events: list[Any]


class ThreadForked(ThreadSummary):
    project: str
    parent: JSON | None
    turn_id: str | None = Field(description="The child's first turn, when an input was given.")


class TurnRecovered(Out):
    recorded: bool = Field(description="False when the same request id was recovered already (a replay).")
    receipt: JSON
    thread: ThreadSummary


# --- runs ---------------------------------------------------------------------------------------


class Task(Out):
    task_id: str
    kind: str
    params: JSON
    revision: int
    status: str
    attempts: list[JSON]
    evidence: JSON | None


class Plan(Out):
    revision: int = Field(ge=0)
    provider_revision: int = Field(ge=0)
    reason: str
    tasks: list[Task]
    revisions: list[JSON]


class Run(Out):
    """A run as its journal, the resolver and its lease make it."""

    run_id: str = Field(pattern=ID)
    project: str
    brief: str
    status: str
    reason: str
    pause_reason: str | None
    source: JSON
    provider: JSON
    providers: list[JSON]
    policy: JSON
    policy_digest: str
    workspace: str
    plan: Plan
    pauses: list[JSON]
    automatic_retries_used: int = Field(ge=0)
    repairs_used: int = Field(ge=0)
    reconciliations: list[JSON]
    finished: JSON | None
    lineage: JSON
    owner: JSON | None
    seq: int = Field(ge=0)
    head_hash: str
    problems: list[str]
    safe_to_continue: bool
    has_corruption: bool
    corruption: JSON | None
    blocked: JSON | None = Field(default=None, description="What stops every operation that would move the run "
                                                           "on: its project is corrupt, or a cancellation of it is "
                                                           "in doubt (by, reason, and the request and command).")


class RunPage(Out):
    runs: list[Run]


class Journal(Out):
    run_id: str = Field(pattern=ID)
    entries: list[JSON]
    valid: bool
    corruption: JSON | None


class ExecutionRequest(Out):
    request_id: str = Field(pattern=ID)
    run_id: str = Field(pattern=ID)
    kind: str
    attempt: int
    status: str
    reason: str | None
    actor: str | None
    admitted_source: JSON | None
    target: JSON | None
    intent: JSON | None
    receipt: JSON | None
    reconciliations: list[JSON]
    inspections: list[JSON]
    decision: JSON | None
    seq: int = Field(ge=0)
    head_hash: str
    chain_valid: bool
    corruption: JSON | None


class ExecutionRequestPage(Out):
    run_id: str = Field(pattern=ID)
    requests: list[ExecutionRequest]
    corruption: JSON | None = Field(default=None, description=(
        "The run's corruption verdict when its journal does not verify: the list then holds only the requests "
        "its record names before the first bad event (a request admitted later is not listed), each as corrupt "
        "as the run."))


class Reconciled(Out):
    reconciliation_id: str
    request_id: str = Field(pattern=ID)
    run_id: str = Field(pattern=ID)
    actor: str
    status_before: str
    settled: bool


class Inspected(Out):
    actor: str
    provider: str
    found: Any
    expected: JSON
    evidence: JSON
    event_id: str = Field(pattern=ID)
    settled: bool = Field(description="The inspection found the admitted source and settled the outcome.")


# --- projects -----------------------------------------------------------------------------------


class Project(Out):
    name: str
    origin: str
    default_branch: str
    policy: JSON
    policy_digest: str
    policy_revision: int = Field(ge=1)
    seq: int = Field(ge=1)


class ProjectSeen(Project):
    role: Role


class ProjectRow(Out):
    name: str
    registered: bool = Field(description="False: the caller has a role in a project nobody registered yet.")
    role: Role
    corrupt: JSON | None = Field(default=None, description="Set (first_bad_seq, reason) when the project's stream "
                                                           "does not verify: nothing acts on it.")


class ProjectPage(Out):
    projects: list[ProjectRow]


def problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` entry documenting problem+json answers with these statuses."""
    return {status: {"model": Problem, "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
                     "description": "A problem (RFC 9457)."} for status in statuses}


READ = problems(401, 404, 409, 422, 429, 503)
"""409: a read that needs a record a corrupt stream no longer holds (a corrupt run's execution request); 429: too
many failed logins from the caller's address (every authenticated route)."""
WRITE = problems(401, 403, 404, 409, 413, 422, 429, 503)

__all__ = [
    "JSON",
    "READ",
    "ChainReport",
    "Effect",
    "ExecutionRequest",
    "ExecutionRequestPage",
    "Inspected",
    "Journal",
    "Plan",
    "Project",
    "ProjectPage",
    "ProjectRow",
    "ProjectSeen",
    "Reconciled",
    "Run",
    "RunPage",
    "Task",
    "ThreadDetail",
    "ThreadForked",
    "ThreadState",
    "TurnRecovered",
    "Verification",
    "EffectId",
    "FreeObject",
    "FreeValue",
    "ProjectName",
    "RequestId",
    "RunId",
    "ThreadId",
    "TokenId",
    "TurnId",
    "WRITE",
    "Body",
    "CancelRun",
    "CreateRun",
    "CreateThread",
    "CreateToken",
    "Decision",
    "ForkThread",
    "Handoff",
    "Problem",
    "Reconcile",
    "RecoverTurn",
    "RegisterProject",
    "ResolveOutcome",
    "ResumeRun",
    "RetryRun",
    "RevokeToken",
    "RotateToken",
    "SendInput",
    "Caller",
    "EffectDecided",
    "EventOut",
    "EventPage",
    "Health",
    "InputQueued",
    "Out",
    "ThreadCreated",
    "ThreadPage",
    "ThreadRow",
    "ThreadSummary",
    "Token",
    "TokenCreated",
    "TokenPage",
    "UpdatePolicy",
    "problems",
]
