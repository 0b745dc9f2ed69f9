"""The Harness: one Agent definition over one store, making and reopening threads."""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from jixu.errors import IncompatibleAgent, InvalidInput, ThreadNotFound
from jixu.ledger import NewEvent, Store, new_id, open_store, project
from jixu.ledger.ids import is_valid_id
from jixu.threads.agent import Agent
from jixu.threads.projection import ThreadProjection
from jixu.threads.thread import Thread, stream_of

THREAD_PREFIX = "thread/"


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
        if metadata is not None and not isinstance(metadata, dict):
            raise InvalidInput("metadata must be a JSON object", field="metadata")
        thread_id = new_id()
        created = NewEvent("thread.created", {"thread_id": thread_id, "agent": self.agent.describe(),
                                              "metadata": metadata or {}}, {"actor": self.actor})
        [event] = self.store.append(stream_of(thread_id), [created], 0)
        projection = ThreadProjection()
        return Thread(self, projection.apply(projection.initial(), event))

    async def open_thread(self, thread_id: str, *, resume: bool = True) -> Thread:
        """Reopen a thread after a process boundary and, with ``resume``, continue its pending work.

        Loads the latest valid checkpoint plus the events after it, asks the
        resolver, then dispatches work that never left the process, retries
        retry-safe effects under their original identity, and waits (status
        ``waiting``) on unknown unsafe effects or parked calls. A corrupt thread
        opens for inspection but does not run.
        """
        if not is_valid_id(thread_id):
            raise InvalidInput(f"thread id {thread_id!r} is not a valid id", field="thread_id")
        stream = stream_of(thread_id)
        if self.store.stream_info(stream) is None:
            raise ThreadNotFound(f"no thread {thread_id} in {self.store.url}", thread_id=thread_id)
        projected = project(self.store, stream, ThreadProjection())
        state = projected.state
        recorded = state.agent.get("contract")
        if recorded != self.agent.contract:
            raise IncompatibleAgent(
                f"thread {thread_id} was recorded under agent {state.agent.get('name')!r} with contract "
                f"{str(recorded)[:12]}…; this harness runs {self.agent.name!r} with contract "
                f"{self.agent.contract[:12]}… (tool names, schemas or semantics differ)",
                thread_id=thread_id)
        chain_break = None if projected.chain.valid else projected.chain.first_bad_seq
        thread = Thread(self, state, chain_break_seq=chain_break)
        thread.checkpoint_status = projected.checkpoint
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
