"""An in-process worker or a pool of worker processes for ``jixu serve``.

The workers of ``jixu serve --agent/--providers``: inputs and runs sent over HTTP are executed by them.

:class:`BackgroundWorker` is the same :class:`jixu.scheduling.Worker` that ``jixu worker`` runs, in the
server's process on its own thread with its own event loop (the store is thread-safe), so a long model or
tool call never blocks the HTTP server; plain ``def`` tools run in that loop's bounded pool
(``WorkerConfig.tool_threads``). :class:`BackgroundPool` is ``jixu worker --processes N`` beside the server
instead (``jixu serve --worker-processes N``): the turns' CPU is spread over processes of their own, each
one ending with the server however it ends. Both are started and stopped (drained) with the app's lifespan.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from jixu.ledger import Store
from jixu.runs import Provider
from jixu.scheduling import Worker, WorkerConfig, WorkerPool
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
        """Run the worker while the app runs; every mutation the app answers nudges it (see
        :attr:`Services.work_queued <jixu.server.context.Services.work_queued>`)."""
        self.start()
        queued: list[Callable[[], None]] = app.state.jixu.work_queued
        queued.append(self.worker.nudge)
        try:
            yield
        finally:
            queued.remove(self.worker.nudge)
            await asyncio.to_thread(self.stop)


class BackgroundPool:
    """``processes`` worker processes configured as ``config`` (a :class:`~jixu.scheduling.WorkerPool`, named
    ``<config.owner>-<i>``) beside the server; use :meth:`lifespan` with create_app.

    The children are drained on shutdown (SIGTERM, the drain timeout, SIGKILL for stragglers); if the server's
    process dies instead, they notice and drain by themselves. One that dies while the server runs is started
    again under its name (:meth:`WorkerPool.restart_dead`), which reclaims its turns at once; the log says so."""

    def __init__(self, config: WorkerConfig, processes: int) -> None:
        self.pool = WorkerPool.of(config, processes)

    async def _watch(self) -> None:
        """Start again each child that dies while the server runs, and log it (and one that exits by itself)."""
        reported: set[int] = set()
        while True:
            await asyncio.sleep(0.5)
            for owner, code in self.pool.restart_dead():
                log.warning("worker process %s died (exit %d); started it again", owner, code)
            for owner, process in zip(self.pool.owners, self.pool.processes, strict=True):
                if process.poll() == 0 and process.pid not in reported:
                    reported.add(process.pid)
                    log.warning("worker process %s (pid %d) exited; its work stays queued for the other workers",
                                owner, process.pid)

    @asynccontextmanager
    async def lifespan(self, app: Any) -> AsyncIterator[None]:
        """Run the worker processes while the app runs."""
        self.pool.start()
        log.info("started %d worker processes: %s", len(self.pool.owners), ", ".join(self.pool.owners))
        watch = asyncio.create_task(self._watch(), name="jixu-worker-processes")
        try:
            yield
        finally:
            watch.cancel()
            codes = await asyncio.to_thread(self.pool.stop)
            log.info("worker processes stopped: %s", ", ".join(f"{owner} {code}" for owner, code
                                                               in zip(self.pool.owners, codes, strict=True)))


__all__ = ["BackgroundPool", "BackgroundWorker"]
