"""The decide-and-act loop every aggregate runs, and the pauses it waits out.

Threads and runs supply a pure decide step (what to do next, from the
projected record and the resolver's analysis) and the actions that carry a
decision out; :func:`drive` runs them: decide, act, and when another writer
moved the head meanwhile (:class:`~jixu.errors.ConcurrencyError`), fold its
events and decide again. Every action records at least one event: an action
that records nothing would make the loop spin forever, so it stops instead.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from jixu.errors import ConcurrencyError, InvalidInput, JixuError
from jixu.kernel.writer import StreamWriter, unrecorded_receipts
from jixu.ledger.store import Store

MAX_AUTOMATIC_RETRIES: Final = 3
"""Automatic resumes of a pause (rate limit, transient failure) before it waits for an operator."""

AUTOMATIC_PAUSES: Final = frozenset({"rate_limit", "transient"})
"""The provider failures whose pause ends by itself (at most :data:`MAX_AUTOMATIC_RETRIES` times)."""

OPERATOR_PAUSES: Final = frozenset({"quota", "authentication"})
"""The provider failures whose pause an operator ends (waiting does not lift them)."""

MAX_RETRY_AFTER = 3600.0
"""The longest wait a provider's retry-after is honoured for by itself (seconds); a longer one (a day's quota, a
value no provider means) pauses for an operator instead of holding the turn or run that long."""


class _LoopStopped:
    """What an action returns when it ended the loop without recording anything (see :data:`LOOP_STOPPED`)."""


LOOP_STOPPED: Final = _LoopStopped()
"""Returned by ``act`` to end :func:`drive` at once: the action had nothing to record (a loop waiting out an
automatic pause when a drain comes: the pause is recorded, whoever continues the turn waits out the rest)."""


async def drive(writer: StreamWriter[Any], next_action: Callable[[], Awaitable[Any]],
                act: Callable[[Any], Awaitable[object]], *, what: str, **details: Any) -> None:
    """Run ``act(next_action())`` until ``next_action`` returns ``None`` (or ``act`` returns :data:`LOOP_STOPPED`).

    ``what`` names the stream's owner in the error raised when an action
    recorded nothing (``details`` go into it).
    """
    while True:
        action = await next_action()
        if action is None:
            return
        head = writer.state.seq
        try:
            if await act(action) is LOOP_STOPPED:
                return
        except ConcurrencyError as conflict:
            if unrecorded_receipts(conflict):
                raise  # receipts it could not record are facts: they reach the caller, never dropped here
            # Another writer appended (an operator's decision, say): read it and decide again. Receipts the
            # refused append carried are already recorded after it (see StreamWriter).
            await writer.idle()
            writer.sync()
            if writer.state.seq != head or writer.chain_break is not None:
                continue
        if writer.state.seq == head:
            raise JixuError(f"{what}: {type(action).__name__} recorded nothing; stopping instead of looping",
                            **details)


def check_backoff(name: str, value: object) -> float:
    """Return ``value`` (seconds) if it is a number from 0 to 3600: a ``retry_backoff`` or its cap."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 3600:
        raise InvalidInput(f"{name} must be between 0 and 3600 seconds", field=name)
    return float(value)


def asked_too_long(pause: Mapping[str, Any]) -> str:
    """For a recorded pause made an operator's because the provider asked to wait longer than
    :data:`MAX_RETRY_AFTER`: what it asked (for the pause's reason), else ``""``."""
    asked = pause.get("retry_after")
    if pause.get("automatic") or isinstance(asked, bool) or not isinstance(asked, int | float) \
            or not asked > MAX_RETRY_AFTER:
        return ""
    return f" (the provider asked to wait {asked:.0f} s, longer than the hour jixu waits by itself)"


def pause_delay(retry_after: float | None, retries_used: int, *, backoff: float, cap: float) -> float | None:
    """The delay of an automatic pause: the provider's ``retry_after``, else ``backoff * 2**n`` with +-20 %
    jitter, capped at ``cap``. None when the provider asks for more than :data:`MAX_RETRY_AFTER`: the pause is
    then an operator's (recorded ``automatic: false``, the provider's ``retry_after`` kept)."""
    if retry_after is not None:
        return float(retry_after) if retry_after <= MAX_RETRY_AFTER else None
    return min(backoff * (2.0 ** retries_used) * random.uniform(0.8, 1.2), cap)


async def sleep_until(store: Store, resume_at: object) -> None:
    """Sleep until ``resume_at`` (seconds on the store's clock); at once if it passed or is not a time."""
    if isinstance(resume_at, int | float) and not isinstance(resume_at, bool):
        remaining = resume_at - store.now()
        if remaining > 0:
            await asyncio.sleep(remaining)


__all__ = ["AUTOMATIC_PAUSES", "LOOP_STOPPED", "MAX_AUTOMATIC_RETRIES", "MAX_RETRY_AFTER", "OPERATOR_PAUSES",
           "asked_too_long", "check_backoff", "drive", "pause_delay", "sleep_until"]
