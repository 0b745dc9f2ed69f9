"""The ledger: streams of immutable, hash-chained events and the stores that keep them."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from jixu.ledger.chain import REASONS, VerifyReport, verify_rows
from jixu.ledger.encoding import JSONObject, canonical_bytes, canonical_text, content_hash
from jixu.ledger.event import GENESIS_HASH, Event, NewEvent
from jixu.ledger.ids import is_valid_id, new_id
from jixu.ledger.memory import MemoryStore
from jixu.ledger.projection import Projected, Projection, project, save_checkpoint
from jixu.ledger.sqlite import SQLiteStore
from jixu.ledger.store import Checkpoint, Fence, Lease, LeaseTake, Store, StreamInfo, WorkClaim, WorkItem
from jixu.ledger.urls import DEFAULT_STORE_URL, open_store

if TYPE_CHECKING:
    from jixu.ledger.postgres import PostgresStore


def __getattr__(name: str) -> Any:
    """Import :class:`PostgresStore` (and psycopg) only when it is first used."""
    if name == "PostgresStore":
        from jixu.ledger.postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def verify(store: Store | str | os.PathLike[str], stream: str) -> VerifyReport:
    """Recompute ``stream``'s hash chain in ``store`` (a Store, URL or path)."""
    opened = open_store(store, create=False) if not isinstance(store, Store) else store
    try:
        return opened.verify(stream)
    finally:
        if opened is not store:
            opened.close()


def verify_all(store: Store | str | os.PathLike[str]) -> list[VerifyReport]:
    """Verify every stream in ``store``, in stream-name order."""
    opened = open_store(store, create=False) if not isinstance(store, Store) else store
    try:
        reports: list[VerifyReport] = []
        after = ""
        while True:
            page = opened.list_streams(after=after, limit=1000)
            reports.extend(opened.verify(info.stream) for info in page)
            if len(page) < 1000:
                return reports
            after = page[-1].stream
    finally:
        if opened is not store:
            opened.close()


__all__ = [
    "DEFAULT_STORE_URL",
    "GENESIS_HASH",
    "REASONS",
    "Checkpoint",
    "Event",
    "Fence",
    "JSONObject",
    "Lease",
    "LeaseTake",
    "MemoryStore",
    "NewEvent",
    "PostgresStore",
    "Projected",
    "Projection",
    "SQLiteStore",
    "Store",
    "StreamInfo",
    "VerifyReport",
    "WorkClaim",
    "WorkItem",
    "canonical_bytes",
    "canonical_text",
    "content_hash",
    "is_valid_id",
    "new_id",
    "open_store",
    "project",
    "save_checkpoint",
    "verify",
    "verify_all",
    "verify_rows",
]
