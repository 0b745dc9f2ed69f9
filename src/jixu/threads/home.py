"""The event loop a harness's threads live on, when the harness owns one (decision 0036).

A :class:`~jixu.Harness` normally works on whatever event loop awaits it. A
harness driven from synchronous code (:class:`~jixu.SyncHarness`) owns a loop
instead: :class:`OwnLoop`, run by a daemon thread for as long as the harness is
open. Its threads' agent loops, heartbeats and shared commits all live there,
so no caller's short-lived loop (one ``asyncio.run`` per web request) ever
holds a turn.

Every coroutine method of :class:`~jixu.Harness` and :class:`~jixu.Thread` is
marked :func:`on_home_loop`: awaited on another loop than its harness's own,
it is carried out on the harness's loop and its answer (or error) handed
back. One implementation serves both APIs: the synchronous facade runs the
same coroutines there.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from jixu.errors import HarnessClosed, ThreadBusy

P = ParamSpec("P")
R = TypeVar("R")


class Homed(Protocol):
    """Something whose coroutines belong on one event loop (``None``: any caller's)."""

    @property
    def home_loop(self) -> asyncio.AbstractEventLoop | None: ...


H = TypeVar("H", bound=Homed)


def on_home_loop(method: Callable[Concatenate[H, P], Coroutine[Any, Any, R]],
                 ) -> Callable[Concatenate[H, P], Coroutine[Any, Any, R]]:
    """Carry ``method`` out on its object's home loop when it is awaited on another one."""

    async def carried(self: H, /, *args: P.args, **kwargs: P.kwargs) -> R:
        home = self.home_loop
        if home is None or home is asyncio.get_running_loop():
            return await method(self, *args, **kwargs)
        if home.is_closed() or not home.is_running():
            raise HarnessClosed("the harness's event loop is closed: it admits no more work")
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(method(self, *args, **kwargs), home))

    functools.update_wrapper(carried, method)
    return carried


class OwnLoop:
    """An event loop of its own, served by a daemon thread until :meth:`stop`.

    :meth:`call` runs a coroutine there from any other OS thread and returns
    its answer; many threads may call at once (each call is a task on the
    loop). The thread is a daemon so that a program that forgets to close its
    harness can still exit (see :class:`~jixu.SyncHarness` for what happens then).
    """

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._pid = os.getpid()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        try:
            self.loop.run_forever()
        finally:
            # Whatever is left (nothing, after a harness's shutdown drained its turns) ends the way
            # asyncio.run ends its tasks: cancelled, which never cuts a call in flight (decision 0036).
            tasks = asyncio.all_tasks(self.loop)
            for task in tasks:
                task.cancel()
            if tasks:
                self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()

    @property
    def alive(self) -> bool:
        """Whether the loop still serves calls (in this process)."""
        return self._pid == os.getpid() and self._thread.is_alive() and not self.loop.is_closed()

    def call(self, coroutine: Coroutine[Any, Any, R], timeout: float | None = None, *, what: str = "the call") -> R:
        """Run ``coroutine`` on the loop and return what it returns (or raise what it raises).

        After ``timeout`` seconds the coroutine is cancelled (a thread's ``wait`` leaves its agent loop
        running) and :class:`TimeoutError` raised, naming ``what`` did not finish.
        """
        problem = self._problem()
        if problem is not None:
            coroutine.close()
            raise problem
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            if future.done():
                raise  # the coroutine's own TimeoutError
            future.cancel()
            raise TimeoutError(f"{what} did not finish within {timeout} s; its work goes on (wait again)") from None

    def _problem(self) -> Exception | None:
        if self._pid != os.getpid():
            return HarnessClosed(f"this harness was opened in process {self._pid}, before a fork; open one in "
                                 "each process that uses it (e.g. in the web server's worker, not before it forks)")
        if not self._thread.is_alive() or self.loop.is_closed():
            return HarnessClosed("the harness is closed: it admits no more work")
        if threading.get_ident() == self._thread.ident:
            return ThreadBusy("a synchronous harness was called from its own event loop (a tool, say): waiting "
                              "there would block the loop; await the async Thread's methods instead")
        return None

    def stop(self) -> None:
        """Stop the loop (its tasks end as under ``asyncio.run``) and wait for its thread to finish."""
        if self.loop.is_closed() or not self._thread.is_alive():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.get_ident() != self._thread.ident:
            self._thread.join()


__all__ = ["Homed", "OwnLoop", "on_home_loop"]
