"""Durable threads from synchronous code: scripts, Flask and Django handlers, WSGI servers (decision 0036).

:class:`SyncHarness` owns an event loop in a daemon thread (:class:`~jixu.threads.home.OwnLoop`) and its
:class:`~jixu.Harness` lives there: every method runs the async API's own coroutine on that loop and returns
its answer, so the two APIs cannot drift apart. Turns go on in the background between calls (a handler that
sends returns at once; another that waits finds the turn finished or still running), and any number of OS
threads may call one facade at once::

    harness = SyncHarness(agent, "sqlite:///jixu.db")     # once per process, e.g. at import time
    thread = harness.create_thread()
    state = thread.run_sync("Email a@example.com")        # send, then wait for the turn to end
    harness.close()                                       # or `with SyncHarness(...) as harness:`

Closing drains the harness (:meth:`Harness.shutdown`): calls in flight may finish for up to
``drain_timeout`` seconds (then they are cut and recorded as having an unknown outcome), every lease is
given back and the loop stops. A harness still open when the interpreter exits is closed the same way by
an ``atexit`` hook; a process that dies without running it (SIGKILL, ``os._exit``) leaves its claims to
expire, as any crash does.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, Self, TypeVar

from jixu.errors import InvalidInput
from jixu.ledger import Event, Store
from jixu.recovery import Analysis
from jixu.threads.agent import Agent
from jixu.threads.harness import Harness, ThreadSummary
from jixu.threads.home import OwnLoop
from jixu.threads.log import State
from jixu.threads.thread import Thread

R = TypeVar("R")

_OPEN: set[SyncHarness] = set()
"""Facades not closed yet: the interpreter's exit closes them (see :func:`_close_at_exit`)."""


async def _now(function: Callable[..., R], *args: Any) -> R:
    """Call a synchronous method of the async API on the loop it belongs to."""
    return function(*args)


class SyncThread:
    """A :class:`~jixu.Thread` for synchronous code (get one from :class:`SyncHarness`).

    Each method is the Thread's method of the same name, run on the harness's loop; :attr:`thread` is the
    Thread itself (for ``await`` on other loops: it is carried out on the harness's loop too).
    """

    def __init__(self, thread: Thread, own: OwnLoop) -> None:
        self.thread = thread
        self._own = own
        self.thread_id = thread.thread_id
        self.stream = thread.stream

    def _call(self, coroutine: Coroutine[Any, Any, R], timeout: float | None = None) -> R:
        return self._own.call(coroutine, timeout, what=f"thread {self.thread_id}")

    def __repr__(self) -> str:
        return f"<SyncThread {self.thread_id}>"

    @property
    def running(self) -> bool:
        """True while the agent loop is working on this thread."""
        return self._call(_now(lambda: self.thread.running))

    @property
    def checkpoint_status(self) -> str:
        """How opening this thread used its checkpoint (see :attr:`Thread.checkpoint_status`)."""
        return self._call(_now(lambda: self.thread.checkpoint_status))

    def state(self) -> State:
        """The current state (see :meth:`Thread.state`)."""
        return self._call(_now(self.thread.state))

    def analysis(self) -> Analysis:
        """The RecoveryResolver's answer for this thread as it stands."""
        return self._call(_now(self.thread.analysis))

    def events(self, from_seq: int = 1) -> list[Event]:
        """The thread's events, in order."""
        return self._call(self.thread.events(from_seq))

    def refresh(self) -> State:
        """Pick up events other processes appended, and return the state."""
        return self._call(self.thread.refresh())

    def send(self, text: str) -> str:
        """Start a turn; returns its id once ``turn.started`` is durable. The turn goes on in the background."""
        return self._call(self.thread.send(text))

    def wait(self, timeout: float | None = None) -> State:
        """Wait until the thread is idle, waiting, failed or corrupt; return its state.

        After ``timeout`` seconds, :class:`TimeoutError`: the turn goes on, and a later ``wait()`` collects it.
        """
        return self._call(self.thread.wait(), timeout)

    def run_sync(self, text: str, timeout: float | None = None) -> State:
        """:meth:`send` ``text``, then :meth:`wait` (``timeout`` as there) for the turn to end."""

        async def send_and_wait() -> State:
            await self.thread.send(text)
            return await self.thread.wait()

        return self._call(send_and_wait(), timeout)

    def interrupt(self, reason: str = "interrupted by the caller") -> State:
        """Stop the running turn; calls in flight are recorded as having an unknown outcome."""
        return self._call(self.thread.interrupt(reason))

    def resume(self, *, actor: str = "operator", note: str | None = None) -> State:
        """Resume a paused turn; it continues in the background."""
        return self._call(self.thread.resume(actor=actor, note=note))

    def resolve_tool_outcome(self, effect_id: str, resolution: str, *, resolution_id: str | None = None,
                             note: str | None = None, actor: str = "operator", evidence: dict[str, Any] | None = None,
                             result: Any = None) -> State:
        """Record an operator's decision about an effect whose outcome is unknown, then continue
        (see :meth:`Thread.resolve_tool_outcome`)."""
        return self._call(self.thread.resolve_tool_outcome(effect_id, resolution, resolution_id=resolution_id,
                                                           note=note, actor=actor, evidence=evidence, result=result))

    def approve(self, effect_id: str, *, actor: str = "operator", note: str | None = None) -> State:
        """Approve a parked call; the thread continues and dispatches it."""
        return self._call(self.thread.approve(effect_id, actor=actor, note=note))

    def deny(self, effect_id: str, *, actor: str = "operator", note: str | None = None) -> State:
        """Deny a parked call; the model is told and the thread continues."""
        return self._call(self.thread.deny(effect_id, actor=actor, note=note))

    def replay(self, upto: int | str | None = None) -> State:
        """Rebuild the state from events alone, calling no model, tool or other driver."""
        return self._call(self.thread.replay(upto))

    def fork(self, at: str, input: str | None = None) -> SyncThread:
        """A new thread with this one's state at event ``at`` (see :meth:`Thread.fork`)."""
        return SyncThread(self._call(self.thread.fork(at, input)), self._own)


class SyncHarness:
    """A :class:`~jixu.Harness` for synchronous code, on an event loop of its own (see the module docstring).

    ``SyncHarness(agent, store, **options)`` takes :class:`~jixu.Harness`'s arguments;
    ``SyncHarness(harness)`` (or ``harness.sync()``) moves an existing harness, none of whose threads runs
    yet, onto the loop. ``drain_timeout``: how long :meth:`close` lets calls in flight finish.
    """

    def __init__(self, agent: Agent | Harness, store: Store | str | None = None, *, drain_timeout: float = 10.0,
                 **options: Any) -> None:
        if isinstance(agent, Harness):
            if store is not None or options:
                raise InvalidInput("SyncHarness(harness) takes no store or harness options: the harness has them",
                                   field="store")
            harness = agent
        else:
            harness = Harness(agent, store, **options)
        if isinstance(drain_timeout, bool) or not isinstance(drain_timeout, int | float) or drain_timeout < 0:
            raise InvalidInput("drain_timeout must be a number of seconds >= 0", field="drain_timeout")
        self.harness = harness
        """The async harness: its coroutines, awaited on any loop, are carried out on this facade's loop."""
        self.drain_timeout = float(drain_timeout)
        self._closing = threading.Lock()
        self.closed = False
        self._own = OwnLoop(f"jixu-harness {harness.owner}")
        try:
            harness._adopt(self._own)
        except BaseException:
            self._own.stop()
            raise
        _OPEN.add(self)

    def _call(self, coroutine: Coroutine[Any, Any, R]) -> R:
        return self._own.call(coroutine, what="the harness")

    def __repr__(self) -> str:
        return f"<SyncHarness {self.harness.owner} {self.harness.store.url}{' closed' if self.closed else ''}>"

    @property
    def store(self) -> Store:
        """The harness's store."""
        return self.harness.store

    def create_thread(self, *, metadata: dict[str, Any] | None = None) -> SyncThread:
        """A new, idle thread recorded under the harness's agent."""
        return SyncThread(self._call(self.harness.create_thread(metadata=metadata)), self._own)

    def open_thread(self, thread_id: str, *, resume: bool = True) -> SyncThread:
        """Open a thread (after a restart, or in another request): see :meth:`Harness.open_thread`. A thread
        this harness is working on already is the same thread, its turn untouched."""
        return SyncThread(self._call(self.harness.open_thread(thread_id, resume=resume)), self._own)

    def list_threads(self, *, limit: int = 1000, after: str = "") -> list[ThreadSummary]:
        """Threads in this store, oldest id first."""
        return self._call(self.harness.list_threads(limit=limit, after=after))

    def close(self, drain_timeout: float | None = None) -> None:
        """Drain the running turns (up to ``drain_timeout``, default the facade's), give every lease back, close
        the store if the harness opened it, and stop the loop. Closing again does nothing."""
        with self._closing:
            if self.closed:
                return
            self.closed = True
        try:
            if self._own.alive:
                timeout = self.drain_timeout if drain_timeout is None else drain_timeout
                self._own.call(self.harness.shutdown(timeout), what="the harness")
        finally:
            self._own.stop()
            _OPEN.discard(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


@atexit.register
def _close_at_exit() -> None:
    """At the interpreter's exit (non-daemon threads joined, daemon ones still running), close every facade
    left open: its calls in flight finish (up to its drain timeout) and its leases are given back."""
    for harness in list(_OPEN):
        with contextlib.suppress(Exception):
            harness.close()


__all__ = ["SyncHarness", "SyncThread"]
