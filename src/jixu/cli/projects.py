"""``jixu projects …``: register the projects runs work on (an authorized git origin and a policy), list, show.

A project's policy is what every run of it must satisfy: the check commands
(``--check NAME=COMMAND``; COMMAND is split like a shell would, with
:func:`shlex.split`, and runs without a shell), the paths a run may change
(``--allowed-path GLOB``) and its limits. Runs freeze the policy they start
with; ``update-policy`` only changes later runs.
"""

from __future__ import annotations

import asyncio
import shlex
import sys
from collections import Counter
from typing import Any

import click
from rich.table import Table

from jixu.cli.output import EXIT_CHECK_FAILED, emit_json, handled, json_option, literal
from jixu.cli.runs import observer_runs
from jixu.cli.threads import default_actor, out, trim
from jixu.errors import InvalidInput, ProjectNotFound
from jixu.ledger import Store, open_store
from jixu.ledger.encoding import JSONObject
from jixu.runs.model import (
    Project,
    check_project_name,
    get_project,
    project_branch,
    register_project,
    survey_projects,
    update_policy,
    validate_policy,
)
from jixu.runs.workspace import check_origin


def parse_check(value: str) -> JSONObject:
    """One ``--check NAME=COMMAND`` as ``{name, argv}`` (typed error, nothing written, when malformed)."""
    name, sep, command = value.partition("=")
    name = name.strip()
    if not sep or not name or not command.strip():
        raise InvalidInput(f"--check {value!r} must be NAME=COMMAND, e.g. --check 'unit=python -m pytest -q'",
                           field="check")
    try:
        argv = shlex.split(command)
    except ValueError as error:
        raise InvalidInput(f"--check {value!r}: cannot split the command ({error})", field="check") from error
    if not argv:
        raise InvalidInput(f"--check {value!r} has an empty command", field="check")
    return {"name": name, "argv": argv}


def build_policy(checks: tuple[str, ...], allowed_paths: tuple[str, ...], max_repair_attempts: int | None,
                 check_timeout: float | None) -> JSONObject:
    """The normalised policy from the command-line options (validated; nothing touched)."""
    limits: dict[str, Any] = {}
    if max_repair_attempts is not None:
        limits["max_repair_attempts"] = max_repair_attempts
    if check_timeout is not None:
        limits["check_timeout_s"] = check_timeout
    policy: dict[str, Any] = {"checks": [parse_check(c) for c in checks], "limits": limits}
    if allowed_paths:
        policy["allowed_paths"] = list(allowed_paths)
    return validate_policy(policy)


def policy_options(fn: Any) -> Any:
    """``--check``, ``--allowed-path``, ``--max-repair-attempts``, ``--check-timeout``."""
    options = [
        click.option("--check", "checks", multiple=True, metavar="NAME=COMMAND",
                     help="A check every run must pass (repeatable, at least one); COMMAND is split with shlex "
                          "and runs without a shell, e.g. --check 'unit=python -m pytest -q'."),
        click.option("--allowed-path", "allowed_paths", multiple=True, metavar="GLOB",
                     help="A path glob runs may change (repeatable; default '*': everything)."),
        click.option("--max-repair-attempts", type=int, default=None, metavar="N",
                     help="Repair attempts after failing checks, 0-5 (default 1)."),
        click.option("--check-timeout", type=float, default=None, metavar="S",
                     help="Seconds each check may take (default 600)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def runs_by_status(store: Store, project: str) -> dict[str, int]:
    """How many runs of ``project`` are in each status."""
    states = asyncio.run(observer_runs(store).list_runs(project=project))
    return dict(Counter(state.status for state in states))


def checks_table(project: Project) -> Table:
    """The project's checks: name, command, timeout."""
    table = Table(title=f"checks of {literal(project.name)} (policy revision {project.policy_revision})")
    for column in ("check", "command (argv, no shell)", "timeout"):
        table.add_column(column, overflow="fold")
    for check in project.policy.get("checks") or []:
        table.add_row(literal(check["name"]), literal(shlex.join(str(a) for a in check["argv"])),
                      f"{check['timeout_s']:g}s")
    return table


def print_project(project: Project, runs: dict[str, int] | None = None) -> None:
    """A project in a few lines and its checks table."""
    limits = project.policy.get("limits") or {}
    view = out()
    view.print(f"[bold]project {literal(project.name)}[/]", highlight=False)
    view.print(f"  origin          {project.origin}\n  default branch  {project.default_branch}\n"
               f"  policy          revision {project.policy_revision}, digest {project.policy_digest}\n"
               f"  allowed paths   {', '.join(project.policy.get('allowed_paths') or ['*'])}\n"
               f"  limits          max repair attempts {limits.get('max_repair_attempts')}, "
               f"check timeout {limits.get('check_timeout_s')}s", highlight=False, markup=False)
    if runs is not None:
        total = sum(runs.values())
        detail = ", ".join(f"{n} {status}" for status, n in sorted(runs.items()))
        view.print(f"  runs            {total}" + (f" ({detail})" if detail else ""), highlight=False, markup=False)
    view.print(checks_table(project))


@click.group("projects", short_help="Register, list and show the projects runs work on.")
def projects_group() -> None:
    """Register, list and show projects: an authorized git origin plus the policy its runs must satisfy.

    Every command takes STORE first: a SQLite file path, sqlite:///PATH or a
    postgresql:// URL. Only `register` creates the store when it does not
    exist; the others never do.

    Exit codes: 0 ok, 2 usage, 3 not found (store, project, origin), 4 conflict
    (a project with the name but another origin or policy), 5 store problem,
    6 invalid input (nothing written).
    """


@projects_group.command("register", short_help="Register a project: its git origin and policy.")
@click.argument("store")
@click.argument("name")
@click.option("--origin", required=True, metavar="PATH_OR_URL",
              help="The authorized git origin runs clone (a local path is recorded absolute).")
@policy_options
@click.option("--default-branch", default=None, metavar="BRANCH",
              help="The branch runs start from (default: the origin's HEAD branch).")
@click.option("--actor", default=None, help="Who registers (recorded; default cli:<login name>).")
@json_option
def register_command(store: str, name: str, origin: str, checks: tuple[str, ...], allowed_paths: tuple[str, ...],
                     max_repair_attempts: int | None, check_timeout: float | None, default_branch: str | None,
                     actor: str | None, as_json: bool) -> None:
    """Register project NAME in STORE: its authorized git --origin and its policy.

    Registering again with the same origin, branch and policy changes nothing;
    with a different one it is refused (exit 4; use `update-policy`). The
    origin is read (git ls-remote) before anything is written; bad input
    (a malformed --check, an unreadable origin, a --default-branch the
    origin does not have) writes nothing, not even the store file.

    \b
    Example:
      jixu projects register ops.db calc --origin ../calc.git \\
          --check 'unit=python -m pytest -q' --check 'lint=ruff check .' --allowed-path 'src/*'
    """
    who = actor if actor is not None else default_actor()
    with handled(as_json):
        check_project_name(name)
        policy = build_policy(checks, allowed_paths, max_repair_attempts, check_timeout)
        authorized = check_origin(origin)
        branch = project_branch(authorized, default_branch)  # on the origin now, before the store is opened
        with open_store(store) as opened:
            try:
                before: Project | None = get_project(opened, name)
            except ProjectNotFound:
                before = None
            project = register_project(opened, name, authorized, policy, default_branch=branch, actor=who)
    registered = before is None
    if as_json:
        emit_json({"registered": registered, "project": project.to_dict()})
        return
    out().print(f"{'registered' if registered else 'already registered, unchanged:'} project [bold]{literal(name)}[/]",
                highlight=False)
    print_project(project)


@projects_group.command("update-policy", short_help="Record a new policy for later runs.")
@click.argument("store")
@click.argument("name")
@policy_options
@click.option("--actor", default=None, help="Who changes it (recorded; default cli:<login name>).")
@json_option
def update_policy_command(store: str, name: str, checks: tuple[str, ...], allowed_paths: tuple[str, ...],
                          max_repair_attempts: int | None, check_timeout: float | None, actor: str | None,
                          as_json: bool) -> None:
    """Replace project NAME's policy for runs created from now on (runs already created keep theirs).

    The options give the whole new policy (as for `register`). The same policy
    again writes nothing.
    """
    who = actor if actor is not None else default_actor()
    with handled(as_json):
        policy = build_policy(checks, allowed_paths, max_repair_attempts, check_timeout)
        with open_store(store, create=False) as opened:
            before = get_project(opened, name)
            project = update_policy(opened, name, policy, actor=who)
    changed = project.policy_revision != before.policy_revision
    if as_json:
        emit_json({"updated": changed, "project": project.to_dict()})
        return
    out().print(f"{'updated' if changed else 'the same policy; nothing written for'} project [bold]{literal(name)}[/]",
                highlight=False)
    print_project(project)


@projects_group.command("list", short_help="List the registered projects.")
@click.argument("store")
@json_option
def list_command(store: str, as_json: bool) -> None:
    """List the projects registered in STORE: origin, branch, checks, policy revision."""
    with handled(as_json), open_store(store, create=False) as opened:
        projects, corrupt = survey_projects(opened)
    if as_json:
        emit_json([p.to_dict() for p in projects] + [{"name": e.details["project"], "corrupt": e.to_dict()}
                                                      for e in corrupt])
        if corrupt:
            sys.exit(EXIT_CHECK_FAILED)
        return
    table = Table(title=f"projects in {literal(store)}")
    for column in ("project", "origin", "branch", "checks", "policy"):
        table.add_column(column, overflow="fold")
    for project in projects:
        checks = ", ".join(str(c["name"]) for c in project.policy.get("checks") or [])
        table.add_row(literal(project.name), literal(project.origin), literal(project.default_branch),
                      literal(trim(checks, 50)),
                      f"r{project.policy_revision} {project.policy_digest[:12]}")
    out().print(table)
    out().print(f"{len(projects)} project(s)", highlight=False)
    for error in corrupt:
        out().print(f"CORRUPT project {error.details['project']}: {error.message}", highlight=False, markup=False)
    if corrupt:
        sys.exit(EXIT_CHECK_FAILED)


@projects_group.command("show", short_help="Show a project: origin, policy, checks, its runs.")
@click.argument("store")
@click.argument("name")
@json_option
def show_command(store: str, name: str, as_json: bool) -> None:
    """Show project NAME: origin, default branch, the current policy (checks, allowed paths, limits), and how
    many of its runs are in each status. Exit 3 when it is not registered."""
    with handled(as_json), open_store(store, create=False) as opened:
        project = get_project(opened, name)
        runs = runs_by_status(opened, name)
    if as_json:
        emit_json({**project.to_dict(), "runs": {"total": sum(runs.values()), "by_status": runs}})
        return
    print_project(project, runs)


__all__ = ["build_policy", "parse_check", "projects_group"]
