"""Bearer tokens with project-scoped roles, recorded as events in the ledger.

A token is ``jixu_<token_id>_<secret>``: the id (a ULID) finds its record, the
secret (32 random bytes, url-safe base64) proves possession. Only
``sha256(secret)`` is stored; the secret is shown once, when the token is made.
Each token is the stream ``auth/token/<token_id>``: ``token.created`` (name,
kind, role per project, the secret's hash, who made it, when it expires if
ever), ``token.rotated`` (a new secret's hash; the one before may keep
working for a grace period) and ``token.revoked``. Because the secret is
random and long, a plain SHA-256 is enough (no password stretching is
needed) and lookups cost one stream read. When a token was last used is not
an event (it changes all the time): the server notes it in the store's
credential-use rows (:meth:`jixu.ledger.Store.record_use`), at most once a
minute per token and process.

A token is read from *verified* events only, like a project (decision 0068): a
token stream that does not verify authenticates nobody (401 ``token_corrupt``,
naming the first bad seq and the reason), is listed with its ``corruption``,
shows only what its events before the break say, and is neither rotated nor
revoked (:class:`TokenCorrupt`). A role edited into the file is never a role.

Roles per project: ``viewer`` reads, ``editor`` also sends input, creates
threads and runs and recovers conversation turns, ``operator`` also resolves
outcomes, approves or denies parked calls, reconciles, hands off, resumes and
cancels. An ``admin`` token may do everything in every project and manages
projects and tokens. A caller with no role in a project is told that the
thing does not exist (404), never that it is forbidden.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from jixu.errors import InvalidInput, JixuError, LeaseHeld, NotFound, StreamCorrupt
from jixu.kernel import acquire_claim, record, release
from jixu.ledger import Event, Fence, NewEvent, Store, is_valid_id, new_id
from jixu.ledger.encoding import JSONObject
from jixu.ledger.event import format_timestamp
from jixu.ledger.projection import fold_verified
from jixu.recovery.corruption import Corruption, corruption
from jixu.runs.model import check_project_name
from jixu.server.problems import FORBIDDEN, TOKEN_CORRUPT, TOKEN_EXPIRED, UNAUTHORIZED, HTTPProblem

TOKEN_PREFIX = "auth/token/"
ROLES = ("viewer", "editor", "operator")
"""Project roles, weakest first: each includes the ones before it."""
ROLE_RANK = {role: rank for rank, role in enumerate(ROLES, start=1)}
TOKEN_PATTERN = re.compile(r"^jixu_([0-7][0-9A-HJKMNP-TV-Z]{25})_([A-Za-z0-9_-]{43})$")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@:-]{0,63}$")
MAX_PROJECTS_PER_TOKEN = 100
MAX_LIFETIME_SECONDS = 3650 * 86400
"""The longest expiry a token may be given (ten years); a token may also never expire."""
MAX_GRACE_SECONDS = 7 * 86400
"""The longest a rotated-out secret may keep working."""
USE_KEY_PREFIX = "token/"
"""Credential-use keys of tokens in the store: ``token/<token_id>``."""
_DURATION = re.compile(r"^([0-9]{1,7})([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class TokenNotFound(NotFound):
    """No token with this id exists."""

    code = "token_not_found"


class TokenCorrupt(StreamCorrupt):
    """The token's stream does not verify: it authenticates nobody and is neither rotated nor revoked."""

    code = "token_corrupt"


class TokenRevoked(JixuError):
    """The token was revoked: it cannot be rotated (make a new one)."""

    code = "token_revoked"


class LastAdminToken(JixuError):
    """Revoking this token over the API would leave no admin token that works: nobody could manage tokens there."""

    code = "last_admin_token"


def parse_duration(text: str, field: str = "expires_in") -> int:
    """``30d``, ``12h``, ``15m``, ``45s``, ``2w`` (or plain seconds) as seconds; typed error otherwise."""
    value = text.strip() if isinstance(text, str) else ""
    match = _DURATION.match(value) or (re.match(r"^([0-9]{1,9})()$", value) if value.isascii() else None)
    if match is None:
        raise InvalidInput(f"{field} {text!r} must be a number and a unit: 45s, 15m, 12h, 30d or 2w", field=field)
    return int(match.group(1)) * _UNIT_SECONDS.get(match.group(2), 1)


def _time_text(when: datetime) -> str:
    return format_timestamp(when)


def _parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _epoch_text(seconds: float) -> str:
    return _time_text(datetime.fromtimestamp(seconds, UTC))


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
    expires_at: str | None = None
    """When the token stops working (UTC, ``recorded_at`` form); ``None``: never."""
    rotated_at: str | None = None
    """When its secret was last replaced."""
    last_used_at: str | None = None
    """When a server last noted its use (to within a minute); ``None``: never noted (filled in by reads)."""
    secret_sha256: str = field(default="", repr=False)
    previous_secrets: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    """Rotated-out secrets' hashes with the time each stops working (a rotation's grace period)."""
    corruption: Corruption | None = None
    """Why the token's stream does not verify (the fields above then say only what the events before the break
    say), or ``None``."""

    def expired(self, now: datetime | None = None) -> bool:
        """True once ``expires_at`` has passed."""
        return self.expires_at is not None and _parse_time(self.expires_at) <= (now or datetime.now(UTC))

    def accepts(self, secret: str, now: datetime | None = None) -> bool:
        """True when ``secret`` is the token's secret, or a rotated-out one still in its grace period."""
        digest = secret_hash(secret)
        if hmac.compare_digest(self.secret_sha256, digest):
            return True
        moment = now or datetime.now(UTC)
        return any(hmac.compare_digest(old, digest) and _parse_time(until) > moment
                   for old, until in self.previous_secrets)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, without the secret's hash."""
        return {"token_id": self.token_id, "name": self.name, "kind": "admin" if self.admin else "project",
                "roles": dict(self.roles), "created_at": self.created_at, "created_by": self.created_by,
                "revoked": self.revoked, "revoked_at": self.revoked_at, "expires_at": self.expires_at,
                "expired": self.expired(), "rotated_at": self.rotated_at, "last_used_at": self.last_used_at,
                "corruption": self.corruption.to_dict() if self.corruption is not None else None}


@dataclass(frozen=True)
class Principal:
    """The authenticated caller of a request: its token, its role in each project, whether it is an admin."""

    token_id: str
    name: str
    admin: bool
    roles: dict[str, str]
    expires_at: str | None = None

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
        """JSON-ready: token id, name, kind, roles, actor, expiry."""
        return {"token_id": self.token_id, "name": self.name, "kind": "admin" if self.admin else "project",
                "roles": dict(self.roles), "actor": self.actor, "expires_at": self.expires_at}


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


def _new_secret() -> str:
    return base64.urlsafe_b64encode(secrets.token_bytes(32)).decode("ascii").rstrip("=")


def _check_seconds(value: object, field: str, maximum: int, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise InvalidInput(f"{field} {value!r} must be a whole number of seconds from {minimum} to {maximum}",
                           field=field)
    return value


def create_token(store: Store, name: str, *, roles: dict[str, str] | None = None, admin: bool = False,
                 actor: str = "jixu", expires_in: int | None = None) -> tuple[TokenInfo, str]:
    """Record a new token; returns its record and the bearer text (shown once, never stored).

    A project token needs at least one role; an admin token has none (it may
    do everything). ``expires_in``: seconds until it stops working (default: never).
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
    data: dict[str, Any] = {}
    if expires_in is not None:
        lifetime = _check_seconds(expires_in, "expires_in", MAX_LIFETIME_SECONDS)
        data["expires_at"] = _time_text(datetime.now(UTC) + timedelta(seconds=lifetime))
    token_id = new_id()
    secret = _new_secret()
    [event] = record(store, token_stream(token_id), [NewEvent("token.created", {
        "token_id": token_id, "name": name, "kind": "admin" if admin else "project", "roles": checked,
        "secret_sha256": secret_hash(secret), "created_by": actor, **data}, {"actor": actor})], 0)
    return _info([event]), f"jixu_{token_id}_{secret}"


def _info(events: list[Event]) -> TokenInfo:
    created = events[0]
    data = created.data
    revoked = next((e for e in events if e.type == "token.revoked"), None)
    secret, previous, rotated_at = str(data.get("secret_sha256")), [], None
    for event in events:
        if event.type == "token.rotated":
            until = event.data.get("previous_valid_until")
            if isinstance(until, str):
                previous.append((secret, until))
            secret, rotated_at = str(event.data.get("secret_sha256")), event.recorded_at
    expires = data.get("expires_at")
    return TokenInfo(token_id=str(data["token_id"]), name=str(data["name"]), admin=data.get("kind") == "admin",
                     roles={str(k): str(v) for k, v in dict(data.get("roles") or {}).items()},
                     created_at=created.recorded_at, created_by=str(data.get("created_by")),
                     revoked=revoked is not None, revoked_at=revoked.recorded_at if revoked else None,
                     expires_at=expires if isinstance(expires, str) else None, rotated_at=rotated_at,
                     secret_sha256=secret, previous_secrets=tuple(previous))


def _with_use(store: Store, tokens: list[TokenInfo]) -> list[TokenInfo]:
    """``tokens`` with ``last_used_at`` from the store's credential-use notes (one read for all of them)."""
    used: dict[str, float] = {}
    keys = [f"{USE_KEY_PREFIX}{t.token_id}" for t in tokens]
    for start in range(0, len(keys), 1000):
        used.update(store.last_used(keys[start:start + 1000]))
    return [dataclasses.replace(t, last_used_at=_epoch_text(used[key])) if key in used else t
            for t, key in zip(tokens, keys, strict=True)]


class _TokenEvents:
    """A token stream's events in order (a token is a few events: never checkpointed)."""

    name = "token"
    version = 1

    def initial(self) -> list[Event]:
        """No events yet."""
        return []

    def apply(self, state: list[Event], event: Event) -> list[Event]:
        """``state`` with ``event`` added."""
        state.append(event)
        return state

    def dump(self, state: list[Event]) -> JSONObject:
        """The events (the protocol asks for it; token streams are never checkpointed)."""
        return {"events": [event.to_dict() for event in state]}

    def load(self, data: JSONObject) -> list[Event]:
        """Never called: token streams are never checkpointed."""
        raise InvalidInput("token streams are never checkpointed")


def _verified(store: Store, token_id: str) -> TokenInfo | None:
    """The token ``token_id`` as its verified events say, with its corruption when its stream does not verify
    (a break found is recorded, as every verified read does); ``None`` when there is no such token."""
    stream = token_stream(token_id)
    try:
        projected = fold_verified(store, stream, _TokenEvents())
    except NotFound:
        return None
    found = corruption(stream, chain=projected.chain, analysis=None)
    events = projected.state
    if found is None:
        return _info(events) if events and events[0].type == "token.created" else None
    if events and events[0].type == "token.created":
        return dataclasses.replace(_info(events), corruption=found)
    return TokenInfo(token_id=token_id, name="", admin=False, roles={}, created_at="", created_by="",
                     corruption=found)


def _read_token(store: Store, token_id: str) -> TokenInfo:
    if not is_valid_id(token_id):
        raise InvalidInput(f"token id {token_id!r} is not a valid id", field="token_id")
    token = _verified(store, token_id)
    if token is None:
        raise TokenNotFound(f"no token {token_id}", token_id=token_id)
    return token


def _sound(token: TokenInfo) -> TokenInfo:
    """``token`` when its stream verifies, else :class:`TokenCorrupt` (nothing is appended to a broken stream)."""
    found = token.corruption
    if found is not None:
        raise TokenCorrupt(f"token {token.token_id}'s stream is corrupt: {found.summary()}. It authenticates nobody "
                           f"and is neither rotated nor revoked; make a new token, and inspect this one with `jixu "
                           f"verify STORE --stream {token_stream(token.token_id)}`", token_id=token.token_id,
                           stream=token_stream(token.token_id), first_bad_seq=found.first_bad_seq,
                           reason=found.reason, detail=found.detail)
    return token


def get_token(store: Store, token_id: str) -> TokenInfo:
    """A token's record with its last use (:class:`TokenNotFound` if there is none)."""
    return _with_use(store, [_read_token(store, token_id)])[0]


def list_tokens(store: Store) -> list[TokenInfo]:
    """Every token, oldest first (revoked and expired ones included), with its last use."""
    tokens: list[TokenInfo] = []
    after = ""
    while True:
        page = store.list_streams(TOKEN_PREFIX, after=after, limit=1000)
        for info in page:
            token_id = info.stream[len(TOKEN_PREFIX):]
            token = _verified(store, token_id) if is_valid_id(token_id) else None
            if token is not None:
                tokens.append(token)
        if len(page) < 1000:
            return _with_use(store, tokens)
        after = page[-1].stream


def rotate_token(store: Store, token_id: str, *, actor: str = "jixu",
                 grace_seconds: int = 0) -> tuple[TokenInfo, str]:
    """Give a token a new secret; returns its record and the new bearer text (shown once).

    The old secret stops working at once, or after ``grace_seconds`` (at most
    :data:`MAX_GRACE_SECONDS`), so clients can be moved to the new one. Roles,
    expiry and id stay; the token's Studio sessions end (log in again with the
    new secret). A revoked token is refused (:class:`TokenRevoked`).
    """
    grace = _check_seconds(grace_seconds, "grace_seconds", MAX_GRACE_SECONDS, minimum=0)
    token = _sound(_read_token(store, token_id))
    if token.revoked:
        raise TokenRevoked(f"token {token_id} is revoked; make a new one", token_id=token_id)
    secret = _new_secret()
    stream = token_stream(token_id)
    info = store.stream_info(stream)
    until = _time_text(datetime.now(UTC) + timedelta(seconds=grace)) if grace else None
    record(store, stream, [NewEvent("token.rotated", {"token_id": token_id, "secret_sha256": secret_hash(secret),
                                                      "previous_valid_until": until, "actor": actor},
                                    {"actor": actor})], info.head_seq if info else 0)
    store.revoke_sessions(token_id)
    return get_token(store, token_id), f"jixu_{token_id}_{secret}"


def revoke_token(store: Store, token_id: str, *, actor: str = "jixu", reason: str | None = None,
                 keep_an_admin: bool = False) -> TokenInfo:
    """Record that a token may no longer be used (idempotent: revoking twice changes nothing).

    ``keep_an_admin`` (the HTTP API's): refuse (:class:`LastAdminToken`) to revoke the last admin token that works,
    as nobody could then manage tokens over the API (an audit's fuzzer revoked its own, and only, admin token);
    whoever holds the store can (``jixu tokens revoke``), and can make a new one.
    """
    if reason is not None and (not isinstance(reason, str) or len(reason) > 1000):
        raise InvalidInput("reason must be a string of at most 1000 characters", field="reason")
    token = _sound(get_token(store, token_id))
    if token.revoked:
        store.revoke_sessions(token_id)  # a revocation recorded by a process that stopped before ending them
        return token
    guard = _admin_guard(store) if keep_an_admin and token.admin else None
    try:
        if guard is not None and not any(
                other.admin and other.token_id != token_id and other.corruption is None and not other.revoked
                and not other.expired() for other in list_tokens(store)):
            raise LastAdminToken(f"token {token_id} is the last admin token that works: revoked, nobody could "
                                 "manage tokens over the API. Make another admin token first (POST /tokens), or "
                                 "revoke it with `jixu tokens revoke` on the store", token_id=token_id)
        stream = token_stream(token_id)
        info = store.stream_info(stream)
        # Under the guard's fence: two admins revoking each other at once see each other working (a review), so
        # the check and the revocation hold the guard together, and a guard lost meanwhile records nothing.
        record(store, stream, [NewEvent("token.revoked", {"token_id": token_id, "actor": actor, "reason": reason},
                                       {"actor": actor})], info.head_seq if info else 0, fence=guard)
    finally:
        release(store, guard)
    store.revoke_sessions(token_id)  # its Studio sessions end with it (each is checked against the token too)
    return get_token(store, token_id)


ADMIN_GUARD_KEY = "auth/admin-revocation"
"""The lease an admin token's revocation over the API holds while it checks that another admin token works."""
ADMIN_GUARD_TTL = 10.0
_ADMIN_GUARD_WAIT = 5.0


def _admin_guard(store: Store) -> Fence:
    """The admin-revocation guard's lease (waiting up to a few seconds for another revocation to end)."""
    deadline = time.monotonic() + _ADMIN_GUARD_WAIT
    while True:
        try:
            return acquire_claim(store, ADMIN_GUARD_KEY, f"revoke:{new_id()}", ADMIN_GUARD_TTL)
        except LeaseHeld:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.02)


def token_id_of(authorization: str | None) -> str | None:
    """The token id an ``Authorization`` header names (well formed or not otherwise), or ``None``."""
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    match = TOKEN_PATTERN.match(value.strip()) if scheme.lower() == "bearer" else None
    return match.group(1) if match else None


def principal_of(token: TokenInfo) -> Principal:
    """The caller ``token`` makes, when it may still be used (401 problem when corrupt, revoked or expired)."""
    found = token.corruption
    if found is not None:
        raise HTTPProblem(TOKEN_CORRUPT, f"token {token.token_id}'s stream is corrupt ({found.summary()}): it "
                                         "authenticates nobody; ask an admin for a new token", status=401,
                          token_id=token.token_id, first_bad_seq=found.first_bad_seq, reason=found.reason)
    if token.revoked:
        raise HTTPProblem(UNAUTHORIZED, "unknown or revoked token")
    if token.expired():
        raise HTTPProblem(TOKEN_EXPIRED, f"token {token.token_id} expired at {token.expires_at}; ask an admin for "
                                         "a new one (or rotate it with a new expiry)", token_id=token.token_id,
                          expires_at=token.expires_at)
    return Principal(token.token_id, token.name, token.admin, dict(token.roles), token.expires_at)


def token_principal(store: Store, token_id: str) -> Principal:
    """The caller token ``token_id`` makes, without its secret (a server-side session proved it already)."""
    token = _verified(store, token_id) if is_valid_id(token_id) else None
    if token is None:
        raise HTTPProblem(UNAUTHORIZED, "unknown or revoked token")
    return principal_of(token)


def authenticate(store: Store, authorization: str | None) -> Principal:
    """The caller named by an ``Authorization: Bearer jixu_…`` header (401 problem when absent or wrong).

    An expired token is told so (``token_expired``), and one whose stream does not verify (``token_corrupt``), but
    only to a caller that knows its secret (as its verified events record it).
    """
    if not authorization:
        raise HTTPProblem(UNAUTHORIZED, "send a bearer token: Authorization: Bearer jixu_<id>_<secret> "
                                        "(make one with `jixu tokens create`)")
    scheme, _, value = authorization.partition(" ")
    match = TOKEN_PATTERN.match(value.strip()) if scheme.lower() == "bearer" else None
    if match is None:
        raise HTTPProblem(UNAUTHORIZED, "the Authorization header must be 'Bearer jixu_<id>_<secret>'")
    token_id, secret = match.groups()
    token = _verified(store, token_id)
    if token is None or not token.accepts(secret):  # a corrupt token is told so only to who knows its secret
        raise HTTPProblem(UNAUTHORIZED, "unknown or revoked token")
    return principal_of(token)


__all__ = [
    "ROLES",
    "ROLE_RANK",
    "TOKEN_PREFIX",
    "Principal",
    "TokenInfo",
    "MAX_GRACE_SECONDS",
    "MAX_LIFETIME_SECONDS",
    "USE_KEY_PREFIX",
    "TokenCorrupt",
    "TokenNotFound",
    "TokenRevoked",
    "LastAdminToken",
    "authenticate",
    "check_roles",
    "create_token",
    "get_token",
    "list_tokens",
    "parse_duration",
    "principal_of",
    "revoke_token",
    "rotate_token",
    "secret_hash",
    "token_id_of",
    "token_principal",
    "token_stream",
]
