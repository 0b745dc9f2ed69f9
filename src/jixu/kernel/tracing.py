"""Where the kernel tells an observer what it does: a turn running in this process, each call, each decision.

The default :class:`Tracer` does nothing and costs one attribute lookup per
call. :func:`jixu.integrations.otel.instrument` installs one that turns them
into OpenTelemetry spans. Observers see what the ledger records and never
change it: an exception an observer raises is swallowed (and logged), so
tracing can never make a call run twice or a receipt go unrecorded.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from jixu.kernel.effects import Outcome

_log = logging.getLogger("jixu.tracing")

Attributes = Mapping[str, Any]


class EffectSpan:
    """One call in flight, as an observer sees it (the no-op one)."""

    def finish(self, outcome: Outcome | None, state: Callable[[], str | None]) -> None:
        """The call ended with ``outcome`` (``None``: cut off without a receipt); ``state()`` answers the
        resolver's state of the effect after its receipt (asked only by observers that record it)."""


class Tracer:
    """The observer interface, doing nothing. Subclasses override what they observe."""

    enabled = False

    @contextlib.contextmanager
    def turn(self, *, agent: str, thread_id: str, turn_id: str | None, attributes: Attributes) -> Iterator[None]:
        """The agent loop of one thread running in this process (one segment of a turn: another process may
        run the rest after a crash or a hand-off)."""
        yield

    def effect(self, kind: str, *, effect_id: str, attempt: int, intent: Attributes,
               attributes: Attributes) -> EffectSpan:
        """A call about to leave the process (after its dispatch marker is durable)."""
        return _NO_SPAN

    def note(self, name: str, attributes: Attributes) -> None:
        """Something the ledger recorded about effects outside a call: a recovery's verdict on reopening,
        an outcome resolution, a probe's answer."""


_NO_SPAN = EffectSpan()
_current: Tracer = Tracer()


def tracer() -> Tracer:
    """The installed tracer (the no-op one unless :func:`set_tracer` installed another)."""
    return _current


def set_tracer(new: Tracer | None) -> Tracer:
    """Install ``new`` (``None``: the no-op tracer) for every thread and run of this process; the old one."""
    global _current
    old, _current = _current, new if new is not None else Tracer()
    return old


class Guarded(EffectSpan):
    """An observer's span whose failures are logged, never raised into the call it observes."""

    def __init__(self, span: EffectSpan) -> None:
        self._span = span

    def finish(self, outcome: Outcome | None, state: Callable[[], str | None]) -> None:
        try:
            self._span.finish(outcome, state)
        except Exception:  # an observer's bug must not become the call's outcome
            _log.exception("the tracer failed to finish a span")


def start_effect(kind: str, *, effect_id: str, attempt: int, intent: Attributes,
                 attributes: Attributes) -> EffectSpan:
    """:meth:`Tracer.effect` of the installed tracer, guarded."""
    current = _current
    if not current.enabled:
        return _NO_SPAN
    try:
        return Guarded(current.effect(kind, effect_id=effect_id, attempt=attempt, intent=intent,
                                      attributes=attributes))
    except Exception:
        _log.exception("the tracer failed to start a span")
        return _NO_SPAN


def note(name: str, attributes: Attributes) -> None:
    """:meth:`Tracer.note` of the installed tracer, guarded."""
    current = _current
    if not current.enabled:
        return
    try:
        current.note(name, attributes)
    except Exception:
        _log.exception("the tracer failed to record %s", name)


@contextlib.contextmanager
def turn(*, agent: str, thread_id: str, turn_id: str | None, attributes: Attributes) -> Iterator[None]:
    """:meth:`Tracer.turn` of the installed tracer; its failures to start or end are logged, not raised."""
    current = _current
    if not current.enabled:
        yield
        return
    try:
        context = current.turn(agent=agent, thread_id=thread_id, turn_id=turn_id, attributes=attributes)
        context.__enter__()
    except Exception:
        _log.exception("the tracer failed to start a turn span")
        yield
        return
    try:
        yield
    except BaseException as error:
        try:
            context.__exit__(type(error), error, error.__traceback__)
        except Exception:
            _log.exception("the tracer failed to end a turn span")
        raise
    else:
        try:
            context.__exit__(None, None, None)
        except Exception:
            _log.exception("the tracer failed to end a turn span")


__all__ = ["EffectSpan", "Tracer", "note", "set_tracer", "start_effect", "tracer", "turn"]
