"""Runs layer: scheduling queued work and the worker processes that run it.

Threads become queued work with :func:`submit_turn` (or :func:`enqueue_thread`);
:class:`WorkerPool` / ``jixu worker`` run them with bounded, fair concurrency.
"""

from __future__ import annotations

from jixu.runs.scheduler import (
    DEFAULT_PROJECT,
    create_thread_for,
    enqueue_thread,
    project_of,
    submit_turn,
    thread_id_of,
    thread_work_key,
)
from jixu.runs.workers import (
    Worker,
    WorkerConfig,
    WorkerPool,
    WorkerStats,
    load_agent_factory,
    make_agent,
    serve,
)

__all__ = [
    "DEFAULT_PROJECT",
    "Worker",
    "WorkerConfig",
    "WorkerPool",
    "WorkerStats",
    "create_thread_for",
    "enqueue_thread",
    "load_agent_factory",
    "make_agent",
    "project_of",
    "serve",
    "submit_turn",
    "thread_id_of",
    "thread_work_key",
]
