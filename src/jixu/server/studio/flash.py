"""One-time messages of the Studio's Post/Redirect/Get: what a refused form said, shown on the page it led to.

Every Studio form post answers ``303 See Other`` to a page (decision 0038):
on success with ``?done=<what>``, on refusal with ``?flash=<id>``, where the
id names a :class:`Flash` kept here: the problem the API answered (status,
code, message, details) and the fields the person had typed (so a refused
message can be corrected and sent again on purpose, never by the browser).
A reload of that page is a GET: it shows the refusal again and sends nothing.

Flashes live in the server's memory, bound to who posted (a flash id is
useless in another session), for :data:`FLASH_SECONDS`, at most
:data:`MAX_FLASHES` of them (the oldest go first). A server restart forgets
them: the page then says the message has expired, and nothing else changes.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

FLASH_SECONDS = 15 * 60
MAX_FLASHES = 2000
MAX_KEPT_FIELD = 20_000
"""Longer typed fields are not kept for the refilled form (the limit is the server's memory, not the API's)."""
_NOT_KEPT = frozenset({"csrf_token", "token", "resolution_id", "reconciliation_id"})
"""Fields never kept: secrets, and generated ids a new page generates afresh."""


@dataclass(frozen=True)
class Flash:
    """What a refused post answered, for the page it redirects to."""

    owner: str
    problem: dict[str, Any]
    action: str
    """The path the form posted to: its fields are refilled only in that form."""
    fields: dict[str, str] = field(default_factory=dict)
    created: float = field(default_factory=time.monotonic)


class Flashes:
    """The server's flashes, by id (thread-safe; bounded in number and age)."""

    def __init__(self) -> None:
        self._items: OrderedDict[str, Flash] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, owner: str, problem: dict[str, Any], action: str, fields: dict[str, str]) -> str:
        """Keep a refusal for ``owner``; its id for the redirect's ``?flash=``."""
        kept = {k: v for k, v in fields.items() if k not in _NOT_KEPT and len(v) <= MAX_KEPT_FIELD}
        flash_id = secrets.token_urlsafe(16)
        with self._lock:
            self._items[flash_id] = Flash(owner, problem, action, kept)
            while len(self._items) > MAX_FLASHES:
                self._items.popitem(last=False)
        return flash_id

    def get(self, flash_id: str, owner: str) -> Flash | None:
        """The flash ``flash_id`` if ``owner`` made it and it has not expired (it stays readable: a reload shows
        the same refusal again)."""
        with self._lock:
            found = self._items.get(flash_id)
            if found is None or found.owner != owner:
                return None
            if time.monotonic() - found.created > FLASH_SECONDS:
                del self._items[flash_id]
                return None
            return found


def flashes(request: Request) -> Flashes:
    """The flashes of the app serving ``request`` (made on first use)."""
    state = request.app.state
    found: Flashes | None = getattr(state, "studio_flashes", None)
    if found is None:
        with _MAKING:
            found = getattr(state, "studio_flashes", None)
            if found is None:
                found = Flashes()
                state.studio_flashes = found
    return found


_MAKING = threading.Lock()

__all__ = ["FLASH_SECONDS", "Flash", "Flashes", "flashes"]
