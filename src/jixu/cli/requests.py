"""``jixu runs publish | execution-requests | execute-request | reconcile-execution-request | inspect-remote |
resolve-request | resolve-task``: execution requests and operator outcome decisions on runs.

A publication or a cancellation of a run is an *execution request* with its own
hash-chained stream (see :mod:`jixu.runs.requests`). Publishers come from
``--publishers MODULE:FACTORY`` (or ``$JIXU_PUBLISHERS``), a zero-argument
callable returning ``dict[str, Publisher]``; without one, ``git`` (push to a
branch on the run's authorized origin) is the only publisher::

    # myapp/publishers.py      (jixu runs publish … --publishers myapp.publishers:publishers)
    import os
    from jixu.runs import GitPublisher, PullRequestPublisher

    def publishers():
        github = PullRequestPublisher("https://api.github.com", "acme/calc", os.environ["GITHUB_TOKEN"],
                                      name="github")
        return {"git": GitPublisher(), "github": github}
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import click
from rich.table import Table

from jixu.cli.output import EXIT_CHECK_FAILED, EXIT_OK, emit_json, json_option, literal
from jixu.cli.runs import actor_option, observer_owner, opened, runs_group
from jixu.cli.threads import default_actor, out, styled
from jixu.errors import InvalidInput, ReconciliationNeedsProof
from jixu.ledger import Store
from jixu.ledger.encoding import JSONObject
from jixu.runs.engine import Runs
from jixu.runs.operations import PLACEHOLDER, PUBLISHERS_ENV, REMOTES_ENV, load_publishers, load_remotes
from jixu.runs.requests import ExecutionRequestView

REQUEST_STYLE = {"pending": "cyan", "in_progress": "bold cyan", "succeeded": "green", "failed": "red",
                 "needs_reconciliation": "bold red", "abandoned": "yellow", "corrupt": "bold red"}
"""Colour of each request status."""


def publishers_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--publishers MODULE:FACTORY`` (default ``$JIXU_PUBLISHERS``, else only ``git``)."""
    return click.option("--publishers", "publishers_spec", envvar=PUBLISHERS_ENV, default=None, metavar=PLACEHOLDER,
                        help="A zero-argument callable returning dict[str, Publisher], importable here. Default: "
                             f"${PUBLISHERS_ENV}, else only 'git' (push to the run's authorized origin).")(fn)


def remotes_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--remotes MODULE:FACTORY`` (default ``$JIXU_REMOTES``): deploy / rollback / knowledge-write providers."""
    return click.option("--remotes", "remotes_spec", envvar=REMOTES_ENV, default=None, metavar=PLACEHOLDER,
                        help="A zero-argument callable returning dict[str, RemoteProvider] (e.g. CommandRemote), "
                             f"importable here. Default: ${REMOTES_ENV}.")(fn)


def service(store: Store, publishers_spec: str | None, remotes_spec: str | None = None) -> Runs:
    """A :class:`Runs` that operates (never executes runs) with the configured publishers and remote providers."""
    return Runs(store, ".", {}, owner=observer_owner(), actor=default_actor(),
                publishers=load_publishers(publishers_spec),
                remotes=load_remotes(remotes_spec) if remotes_spec else None)


def evidence_text(view: ExecutionRequestView) -> str:
    """The short evidence of a request: branch and commit, pull request, or drain."""
    result = (view.receipt or {}).get("result") or {}
    args = (view.intent or {}).get("args") or {}
    if result.get("job_id") or result.get("version"):
        return f"{view.kind} {result.get('job_id') or result.get('version')}"
    if view.kind == "publication":
        parts = [str(args.get("branch") or view.target.get("branch") or "")]
        commit = result.get("pushed_commit") or args.get("commit")
        if commit:
            parts.append(str(commit)[:12])
        if result.get("pr_url"):
            parts.append(str(result["pr_url"]))
        return " ".join(p for p in parts if p)
    if result.get("drained"):
        return f"drained (by {result.get('drained_by')})"
    return ""


def print_requests(views: list[ExecutionRequestView]) -> None:
    """A table of requests."""
    table = Table(title="execution requests", title_justify="left")
    for column in ("request", "kind", "attempt", "status", "actor", "evidence", "why"):
        table.add_column(column, overflow="fold")
    for view in views:
        table.add_row(literal(view.request_id), literal(view.kind), str(view.attempt),
                      styled(view.status, REQUEST_STYLE), literal(view.actor), literal(evidence_text(view)),
                      literal(view.reason))
    out().print(table)


def report_request(view: ExecutionRequestView, as_json: bool, extra: JSONObject | None = None) -> None:
    """One request, as JSON or a table; exit 1 when it needs an operator."""
    if as_json:
        emit_json({**(extra or {}), "request": view.to_dict()})
    else:
        print_requests([view])
    raise SystemExit(EXIT_CHECK_FAILED if view.status in ("needs_reconciliation", "corrupt") else EXIT_OK)


@runs_group.command("publish", short_help="Publish a succeeded run's verified source (an execution request).")
@click.argument("store")
@click.argument("run_id")
@click.option("--publisher", default="git", show_default=True, help="Which configured publisher.")
@click.option("--branch", default=None, help="Branch to push (default jixu/<run_id>).")
@click.option("--base", "base_branch", default=None, help="Pull request base (default: the project's branch).")
@click.option("--title", default=None, help="Commit and pull-request title.")
@click.option("--execute", is_flag=True, help="Carry the request out in this process (else a worker does).")
@publishers_option
@actor_option
@json_option
def publish_command(store: str, run_id: str, publisher: str, branch: str | None, base_branch: str | None,
                    title: str | None, execute: bool, publishers_spec: str | None, actor: str | None,
                    as_json: bool) -> None:
    """Admit publishing RUN_ID (which must have succeeded) and optionally carry it out here. At most 3
    attempts, none while an earlier one is unresolved (exit 4). Exit 1 if its outcome is unknown afterwards."""
    with opened(store, as_json) as store_:
        runs = service(store_, publishers_spec)
        request_id = asyncio.run(runs.request_publication(run_id, publisher=publisher, branch=branch,
                                                          base_branch=base_branch, title=title,
                                                          actor=actor or default_actor()))
        view = asyncio.run(runs.execute_request(request_id) if execute else runs.execution_request(run_id,
                                                                                                    request_id))
    report_request(view, as_json, {"request_id": request_id, "executed": execute})


@runs_group.command("remote-task", short_help="Deploy, roll back or write knowledge from a succeeded run.")
@click.argument("store")
@click.argument("run_id")
@click.option("--kind", required=True, type=click.Choice(["deploy", "rollback", "knowledge_write"]))
@click.option("--provider", required=True, help="Which configured remote provider (see --remotes).")
@click.option("--parameters", default="{}", metavar="JSON", help="A JSON object handed to the provider.")
@click.option("--execute", is_flag=True, help="Carry the request out in this process (else a worker does).")
@remotes_option
@actor_option
@json_option
def remote_task_command(store: str, run_id: str, kind: str, provider: str, parameters: str, execute: bool,
                        remotes_spec: str | None, actor: str | None, as_json: bool) -> None:
    """Admit a remote task of RUN_ID (which must have succeeded): its evidence is the job id or version the
    provider reports. At most 3 attempts per kind, none while an earlier one is unresolved (exit 4)."""
    with opened(store, as_json) as store_:
        try:
            values = json.loads(parameters)
        except ValueError as error:
            raise InvalidInput(f"--parameters is not JSON: {error}", field="parameters") from error
        runs = service(store_, None, remotes_spec)
        request_id = asyncio.run(runs.request_remote(run_id, kind, provider=provider, parameters=values,
                                                     actor=actor or default_actor()))
        view = asyncio.run(runs.execute_request(request_id) if execute else runs.execution_request(run_id,
                                                                                                    request_id))
    report_request(view, as_json, {"request_id": request_id, "executed": execute})


@runs_group.command("execute-request", short_help="Carry out a pending execution request in this process.")
@click.argument("store")
@click.argument("run_id")
@click.argument("request_id")
@publishers_option
@remotes_option
@json_option
def execute_request_command(store: str, run_id: str, request_id: str, publishers_spec: str | None,
                            remotes_spec: str | None, as_json: bool) -> None:
    """Carry out REQUEST_ID of RUN_ID (what a worker does). A settled or unknown request is not touched."""
    with opened(store, as_json) as store_:
        runs = service(store_, publishers_spec, remotes_spec)
        asyncio.run(runs.execution_request(run_id, request_id))  # typed error if it is not this run's
        view = asyncio.run(runs.execute_request(request_id))
    report_request(view, as_json)


@runs_group.command("execution-requests", short_help="List a run's execution requests and their evidence.")
@click.argument("store")
@click.argument("run_id")
@json_option
def execution_requests_command(store: str, run_id: str, as_json: bool) -> None:
    """List RUN_ID's publication and cancellation requests: status, attempt, actor, evidence."""
    with opened(store, as_json) as store_:
        views = asyncio.run(service(store_, None).execution_requests(run_id))
    if as_json:
        emit_json({"run_id": run_id, "requests": [v.to_dict() for v in views]})
    elif views:
        print_requests(views)
    else:
        out().print(f"run {run_id} has no execution requests", highlight=False, markup=False)


@runs_group.command("reconcile-execution-request",
                    short_help="Settle an execution request from retained evidence (exit 4 without proof).")
@click.argument("store")
@click.argument("run_id")
@click.argument("request_id")
@click.option("--reconciliation-id", required=True, metavar="HEX",
              help="32 lowercase hex characters; the same id returns the same retained result.")
@actor_option
@json_option
def reconcile_command(store: str, run_id: str, request_id: str, reconciliation_id: str, actor: str | None,
                      as_json: bool) -> None:
    """Ask jixu to establish REQUEST_ID's outcome from retained, immutable evidence. You cannot assert an
    outcome; nothing is called or repeated. Without proof the finding is retained and the exit status is 4."""
    with opened(store, as_json) as store_:
        runs = service(store_, None)
        try:
            result = asyncio.run(runs.reconcile_execution_request(run_id, request_id, reconciliation_id,
                                                                  actor=actor or default_actor()))
        except ReconciliationNeedsProof as refused:
            if not as_json:
                print_finding(refused.details.get("result") or {})
            raise
    if as_json:
        emit_json({"result": result})
    else:
        print_finding(result)


def print_finding(result: JSONObject) -> None:
    """A reconciliation's retained result."""
    settled = bool(result.get("settled"))
    view = out()
    verdict = (f"[green]settled: {literal(result.get('outcome'))}[/]" if settled
               else "[bold red]no proof: outcome unknown[/]")
    view.print(f"reconciliation {literal(result.get('reconciliation_id'))}: {verdict}", highlight=False)
    view.print(f"  {result.get('reason')}", highlight=False, markup=False)
    for proof in result.get("proof") or []:
        view.print(f"  proof: {proof.get('type')} at {proof.get('stream')} seq {proof.get('seq')}", highlight=False,
                   markup=False)


@runs_group.command("inspect-remote", short_help="Ask the publisher, read-only, what it shows; the finding is kept.")
@click.argument("store")
@click.argument("run_id")
@click.argument("request_id")
@publishers_option
@remotes_option
@actor_option
@json_option
def inspect_remote_command(store: str, run_id: str, request_id: str, publishers_spec: str | None,
                           remotes_spec: str | None, actor: str | None, as_json: bool) -> None:
    """Query the publisher for REQUEST_ID's recorded branch (and pull requests) without changing anything
    there; what it shows is retained in the request's stream (request.inspected) before any next step."""
    with opened(store, as_json) as store_:
        found = asyncio.run(service(store_, publishers_spec, remotes_spec).inspect_remote(
            run_id, request_id, actor=actor or default_actor()))
    if as_json:
        emit_json(found)
        return
    view = out()
    expected, seen = found.get("expected") or {}, found.get("found") or {}
    if "branch" not in expected:  # a deploy / rollback / knowledge write: the provider's own report
        view.print(f"expected: {json.dumps(expected, sort_keys=True)}", highlight=False, markup=False)
        view.print(f"found:    {json.dumps(seen, sort_keys=True)}", highlight=False, markup=False)
        view.print(f"retained as event {found.get('event_id')}", highlight=False, markup=False)
        _print_evidence(found)
        return
    view.print(f"expected: branch {expected.get('branch')} at {expected.get('commit')}", highlight=False,
               markup=False)
    view.print(f"found:    branch {seen.get('branch')} at {seen.get('remote_commit')}", highlight=False, markup=False)
    for pull in seen.get("pull_requests") or []:
        view.print(f"          pull request #{pull.get('number')} {pull.get('state')} {pull.get('url')} "
                   f"(head {str(pull.get('head_sha'))[:12]})", highlight=False, markup=False)
    view.print(f"retained as event {found.get('event_id')}", highlight=False, markup=False)
    _print_evidence(found)


def _print_evidence(found: JSONObject) -> None:
    """Whether the inspection settled the request, or what it lacks as evidence."""
    evidence = found.get("evidence") or {}
    if found.get("settled"):
        out().print("settled: it shows the admitted source, so the request succeeded (recorded by the probe)",
                    highlight=False, markup=False)
    elif evidence.get("shown"):
        out().print("it shows the admitted source; the request was settled already", highlight=False, markup=False)
    else:
        for missing in evidence.get("missing") or []:
            out().print(f"not evidence: {missing}", highlight=False, markup=False)
        out().print("the outcome stays unknown: 'occurred' would be refused; resolve-request --resolution "
                    "abandoned_unknown settles it without claiming success", highlight=False, markup=False)


RESOLUTION_CHOICE = click.Choice(["occurred", "not_occurred", "abandoned_unknown"])


@runs_group.command("resolve-request", short_help="Record what happened to an unknown request, after inspecting it.")
@click.argument("store")
@click.argument("run_id")
@click.argument("request_id")
@click.option("--resolution", required=True, type=RESOLUTION_CHOICE)
@click.option("--resolution-id", default=None, help="Idempotency id (same id + same body: no-op).")
@click.option("--note", required=True, help="What you found (recorded).")
@actor_option
@json_option
def resolve_request_command(store: str, run_id: str, request_id: str, resolution: str, resolution_id: str | None,
                            note: str, actor: str | None, as_json: bool) -> None:
    """Record an operator's decision about REQUEST_ID's unknown outcome; a publication needs a retained
    inspect-remote finding first, which the resolution cites."""
    with opened(store, as_json) as store_:
        view = asyncio.run(service(store_, None).resolve_request_outcome(
            run_id, request_id, resolution, resolution_id=resolution_id, note=note, actor=actor or default_actor()))
    report_request(view, as_json)


@runs_group.command("resolve-task", short_help="Record what happened to a run task whose outcome is unknown.")
@click.argument("store")
@click.argument("run_id")
@click.argument("effect_id")
@click.option("--resolution", required=True, type=RESOLUTION_CHOICE)
@click.option("--resolution-id", default=None, help="Idempotency id (same id + same body: no-op).")
@click.option("--note", default=None, help="What you found (recorded).")
@actor_option
@json_option
def resolve_task_command(store: str, run_id: str, effect_id: str, resolution: str, resolution_id: str | None,
                         note: str | None, actor: str | None, as_json: bool) -> None:
    """Record an operator's decision about EFFECT_ID (a task attempt) of RUN_ID: not_occurred lets the run try
    the task again, abandoned_unknown fails it; occurred is refused for local tasks."""
    from jixu.cli.runs import report_operation

    with opened(store, as_json) as store_:
        state = asyncio.run(service(store_, None).resolve_task_outcome(
            run_id, effect_id, resolution, resolution_id=resolution_id, note=note, actor=actor or default_actor()))
    report_operation(state, store, None, as_json, f"task {effect_id} resolved as {resolution}", {"resolved": True})


__all__ = ["publishers_option", "service"]
