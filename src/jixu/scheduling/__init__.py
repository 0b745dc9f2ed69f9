"""Scheduling layer: the work queue's policy, and the workers that serve it.

Above threads and runs, below the interfaces. What goes in the queue
(:func:`submit_turn`, :func:`create_thread_for`, :func:`enqueue_thread`,
:func:`submit_run`; keys ``thread/<id>``, ``run/<id>``, ``request/<id>``), the
projects that are the queue's groups, their limits and the fairness between
them (:func:`claim`, :class:`WorkLimits`), and the workers that claim items and
hand them to a thread's harness or a run's engine (:class:`Worker`,
:class:`WorkerPool`, :func:`serve`, ``jixu worker``). The queue's storage, and
the atomicity of a claim across every process sharing a store, are the
ledger's (:meth:`jixu.ledger.Store.claim_work`); nothing here writes SQL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jixu.exports import lazy_exports

if TYPE_CHECKING:
    from jixu.scheduling.queue import (
        DEFAULT_PROJECT,
        QueuedWork,
        WorkLimits,
        check_limits,
        claim,
        queued_work,
    )
    from jixu.scheduling.work import (
        create_thread_for,
        enqueue_thread,
        project_of,
        repair_queue,
        submit_run,
        submit_turn,
        thread_id_of,
        thread_work_key,
    )
    from jixu.scheduling.workers import (
        Worker,
        WorkerConfig,
        WorkerPool,
        WorkerStats,
        load_agent_factory,
        make_agent,
        serve,
    )

_EXPORTS = {
    "DEFAULT_PROJECT": "jixu.scheduling.queue",
    "QueuedWork": "jixu.scheduling.queue",
    "Worker": "jixu.scheduling.workers",
    "WorkerConfig": "jixu.scheduling.workers",
    "WorkerPool": "jixu.scheduling.workers",
    "WorkerStats": "jixu.scheduling.workers",
    "WorkLimits": "jixu.scheduling.queue",
    "check_limits": "jixu.scheduling.queue",
    "claim": "jixu.scheduling.queue",
    "create_thread_for": "jixu.scheduling.work",
    "enqueue_thread": "jixu.scheduling.work",
    "load_agent_factory": "jixu.scheduling.workers",
    "make_agent": "jixu.scheduling.workers",
    "project_of": "jixu.scheduling.work",
    "queued_work": "jixu.scheduling.queue",
    "repair_queue": "jixu.scheduling.work",
    "serve": "jixu.scheduling.workers",
    "submit_run": "jixu.scheduling.work",
    "submit_turn": "jixu.scheduling.work",
    "thread_id_of": "jixu.scheduling.work",
    "thread_work_key": "jixu.scheduling.work",
}
"""Each public name and the module it lives in (imported on first use: :mod:`jixu.exports`)."""

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "DEFAULT_PROJECT",
    "QueuedWork",
    "WorkLimits",
    "Worker",
    "WorkerConfig",
    "WorkerPool",
    "WorkerStats",
    "check_limits",
    "claim",
    "create_thread_for",
    "enqueue_thread",
    "load_agent_factory",
    "make_agent",
    "project_of",
    "queued_work",
    "repair_queue",
    "serve",
    "submit_run",
    "submit_turn",
    "thread_id_of",
    "thread_work_key",
]
