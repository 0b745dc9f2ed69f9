"""The Harness: one Agent definition over one store, making and reopening threads."""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from jixu.errors import IncompatibleAgent, InvalidInput
from jixu.ledger import Store, open_store
from jixu.threads.agent import Agent
from jixu.threads.log import THREAD_PREFIX, ThreadLog
from jixu.threads.thread import Thread


@dataclass(frozen=True, slots=True)
class ThreadSummary:
    """A thread as listed: id, head and when it started."""

    thread_id: str
    events: int
    head_hash: str
    created_at: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return {"thread_id": self.thread_id, "events": self.events, "head_hash": self.head_hash,
                "created_at": self.created_at}


class Harness:
    """Runs threads of one :class:`Agent` over a store (a Store, URL or path; default ``sqlite:///jixu.db``).

    ``max_attempts`` bounds automatic retries of retry-safe effects whose
    outcome is unknown (model calls, ``read_only`` and ``idempotent`` tools).
    """

    def __init__(self, agent: Agent, store: Store | str | os.PathLike[str] | None = None, *,
                 max_attempts: int = 3, actor: str = "jixu") -> None:
        if not isinstance(agent, Agent):
            raise InvalidInput("Harness needs a jixu Agent", field="agent")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidInput("max_attempts must be an integer >= 1", field="max_attempts")
        self.agent = agent
        self._owns_store = not isinstance(store, Store)
        self.store = open_store(store)
        self.max_attempts = max_attempts
        self.actor = actor

    async def create_thread(self, *, metadata: dict[str, Any] | None = None) -> Thread:
        """A new, idle thread recorded under this harness's agent."""
        return Thread(self, ThreadLog.create(self.store, self.agent.describe(), metadata=metadata,
                                             actor=self.actor))

    async def open_thread(self, thread_id: str, *, resume: bool = True) -> Thread:
        """Reopen a thread after a process boundary and, with ``resume``, continue its pending work.

        Loads the latest valid checkpoint plus the events after it, asks the
        resolver, then dispatches work that never left the process, retries
        retry-safe effects under their original identity, and waits (status
        ``waiting``) on unknown unsafe effects or parked calls. A corrupt thread
        opens for inspection but does not run.
        """
        log = ThreadLog.load(self.store, thread_id, actor=self.actor)
        recorded = log.state.agent.get("contract")
        if recorded != self.agent.contract:
            raise IncompatibleAgent(
                f"thread {thread_id} was recorded under agent {log.state.agent.get('name')!r} with contract "
                f"{str(recorded)[:12]}…; this harness runs {self.agent.name!r} with contract "
                f"{self.agent.contract[:12]}… (tool names, schemas or semantics differ)",
                thread_id=thread_id)
        thread = Thread(self, log)
        if resume and thread.state().status == "running":
            thread.wait_in_background()
        return thread

    async def list_threads(self, *, limit: int = 1000, after: str = "") -> list[ThreadSummary]:
        """Threads in this store, oldest id first."""
        infos = self.store.list_streams(THREAD_PREFIX, after=THREAD_PREFIX + after if after else "", limit=limit)
        return [ThreadSummary(i.stream[len(THREAD_PREFIX):], i.head_seq, i.head_hash, i.created_at) for i in infos]

    def close(self) -> None:
        """Close the store if this harness opened it."""
        if self._owns_store:
            self.store.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.close()


__all__ = ["Harness", "ThreadSummary"]
