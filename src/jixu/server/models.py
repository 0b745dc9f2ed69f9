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


class RecoverTurn(Body):
    request_id: str = Field(pattern=r"^[0-9a-f]{32}$", description="32 lower-case hex characters.")
    expected_epoch: int = Field(ge=0, description="The claim epoch you observed (state.ownership.epoch).")
    legacy_confirmed_stopped: bool = False


# --- runs --------------------------------------------------------------------------------------


class CreateRun(Body):
    project: str = Field(pattern=PROJECT)
    brief: str = Field(min_length=1, max_length=MAX_INPUT)
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


class ThreadSummary(Out):
    thread_id: str = Field(pattern=ID)
    status: str
    reason: str | None
    seq: int = Field(ge=0)
    head_hash: str


class ThreadCreated(ThreadSummary):
    project: str
    agent: str | None


class InputQueued(Out):
    thread_id: str = Field(pattern=ID)
    turn_id: str = Field(pattern=ID)
    queued: bool


class EffectDecided(Out):
    recorded: bool
    effect: dict[str, Any]
    thread: ThreadSummary


class TokenCreated(BaseModel):
    token: Token
    secret: str | None = Field(description="The bearer token, shown once (null when a request is replayed).")


def problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` entry documenting problem+json answers with these statuses."""
    return {status: {"model": Problem, "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
                     "description": "A problem (RFC 9457)."} for status in statuses}


READ = problems(401, 404, 422, 503)
WRITE = problems(401, 403, 404, 409, 413, 422, 503)

__all__ = [
    "READ",
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
