"""``/api/v1/runs``: create, list and inspect runs; resume, hand off, retry and cancel them.

Runs made, resumed, handed off or settled here are put in the work queue with their record (one transaction):
the server's own worker (``jixu serve --providers``) or ``jixu worker``
executes them. A run belongs to its project: other projects' callers get 404.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse

from jixu.errors import InvalidInput, ProjectNotFound, RunNotFound
from jixu.ledger import is_valid_id
from jixu.runs import RUN_STATUSES
from jixu.runs.engine import RunLog
from jixu.server.context import Authenticated, Context, context, mutation, run_async
from jixu.server.idempotency import Outcome
from jixu.server.models import (
    READ,
    WRITE,
    CancelRun,
    CreateRun,
    EffectId,
    ExecutionRequest,
    ExecutionRequestPage,
    Handoff,
    Inspect,
    Inspected,
    Journal,
    Plan,
    Publish,
    Reconcile,
    Reconciled,
    RemoteTask,
    RequestId,
    ResolveRequest,
    ResolveTask,
    ResumeRun,
    RetryRun,
    Run,
    RunId,
    RunPage,
)

router = APIRouter(prefix="/runs", tags=["runs"], route_class=Authenticated)
Obj = dict[str, Any]


def _hidden(run_id: str) -> RunNotFound:
    return RunNotFound(f"no run {run_id}", run_id=run_id)


def authorize(ctx: Context, run_id: str, role: str) -> str:
    """Allow the caller ``role`` on a run (404 outside its projects, 403 when the role is too weak)."""
    if not is_valid_id(run_id):
        raise InvalidInput(f"run id {run_id!r} is not a valid id", field="run_id")
    try:
        project = RunLog(ctx.store, run_id).record.project
    except RunNotFound:
        raise _hidden(run_id) from None  # the very answer another project's run gets (no store location either)
    ctx.principal.require(project, role, _hidden(run_id))
    return project


def state_of(ctx: Context, run_id: str) -> Obj:
    """A run's state as JSON."""
    return run_async(ctx.services.runs.state(run_id)).to_dict()


@router.post("", status_code=201, responses=WRITE, response_model=Run, summary="Create a run (queued for workers)")
def create_run(body: CreateRun, ctx: Annotated[Context, Depends(mutation)]) -> JSONResponse:
    """Record a run of ``brief`` on ``project`` with ``provider`` and queue it (editor)."""
    ctx.principal.require(body.project, "editor", ProjectNotFound(f"no project {body.project}",
                                                                  project=body.project))

    def operation() -> Outcome:
        runs = ctx.services.runs
        run_id = run_async(runs.create_run(body.project, body.brief, provider=body.provider, commit=body.commit,
                                           knowledge=body.knowledge, actor=ctx.actor, queue=True))
        return Outcome(201, state_of(ctx, run_id))

    return ctx.mutate(body, operation)


@router.get("", responses=READ, response_model=RunPage, summary="List runs")
def list_runs(ctx: Annotated[Context, Depends(context)],
              project: Annotated[str | None, Query(max_length=100)] = None,
              status: Annotated[str | None, Query(max_length=40, description="One of the run statuses",
                                                  json_schema_extra={"enum": list(RUN_STATUSES)})] = None,
              ) -> JSONResponse:
    """Runs the caller may see (of ``project``, in ``status``), oldest first."""
    if status is not None and status not in RUN_STATUSES:
        raise InvalidInput(f"status {status!r} must be one of {list(RUN_STATUSES)}", field="status")
    states = run_async(ctx.services.runs.list_runs(project=project))
    rows = [s.to_dict() for s in states if ctx.principal.visible(s.project)
            and (status is None or s.status == status)]
    return JSONResponse({"runs": rows})


@router.get("/{run_id}", responses=READ, response_model=Run, summary="A run's state")
def get_run(run_id: RunId, ctx: Annotated[Context, Depends(context)]) -> JSONResponse:
    """Status (derived from the journal), snapshots, plan, tasks with the resolver's decisions, pauses."""
    authorize(ctx, run_id, "viewer")
    return JSONResponse(state_of(ctx, run_id))


@router.get("/{run_id}/plan", responses=READ, response_model=Plan, summary="A run's plan")
def get_plan(run_id: RunId, ctx: Annotated[Context, Depends(context)]) -> JSONResponse:
    """The current plan revision with its tasks' states, and every earlier revision."""
    authorize(ctx, run_id, "viewer")
    return JSONResponse(run_async(ctx.services.runs.plan(run_id)).to_dict())


@router.get("/{run_id}/journal", responses=READ, response_model=Journal, summary="A run's journal and whether it verifies")
def get_journal(run_id: RunId, ctx: Annotated[Context, Depends(context)]) -> JSONResponse:
    """The run's hash-chained entries and ``valid``: whether the whole chain verifies."""
    authorize(ctx, run_id, "viewer")
    entries, valid = run_async(ctx.services.runs.journal(run_id))
    state = run_async(ctx.services.runs.state(run_id))
    return JSONResponse({"run_id": run_id, "entries": entries, "valid": valid,
            "corruption": None if state.corruption is None else state.corruption.to_dict()})


@router.post("/{run_id}/resume", responses=WRITE, response_model=Run, summary="Resume a run in place")
def resume_run(run_id: RunId, body: ResumeRun, ctx: Annotated[Context, Depends(mutation)]) -> JSONResponse:
    """Continue a paused, interrupted or unreconciled run (editor): the workspace is reconciled first."""
    authorize(ctx, run_id, "editor")

    def operation() -> Outcome:
        # Queued with its record, in one transaction: a worker continues it (a crash never leaves one without the other).
        run_async(ctx.services.runs.resume(run_id, ctx.actor, note=body.note, stop_agents=body.stop_agents,
                                           queue=True))
        return Outcome(200, state_of(ctx, run_id))

    return ctx.mutate(body, operation)


@router.post("/{run_id}/handoff", responses=WRITE, response_model=Run, summary="Hand a run to another provider")
def handoff_run(run_id: RunId, body: Handoff, ctx: Annotated[Context, Depends(mutation)]) -> JSONResponse:
    """Hand the run to provider ``agent`` (operator): tested first, then a new snapshot and plan revision."""
    authorize(ctx, run_id, "operator")

    def operation() -> Outcome:
        run_async(ctx.services.runs.handoff(run_id, body.agent, ctx.actor, note=body.note, queue=True))
        return Outcome(200, state_of(ctx, run_id))

    return ctx.mutate(body, operation)


@router.post("/{run_id}/retry", status_code=201, responses=WRITE, response_model=Run,
             summary="Retry a failed or cancelled run as a fresh run")
def retry_run(run_id: RunId, body: RetryRun, ctx: Annotated[Context, Depends(mutation)]) -> JSONResponse:
    """A new run (fresh clone, lineage to this one) of a failed or cancelled run, queued (editor)."""
    authorize(ctx, run_id, "editor")

    def operation() -> Outcome:
        new_id = run_async(ctx.services.runs.retry(run_id, ctx.actor, provider=body.provider, queue=True))
        return Outcome(201, state_of(ctx, new_id))

    return ctx.mutate(body, operation)


@router.post("/{run_id}/cancel", responses=WRITE, response_model=Run, summary="Cancel a run")
def cancel_run(run_id: RunId, body: CancelRun, ctx: Annotated[Context, Depends(mutation)]) -> JSONResponse:
    """Finish the run as cancelled (operator)."""
    authorize(ctx, run_id, "operator")

    def operation() -> Outcome:
        return Outcome(200, run_async(ctx.services.runs.cancel(run_id, ctx.actor, reason=body.reason)).to_dict())

    return ctx.mutate(body, operation)


@router.get("/{run_id}/execution-requests", responses=READ, response_model=ExecutionRequestPage, summary="A run's execution requests")
def list_execution_requests(run_id: RunId, ctx: Annotated[Context, Depends(context)]) -> JSONResponse:
    """The run's execution requests (publication, cancellation, remote tasks), oldest first, with their status."""
    authorize(ctx, run_id, "viewer")
    state, views = run_async(ctx.services.runs.state_and_requests(run_id))
    corrupt = state.corruption
    return JSONResponse({"run_id": run_id, "requests": [view.to_dict() for view in views],
                         "corruption": corrupt.to_dict() if corrupt is not None else None})


@router.post("/{run_id}/execution-requests/{request_id}/reconcile", responses=WRITE, response_model=Reconciled,
             summary="Reconcile an execution request from retained evidence (operator)")
def reconcile_execution_request(run_id: RunId, request_id: RequestId, body: Reconcile,
                                ctx: Annotated[Context, Depends(mutation)]) -> JSONResponse:
    """Settle an interrupted request from retained evidence only (operator); 409 when there is no proof.

    The caller cannot assert success or absence; no provider is called and
    nothing is repeated. The same reconciliation id returns its retained result.
    """
    authorize(ctx, run_id, "operator")

    def operation() -> Outcome:
        return Outcome(200, run_async(ctx.services.runs.reconcile_execution_request(
            run_id, request_id, body.reconciliation_id, actor=ctx.actor)))

    return ctx.mutate(body, operation)


def _request_of(ctx: Context, run_id: str, request_id: str) -> None:
    """404 unless ``request_id`` is one of the run's execution requests."""
    run_async(ctx.services.runs.execution_request(run_id, request_id))


@router.post("/{run_id}/publications", status_code=201, responses=WRITE, response_model=ExecutionRequest,
             summary="Publish a succeeded run's verified source (operator; queued for workers)")
def publish_run(run_id: RunId, body: Publish, ctx: Annotated[Context, Depends(mutation)]) -> JSONResponse:
    """Admit a publication request (push a branch, or open a pull request); a worker carries it out.

    409 when the run did not succeed, the project's authority changed, an
    earlier publication is unresolved or succeeded, or 3 attempts were admitted.
    """
    authorize(ctx, run_id, "operator")

    def operation() -> Outcome:
        runs = ctx.services.runs
        request_id = run_async(runs.request_publication(run_id, publisher=body.publisher, branch=body.branch,
                                                        base_branch=body.base_branch, title=body.title,
                                                        actor=ctx.actor))
        return Outcome(201, run_async(runs.execution_request(run_id, request_id)).to_dict())

    return ctx.mutate(body, operation)


@router.post("/{run_id}/remote-tasks", status_code=201, responses=WRITE, response_model=ExecutionRequest,
             summary="Deploy, roll back or write knowledge from a succeeded run (operator; queued for workers)")
def remote_task(run_id: RunId, body: RemoteTask, ctx: Annotated[Context, Depends(mutation)]) -> JSONResponse:
    """Admit a remote task request; its evidence will be the job id or version the provider reports."""
    authorize(ctx, run_id, "operator")

    def operation() -> Outcome:
        runs = ctx.services.runs
        request_id = run_async(runs.request_remote(run_id, body.kind, provider=body.provider,
                                                   parameters=body.parameters, actor=ctx.actor))
        return Outcome(201, run_async(runs.execution_request(run_id, request_id)).to_dict())

    return ctx.mutate(body, operation)


@router.get("/{run_id}/execution-requests/{request_id}", responses=READ, response_model=ExecutionRequest, summary="One execution request")
def get_execution_request(run_id: RunId, request_id: RequestId, ctx: Annotated[Context, Depends(context)]) -> JSONResponse:
    """An execution request with its intent, receipt, reconciliations and inspections."""
    authorize(ctx, run_id, "viewer")
    return JSONResponse(run_async(ctx.services.runs.execution_request(run_id, request_id)).to_dict())


@router.post("/{run_id}/execution-requests/{request_id}/inspect", responses=WRITE, response_model=Inspected,
             summary="Ask the provider, read-only, what it shows for a request (operator); the finding is kept")
def inspect_remote(run_id: RunId, request_id: RequestId, body: Inspect,
                   ctx: Annotated[Context, Depends(mutation)]) -> JSONResponse:
    """Query the publisher or remote provider without changing anything there; what it shows is retained."""
    authorize(ctx, run_id, "operator")
    _request_of(ctx, run_id, request_id)

    def operation() -> Outcome:
        return Outcome(200, run_async(ctx.services.runs.inspect_remote(run_id, request_id, actor=ctx.actor)))

    return ctx.mutate(body, operation)


@router.post("/{run_id}/execution-requests/{request_id}/resolve", responses=WRITE, response_model=ExecutionRequest,
             summary="Record an operator's resolution of an unknown request, after an inspection (operator)")
def resolve_request(run_id: RunId, request_id: RequestId, body: ResolveRequest,
                    ctx: Annotated[Context, Depends(mutation)]) -> JSONResponse:
    """The resolution cites the latest retained inspection; 409 without one."""
    authorize(ctx, run_id, "operator")
    _request_of(ctx, run_id, request_id)

    def operation() -> Outcome:
        view = run_async(ctx.services.runs.resolve_request_outcome(
            run_id, request_id, body.resolution, resolution_id=body.resolution_id, note=body.note, actor=ctx.actor))
        return Outcome(200, view.to_dict())

    return ctx.mutate(body, operation)


@router.post("/{run_id}/tasks/{effect_id}/resolve", responses=WRITE, response_model=Run,
             summary="Record an operator's decision about a run task stuck unknown (operator)")
def resolve_task(run_id: RunId, effect_id: EffectId, body: ResolveTask,
                 ctx: Annotated[Context, Depends(mutation)]) -> JSONResponse:
    """not_occurred: the run tries the task again under a new effect id; abandoned_unknown: it fails."""
    authorize(ctx, run_id, "operator")

    def operation() -> Outcome:
        run_async(ctx.services.runs.resolve_task_outcome(
            run_id, effect_id, body.resolution, resolution_id=body.resolution_id, note=body.note, actor=ctx.actor,
            queue=True))
        return Outcome(200, state_of(ctx, run_id))

    return ctx.mutate(body, operation)


__all__ = ["authorize", "router"]
