"""Threads as queued work: record a turn for whichever worker claims it, and put the thread in the queue.

A thread's work item has the key ``thread/<thread_id>`` (its stream's name)
and the project named in the thread's metadata (``project``, default
``"default"``). The queue itself (fair, bounded claims) is the ledger's
(:meth:`jixu.ledger.Store.claim_work`); this module only decides what goes in.
"""

from __future__ import annotations

import asyncio
from typing import Any

from jixu.errors import InvalidInput, JixuError, ThreadBusy
from jixu.ledger import Store
from jixu.ledger.store import WorkItem, check_project
from jixu.threads.agent import Agent
from jixu.threads.log import DEFAULT_PROJECT, THREAD_PREFIX, ThreadLog


def thread_work_key(thread_id: str) -> str:
    """The work-queue key of a thread (the same text as its stream's name)."""
    return f"{THREAD_PREFIX}{thread_id}"


def thread_id_of(key: str) -> str | None:
    """The thread id a work key names, or ``None`` for another kind of work."""
    return key[len(THREAD_PREFIX):] if key.startswith(THREAD_PREFIX) and len(key) > len(THREAD_PREFIX) else None


def project_of(metadata: dict[str, Any]) -> str:
    """The project recorded in a thread's metadata (``"default"`` when absent)."""
    project = metadata.get("project", DEFAULT_PROJECT)
    return check_project(project)


def create_thread_for(store: Store, agent: Agent | dict[str, Any], *, project: str = DEFAULT_PROJECT,
                      metadata: dict[str, Any] | None = None, actor: str = "jixu") -> str:
    """Record a new idle thread of ``agent`` (an Agent or its ``describe()`` record) in ``project``; its id.

    The project is kept in the thread's metadata, so every later enqueue of
    the thread lands in the same project.
    """
    check_project(project)
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidInput("metadata must be a JSON object", field="metadata")
    if isinstance(agent, Agent):
        record = agent.describe()
    elif isinstance(agent, dict) and agent.get("contract"):
        record = agent
    else:
        raise InvalidInput("agent must be a jixu Agent or its describe() record", field="agent")
    return ThreadLog.create(store, record, metadata={**(metadata or {}), "project": project}, actor=actor).thread_id


def submit_turn(store: Store, thread_id: str, text: str, *, actor: str = "jixu") -> str:
    """Queue a turn with user input ``text`` for whichever worker claims the thread; returns the turn id.

    Records an unowned ``turn.started`` (``queued``) and enqueues the thread
    in its project, in one transaction (both or neither). Refused (nothing
    written) while the thread has an active turn, waits for an operator, or
    is corrupt.
    """
    log = ThreadLog.load(store, thread_id, actor=actor)
    project = project_of(log.state.metadata)
    log.open_to_act()  # the whole history first: a corrupt thread takes no input (ThreadCorrupt)
    state = log.snapshot()
    if state.status == "waiting":
        raise ThreadBusy(f"thread {thread_id} is waiting: {state.reason}. Settle that first", thread_id=thread_id)
    turn_id, _ = log.start_turn(text, enqueue=(thread_work_key(thread_id), project))
    return turn_id


def enqueue_thread(store: Store, thread_id: str) -> WorkItem:
    """Put a thread (back) in the queue, e.g. after an operator's decision lets it continue.

    Idempotent: a pending thread stays as it is; one being worked on runs once
    more after its current claim.
    """
    log = ThreadLog.load(store, thread_id)
    return store.enqueue(thread_work_key(thread_id), project_of(log.state.metadata))


async def repair_queue(store: Store, *, page: int = 500) -> list[str]:
    """Enqueue every thread whose queued turn has no work item (left by versions that wrote the two in separate
    transactions, killed in between); the ids of the threads it enqueued.

    Reads each thread without a work item once (from its checkpoint), yielding to the event loop between
    threads, so a worker can run it beside its work (:meth:`jixu.runs.Worker.run` does, at start).
    """
    repaired: list[str] = []
    after = ""
    while True:
        infos = store.list_streams(THREAD_PREFIX, after=after, limit=page)
        for info in infos:
            thread_id = info.stream[len(THREAD_PREFIX):]
            if store.get_work(thread_work_key(thread_id)) is not None:
                continue
            try:
                log = ThreadLog.load(store, thread_id)
            except JixuError:
                continue  # not a thread this can read (corrupt, invalid id): an operator's business
            turn = log.state.active_turn()
            if turn is not None and turn.queued and turn.owner is None:
                store.enqueue(thread_work_key(thread_id), project_of(log.state.metadata))
                repaired.append(thread_id)
            await asyncio.sleep(0)
        if len(infos) < page:
            return repaired
        after = infos[-1].stream


__all__ = ["DEFAULT_PROJECT", "create_thread_for", "enqueue_thread", "project_of", "repair_queue", "submit_turn",
           "thread_id_of", "thread_work_key"]
