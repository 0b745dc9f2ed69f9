"""``jixu runs …``: create runs, execute them, inspect them, and resume, hand off, retry or cancel them.

A run (SPEC section 5, decision 0005) implements a brief against a project's
git source with a worker *provider*, verifies it with the project's checks and
records every step in its hash-chained journal (``run/<id>``). Its status is
derived from the journal and the RecoveryResolver's analysis, never stored.

Providers come from a factory the caller names: ``--providers
MODULE:FACTORY`` (or ``$JIXU_PROVIDERS``), a zero-argument callable that
returns a ``dict[str, Provider]`` keyed by each provider's name, e.g.::

    # myapp/providers.py        (jixu runs … --providers myapp.providers:providers)
    from jixu.runs import CommandProvider

    def providers():
        codex = CommandProvider("codex", ["codex", "exec", "--full-auto"])
        return {codex.name: codex}

The current directory is importable. The factory is called once per command;
a run freezes a snapshot of its provider's configuration (kind, name,
settings), so executing it later needs a factory that configures that provider
the same way (or a handoff).

Who holds a run: a process executing a run holds its lease under an owner name
(``--owner``, default ``runs@<hostname>``: a process restarted under the same
name takes its runs back at once). Inspecting and operating commands use a name
of their own, so a run another process is executing shows as ``running``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import socket
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from jixu.cli.output import EXIT_CHECK_FAILED, EXIT_OK, emit_json, handled, json_option, literal
from jixu.cli.threads import default_actor, out, styled, trim
from jixu.errors import InvalidInput, NotFound, RunStateError
from jixu.ledger import Store, VerifyReport, open_store
from jixu.ledger.encoding import JSONObject
from jixu.runs.engine import RunLog, Runs, default_run_owner
from jixu.runs.model import (
    RUN_PREFIX,
    RUN_STATUSES,
    RunState,
    TaskView,
    check_project_name,
    get_project,
    run_stream,
)
from jixu.runs.operations import PLACEHOLDER, PROVIDERS_ENV, load_providers, next_operations
from jixu.runs.orphans import survey
from jixu.runs.projection import task_views
from jixu.runs.providers import Provider
from jixu.scheduling import submit_run

"""The environment variable naming the providers factory when ``--providers`` is not given."""
WORKSPACE_ENV = "JIXU_WORKSPACE_ROOT"
"""The environment variable naming the workspace root when ``--workspace-root`` is not given."""
DEFAULT_WORKSPACE_ROOT = "jixu-workspaces"
"""Where new runs' workspaces go by default: ``./jixu-workspaces/<run_id>``."""
PROGRESS_POLL_S = 0.1
"""How often the progress display reads the journal while a run executes."""

STATUS_STYLE = {
    "queued": "cyan",
    "running": "bold cyan",
    "paused": "bold yellow",
    "interrupted": "bold magenta",
    "needs_reconciliation": "bold red",
    "failed": "red",
    "succeeded": "green",
    "cancelled": "dim",
}
"""Colour of each run status."""

TASK_STYLE = {"pending": "dim", "ready": "cyan", "unknown": "bold yellow", "done": "green", "failed": "red",
              "blocked": "bold red"}
"""Colour of each task status."""

PROVIDERS_HELP = ("A zero-argument callable returning dict[str, Provider] (name -> provider), importable here, "
                  f"e.g. myapp.providers:providers. Default: ${PROVIDERS_ENV}.")


# --- providers ---------------------------------------------------------------------------------


def providers_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--providers MODULE:FACTORY`` (default ``$JIXU_PROVIDERS``)."""
    return click.option("--providers", "providers_spec", envvar=PROVIDERS_ENV, default=None, metavar=PLACEHOLDER,
                        help=PROVIDERS_HELP)(fn)


def workspace_root_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--workspace-root DIR`` (default ``$JIXU_WORKSPACE_ROOT``, else ``./jixu-workspaces``)."""
    return click.option("--workspace-root", envvar=WORKSPACE_ENV, default=DEFAULT_WORKSPACE_ROOT,
                        show_default=True, metavar="DIR",
                        help=f"Where new runs' workspaces are made (DIR/<run_id>); default ${WORKSPACE_ENV}. A "
                             "run's workspace path is frozen when it is created.")(fn)


def owner_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--owner NAME`` for commands that execute runs."""
    return click.option("--owner", default=None, metavar="NAME",
                        help="The run-lease owner name of this process while it executes (default "
                             "runs@<hostname>); unique among running processes, stable across restarts.")(fn)


def actor_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--actor``: who decides (recorded)."""
    return click.option("--actor", default=None, help="Who decides (recorded; default cli:<login name>).")(fn)


def observer_owner() -> str:
    """The owner name inspecting and operating commands use: this process only, so it never mistakes a run
    another process executes (even one named ``runs@<hostname>``) for one of its own."""
    return f"jixu-cli-{os.getpid()}@{socket.gethostname()}"


def observer_runs(store: Store, providers: Mapping[str, Provider] | None = None,
                  workspace_root: str = DEFAULT_WORKSPACE_ROOT) -> Runs:
    """A :class:`Runs` for inspecting and operating (never executing) runs."""
    return Runs(store, workspace_root, providers or {}, owner=observer_owner(), actor=default_actor())


def executor_runs(store: Store, providers: Mapping[str, Provider], workspace_root: str, owner: str | None) -> Runs:
    """A :class:`Runs` that executes runs under ``owner`` (default ``runs@<hostname>``)."""
    return Runs(store, workspace_root, providers, owner=owner or default_run_owner(), actor=default_actor())


# --- plumbing ----------------------------------------------------------------------------------


@contextmanager
def opened(store: str, as_json: bool) -> Iterator[Store]:
    """Open STORE (never creating it); typed errors become exit codes."""
    with handled(as_json), open_store(store, create=False) as store_:
        yield store_


def refuse_both(execute: bool, queue: bool) -> None:
    """``--execute`` and ``--queue`` together: invalid input (before anything is written)."""
    if execute and queue:
        raise InvalidInput("--execute and --queue exclude each other: run it here, or let workers run it",
                           field="execute")


def finished_code(state: RunState) -> int:
    """Exit status after executing: 0 when the run succeeded, 1 when it stopped otherwise."""
    return EXIT_OK if state.status == "succeeded" else EXIT_CHECK_FAILED


def run_ids(store: Store) -> list[str]:
    """Every run id in the store, oldest first."""
    ids: list[str] = []
    after = ""
    while True:
        page = store.list_streams(RUN_PREFIX, after=after, limit=1000)
        ids.extend(info.stream[len(RUN_PREFIX):] for info in page)
        if len(page) < 1000:
            return ids
        after = page[-1].stream


def created_event(store: Store, run_id: str) -> JSONObject:
    """The run's first journal entry (``run.created``) as a dict, or ``{}``."""
    events = store.read(run_stream(run_id), 1, 1)
    return events[0].to_dict() if events else {}


def lineage(store: Store, state: RunState) -> JSONObject:
    """``{parent_run_id, ancestors (oldest first), children}``: what this run retries and what retried it."""
    ancestors: list[str] = []
    parent = state.lineage.get("parent_run_id")
    while isinstance(parent, str) and parent not in ancestors and len(ancestors) < 1000:
        ancestors.insert(0, parent)
        parent = created_event(store, parent).get("data", {}).get("parent_run_id")
    children = [run_id for run_id in run_ids(store) if run_id != state.run_id
                and created_event(store, run_id).get("data", {}).get("parent_run_id") == state.run_id]
    return {"parent_run_id": state.lineage.get("parent_run_id"), "ancestors": ancestors, "children": children}


# --- summaries -----------------------------------------------------------------------------------


def _short(value: object, n: int = 12) -> str:
    return str(value)[:n] if value else "-"


def receipt_summary(kind: str, receipt: JSONObject | None) -> str:
    """A task attempt's receipt in a few words."""
    if not receipt:
        return ""
    if receipt.get("phase") == "failed":
        error = receipt.get("error") or {}
        label = str(error.get("type") or "failed") + (f"/{error['kind']}" if error.get("kind") else "")
        return f"{label}: {error.get('message') or ''}"
    result = receipt.get("result") or {}
    if kind == "prepare":
        return f"checked out {_short(result.get('head'))} (tree {_short(result.get('tree'))})" + (
            ", adopted" if result.get("adopted") else "")
    if kind == "implement":
        changed = result.get("changed_paths") or []
        extra = f"; OUTSIDE allowed paths: {', '.join(result['disallowed_paths'])}" if result.get(
            "disallowed_paths") else ""
        return f"{result.get('summary') or ''} — changed {', '.join(changed) or 'nothing'}{extra}"
    if kind == "verify":
        checks = result.get("checks") or []
        parts = [f"{c.get('name')} {'passed' if c.get('passed') else failure_text(c)}" for c in checks]
        return ("passed: " if result.get("passed") else "FAILED: ") + ", ".join(parts)
    return trim(result, 80)


def failure_text(check: JSONObject) -> str:
    """Why one check did not pass, in a few words."""
    if check.get("timed_out"):
        return f"timed out after {check.get('timeout_s')}s"
    if check.get("error"):
        return f"could not start ({check['error']})"
    return f"failed (exit {check.get('exit_status')})"


TaskRef = tuple[str, str, int]
"""A task intent: (task id, task kind, the task's attempt number)."""


def entry_task(entry: JSONObject, effects: dict[str, TaskRef]) -> TaskRef | None:
    """The task intent a ``task.*`` entry belongs to (learning intents from ``task.requested`` entries)."""
    data = entry.get("data") or {}
    effect = data.get("effect_id")
    if not isinstance(effect, str):
        return None
    if entry["type"] == "task.requested":
        attempt = data.get("attempt")
        effects[effect] = (str(data.get("task_id") or ""), str(data.get("name") or ""),
                           attempt if isinstance(attempt, int) else 0)
    return effects.get(effect)


def entry_summary(entry: JSONObject, task: TaskRef | None) -> str:
    """One journal entry in a line."""
    kind, data = str(entry["type"]), entry.get("data") or {}
    if kind == "run.created":
        provider, source = data.get("provider") or {}, data.get("source") or {}
        return (f"project {data.get('project')}, provider {provider.get('name')} ({provider.get('kind')}) "
                f"r{provider.get('revision')}, source {_short(source.get('commit'))} of {source.get('origin')}"
                + (f", retry of {data['parent_run_id']}" if data.get("parent_run_id") else "")
                + f": {data.get('brief')}")
    if kind == "plan.revised":
        tasks = ", ".join(str(t.get("kind")) for t in data.get("tasks") or [])
        return f"revision {data.get('revision')} ({data.get('reason')}), provider r{data.get('provider_revision')}: {tasks}"
    if kind == "run.claimed":
        return f"{data.get('owner')} epoch {data.get('epoch')} ({data.get('reason')})"
    if kind == "task.requested":
        return f"intent ({data.get('semantics')})"
    if kind == "task.dispatched":
        return f"dispatch {data.get('attempt')}"
    if kind in ("task.completed", "task.failed"):
        return receipt_summary(task[1] if task else "", {**data, "phase": kind.split(".")[1]})
    if kind == "run.paused":
        return f"{data.get('reason')}, " + (f"automatic retry after {data.get('delay')}s" if data.get("automatic")
                                            else "waiting for an operator (resume or handoff)")
    if kind == "run.resumed":
        return f"{data.get('reason')} by {data.get('actor')}" + (f": {data['note']}" if data.get("note") else "")
    if kind == "run.reconciled":
        details = "; ".join(str(d) for d in data.get("details") or [])
        return f"{data.get('outcome')} ({data.get('trigger')})" + (f": {details}" if details else "")
    if kind == "run.handed_off":
        provider, tested = data.get("provider") or {}, data.get("tested") or {}
        return (f"to {provider.get('name')} ({provider.get('kind')}) r{provider.get('revision')} by "
                f"{data.get('actor')}; tested {'ok' if tested.get('ok') else 'NOT ok'}")
    if kind == "run.finished":
        return f"{data.get('outcome')}: {data.get('reason')}"
    return json.dumps(data, ensure_ascii=False, sort_keys=True)


def journal_rows(entries: list[JSONObject]) -> list[JSONObject]:
    """The journal as rows: seq, type, task (id and kind), the task's attempt, a summary, plus the full entry."""
    effects: dict[str, TaskRef] = {}
    rows: list[JSONObject] = []
    for entry in entries:
        task = entry_task(entry, effects)
        rows.append({"seq": entry["seq"], "type": entry["type"], "task_id": task[0] if task else None,
                     "task": task[1] if task else None, "attempt": task[2] if task else None,
                     "summary": entry_summary(entry, task), "id": entry["id"], "recorded_at": entry["recorded_at"],
                     "hash": entry["hash"], "prev_hash": entry["prev_hash"], "data": entry.get("data") or {},
                     "meta": entry.get("meta") or {}})
    return rows


def failed_checks(views: Sequence[TaskView]) -> list[JSONObject]:
    """The evidence of every failing check of every verification attempt: exit status, output excerpt."""
    rows: list[JSONObject] = []
    for task in views:
        if task.kind != "verify":
            continue
        for attempt in task.attempts:
            receipt = attempt.get("receipt") or {}
            if receipt.get("phase") != "completed":
                continue
            for check in (receipt.get("result") or {}).get("checks") or []:
                if not check.get("passed"):
                    rows.append({"task_id": task.task_id, "effect_id": attempt.get("effect_id"),
                                 "attempt": attempt.get("attempt"), "revision": attempt.get("revision"),
                                 **{k: check.get(k) for k in ("name", "argv", "exit_status", "timed_out",
                                                              "duration_s", "timeout_s", "output_digest",
                                                              "output_bytes", "output_excerpt", "error")}})
    return rows


def status_text(state: RunState) -> str:
    """``status: reason`` with the status coloured (Rich markup)."""
    text = f"status {styled(state.status, STATUS_STYLE)}"
    return text + (f": {literal(state.reason)}" if state.reason else "")


def tasks_table(views: Sequence[TaskView], title: str) -> Table:
    """Tasks with their status, attempts and the resolver's decision on the latest attempt."""
    table = Table(title=title)
    table.add_column("task", no_wrap=True, min_width=26)
    for column in ("kind", "rev", "status", "attempts", "resolver (latest attempt)", "outcome"):
        table.add_column(column, overflow="fold")
    for task in views:
        latest = task.attempts[-1] if task.attempts else {}
        decision = latest.get("decision") or {}
        resolver = f"{decision.get('state')}: {decision.get('reason')}" if decision else ""
        table.add_row(literal(task.task_id), literal(task.kind), str(task.revision), styled(task.status, TASK_STYLE),
                      str(len(task.attempts)), literal(resolver),
                      literal(trim(receipt_summary(task.kind, latest.get("receipt")), 90)))
    return table


def print_next(view: Console, ops: list[JSONObject]) -> None:
    """The operations allowed now, each with its command."""
    if not ops:
        view.print("next: nothing; the run succeeded", highlight=False)
        return
    view.print("[bold]next[/] (allowed now):", highlight=False)
    for op in ops:
        view.print(f"  {op['operation']:<8} {op['why']}", highlight=False, markup=False)
        view.print(f"           {op['command']}", highlight=False, markup=False)


def print_outcome(state: RunState, store: str, providers_spec: str | None) -> None:
    """A run's status after an operation, its tasks, and what is allowed next."""
    view = out()
    view.print(f"run [bold]{literal(state.run_id)}[/]  {status_text(state)}", highlight=False)
    view.print(tasks_table(list(state.plan.tasks),
                           f"plan revision {state.plan.revision} ({literal(state.plan.reason)})"))
    print_next(view, next_operations(state, store, providers_spec))


def state_json(state: RunState, store: str, providers_spec: str | None = None,
               running: Sequence[JSONObject] = ()) -> JSONObject:
    """The run as JSON with the operations allowed next (``running``: see :func:`next_operations`)."""
    return {**state.to_dict(), "next_operations": next_operations(state, store, providers_spec, running)}


# --- executing with a progress display -------------------------------------------------------------


async def execute_with_progress(runs: Runs, run_id: str, show: bool) -> RunState:
    """``runs.execute(run_id)``, printing each journal entry as it is recorded under a status spinner."""
    if not show:
        return await runs.execute(run_id)
    view = out()
    stream = run_stream(run_id)
    effects: dict[str, TaskRef] = {}
    seen = 0
    for event in runs.store.read(stream):
        entry_task(event.to_dict(), effects)
        seen = event.seq
    work = asyncio.ensure_future(runs.execute(run_id))
    try:
        with view.status(f"run {literal(run_id)}: starting", spinner="dots") as status:
            while True:
                done, _pending = await asyncio.wait({work}, timeout=PROGRESS_POLL_S)
                for event in runs.store.read(stream, seen + 1):
                    seen = event.seq
                    entry = event.to_dict()
                    task = entry_task(entry, effects)
                    kind = task[1] if task else ""
                    view.print(f"[dim]{event.seq:>4}[/] {literal(event.type):<16} {literal(kind):<9} "
                               f"{literal(trim(entry_summary(entry, task), 110))}", highlight=False)
                    if event.type == "task.dispatched":
                        status.update(f"run {literal(run_id)}: {literal(kind)} (attempt {task[2] if task else '?'}) …")
                    elif event.type == "run.paused":
                        status.update(f"run {literal(run_id)}: paused ({literal(event.data.get('reason'))}) …")
                if done:
                    break
    finally:
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
    return work.result()


def run_and_report(runs: Runs, run_id: str, store: str, providers_spec: str | None, as_json: bool,
                   extra: JSONObject | None = None) -> None:
    """Execute the run to its next stop, print the outcome, exit 0 (succeeded) or 1 (any other stop)."""
    state = asyncio.run(execute_with_progress(runs, run_id, show=not as_json))
    if as_json:
        emit_json({**(extra or {}), "executed": True, "run": state_json(state, store, providers_spec)})
    else:
        print_outcome(state, store, providers_spec)
    sys.exit(finished_code(state))


# --- commands ------------------------------------------------------------------------------------


@click.group("runs", short_help="Create, execute, inspect, resume, hand off, retry and cancel runs.")
def runs_group() -> None:
    """Runs: a brief implemented against a project's git source by a provider, verified by the project's
    checks, every step in a hash-chained journal.

    Every command takes STORE first (a SQLite file path, sqlite:///PATH or a
    postgresql:// URL; never created here: register a project first with
    `jixu projects register`).

    Providers (needed to create, execute, hand off and retry runs, and to
    resume with --execute): --providers MODULE:FACTORY or $JIXU_PROVIDERS names
    a zero-argument callable returning dict[str, Provider], keyed by each
    provider's name, e.g. `def providers(): return {"codex":
    CommandProvider("codex", ["codex", "exec"])}`. The current directory is
    importable.

    \b
    Exit codes: 0 ok (for commands that execute: the run succeeded),
    1 the run stopped without succeeding (failed, paused, interrupted, needs
      reconciliation, cancelled), an invalid journal, a workspace that does not
      match its journal, a provider that failed its test,
    2 usage, 3 not found (store, run, project, source commit),
    4 conflict (the run's status does not allow the operation, another process
      is executing it, the configured provider differs from the run's snapshot),
    5 store problem, 6 invalid input (unknown provider, malformed option).
    Bad input writes nothing.
    """


@runs_group.command("create", short_help="Create a run of a brief on a project (optionally execute or queue it).")
@click.argument("store")
@click.argument("project")
@click.option("--brief", required=True, help="What to do, e.g. 'fix the failing date parser'.")
@click.option("--provider", "provider_name", required=True, metavar="NAME",
              help="The provider (a key of the providers factory's dict) that implements it.")
@providers_option
@click.option("--commit", default=None, metavar="SHA_OR_REF",
              help="The source to start from (default: the tip of the project's default branch).")
@workspace_root_option
@click.option("--execute", is_flag=True, help="Run it to its next stop in this process, showing progress.")
@click.option("--queue", is_flag=True, help="Put it in the work queue (key run/<id>, in the project) for workers.")
@owner_option
@actor_option
@json_option
def create_command(store: str, project: str, brief: str, provider_name: str, providers_spec: str | None,
                   commit: str | None, workspace_root: str, execute: bool, queue: bool, owner: str | None,
                   actor: str | None, as_json: bool) -> None:
    """Create a run of --brief on PROJECT with --provider; print its id.

    Freezes the source (the origin and the commit resolved there), the
    provider's configuration snapshot, the project's current policy and the
    workspace path (WORKSPACE_ROOT/<run_id>). Nothing runs unless --execute
    (here, to the run's next stop, exit 0 only if it succeeded) or --queue (for
    workers).
    """
    who = actor if actor is not None else default_actor()
    with opened(store, as_json) as store_:
        refuse_both(execute, queue)
        check_project_name(project)
        providers = load_providers(providers_spec)
        runs = executor_runs(store_, providers, workspace_root, owner)
        run_id = asyncio.run(runs.create_run(project, brief, provider=provider_name, commit=commit, actor=who,
                                             queue=queue))
        work = submit_run(store_, run_id).to_dict() if queue else None  # enqueued with it: its queue row as is
        created = {"run_id": run_id, "queued": work}
        if not as_json:
            out().print(run_id, highlight=False, markup=False)
            state = asyncio.run(runs.state(run_id))
            out().print(f"created run [bold]{literal(run_id)}[/] of project {literal(project)} with provider "
                        f"{literal(provider_name)}: source {literal(state.source.get('commit'))} "
                        f"({literal(state.source.get('ref'))}), workspace {literal(state.workspace)}", highlight=False)
            if work is not None:
                out().print(f"queued for workers: key {work['key']} in project {work['project']}",
                            highlight=False, markup=False)
        if execute:
            run_and_report(runs, run_id, store, providers_spec, as_json, created)
        state = asyncio.run(runs.state(run_id))
    if as_json:
        emit_json({**created, "executed": False, "run": state_json(state, store, providers_spec)})
    elif work is None:
        print_next(out(), next_operations(state, store, providers_spec))


@runs_group.command("queue", short_help="Put an existing run in the work queue for workers.")
@click.argument("store")
@click.argument("run_id")
@json_option
def queue_command(store: str, run_id: str, as_json: bool) -> None:
    """Put RUN_ID in the work queue (key run/<id>, in its project) for `jixu worker`: for a run created without
    --queue, or one an operator resumed or handed off without --execute. Idempotent. A finished run is refused
    (exit 4), a corrupt one too (exit 1)."""
    with opened(store, as_json) as store_:
        log = RunLog(store_, run_id)  # unknown run: exit 3
        log.open_to_act()  # a corrupt journal is queued for nobody
        outcome = (log.record.finished or {}).get("outcome")
        if outcome is not None:
            raise RunStateError(f"run {run_id} is {outcome}: there is nothing to run"
                                + ("; retry it with `jixu runs retry`" if outcome != "succeeded" else ""),
                                run_id=run_id, status=outcome)
        observer_runs(store_).refuse_if_blocked(log, "queued", "unfinished")  # the rule execute refuses by
        work = submit_run(store_, run_id).to_dict()
    if as_json:
        emit_json({"run_id": run_id, "queued": work})
    else:
        out().print(f"queued run {run_id} for workers: key {work['key']} in project {work['project']}",
                    highlight=False, markup=False)


@runs_group.command("execute", short_help="Run a run to its next stop in this process, showing progress.")
@click.argument("store")
@click.argument("run_id")
@providers_option
@workspace_root_option
@owner_option
@json_option
def execute_command(store: str, run_id: str, providers_spec: str | None, workspace_root: str, owner: str | None,
                    as_json: bool) -> None:
    """Drive RUN_ID until it succeeds, fails, pauses for an operator, needs reconciliation or is interrupted.

    Automatic pauses (rate limits, transient failures) are waited out here.
    A paused-for-an-operator, interrupted or finished run is left as it is
    (resume or hand it off first). Exit 0 only when the run succeeded.
    """
    with opened(store, as_json) as store_:
        runs = executor_runs(store_, load_providers(providers_spec), workspace_root, owner)
        RunLog(store_, run_id)  # unknown run: exit 3 before anything else
        run_and_report(runs, run_id, store, providers_spec, as_json, {"run_id": run_id})


@runs_group.command("list", short_help="List runs: status, project, provider, lineage.")
@click.argument("store")
@click.option("--project", default=None, help="Only this project's runs.")
@click.option("--status", type=click.Choice(RUN_STATUSES), default=None, help="Only runs in this status.")
@json_option
def list_command(store: str, project: str | None, status: str | None, as_json: bool) -> None:
    """List the runs in STORE (oldest first): status and why, project, provider, plan revision, lineage."""
    with opened(store, as_json) as store_:
        if project is not None:
            get_project(store_, project)
        states = asyncio.run(observer_runs(store_).list_runs(project=project))
        rows: list[JSONObject] = []
        for state in states:
            if status is not None and state.status != status:
                continue
            rows.append({"run_id": state.run_id, "project": state.project, "status": state.status,
                         "reason": state.reason, "pause_reason": state.pause_reason,
                         "provider": state.provider.get("name"), "provider_revision": state.provider.get("revision"),
                         "plan_revision": state.plan.revision, "parent_run_id": state.lineage.get("parent_run_id"),
                         "created_at": created_event(store_, state.run_id).get("recorded_at"),
                         "brief": state.brief, "seq": state.seq})
    if as_json:
        emit_json(rows)
        return
    table = Table(title=f"runs in {literal(store)}" + (f" of project {literal(project)}" if project else "")
                  + (f" that are {status}" if status else ""))
    table.add_column("run", no_wrap=True, min_width=26)
    for column in ("project", "status", "why", "provider", "plan", "retry of", "brief"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(literal(row["run_id"]), literal(row["project"]), styled(row["status"], STATUS_STYLE),
                      literal(trim(row["reason"], 60)), literal(f"{row['provider']} r{row['provider_revision']}"),
                      f"r{row['plan_revision']}", literal(row["parent_run_id"] or ""), literal(trim(row["brief"], 40)))
    out().print(table)
    out().print(f"{len(rows)} run(s)", highlight=False)


@runs_group.command("show", short_help="Show a run: status, snapshots, lineage, plan, checks, pauses, next steps.")
@click.argument("store")
@click.argument("run_id")
@json_option
def show_command(store: str, run_id: str, as_json: bool) -> None:
    """Show RUN_ID: status and why; the frozen source, provider and policy snapshots; lineage; every plan
    revision and each task's state with the RecoveryResolver's decision; the evidence of failed checks (exit
    status, output excerpt); pauses; and the operations allowed now, with their commands.

    Exit 1 when the journal's hash chain is invalid or the journal contradicts itself.
    """
    with opened(store, as_json) as store_:
        log = RunLog(store_, run_id)
        state = asyncio.run(observer_runs(store_).state(run_id))
        views = list(task_views(log.record, log.analysis(), list(log.record.tasks)))
        chain = store_.verify(run_stream(run_id))
        info = store_.stream_info(run_stream(run_id))
        entries = info.head_seq if info is not None else 0
        family = lineage(store_, state)
        running = survey(log.record)
    checks = failed_checks(views)
    broken = not chain.valid or bool(state.problems) or state.analysis.has_corruption
    if as_json:
        emit_json({**state_json(state, store, os.environ.get(PROVIDERS_ENV), running), "lineage": family,
                   "tasks": [v.to_dict() for v in views],
                   "failed_checks": checks, "journal": {"valid": chain.valid, "entries": entries,
                                                      "chain": chain.to_dict()}})
    else:
        print_show(state, family, views, checks, chain, entries, store, os.environ.get(PROVIDERS_ENV), running)
    if broken:
        sys.exit(EXIT_CHECK_FAILED)


def print_show(state: RunState, family: JSONObject, views: Sequence[TaskView], checks: list[JSONObject],
               chain: VerifyReport, entries: int, store: str, providers_spec: str | None,
               running: Sequence[JSONObject] = ()) -> None:
    view = out()
    source, provider, policy = state.source, state.provider, state.policy
    view.print(f"[bold]run {literal(state.run_id)}[/]  {status_text(state)}", highlight=False)
    lines = [
        f"project     {state.project}",
        f"brief       {trim(state.brief, 140)}",
        f"source      {source.get('commit')} ({source.get('ref')}) of {source.get('origin')}",
        f"provider    {provider.get('name')} ({provider.get('kind')}) revision {provider.get('revision')}, settings "
        f"{json.dumps(provider.get('settings'), sort_keys=True)}, digest {_short(provider.get('digest'), 16)}",
    ]
    if len(state.providers) > 1:
        lines.append("            earlier: " + ", ".join(f"r{p.get('revision')} {p.get('name')} ({p.get('kind')})"
                                                     for p in state.providers[:-1]))
    limits = policy.get("limits") or {}
    lines += [
        f"policy      digest {state.policy_digest[:16]}, checks "
        + "; ".join(f"{c.get('name')}: {shlex.join(str(a) for a in c.get('argv') or [])} ({c.get('timeout_s')}s)"
                    for c in policy.get("checks") or [])
        + f"; allowed paths {', '.join(policy.get('allowed_paths') or ['*'])}; max repair attempts "
        f"{limits.get('max_repair_attempts')} (used {state.repairs_used})",
        f"workspace   {state.workspace}",
        "lineage     " + ("retry of " + " <- ".join(reversed(family["ancestors"])) if family["ancestors"]
                          else "original run")
        + (f"; retried as {', '.join(family['children'])}" if family["children"] else ""),
        f"journal     {chain.count if chain.valid else entries} entries, head {chain.head_hash[:16]}…, hash chain "
        + ("valid" if chain.valid else f"INVALID at seq {chain.first_bad_seq} ({chain.reason}); the state above is "
           f"projected from the {state.seq} entries before it"),
    ]
    if state.owner:
        lines.append(f"lease       {state.owner.get('owner')} epoch {state.owner.get('epoch')}"
                     + (", released" if state.owner.get("released") else ", expired" if state.owner.get("expired")
                        else ", live"))
    for line in lines:
        view.print(line, highlight=False, markup=False)
    for problem in state.problems:
        view.print(f"[bold red]journal problem[/]: {literal(problem)}", highlight=False)

    revisions = Table(title="plan revisions (immutable; the last is current)")
    for column in ("rev", "reason", "provider", "seq", "tasks"):
        revisions.add_column(column, overflow="fold")
    for revision in state.plan.revisions:
        revisions.add_row(literal(revision.get("revision")), literal(revision.get("reason")),
                          literal(f"r{revision.get('provider_revision')}"), literal(revision.get("seq")),
                          literal(", ".join(str(t.get("kind")) for t in revision.get("tasks") or [])))
    view.print(revisions)
    view.print(tasks_table(views, "tasks (every revision) and the RecoveryResolver's decisions"))

    if checks:
        failed = Table(title="failed checks (evidence recorded by verification)")
        for column in ("check", "task attempt", "exit", "duration", "output (end)"):
            failed.add_column(column, overflow="fold")
        for check in checks:
            exit_text = "timed out" if check.get("timed_out") else (
                f"not started: {check.get('error')}" if check.get("error") else str(check.get("exit_status")))
            excerpt = "\n".join(str(check.get("output_excerpt") or "").rstrip().splitlines()[-8:])
            failed.add_row(literal(f"{check.get('name')}\n{shlex.join(str(a) for a in check.get('argv') or [])}"),
                           literal(f"{check.get('task_id')}\nattempt {check.get('attempt')}, rev {check.get('revision')}"),
                           literal(exit_text), literal(f"{check.get('duration_s')}s"), literal(excerpt))
        view.print(failed)

    if state.pauses:
        pauses = Table(title="pauses")
        for column in ("seq", "reason", "automatic", "delay", "task", "ended"):
            pauses.add_column(column, overflow="fold")
        for pause in state.pauses:
            closed = pause.get("closed")
            ended = f"{closed.get('by')} by {closed.get('actor')} (seq {closed.get('seq')})" if closed else "OPEN"
            pauses.add_row(literal(pause.get("seq")), literal(pause.get("reason")),
                           "yes" if pause.get("automatic") else "no",
                           "" if pause.get("delay") is None else f"{pause['delay']:.3g}s", literal(pause.get("task_id")),
                           literal(ended))
        view.print(pauses)
    for reconciliation in state.reconciliations:
        if reconciliation.get("outcome") == "mismatch":
            view.print(f"[bold red]workspace mismatch[/] (seq {literal(reconciliation.get('seq'))}): "
                       + literal("; ".join(str(d) for d in reconciliation.get("details") or [])), highlight=False)
    if state.finished:
        view.print(f"finished    {state.finished.get('outcome')}: {state.finished.get('reason')}",
                   highlight=False, markup=False)
    print_next(view, next_operations(state, store, providers_spec, running))


@runs_group.command("plan", short_help="Show a plan revision and its tasks' states.")
@click.argument("store")
@click.argument("run_id")
@click.option("--revision", type=click.IntRange(1), default=None, metavar="N",
              help="Show revision N (default: the current one). Earlier revisions are kept unchanged.")
@json_option
def plan_command(store: str, run_id: str, revision: int | None, as_json: bool) -> None:
    """Show RUN_ID's plan: a revision (default: the current one), its tasks with their states and attempts
    (with the RecoveryResolver's decision on each), and every revision recorded."""
    with opened(store, as_json) as store_:
        log = RunLog(store_, run_id)
        revisions = log.record.revisions
        if not revisions:
            raise NotFound(f"run {run_id} has no plan", run_id=run_id)
        number = revision if revision is not None else len(revisions)
        if number > len(revisions):
            raise NotFound(f"run {run_id} has {len(revisions)} plan revision(s); there is no revision {number}",
                           run_id=run_id, revision=number)
        chosen = revisions[number - 1]
        ids = [str(t.get("task_id")) for t in chosen.get("tasks") or []]
        views = list(task_views(log.record, log.analysis(), ids))
    body: JSONObject = {"run_id": run_id, "revision": number, "current": number == len(revisions),
                        "provider_revision": chosen.get("provider_revision"), "reason": chosen.get("reason"),
                        "seq": chosen.get("seq"), "tasks": [v.to_dict() for v in views],
                        "revisions": [dict(r) for r in revisions]}
    if as_json:
        emit_json(body)
        return
    view = out()
    view.print(f"run {run_id}: plan revision {number} of {len(revisions)}"
               + (" (current)" if body["current"] else " (superseded; kept unchanged)")
               + f", reason {chosen.get('reason')}, provider revision {chosen.get('provider_revision')}",
               highlight=False, markup=False)
    view.print(tasks_table(views, f"tasks of revision {number}"))
    for task in views:
        for attempt in task.attempts:
            decision = attempt.get("decision") or {}
            view.print(f"  {task.kind} {task.task_id} attempt {attempt.get('attempt')} (rev {attempt.get('revision')},"
                       f" effect {attempt.get('effect_id')}): resolver {decision.get('state')} "
                       f"({decision.get('reason')}, dispatched {decision.get('attempts')}x) — "
                       + trim(receipt_summary(task.kind, attempt.get("receipt")) or "no receipt", 100),
                       highlight=False, markup=False)


@runs_group.command("journal", short_help="Show a run's hash-chained journal and whether it verifies (exit 1 if not).")
@click.argument("store")
@click.argument("run_id")
@json_option
def journal_command(store: str, run_id: str, as_json: bool) -> None:
    """Show RUN_ID's journal: every entry (seq, type, task, attempt, summary) and whether the hash chain
    verifies. Exit 1 when it does not."""
    with opened(store, as_json) as store_:
        entries, valid = asyncio.run(observer_runs(store_).journal(run_id))
        chain = store_.verify(run_stream(run_id))
    rows = journal_rows(entries)
    if as_json:
        emit_json({"run_id": run_id, "valid": valid, "count": len(rows), "chain": chain.to_dict(), "entries": rows})
    else:
        table = Table(title=f"journal of run {literal(run_id)}")
        for column in ("seq", "type", "task", "attempt", "summary"):
            table.add_column(column, overflow="fold")
        for row in rows:
            task = f"{row['task']} {row['task_id']}" if row["task"] else ""
            table.add_row(str(row["seq"]), literal(row["type"]), literal(task),
                          "" if row["attempt"] is None else str(row["attempt"]),
                          literal(trim(row["summary"], 120)))
        view = out()
        view.print(table)
        verdict = "[green]valid[/]" if valid else (
            f"[bold red]INVALID[/] at seq {chain.first_bad_seq}: {literal(chain.reason)} ({literal(chain.detail)})")
        view.print(f"{len(rows)} entries, hash chain {verdict}, head {literal(chain.head_hash)}", highlight=False)
    if not valid:
        sys.exit(EXIT_CHECK_FAILED)


@runs_group.command("resume", short_help="Continue a paused, interrupted or unreconciled run in place.")
@click.argument("store")
@click.argument("run_id")
@providers_option
@actor_option
@click.option("--note", default=None, help="Why (recorded).")
@click.option("--execute", is_flag=True, help="Then run it to its next stop in this process.")
@click.option("--stop-agents", is_flag=True,
              help="Stop an earlier attempt's agent or check that outlived its worker (SIGTERM, then SIGKILL after "
                   "a grace period; recorded) before resuming. Without it such a process refuses the resume (exit 4).")
@workspace_root_option
@owner_option
@json_option
def resume_command(store: str, run_id: str, providers_spec: str | None, actor: str | None, note: str | None,
                   execute: bool, stop_agents: bool, workspace_root: str, owner: str | None, as_json: bool) -> None:
    """Resume RUN_ID: keeps its workspace, brief, policy and provider revision.

    The workspace is first reconciled against the journal (git root, origin,
    HEAD, tree); a mismatch is recorded and nothing continues (exit 1: the run
    needs reconciliation). A completed prepare is not repeated; a failed check
    gets its bounded repair attempt. --providers is needed with --execute.
    A finished run cannot be resumed (exit 4; retry a failed one). While an
    earlier attempt's agent (or check) still runs, e.g. after its worker was
    SIGKILLed, resume refuses and names it (exit 4): --stop-agents stops it first.
    """
    who = actor if actor is not None else default_actor()
    with opened(store, as_json) as store_:
        providers = load_providers(providers_spec) if execute or providers_spec else {}
        state = asyncio.run(observer_runs(store_, providers).resume(run_id, who, note=note, stop_agents=stop_agents))
        if execute:
            if not as_json:
                out().print(f"run {run_id} resumed by {who}", highlight=False, markup=False)
            run_and_report(executor_runs(store_, providers, workspace_root, owner), run_id, store, providers_spec,
                           as_json, {"run_id": run_id, "resumed": True})
    report_operation(state, store, providers_spec, as_json, f"resumed by {who}", {"resumed": True})


@runs_group.command("handoff", short_help="Hand a run to another provider (tested first): a new plan revision.")
@click.argument("store")
@click.argument("run_id")
@click.option("--agent", "agent", required=True, metavar="NAME", help="The provider to hand the run to.")
@providers_option
@actor_option
@click.option("--note", default=None, help="Why (recorded).")
@click.option("--execute", is_flag=True, help="Then run it to its next stop in this process.")
@workspace_root_option
@owner_option
@json_option
def handoff_command(store: str, run_id: str, agent: str, providers_spec: str | None, actor: str | None,
                    note: str | None, execute: bool, workspace_root: str, owner: str | None, as_json: bool) -> None:
    """Hand RUN_ID off to provider --agent: it is tested first, then a new provider snapshot and plan revision
    are recorded. Earlier revisions, partial files, checks and policy stay as they are.

    An unknown provider (exit 6) or one that fails its test (exit 1) writes nothing.
    """
    who = actor if actor is not None else default_actor()
    with opened(store, as_json) as store_:
        providers = load_providers(providers_spec)
        state = asyncio.run(observer_runs(store_, providers).handoff(run_id, agent, who, note=note))
        if execute:
            if not as_json:
                out().print(f"run {run_id} handed off to {agent} by {who}", highlight=False, markup=False)
            run_and_report(executor_runs(store_, providers, workspace_root, owner), run_id, store, providers_spec,
                           as_json, {"run_id": run_id, "handed_off_to": agent})
    report_operation(state, store, providers_spec, as_json, f"handed off to {agent} by {who}",
                     {"handed_off_to": agent})


@runs_group.command("retry", short_help="A fresh run (new id, fresh clone) of a failed or cancelled run.")
@click.argument("store")
@click.argument("run_id")
@providers_option
@click.option("--provider", "provider_name", default=None, metavar="NAME",
              help="The provider of the new run (default: the failed run's current provider).")
@actor_option
@click.option("--execute", is_flag=True, help="Run the new run to its next stop in this process.")
@click.option("--queue", is_flag=True, help="Put the new run in the work queue for workers.")
@workspace_root_option
@owner_option
@json_option
def retry_command(store: str, run_id: str, providers_spec: str | None, provider_name: str | None,
                  actor: str | None, execute: bool, queue: bool, workspace_root: str, owner: str | None,
                  as_json: bool) -> None:
    """Retry a failed or cancelled RUN_ID: a new run (new id, fresh clone) of the same project, brief, source
    commit and frozen policy, recording RUN_ID as its parent. RUN_ID's journal gains only `run.retried` naming the
    new run (a run is retried once: a second retry is refused, exit 4), and nothing it did is rolled back. Prints
    the new run's id and its lineage."""
    who = actor if actor is not None else default_actor()
    with opened(store, as_json) as store_:
        refuse_both(execute, queue)
        runs = executor_runs(store_, load_providers(providers_spec), workspace_root, owner)
        new_id = asyncio.run(runs.retry(run_id, who, provider=provider_name, queue=queue))
        work = submit_run(store_, new_id).to_dict() if queue else None  # enqueued with it: its queue row as is
        state = asyncio.run(runs.state(new_id))
        family = lineage(store_, state)
        chain = [*family["ancestors"], new_id]
        body: JSONObject = {"run_id": new_id, "parent_run_id": run_id, "lineage": chain, "queued": work}
        if not as_json:
            view = out()
            view.print(new_id, highlight=False, markup=False)
            view.print(f"created run [bold]{literal(new_id)}[/] retrying {literal(run_id)} (lineage: "
                       f"{literal(' -> '.join(chain))}); {literal(run_id)}'s history is unchanged", highlight=False)
            if work is not None:
                view.print(f"queued for workers: key {work['key']} in project {work['project']}",
                           highlight=False, markup=False)
        if execute:
            run_and_report(runs, new_id, store, providers_spec, as_json, body)
    if as_json:
        emit_json({**body, "executed": False, "run": state_json(state, store, providers_spec)})
    elif work is None:
        print_next(out(), next_operations(state, store, providers_spec))


@runs_group.command("cancel", short_help="Finish a run as cancelled.")
@click.argument("store")
@click.argument("run_id")
@actor_option
@click.option("--reason", default=None, help="Why (recorded).")
@json_option
def cancel_command(store: str, run_id: str, actor: str | None, reason: str | None, as_json: bool) -> None:
    """Cancel RUN_ID: it finishes as cancelled (a process executing it stops at its next step). A finished run
    cannot be cancelled (exit 4). A cancelled run can be retried."""
    who = actor if actor is not None else default_actor()
    with opened(store, as_json) as store_:
        state = asyncio.run(observer_runs(store_).cancel(run_id, who, reason=reason))
    report_operation(state, store, None, as_json, f"cancelled by {who}", {"cancelled": True})


def report_operation(state: RunState, store: str, providers_spec: str | None, as_json: bool, what: str,
                     extra: JSONObject) -> None:
    """Print (or emit as JSON) the run after an operator's operation."""
    if as_json:
        emit_json({"run_id": state.run_id, **extra, "executed": False,
                   "run": state_json(state, store, providers_spec)})
        return
    out().print(f"run {state.run_id} {what}", highlight=False, markup=False)
    print_outcome(state, store, providers_spec)


__all__ = ["PROVIDERS_ENV", "load_providers", "next_operations", "observer_runs", "runs_group"]
