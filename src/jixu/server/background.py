"""An in-process worker for ``jixu serve --agent/--providers``: inputs sent over HTTP are executed here.

The worker is the same :class:`jixu.scheduling.Worker` that ``jixu worker`` runs,
on its own thread with its own event loop (the store is thread-safe), so a
long model or tool call never blocks the HTTP server; plain ``def`` tools run
in that loop's bounded pool (``WorkerConfig.tool_threads``). It is started and
stopped (drained) with the app's lifespan.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from jixu.ledger import Store
from jixu.runs import Provider
from jixu.scheduling import Worker, WorkerConfig
from jixu.scheduling.workers import use_tool_pool
from jixu.threads import Agent

log = logging.getLogger("jixu.server.worker")


class BackgroundWorker:
    """One :class:`~jixu.scheduling.Worker` over ``store`` on a daemon thread; use :meth:`lifespan` with create_app."""

    def __init__(self, store: Store, config: WorkerConfig, *, agent: Agent | None = None,
                 providers: dict[str, Provider] | None = None) -> None:
        self.worker = Worker(agent, store, config, providers=providers, report=self._report)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    @staticmethod
    def _report(kind: str, message: str) -> None:
        (log.warning if kind in ("error", "lost", "operator") else log.info)("%s: %s", kind, message)

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        tools = use_tool_pool(loop, self.worker.config)
        self._loop = loop
        self._ready.set()
        try:
            loop.run_until_complete(self.worker.run())
        except Exception:  # the server stays up; the failure is in the log and the work stays queued
            log.exception("the in-process worker stopped with an error")
        finally:
            loop.close()
            tools.shutdown(wait=False)

    def start(self) -> None:
        """Start the worker thread."""
        self._thread = threading.Thread(target=self._main, name="jixu-worker", daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop claiming, drain the item in hand (the worker's drain timeout), and join the thread."""
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self.worker.stop, "the server is shutting down")
            self._thread.join(timeout)

    @asynccontextmanager
    async def lifespan(self, app: Any) -> AsyncIterator[None]:
        """Run the worker while the app runs."""
        self.start()
        try:
            yield
        finally:
            await asyncio.to_thread(self.stop)


__all__ = ["BackgroundWorker"]
