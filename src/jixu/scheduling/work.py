"""What goes in the work queue: threads' queued turns and runs, each under its key in its project.

A thread's work item has the key ``thread/<thread_id>`` (its stream's name)
and the project named in the thread's metadata (``project``, default
``"default"``); a run's the key ``run/<run_id>`` in the run's project. The queue itself (atomic claims) is
the ledger's and its policy (limits, fairness) :mod:`jixu.scheduling.queue`'s; this module decides what goes
in.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from jixu.errors import InvalidInput, JixuError, ThreadBusy
from jixu.ledger import Store
from jixu.runs.journal import RunLog
from jixu.runs.model import run_work_key
from jixu.runs.requests import REQUEST_PREFIX, RequestLog, request_work_key
from jixu.scheduling.queue import DEFAULT_PROJECT, QueuedWork, check_project, enqueue
from jixu.threads.agent import Agent
from jixu.threads.log import THREAD_PREFIX, ThreadLog


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


def enqueue_thread(store: Store, thread_id: str) -> QueuedWork:
    """Put a thread (back) in the queue, e.g. after an operator's decision lets it continue.

    Idempotent: a pending thread stays as it is; one being worked on runs once
    more after its current claim.
    """
    log = ThreadLog.load(store, thread_id)
    return enqueue(store, thread_work_key(thread_id), project_of(log.state.metadata))


def submit_run(store: Store, run_id: str) -> QueuedWork:
    """Put a run in the work queue: key ``run/<run_id>`` in the run's project (idempotent, like threads').

    A worker given providers that claims the key runs :meth:`Runs.execute <jixu.runs.Runs.execute>`.
    """
    log = RunLog(store, run_id)
    return enqueue(store, run_work_key(run_id), log.record.project)


async def repair_queue(store: Store, *, page: int = 500, threads: bool = True, requests: bool = True) -> list[str]:
    """Enqueue what older versions left without a work item (they wrote the event and the queue row in separate
    transactions and could be killed in between): ``threads``' queued turns and ``requests`` (execution requests
    that the run's journal names and nobody has carried out yet); the keys it enqueued.

    Finds the streams without a work item a page at a time in a worker thread, then reads each of them once (a
    thread from its checkpoint), yielding to the event loop between them, so a worker can run it beside its work
    (:meth:`jixu.scheduling.Worker.run` does, at start).
    """
    repaired: list[str] = []
    if threads:
        async for thread_id in _streams_without_work(store, THREAD_PREFIX, thread_work_key, page):
            try:
                log = ThreadLog.load(store, thread_id)
            except JixuError:
                continue  # not a thread this can read (corrupt, invalid id): an operator's business
            turn = log.state.active_turn()
            if turn is not None and turn.queued and turn.owner is None:
                repaired.append(enqueue(store, thread_work_key(thread_id), project_of(log.state.metadata)).key)
    if requests:
        async for request_id in _streams_without_work(store, REQUEST_PREFIX, request_work_key, page):
            try:
                request = RequestLog(store, request_id)
                if request.corruption() is not None or request.status()[0] != "pending":
                    continue
                run = RunLog(store, request.record.run_id)
            except JixuError:
                continue
            if request_id in run.record.requests:  # else never admitted completely: never executed (admission)
                repaired.append(enqueue(store, request_work_key(request_id), run.record.project).key)
    return repaired


async def _streams_without_work(store: Store, prefix: str, key_of: Callable[[str], str],
                                page: int) -> AsyncIterator[str]:
    """The ids of the streams named ``prefix + id`` that have no work item, a page at a time.

    Each page is read in a worker thread: a worker repairs at start, while its first turns commit, and each
    read waits for the store's lock; on the event loop those waits would hold back every turn starting.
    """

    def page_after(after: str) -> tuple[list[str], str | None]:
        infos = store.list_streams(prefix, after=after, limit=page)
        ids = [info.stream[len(prefix):] for info in infos]
        missing = [stream_id for stream_id in ids if store.get_work(key_of(stream_id)) is None]
        return missing, (infos[-1].stream if len(infos) == page else None)

    after: str | None = ""
    while after is not None:
        missing, after = await asyncio.to_thread(page_after, after)
        for stream_id in missing:
            yield stream_id
            await asyncio.sleep(0)  # the caller reads each one on the loop: let the turns run in between


__all__ = ["create_thread_for", "enqueue_thread", "project_of", "repair_queue", "submit_run", "submit_turn",
           "thread_id_of", "thread_work_key"]
