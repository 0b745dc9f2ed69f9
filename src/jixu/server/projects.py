"""``/api/v1/projects``: the projects runs work on (admins register them and change their policy)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from jixu.errors import ProjectNotFound
from jixu.runs import get_project, register_project, survey_projects, update_policy
from jixu.server.context import Authenticated, Context, context, mutation
from jixu.server.idempotency import Outcome
from jixu.server.models import (
    READ,
    WRITE,
    Project,
    ProjectName,
    ProjectPage,
    ProjectSeen,
    RegisterProject,
    UpdatePolicy,
    problems,
)

router = APIRouter(prefix="/projects", tags=["projects"], route_class=Authenticated)
Obj = dict[str, Any]


def _hidden(name: str) -> ProjectNotFound:
    return ProjectNotFound(f"no project {name}", project=name)


@router.get("", responses=READ, response_model=ProjectPage, summary="List the projects the caller has a role in")
def list_all(ctx: Annotated[Context, Depends(context)]) -> JSONResponse:
    """Registered projects the caller may see, with the caller's role, and the roles for unregistered names. A
    project whose stream does not verify is listed as ``corrupt`` (first bad seq, reason), without its origin or
    policy; the others are listed as usual."""
    sound, broken = survey_projects(ctx.store)
    registered: dict[str, Obj] = {p.name: p.to_dict() for p in sound}
    registered.update({str(e.details["project"]): {"name": e.details["project"], "corrupt": {
        "first_bad_seq": e.details.get("first_bad_seq"), "reason": e.details.get("reason")}} for e in broken})
    rows = [{**row, "registered": True, "role": ctx.principal.role_in(name)}
            for name, row in sorted(registered.items()) if ctx.principal.visible(name)]
    rows.extend({"name": name, "registered": False, "role": role}
                for name, role in sorted(ctx.principal.roles.items()) if name not in registered)
    return JSONResponse({"projects": rows})


@router.get("/{name}", responses=READ, response_model=ProjectSeen, summary="A project")
def get_one(name: ProjectName, ctx: Annotated[Context, Depends(context)]) -> JSONResponse:
    """A registered project: origin, default branch, policy and its digest."""
    if not ctx.principal.visible(name):
        raise _hidden(name)
    return JSONResponse({**get_project(ctx.store, name).to_dict(), "role": ctx.principal.role_in(name)})


@router.post("", status_code=201, responses={**WRITE, **problems(403)}, response_model=Project,
             summary="Register a project (admin)")
def register(body: RegisterProject, ctx: Annotated[Context, Depends(mutation)]) -> JSONResponse:
    """Record a project: its authorized git origin and policy (admin)."""
    ctx.principal.require_admin()

    def operation() -> Outcome:
        project = register_project(ctx.store, body.name, body.origin, body.policy,
                                   default_branch=body.default_branch, actor=ctx.actor)
        return Outcome(201, project.to_dict())

    return ctx.mutate(body, operation)


@router.put("/{name}/policy", responses=WRITE, response_model=Project, summary="Record a new policy (admin)")
def set_policy(name: ProjectName, body: UpdatePolicy, ctx: Annotated[Context, Depends(mutation)]) -> JSONResponse:
    """Record a new policy for the project's later runs (admin); frozen runs keep theirs."""
    ctx.principal.require_admin()

    def operation() -> Outcome:
        return Outcome(200, update_policy(ctx.store, name, body.policy, actor=ctx.actor).to_dict())

    return ctx.mutate(body, operation)


__all__ = ["router"]
