"""Carrying out one effect: dispatch marker, driver, receipt, in that order, whatever the driver does.

Every effect of threads, runs and execution requests leaves the process
through :func:`perform`: the dispatch marker is durable before the driver is
called; whatever the driver returns or raises becomes exactly one receipt:
``completed`` with what it returned, a determinate ``failed`` when the
driver says for sure that nothing happened, an indeterminate one otherwise;
a cancellation mid-call records ``interrupted`` (indeterminate: the call may
have happened) before the cancellation goes on. The caller supplies the
driver call, the classification of its errors and where the receipt goes.

**A loop's shutdown never cuts a call** (decision 0036). ``asyncio.run``
cancels every task of its loop on the way out, so a program that sends in one
``asyncio.run`` and waits in another would cut the call in flight between its
dispatch marker and its receipt. A call carried out on a
:class:`~jixu.kernel.shutdown.CallerTask` is safe from that (see
:mod:`jixu.kernel.shutdown`): the shutdown takes effect once the call's
receipt is recorded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

from jixu.kernel.shutdown import CallerTask
from jixu.ledger.encoding import JSONObject
from jixu.ledger.event import NewEvent


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one call was observed to do: the body of its receipt."""

    phase: Literal["completed", "failed"]
    body: JSONObject
    """``{"result": ...}`` (or another completed body), or ``{"error": {...}, "indeterminate": bool}``."""

    @classmethod
    def completed(cls, body: JSONObject) -> Outcome:
        """The call returned: ``body`` is the receipt's content (usually ``{"result": ...}``)."""
        return cls("completed", body)

    @classmethod
    def failed(cls, error: JSONObject, *, indeterminate: bool, **extra: Any) -> Outcome:
        """The call failed: determinate only when nothing can have happened."""
        return cls("failed", {"error": error, "indeterminate": indeterminate, **extra})

    def receipt(self, kind: str, effect_id: str, attempt: int | None, meta: JSONObject) -> NewEvent:
        """The ``<kind>.completed`` / ``<kind>.failed`` event (no attempt: a rejection before dispatch)."""
        data: JSONObject = {"effect_id": effect_id}
        if attempt is not None:
            data["attempt"] = attempt
        data.update(self.body)
        return NewEvent(f"{kind}.{self.phase}", data, meta)


INTERRUPTED = Outcome.failed({"type": "interrupted"}, indeterminate=True)
"""The receipt of a call cut off by a cancellation: it may or may not have happened."""


NOT_STARTED = Outcome.failed({"type": "not_started", "message": "cancelled before the call began: it never ran"},
                             indeterminate=False)
"""The receipt of a call cancelled while it waited to start (a worker thread's queue): determinate, nothing ran."""


@dataclass
class _CallMark:
    """What :func:`perform` learns of its own call while it runs (one per performance: never stale)."""

    effect_id: str | None
    not_started: bool = False


_CURRENT_CALL: ContextVar[_CallMark | None] = ContextVar("jixu_current_call", default=None)


def mark_not_started(effect_id: str) -> None:
    """Say that the call of ``effect_id`` that :func:`perform` runs in this context was cancelled before it began
    and will never run (it waited for a worker thread): its cancellation then records :data:`NOT_STARTED`, not
    ``interrupted``. Only that performance's mark is set: a call performing another effect (a durable step
    awaiting a step of its own) is untouched, and the cancellation itself goes on as it came (a plain
    ``CancelledError``, which ``asyncio.timeout`` and task groups expect)."""
    mark = _CURRENT_CALL.get()
    if mark is not None and mark.effect_id == effect_id:
        mark.not_started = True


class _CutOff:
    calls = 0


CUT_OFF = _CutOff()
"""``CUT_OFF.calls``: calls of this process a cancellation cut off (recorded ``interrupted``). What they started
(a subprocess) may still run: a serving process stops its descendants before it ends when there were any."""


def marker(kind: str, effect_id: str, attempt: int, intent: JSONObject, meta: JSONObject,
           **extra: Any) -> NewEvent:
    """The ``<kind>.dispatched`` event of attempt ``attempt``, naming the intent's identity."""
    data: JSONObject = {"effect_id": effect_id, "attempt": attempt}
    for key in ("name", "args_hash", "idempotency_key"):
        if key in intent:
            data[key] = intent[key]
    data.update(extra)
    return NewEvent(f"{kind}.dispatched", data, meta)


async def perform(*, dispatch: Callable[[], Awaitable[object]], call: Callable[[], Awaitable[Outcome]],
                  classify: Callable[[Exception], Outcome], record: Callable[[Outcome], Awaitable[object]],
                  interrupted: Outcome = INTERRUPTED, effect_id: str | None = None) -> Outcome:
    """Dispatch (make the marker durable), call the driver, record exactly one receipt; returns the outcome.

    ``classify`` turns an exception of the call into its outcome (be honest:
    determinate only when the error proves nothing happened). A
    cancellation while the call runs records ``interrupted`` (one that reached the call of ``effect_id`` before
    it began, :func:`mark_not_started`, records :data:`NOT_STARTED`) and goes on,
    except a loop's shutdown on a :class:`CallerTask`: that one is raised
    only after the call ended and its receipt was recorded.
    ``KeyboardInterrupt`` and ``SystemExit`` are not receipts: they go on up
    and leave the effect dispatched without one (``unknown``).
    """
    await dispatch()
    task = asyncio.current_task()
    caller = task if isinstance(task, CallerTask) else None
    if caller is not None:
        caller.in_flight += 1
    mark = _CallMark(effect_id)
    current = _CURRENT_CALL.set(mark)
    try:
        try:
            outcome = await call()
        except asyncio.CancelledError:
            if mark.not_started:
                await record(NOT_STARTED)
            else:
                CUT_OFF.calls += 1
                await record(interrupted)
            raise
        except Exception as error:
            outcome = classify(error)
        await record(outcome)
    finally:
        _CURRENT_CALL.reset(current)
        if caller is not None:
            caller.in_flight -= 1
    if caller is not None and caller.stop_requested and not caller.in_flight:
        raise asyncio.CancelledError  # the loop's shutdown, held back until this receipt was recorded
    return outcome


__all__ = ["CUT_OFF", "INTERRUPTED", "NOT_STARTED", "Outcome", "mark_not_started", "marker", "perform"]
