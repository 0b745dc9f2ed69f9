"""Bearer tokens with project-scoped roles, recorded as events in the ledger.

A token is ``jixu_<token_id>_<secret>``: the id (a ULID) finds its record, the
secret (32 random bytes, url-safe base64) proves possession. Only
``sha256(secret)`` is stored; the secret is shown once, when the token is made.
Each token is the stream ``auth/token/<token_id>``: ``token.created`` (name,
kind, role per project, the secret's hash, who made it) and, later,
``token.revoked``. Because the secret is random and long, a plain SHA-256 is
enough (no password stretching is needed) and lookups cost one stream read.

Roles per project: ``viewer`` reads, ``editor`` also sends input, creates
threads and runs and recovers conversation turns, ``operator`` also resolves
outcomes, approves or denies parked calls, reconciles, hands off, resumes and
cancels. An ``admin`` token may do everything in every project and manages
projects and tokens. A caller with no role in a project is told that the
thing does not exist (404), never that it is forbidden.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from jixu.errors import InvalidInput, JixuError, NotFound
from jixu.kernel import record
from jixu.ledger import Event, NewEvent, Store, is_valid_id, new_id
from jixu.runs.model import check_project_name
from jixu.server.problems import FORBIDDEN, UNAUTHORIZED, HTTPProblem

TOKEN_PREFIX = "auth/token/"
ROLES = ("viewer", "editor", "operator")
"""Project roles, weakest first: each includes the ones before it."""
ROLE_RANK = {role: rank for rank, role in enumerate(ROLES, start=1)}
TOKEN_PATTERN = re.compile(r"^jixu_([0-7][0-9A-HJKMNP-TV-Z]{25})_([A-Za-z0-9_-]{43})$")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@:-]{0,63}$")
MAX_PROJECTS_PER_TOKEN = 100


class TokenNotFound(NotFound):
    """No token with this id exists."""

    code = "token_not_found"


@dataclass(frozen=True)
class TokenInfo:
    """A token as recorded (never its secret)."""

    token_id: str
    name: str
    admin: bool
    roles: dict[str, str]
    created_at: str
    created_by: str
    revoked: bool = False
    revoked_at: str | None = None
    secret_sha256: str = field(default="", repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, without the secret's hash."""
        return {"token_id": self.token_id, "name": self.name, "kind": "admin" if self.admin else "project",
                "roles": dict(self.roles), "created_at": self.created_at, "created_by": self.created_by,
                "revoked": self.revoked, "revoked_at": self.revoked_at}


@dataclass(frozen=True)
class Principal:
    """The authenticated caller of a request: its token, its role in each project, whether it is an admin."""

    token_id: str
    name: str
    admin: bool
    roles: dict[str, str]

    @property
    def actor(self) -> str:
        """The actor recorded in every event this caller causes."""
        return f"token:{self.token_id}"

    def role_in(self, project: str) -> str | None:
        """This caller's role in ``project`` (``operator`` for an admin), or ``None``."""
        return "operator" if self.admin else self.roles.get(project)

    def visible(self, project: str) -> bool:
        """True when this caller may see anything of ``project``."""
        return self.role_in(project) is not None

    def require(self, project: str, role: str, hidden: JixuError) -> None:
        """Allow the caller ``role`` in ``project``: raise ``hidden`` (a 404) without any role, 403 if too weak."""
        have = self.role_in(project)
        if have is None:
            raise hidden
        if ROLE_RANK[have] < ROLE_RANK[role]:
            raise HTTPProblem(FORBIDDEN, f"this needs the {role} role in project {project!r}; token "
                                         f"{self.token_id} is {have} there", role_needed=role, role=have,
                              project=project)

    def require_admin(self) -> None:
        """Allow only admin tokens (403 otherwise)."""
        if not self.admin:
            raise HTTPProblem(FORBIDDEN, f"this needs an admin token; token {self.token_id} is a project token",
                              role_needed="admin")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: token id, name, kind, roles, actor."""
        return {"token_id": self.token_id, "name": self.name, "kind": "admin" if self.admin else "project",
                "roles": dict(self.roles), "actor": self.actor}


def token_stream(token_id: str) -> str:
    """The ledger stream that records one token."""
    return f"{TOKEN_PREFIX}{token_id}"


def secret_hash(secret: str) -> str:
    """The stored form of a token secret."""
    return hashlib.sha256(secret.encode("ascii")).hexdigest()


def check_roles(roles: object) -> dict[str, str]:
    """``roles`` as ``{project: role}`` with valid project names and roles (typed error otherwise)."""
    if not isinstance(roles, dict):
        raise InvalidInput("roles must be an object of project name -> role", field="roles")
    if len(roles) > MAX_PROJECTS_PER_TOKEN:
        raise InvalidInput(f"a token may name at most {MAX_PROJECTS_PER_TOKEN} projects", field="roles")
    checked: dict[str, str] = {}
    for project, role in roles.items():
        check_project_name(project)
        if role not in ROLE_RANK:
            raise InvalidInput(f"role {role!r} of project {project!r} must be one of {list(ROLES)}", field="role")
        checked[str(project)] = str(role)
    return checked


def create_token(store: Store, name: str, *, roles: dict[str, str] | None = None, admin: bool = False,
                 actor: str = "jixu") -> tuple[TokenInfo, str]:
    """Record a new token; returns its record and the bearer text (shown once, never stored).

    A project token needs at least one role; an admin token has none (it may
    do everything).
    """
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise InvalidInput(f"token name {name!r} must be 1-64 of A-Z a-z 0-9 . _ @ : -, starting alphanumeric",
                           field="name")
    if not isinstance(admin, bool):
        raise InvalidInput("admin must be true or false", field="admin")
    checked = check_roles(roles or {})
    if admin and checked:
        raise InvalidInput("an admin token has every role; give it no project roles", field="roles")
    if not admin and not checked:
        raise InvalidInput("a project token needs a role in at least one project", field="roles")
    token_id = new_id()
    secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode("ascii").rstrip("=")
    [event] = record(store, token_stream(token_id), [NewEvent("token.created", {
        "token_id": token_id, "name": name, "kind": "admin" if admin else "project", "roles": checked,
        "secret_sha256": secret_hash(secret), "created_by": actor}, {"actor": actor})], 0)
    return _info([event]), f"jixu_{token_id}_{secret}"


def _info(events: list[Event]) -> TokenInfo:
    created = events[0]
    data = created.data
    revoked = next((e for e in events if e.type == "token.revoked"), None)
    return TokenInfo(token_id=str(data["token_id"]), name=str(data["name"]), admin=data.get("kind") == "admin",
                     roles={str(k): str(v) for k, v in dict(data.get("roles") or {}).items()},
                     created_at=created.recorded_at, created_by=str(data.get("created_by")),
                     revoked=revoked is not None, revoked_at=revoked.recorded_at if revoked else None,
                     secret_sha256=str(data.get("secret_sha256")))


def get_token(store: Store, token_id: str) -> TokenInfo:
    """A token's record (:class:`TokenNotFound` if there is none)."""
    if not is_valid_id(token_id):
        raise InvalidInput(f"token id {token_id!r} is not a valid id", field="token_id")
    events = store.read(token_stream(token_id))
    if not events or events[0].type != "token.created":
        raise TokenNotFound(f"no token {token_id}", token_id=token_id)
    return _info(events)


def list_tokens(store: Store) -> list[TokenInfo]:
    """Every token, oldest first (revoked ones included)."""
    tokens: list[TokenInfo] = []
    after = ""
    while True:
        page = store.list_streams(TOKEN_PREFIX, after=after, limit=1000)
        for info in page:
            events = store.read(info.stream)
            if events and events[0].type == "token.created":
                tokens.append(_info(events))
        if len(page) < 1000:
            return tokens
        after = page[-1].stream


def revoke_token(store: Store, token_id: str, *, actor: str = "jixu", reason: str | None = None) -> TokenInfo:
    """Record that a token may no longer be used (idempotent: revoking twice changes nothing)."""
    if reason is not None and (not isinstance(reason, str) or len(reason) > 1000):
        raise InvalidInput("reason must be a string of at most 1000 characters", field="reason")
    token = get_token(store, token_id)
    if token.revoked:
        return token
    stream = token_stream(token_id)
    info = store.stream_info(stream)
    record(store, stream, [NewEvent("token.revoked", {"token_id": token_id, "actor": actor, "reason": reason},
                                   {"actor": actor})], info.head_seq if info else 0)
    return get_token(store, token_id)


def authenticate(store: Store, authorization: str | None) -> Principal:
    """The caller named by an ``Authorization: Bearer jixu_…`` header (401 problem when absent or wrong)."""
    if not authorization:
        raise HTTPProblem(UNAUTHORIZED, "send a bearer token: Authorization: Bearer jixu_<id>_<secret> "
                                        "(make one with `jixu tokens create`)")
    scheme, _, value = authorization.partition(" ")
    match = TOKEN_PATTERN.match(value.strip()) if scheme.lower() == "bearer" else None
    if match is None:
        raise HTTPProblem(UNAUTHORIZED, "the Authorization header must be 'Bearer jixu_<id>_<secret>'")
    token_id, secret = match.groups()
    events = store.read(token_stream(token_id))
    if not events or events[0].type != "token.created":
        raise HTTPProblem(UNAUTHORIZED, "unknown or revoked token")
    token = _info(events)
    if not hmac.compare_digest(token.secret_sha256, secret_hash(secret)) or token.revoked:
        raise HTTPProblem(UNAUTHORIZED, "unknown or revoked token")
    return Principal(token.token_id, token.name, token.admin, dict(token.roles))


__all__ = [
    "ROLES",
    "ROLE_RANK",
    "TOKEN_PREFIX",
    "Principal",
    "TokenInfo",
    "TokenNotFound",
    "authenticate",
    "check_roles",
    "create_token",
    "get_token",
    "list_tokens",
    "revoke_token",
    "secret_hash",
    "token_stream",
]
