"""RFC 9457 problem details: every error the HTTP API answers with, typed by jixu's stable error codes.

A problem's ``type`` is ``urn:jixu:problem:<code>`` where ``<code>`` is the
:attr:`~jixu.errors.JixuError.code` of the error (or one of the HTTP-only codes
below); the same code is repeated in the ``code`` member so a client never
parses the URN. Validation problems name the bad field (``field``) and list
every complaint (``errors``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jixu.errors import InvalidInput, JixuError, NotFound, StoreError

if TYPE_CHECKING:
    from fastapi.responses import JSONResponse

PROBLEM_TYPE_PREFIX = "urn:jixu:problem:"
PROBLEM_MEDIA_TYPE = "application/problem+json"

UNAUTHORIZED = "unauthorized"
TOKEN_EXPIRED = "token_expired"
TOKEN_CORRUPT = "token_corrupt"
"""401 when the caller's token's stream does not verify; 409 (:class:`~jixu.server.auth.TokenCorrupt`) when an admin
acts on such a token."""
RATE_LIMITED = "too_many_failed_logins"
FORBIDDEN = "forbidden"
REQUEST_TOO_LARGE = "request_too_large"
REQUEST_ID_REUSED = "request_id_reused"
REQUEST_IN_PROGRESS = "request_in_progress"
AGENT_NOT_CONFIGURED = "agent_not_configured"
INTERNAL = "internal_error"

_STATUS_BY_CODE: dict[str, int] = {
    UNAUTHORIZED: 401,
    TOKEN_EXPIRED: 401,
    RATE_LIMITED: 429,
    FORBIDDEN: 403,
    REQUEST_TOO_LARGE: 413,
    "payload_too_large": 413,
    REQUEST_ID_REUSED: 422,
    REQUEST_IN_PROGRESS: 409,
    AGENT_NOT_CONFIGURED: 409,
    "unknown_provider": 422,
    "source_unavailable": 422,
    "unsupported_store_url": 422,
    "git_error": 409,
    "workspace_mismatch": 409,
    "provider_test_failed": 409,
}

_TITLES: dict[int, str] = {
    400: "Bad request",
    401: "Not authenticated",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    409: "Conflict",
    413: "Request too large",
    422: "Invalid input",
    429: "Too many requests",
    500: "Internal error",
    503: "Store unavailable",
}


def problem_type(code: str) -> str:
    """The problem ``type`` URI of a stable error code."""
    return f"{PROBLEM_TYPE_PREFIX}{code}"


def code_of_type(type_uri: str) -> str:
    """The stable error code a problem ``type`` names (the inverse of :func:`problem_type`)."""
    return type_uri[len(PROBLEM_TYPE_PREFIX):] if type_uri.startswith(PROBLEM_TYPE_PREFIX) else type_uri


def status_of(error: JixuError) -> int:
    """The HTTP status of a jixu error: bad input 422, missing 404, store trouble 503, else a conflict (409)."""
    if error.code in _STATUS_BY_CODE:
        return _STATUS_BY_CODE[error.code]
    if isinstance(error, InvalidInput):
        return 422
    if isinstance(error, NotFound):
        return 404
    if isinstance(error, StoreError):
        return 503
    return 409


class HTTPProblem(JixuError):
    """An error that exists only over HTTP (authentication, authorization, request limits, request ids)."""

    def __init__(self, code: str, message: str, *, status: int | None = None,
                 headers: dict[str, str] | None = None, **details: Any) -> None:
        super().__init__(message, **details)
        self.code = code
        self.status = status if status is not None else _STATUS_BY_CODE.get(code, 400)
        self.headers = dict(headers or {})
        """Response headers the problem needs (e.g. ``Retry-After`` of a 429)."""


def problem_body(code: str, status: int, detail: str, instance: str | None = None, /,
                 **extra: Any) -> dict[str, Any]:
    """The problem+json document (``type``, ``title``, ``status``, ``detail``, ``code`` and extensions)."""
    body: dict[str, Any] = {"type": problem_type(code), "title": _TITLES.get(status, "Error"), "status": status,
                            "detail": detail, "code": code}
    if instance is not None:
        body["instance"] = instance
    for key, value in extra.items():
        if value is not None:
            # A detail named like a standard member (e.g. a run's "status") keeps its value under another name.
            body[f"error_{key}" if key in body or key == "instance" else key] = value
    return body


def problem_response(code: str, status: int, detail: str, instance: str | None = None, /,
                     headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    """A problem+json response."""
    from fastapi.responses import JSONResponse  # here: the CLI's HTTP client uses this module without FastAPI

    return JSONResponse(problem_body(code, status, detail, instance, **extra), status_code=status,
                        media_type=PROBLEM_MEDIA_TYPE, headers=headers)


def error_response(error: JixuError, instance: str | None = None) -> JSONResponse:
    """The problem+json response for a typed jixu error (its details become extension members)."""
    status = error.status if isinstance(error, HTTPProblem) else status_of(error)
    headers = {"WWW-Authenticate": 'Bearer realm="jixu"'} if status == 401 else {}
    if isinstance(error, HTTPProblem):
        headers.update(error.headers)
    details = {k: v for k, v in error.details.items() if _json_ready(v)}
    return problem_response(error.code, status, error.message, instance, headers=headers or None, **details)


def validation_errors(errors: list[dict[str, Any]]) -> tuple[str, list[dict[str, str]]]:
    """FastAPI/pydantic validation errors as ``(first bad field, [{field, message}])``.

    The field is the location without its ``body``/``query``/``path`` prefix,
    dotted (``metadata.project``); a missing body is ``body``.
    """
    listed: list[dict[str, str]] = []
    for error in errors:
        loc = [str(part) for part in error.get("loc", ())]
        where = loc[0] if loc else "body"
        path = loc[1:] if where in ("body", "query", "path", "header") and len(loc) > 1 else loc
        message = str(error.get("msg", "invalid"))
        if error.get("type") == "value_error":  # a validator's own sentence, without pydantic's prefix
            message = message.removeprefix("Value error, ")
        listed.append({"field": ".".join(path) or where, "in": where, "message": message})
    first = listed[0]["field"] if listed else "body"
    return first, listed


def _json_ready(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool | list | dict)


__all__ = [
    "AGENT_NOT_CONFIGURED",
    "FORBIDDEN",
    "INTERNAL",
    "PROBLEM_MEDIA_TYPE",
    "PROBLEM_TYPE_PREFIX",
    "RATE_LIMITED",
    "REQUEST_ID_REUSED",
    "REQUEST_IN_PROGRESS",
    "REQUEST_TOO_LARGE",
    "TOKEN_CORRUPT",
    "TOKEN_EXPIRED",
    "UNAUTHORIZED",
    "HTTPProblem",
    "code_of_type",
    "error_response",
    "problem_body",
    "problem_response",
    "problem_type",
    "status_of",
    "validation_errors",
]
