"""``/api/v1/tokens``: admins make, list, rotate and revoke bearer tokens."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from jixu.server.auth import create_token, get_token, list_tokens, revoke_token, rotate_token
from jixu.server.context import Authenticated, Context, context, mutation
from jixu.server.idempotency import Outcome
from jixu.server.models import (
    WRITE,
    CreateToken,
    RevokeToken,
    RotateToken,
    Token,
    TokenCreated,
    TokenId,
    TokenPage,
    problems,
)

router = APIRouter(prefix="/tokens", tags=["tokens"], route_class=Authenticated)
ADMIN = {**WRITE, **problems(403)}
Obj = dict[str, Any]


@router.post("", status_code=201, responses=ADMIN, response_model=TokenCreated, summary="Create a token (admin)")
def create(body: CreateToken, ctx: Annotated[Context, Depends(mutation)]) -> JSONResponse:
    """A new token with ``roles`` per project (or ``admin``), expiring after ``expires_in`` seconds if given; the
    secret is in this answer only.

    A replay with the same ``Idempotency-Key`` returns the token with
    ``secret: null``: the secret is never stored.
    """
    ctx.principal.require_admin()
    made: dict[str, Any] = {}

    def operation() -> Outcome:
        token, secret = create_token(ctx.store, body.name, roles=dict(body.roles), admin=body.admin,
                                     actor=ctx.actor, expires_in=body.expires_in)
        made.update(token=token.to_dict(), secret=secret)
        return Outcome(201, {"token": token.to_dict(), "secret": None})

    response = ctx.mutate(body, operation)
    if made:  # the first answer carries the secret; the recorded answer (for replays) does not
        return JSONResponse(made, status_code=201)
    return response


@router.get("", responses=ADMIN, response_model=TokenPage, summary="List tokens (admin)")
def list_all(ctx: Annotated[Context, Depends(context)]) -> JSONResponse:
    """Every token (never a secret or its hash), with its expiry and last use."""
    ctx.principal.require_admin()
    return JSONResponse({"tokens": [t.to_dict() for t in list_tokens(ctx.store)]})


@router.get("/{token_id}", responses=ADMIN, response_model=Token, summary="A token (admin)")
def get_one(token_id: TokenId, ctx: Annotated[Context, Depends(context)]) -> JSONResponse:
    """One token's record, with its expiry and last use."""
    ctx.principal.require_admin()
    return JSONResponse(get_token(ctx.store, token_id).to_dict())


@router.post("/{token_id}/rotate", responses=ADMIN, response_model=TokenCreated,
             summary="Give a token a new secret (admin)")
def rotate(token_id: TokenId, body: RotateToken, ctx: Annotated[Context, Depends(mutation)]) -> JSONResponse:
    """A new secret for the token, in this answer only; the old one stops working now, or after
    ``grace_seconds``. Roles, id and expiry stay; its Studio sessions end. 409 for a revoked token.

    A replay with the same ``Idempotency-Key`` returns the token with ``secret: null``.
    """
    ctx.principal.require_admin()
    made: dict[str, Any] = {}

    def operation() -> Outcome:
        token, secret = rotate_token(ctx.store, token_id, actor=ctx.actor, grace_seconds=body.grace_seconds)
        made.update(token=token.to_dict(), secret=secret)
        return Outcome(200, {"token": token.to_dict(), "secret": None})

    response = ctx.mutate(body, operation)
    if made:
        return JSONResponse(made, status_code=200)
    return response


@router.post("/{token_id}/revoke", responses=ADMIN, response_model=Token, summary="Revoke a token (admin)")
def revoke(token_id: TokenId, body: RevokeToken, ctx: Annotated[Context, Depends(mutation)]) -> JSONResponse:
    """Record that the token may no longer be used (at once, on every server over this store); its Studio
    sessions end. 409 ``last_admin_token`` for the last admin token that works (make another first)."""
    ctx.principal.require_admin()

    def operation() -> Outcome:
        revoked = revoke_token(ctx.store, token_id, actor=ctx.actor, reason=body.reason, keep_an_admin=True)
        return Outcome(200, revoked.to_dict())

    return ctx.mutate(body, operation)


__all__ = ["router"]
