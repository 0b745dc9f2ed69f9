"""The scheduling layer's face: its names, and the work items it hands the interfaces (told with their project)."""

from __future__ import annotations

import json

import pytest

import jixu.runs
import jixu.scheduling
from jixu.errors import InvalidInput
from jixu.ledger import MemoryStore
from jixu.scheduling import QueuedWork, enqueue_thread, queued_work, submit_turn, thread_work_key
from jixu.scheduling.queue import enqueue
from jixu.threads.log import ThreadLog

MOVED = ("DEFAULT_PROJECT", "create_thread_for", "enqueue_thread", "project_of", "submit_turn", "thread_id_of",
         "thread_work_key", "submit_run", "Worker", "WorkerConfig", "WorkerPool", "WorkerStats", "serve",
         "make_agent", "load_agent_factory")


def test_every_name_of_the_layer_resolves_and_runs_no_longer_hands_them_on() -> None:
    for name in jixu.scheduling.__all__:
        assert getattr(jixu.scheduling, name) is not None, name
    assert set(MOVED) <= set(jixu.scheduling.__all__)
    stale = [name for name in MOVED if name in jixu.runs.__all__ or hasattr(jixu.runs, name)]
    assert not stale, f"thread scheduling no longer lives in jixu.runs: {stale}"


def test_queued_work_is_the_ledgers_item_told_with_its_project() -> None:
    store = MemoryStore()
    thread_id = ThreadLog.create(store, {"contract": "c", "name": "a", "tools": []},
                                 metadata={"project": "billing"}).thread_id
    assert queued_work(store, thread_work_key(thread_id)) is None
    submit_turn(store, thread_id, "hello")
    stored = store.get_work(thread_work_key(thread_id))
    told = queued_work(store, thread_work_key(thread_id))
    assert stored is not None and told is not None
    assert told == stored and stored == told and hash(told) == hash(QueuedWork.of(stored))
    assert (told.project, told.group, told.state) == ("billing", "billing", "pending")
    data = json.loads(json.dumps(told.to_dict()))
    assert data["project"] == "billing" and "group" not in data
    assert list(data) == ["project" if key == "group" else key for key in stored.to_dict()]
    again = enqueue_thread(store, thread_id)
    assert isinstance(again, QueuedWork) and again == stored, "a pending thread stays as it is"
    with pytest.raises(InvalidInput) as refused:
        enqueue(store, "thread/x", "")
    assert refused.value.details["field"] == "project", "the interfaces' bad input names the project, not the ledger's group"
