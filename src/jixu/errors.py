"""One small hierarchy of typed errors, each with a stable ``code``.

Every error jixu raises on purpose derives from :class:`JixuError`. The
``code`` is stable across releases: the CLI maps it to an exit status and the
HTTP API to a problem ``type``. Messages name the offending id and say what to
do next.
"""

from __future__ import annotations

from typing import Any


class JixuError(Exception):
    """Base class of every error jixu raises deliberately."""

    code: str = "jixu_error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description: ``{"code", "message", **details}``."""
        return {"code": self.code, "message": self.message, **self.details}


# --- bad input: nothing was written -------------------------------------------------


class InvalidInput(JixuError):
    """The caller passed something malformed; nothing was changed."""

    code = "invalid_input"


class InvalidId(InvalidInput):
    """An event id, stream name or other identifier has the wrong form."""

    code = "invalid_id"


class MalformedEvent(InvalidInput):
    """An event's type, data or meta cannot be encoded canonically."""

    code = "malformed_event"


class PayloadTooLarge(InvalidInput):
    """An event's encoded data and meta exceed the store's size limit."""

    code = "payload_too_large"


class NotFound(JixuError):
    """A stream, event or other object does not exist."""

    code = "not_found"


# --- append contract ----------------------------------------------------------------


class ConcurrencyError(JixuError):
    """The stream's head moved: ``expected_seq`` is no longer the head."""

    code = "concurrency_conflict"


class FencingError(JixuError):
    """The fence (lease key, owner, epoch) is no longer current."""

    code = "stale_fence"


class IdempotencyConflict(JixuError):
    """An id was reused with different content."""

    code = "idempotency_conflict"


class LeaseHeld(JixuError):
    """Another owner holds an unexpired lease on the key."""

    code = "lease_held"


# --- the store itself ---------------------------------------------------------------


class StoreError(JixuError):
    """The store cannot be used as asked."""

    code = "store_error"


class StoreNotFound(StoreError):
    """The database does not exist and creating it was not allowed."""

    code = "store_not_found"


class StoreLocked(StoreError):
    """Another process held the database lock past the busy timeout."""

    code = "store_locked"


class StoreReadOnly(StoreError):
    """The store was opened read-only (or the file is not writable)."""

    code = "store_read_only"


class SchemaTooNew(StoreError):
    """The database was written by a newer jixu; this code fails closed."""

    code = "schema_too_new"


class UnsupportedStoreUrl(StoreError):
    """A store URL names a scheme jixu does not know."""

    code = "unsupported_store_url"


__all__ = [
    "ConcurrencyError",
    "FencingError",
    "IdempotencyConflict",
    "InvalidId",
    "InvalidInput",
    "JixuError",
    "LeaseHeld",
    "MalformedEvent",
    "NotFound",
    "PayloadTooLarge",
    "SchemaTooNew",
    "StoreError",
    "StoreLocked",
    "StoreNotFound",
    "StoreReadOnly",
    "UnsupportedStoreUrl",
]
