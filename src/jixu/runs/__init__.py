"""Runs layer: durable work orders (runs), their execution requests and the providers that implement them.

Runs (SPEC section 5, decision 0005): :func:`register_project` records a
project (authorized git origin + policy); :class:`Runs` creates runs, executes
them (``prepare`` -> ``implement`` -> ``verify`` as ``task`` effects in the
run's hash-chained journal) and operates them (``resume``, ``handoff``,
``retry``, ``cancel``); :func:`jixu.scheduling.submit_run` puts a run in the work queue.
Execution requests (:mod:`jixu.runs.requests`) publish a succeeded run
(:class:`GitPublisher`, :class:`PullRequestPublisher`) or cancel one, each with
its own hash-chained stream, and are settled only by evidence.
Providers implement the brief: :class:`CommandProvider` (an external agent
CLI), :class:`ScriptedProvider` (deterministic, for tests).

Queued work (threads' turns, runs, execution requests) and the workers that run
it with bounded, fair concurrency are the scheduling layer's (:mod:`jixu.scheduling`);
a worker given providers executes runs (``run/<id>``) and execution requests
(``request/<id>``) with a :class:`Runs` under its own owner name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jixu.exports import lazy_exports

if TYPE_CHECKING:
    from jixu.runs.command_provider import CommandProvider
    from jixu.runs.engine import RunLog, Runs
    from jixu.runs.model import (
        RUN_STATUSES,
        PlanView,
        Project,
        RunState,
        TaskView,
        change_origin,
        get_project,
        list_projects,
        register_project,
        run_id_of,
        run_work_key,
        survey_projects,
        update_policy,
        validate_policy,
    )
    from jixu.runs.providers import (
        ImplementContext,
        ImplementResult,
        Provider,
        ProviderError,
        ProviderTest,
        provider_snapshot,
    )
    from jixu.runs.publication import (
        GitPublisher,
        PublicationContext,
        PublicationRejected,
        Publisher,
        PullRequestPublisher,
    )
    from jixu.runs.remote import CommandRemote, RemoteContext, RemoteProvider
    from jixu.runs.requests import (
        MAX_PUBLICATION_ATTEMPTS,
        REQUEST_STATUSES,
        ExecutionRequestView,
        request_id_of,
        request_work_key,
    )
    from jixu.runs.scripted_provider import ScriptedProvider, write_files

_EXPORTS = {
    "CommandProvider": "jixu.runs.command_provider",
    "CommandRemote": "jixu.runs.remote",
    "ExecutionRequestView": "jixu.runs.requests",
    "GitPublisher": "jixu.runs.publication",
    "ImplementContext": "jixu.runs.providers",
    "ImplementResult": "jixu.runs.providers",
    "MAX_PUBLICATION_ATTEMPTS": "jixu.runs.requests",
    "PlanView": "jixu.runs.model",
    "Project": "jixu.runs.model",
    "Provider": "jixu.runs.providers",
    "ProviderError": "jixu.runs.providers",
    "ProviderTest": "jixu.runs.providers",
    "PublicationContext": "jixu.runs.publication",
    "PublicationRejected": "jixu.runs.publication",
    "Publisher": "jixu.runs.publication",
    "PullRequestPublisher": "jixu.runs.publication",
    "REQUEST_STATUSES": "jixu.runs.requests",
    "RUN_STATUSES": "jixu.runs.model",
    "RemoteContext": "jixu.runs.remote",
    "RemoteProvider": "jixu.runs.remote",
    "RunLog": "jixu.runs.engine",
    "RunState": "jixu.runs.model",
    "Runs": "jixu.runs.engine",
    "ScriptedProvider": "jixu.runs.scripted_provider",
    "TaskView": "jixu.runs.model",
    "change_origin": "jixu.runs.model",
    "get_project": "jixu.runs.model",
    "list_projects": "jixu.runs.model",
    "survey_projects": "jixu.runs.model",
    "provider_snapshot": "jixu.runs.providers",
    "register_project": "jixu.runs.model",
    "request_id_of": "jixu.runs.requests",
    "request_work_key": "jixu.runs.requests",
    "run_id_of": "jixu.runs.model",
    "run_work_key": "jixu.runs.model",
    "update_policy": "jixu.runs.model",
    "validate_policy": "jixu.runs.model",
    "write_files": "jixu.runs.scripted_provider",
}
"""Each public name and the module it lives in (imported on first use: :mod:`jixu.exports`)."""

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "MAX_PUBLICATION_ATTEMPTS",
    "REQUEST_STATUSES",
    "RUN_STATUSES",
    "CommandRemote",
    "ExecutionRequestView",
    "RemoteContext",
    "RemoteProvider",
    "GitPublisher",
    "PublicationContext",
    "PublicationRejected",
    "Publisher",
    "PullRequestPublisher",
    "change_origin",
    "request_id_of",
    "request_work_key",
    "CommandProvider",
    "ImplementContext",
    "ImplementResult",
    "PlanView",
    "Project",
    "Provider",
    "ProviderError",
    "ProviderTest",
    "RunLog",
    "RunState",
    "Runs",
    "ScriptedProvider",
    "TaskView",
    "get_project",
    "list_projects",
    "survey_projects",
    "provider_snapshot",
    "register_project",
    "run_id_of",
    "run_work_key",
    "update_policy",
    "validate_policy",
    "write_files",
]
