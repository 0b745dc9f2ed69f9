"""``jixu remote …``: every thread, run, project and token operation through a jixu server's HTTP API.

``--server URL --token T`` (or ``$JIXU_SERVER`` / ``$JIXU_TOKEN``) name the
server and the bearer token; the server records the token as the actor of
every change. Problems the server answers map to the same exit codes as the
local commands (and 7 when the token is missing, revoked or lacks the role).
Mutations carry a request id (``--request-id``, else a random one), so a
request repeated after a lost answer is not applied twice.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

import click
from rich.table import Table

from jixu.cli.output import EXIT_CHECK_FAILED, emit_json, err_console, handled, json_option, literal
from jixu.cli.threads import EFFECT_STYLE, STATUS_STYLE, out, styled, trim
from jixu.errors import InvalidInput
from jixu.recovery import RESOLUTIONS
from jixu.server.client import SERVER_ENV, TOKEN_ENV, Client

SETTLED = ("idle", "waiting", "failed", "corrupt")
RUN_STOPS = ("succeeded", "failed", "cancelled", "paused", "interrupted", "needs_reconciliation")


def client_of(ctx: click.Context) -> Client:
    """The client for the group's ``--server`` and ``--token``."""
    server, token = ctx.obj["server"], ctx.obj["token"]
    if not server:
        raise InvalidInput(f"give --server URL (or ${SERVER_ENV})", field="server")
    return Client(server, token)


def call(as_json: bool, fn: Callable[[Client], Any]) -> Any:
    """Run ``fn`` with a client; problems become messages and exit codes."""
    ctx = click.get_current_context()
    with handled(as_json), client_of(ctx) as client:
        return fn(client)


def request_id_option(fn: Any) -> Any:
    """``--request-id``: makes a repeated command idempotent."""
    return click.option("--request-id", default=None, metavar="ID",
                        help="Idempotency key: the same id and body return the original answer (default: random).")(fn)


def wait_with_progress(what: str, poll: Callable[[], dict[str, Any]], done: Callable[[dict[str, Any]], bool],
                       timeout: float, quiet: bool) -> dict[str, Any]:
    """Poll until ``done``, showing a spinner (unless ``quiet``); the last answer."""
    deadline = time.monotonic() + timeout
    state = poll()
    with err_console.status(what) if not quiet else contextlib.nullcontext():
        while not done(state) and time.monotonic() < deadline:
            time.sleep(0.3)
            state = poll()
    return state


@click.group("remote", short_help="Threads, runs, projects and tokens through a jixu server (HTTP API).")
@click.option("--server", envvar=SERVER_ENV, default=None, metavar="URL",
              help=f"The server, e.g. http://127.0.0.1:8420 (default ${SERVER_ENV}).")
@click.option("--token", envvar=TOKEN_ENV, default=None, metavar="TOKEN",
              help=f"The bearer token (default ${TOKEN_ENV}).")
@click.pass_context
def remote_group(ctx: click.Context, server: str | None, token: str | None) -> None:
    """Work through a jixu server: `jixu remote --server URL --token T threads list`.

    Exit codes: 0 ok, 1 check failed, 3 not found (or not yours), 4 conflict,
    5 server or store unreachable, 6 invalid input, 7 not authorized.
    """
    ctx.obj = {"server": server, "token": token}


@remote_group.command("whoami", short_help="The token's id, kind and roles.")
@json_option
def whoami_command(as_json: bool) -> None:
    """Show who the token is: id, kind, role per project, the actor recorded for it."""
    me = call(as_json, lambda c: c.whoami())
    if as_json:
        emit_json(me)
        return
    roles = ", ".join(f"{p}: {r}" for p, r in me["roles"].items()) or "every project"
    out().print(f"token {me['token_id']} ({me['name']}, {me['kind']}): {roles}; recorded as {me['actor']}",
                highlight=False, markup=False)


# --- threads -----------------------------------------------------------------------------------


@remote_group.group("threads", short_help="Create threads, send input, read and decide.")
def threads() -> None:
    """Threads through the server."""


def print_thread(state: dict[str, Any]) -> None:
    """A thread's state as tables."""
    out().print(f"[bold]thread {literal(state['thread_id'])}[/] (project {literal(state.get('project'))}) status "
                f"{styled(state['status'], STATUS_STYLE)}{': ' + literal(state['reason']) if state['reason'] else ''}",
                highlight=False)
    messages = Table(title="messages")
    for column in ("#", "role", "content"):
        messages.add_column(column)
    for index, message in enumerate(state["messages"], start=1):
        messages.add_row(str(index), literal(message.get("role")), literal(trim(message.get("content") or "")))
    out().print(messages)
    effects = Table(title="effects (RecoveryResolver)")
    for column in ("effect", "kind", "name", "state", "reason"):
        effects.add_column(column)
    for effect_id, decision in state["effects"].items():
        effects.add_row(literal(effect_id), literal(decision["kind"]), literal(decision.get("name") or ""),
                        styled(decision["state"], EFFECT_STYLE), literal(decision["reason"]))
    out().print(effects)
    for item in state["waiting_on"]:
        out().print(f"waiting on {item['effect_id']} {item['name']} ({item['state']}): settle it with "
                    f"`jixu remote threads {'approve/deny' if item['state'] == 'parked' else 'resolve'} "
                    f"{state['thread_id']} {item['effect_id']} …`", highlight=False, markup=False)


@threads.command("create", short_help="Create a thread in a project.")
@click.option("--project", required=True, help="The project the thread belongs to.")
@click.option("--metadata", default=None, metavar="JSON", help="A JSON object kept with the thread.")
@request_id_option
@json_option
def thread_create(project: str, metadata: str | None, request_id: str | None, as_json: bool) -> None:
    """Create a thread in PROJECT (editor)."""
    def run(client: Client) -> Any:
        meta = json.loads(metadata) if metadata else None
        return client.create_thread(project, meta, request_id=request_id)

    made = call(as_json, run)
    emit_json(made) if as_json else out().print(f"thread {made['thread_id']} created in {project}", highlight=False,
                                                markup=False)


@threads.command("list", short_help="List the threads you may see.")
@click.option("--project", default=None, help="Only this project's threads.")
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True)
@json_option
def thread_list(project: str | None, limit: int, as_json: bool) -> None:
    """List threads (of --project) the token may see."""
    rows = call(as_json, lambda c: c.list_threads(project, limit=limit))["threads"]
    if as_json:
        emit_json(rows)
        return
    table = Table(title="threads")
    for column in ("thread", "project", "events", "created"):
        table.add_column(column)
    for row in rows:
        table.add_row(literal(row["thread_id"]), literal(row["project"]), literal(row["events"]),
                      literal(row["created_at"]))
    out().print(table)


@threads.command("send", short_help="Send input (starts a turn); --wait for the answer.")
@click.argument("thread_id")
@click.argument("text")
@click.option("--wait", "wait_seconds", type=click.FloatRange(0, 86400), default=None, metavar="SECONDS",
              help="Wait up to SECONDS for the thread to settle, showing progress, and print its reply.")
@request_id_option
@json_option
def thread_send(thread_id: str, text: str, wait_seconds: float | None, request_id: str | None,
                as_json: bool) -> None:
    """Send TEXT to THREAD_ID (editor): a turn queued for the server's worker."""
    def run(client: Client) -> Any:
        sent = client.send(thread_id, text, request_id=request_id)
        if wait_seconds is None:
            return sent
        state = wait_with_progress(f"waiting for thread {literal(thread_id)}", lambda: client.thread(thread_id),
                                   lambda s: s["status"] in SETTLED and any(t["turn_id"] == sent["turn_id"]
                                                                            for t in s["turns"]),
                                   wait_seconds, as_json)
        return {**sent, "state": state}

    answer = call(as_json, run)
    if as_json:
        emit_json(answer)
        return
    out().print(f"turn {answer['turn_id']} queued on thread {thread_id}", highlight=False, markup=False)
    if "state" in answer:
        state = answer["state"]
        out().print(f"status {styled(state['status'], STATUS_STYLE)}; reply: {literal(state['last_reply'])}",
                    highlight=False)


@threads.command("show", short_help="A thread's state.")
@click.argument("thread_id")
@json_option
def thread_show(thread_id: str, as_json: bool) -> None:
    """Show THREAD_ID: status, messages, each effect's resolver state, what it waits for (exit 1 if corrupt)."""
    state = call(as_json, lambda c: c.thread(thread_id))
    emit_json(state) if as_json else print_thread(state)
    if state["status"] == "corrupt":
        raise SystemExit(EXIT_CHECK_FAILED)


@threads.command("events", short_help="A thread's events; --follow streams new ones.")
@click.argument("thread_id")
@click.option("--after-seq", type=click.IntRange(0), default=0, show_default=True)
@click.option("--follow", is_flag=True, help="Keep streaming new events (server-sent events) until Ctrl-C.")
@json_option
def thread_events(thread_id: str, after_seq: int, follow: bool, as_json: bool) -> None:
    """Print THREAD_ID's events after --after-seq (JSON lines with --json)."""
    def show(event: dict[str, Any]) -> None:
        if as_json:
            click.echo(json.dumps(event, ensure_ascii=False))
        else:
            out().print(f"{event['seq']:>5} {event['type']:<24} {event['id']} {trim(event['data'], 80)}",
                        highlight=False, markup=False)

    def run(client: Client) -> None:
        if follow:
            for event in client.stream_events(thread_id, after_seq=after_seq):
                show(event)
            return
        cursor = after_seq
        while True:
            page = client.events(thread_id, after_seq=cursor)
            for event in page["events"]:
                show(event)
            if not page["events"]:
                return
            cursor = page["next_after_seq"]

    call(as_json, run)


@threads.command("verify", short_help="Verify a thread's chain and effects (exit 1 if not).")
@click.argument("thread_id")
@json_option
def thread_verify(thread_id: str, as_json: bool) -> None:
    """Recompute THREAD_ID's hash chain on the server and check its effects (exit 1 if not valid)."""
    report = call(as_json, lambda c: c.verify_thread(thread_id))
    if as_json:
        emit_json(report)
    else:
        chain = report["chain"]
        out().print(f"thread {literal(thread_id)}: {'[green]valid[/]' if report['valid'] else '[bold red]INVALID[/]'}, "
                    f"{literal(chain['count'])} events, head {literal(chain['head_hash'])}", highlight=False)
    if not report["valid"]:
        raise SystemExit(EXIT_CHECK_FAILED)


@threads.command("replay", short_help="Rebuild a thread's state from its events alone.")
@click.argument("thread_id")
@click.option("--upto", default=None, metavar="SEQ_OR_EVENT_ID")
@json_option
def thread_replay(thread_id: str, upto: str | None, as_json: bool) -> None:
    """Rebuild THREAD_ID's state from its events (up to --upto); no driver is called."""
    state = call(as_json, lambda c: c.replay(thread_id, upto))
    emit_json(state) if as_json else print_thread({**state, "project": "-"})


@threads.command("fork", short_help="Fork a thread at an event.")
@click.argument("thread_id")
@click.option("--at", required=True, metavar="EVENT_ID")
@click.option("--input", "text", default=None, help="Start the child's first turn with this input.")
@request_id_option
@json_option
def thread_fork(thread_id: str, at: str, text: str | None, request_id: str | None, as_json: bool) -> None:
    """Make a child of THREAD_ID at event --at (editor); the parent does not change."""
    child = call(as_json, lambda c: c.fork(thread_id, at, text, request_id=request_id))
    emit_json(child) if as_json else out().print(f"forked thread {child['thread_id']} from {thread_id} at {at}",
                                                 highlight=False, markup=False)


def decision_output(answer: dict[str, Any], as_json: bool, what: str) -> None:
    """Print a decision's answer."""
    if as_json:
        emit_json(answer)
        return
    effect, thread = answer["effect"], answer["thread"]
    out().print(f"{literal(what)}: effect {literal(effect['effect_id'])} is {styled(effect['state'], EFFECT_STYLE)}; "
                f"thread {literal(thread['thread_id'])} is {styled(thread['status'], STATUS_STYLE)}", highlight=False)


@threads.command("resolve", short_help="Resolve an effect whose outcome is unknown (operator).")
@click.argument("thread_id")
@click.argument("effect_id")
@click.option("--resolution", required=True, type=click.Choice(RESOLUTIONS))
@click.option("--note", required=True, help="Why: what you checked.")
@click.option("--resolution-id", default=None)
@click.option("--evidence", default=None, metavar="JSON")
@request_id_option
@json_option
def thread_resolve(thread_id: str, effect_id: str, resolution: str, note: str, resolution_id: str | None,
                   evidence: str | None, request_id: str | None, as_json: bool) -> None:
    """Record what happened to EFFECT_ID of THREAD_ID (operator)."""
    answer = call(as_json, lambda c: c.resolve(thread_id, effect_id, resolution, note, resolution_id=resolution_id,
                                               evidence=json.loads(evidence) if evidence else None,
                                               request_id=request_id))
    decision_output(answer, as_json, f"resolved as {resolution}")


for _decision in ("approve", "deny"):
    def _make(decision: str) -> None:
        @threads.command(decision, short_help=f"{decision.capitalize()} a parked call (operator).")
        @click.argument("thread_id")
        @click.argument("effect_id")
        @click.option("--note", default=None)
        @request_id_option
        @json_option
        def command(thread_id: str, effect_id: str, note: str | None, request_id: str | None,
                    as_json: bool) -> None:
            answer = call(as_json, lambda c: c.decide(thread_id, effect_id, decision, note, request_id=request_id))
            decision_output(answer, as_json, f"{decision}d" if decision == "approve" else "denied")

        command.__doc__ = f"{decision.capitalize()} the parked call EFFECT_ID of THREAD_ID (operator)."

    _make(_decision)


@threads.command("resume", short_help="Resume a paused turn (editor).")
@click.argument("thread_id")
@click.option("--note", default=None, help="What was fixed (recorded).")
@json_option
def thread_resume(thread_id: str, note: str | None, as_json: bool) -> None:
    """Record an explicit resume of THREAD_ID's paused turn (quota, authentication, retries used up)."""
    answer = call(as_json, lambda c: c.resume_thread(thread_id, note))
    if as_json:
        emit_json(answer)
        return
    out().print(f"resumed: thread {literal(answer['thread_id'])} is {styled(answer['status'], STATUS_STYLE)}",
                highlight=False)


@threads.command("recover-turn", short_help="Recover an expired turn (editor).")
@click.argument("thread_id")
@click.argument("turn_id")
@click.option("--request-id", required=True, metavar="HEX", help="32 lower-case hex characters.")
@click.option("--expected-epoch", required=True, type=click.IntRange(0))
@click.option("--legacy-confirmed-stopped", is_flag=True)
@click.option("--note", default=None, help="Why you recover it (recorded in the receipt).")
@json_option
def thread_recover(thread_id: str, turn_id: str, request_id: str, expected_epoch: int,
                   legacy_confirmed_stopped: bool, note: str | None, as_json: bool) -> None:
    """Fence out the owner of TURN_ID's expired lease and record a recovery receipt."""
    answer = call(as_json, lambda c: c.recover_turn(thread_id, turn_id, request_id=request_id,
                                                    expected_epoch=expected_epoch,
                                                    legacy_confirmed_stopped=legacy_confirmed_stopped, note=note))
    if as_json:
        emit_json(answer)
        return
    receipt = answer["receipt"]
    out().print(f"turn {turn_id} recovered (epoch {receipt['epoch']}, previous owner {receipt['previous_owner']})"
                if answer["recorded"] else f"already recovered by request {request_id}", highlight=False,
                markup=False)


# --- runs --------------------------------------------------------------------------------------


@remote_group.group("runs", short_help="Create, inspect and operate runs.")
def runs() -> None:
    """Runs through the server."""


def print_run(state: dict[str, Any]) -> None:
    """A run's state in a few lines."""
    out().print(f"[bold]run {literal(state['run_id'])}[/] (project {literal(state['project'])}): "
                f"[bold]{literal(state['status'])}[/]"
                f"{' - ' + literal(state.get('reason')) if state.get('reason') else ''}", highlight=False)


@runs.command("create", short_help="Create a run (queued for workers); --wait to follow it.")
@click.option("--project", required=True)
@click.option("--brief", required=True)
@click.option("--provider", required=True)
@click.option("--commit", default=None)
@click.option("--wait", "wait_seconds", type=click.FloatRange(0, 86400), default=None, metavar="SECONDS",
              help="Wait up to SECONDS for the run to stop, showing progress.")
@request_id_option
@json_option
def run_create(project: str, brief: str, provider: str, commit: str | None, wait_seconds: float | None,
               request_id: str | None, as_json: bool) -> None:
    """Create a run of --brief on --project with --provider (editor)."""
    def run(client: Client) -> Any:
        state = client.create_run(project, brief, provider, commit=commit, request_id=request_id)
        if wait_seconds is None:
            return state
        return wait_with_progress(f"run {literal(state['run_id'])}", lambda: client.run(state["run_id"]),
                                  lambda s: s["status"] in RUN_STOPS, wait_seconds, as_json)

    state = call(as_json, run)
    emit_json(state) if as_json else print_run(state)


@runs.command("list", short_help="List runs.")
@click.option("--project", default=None)
@click.option("--status", default=None)
@json_option
def run_list(project: str | None, status: str | None, as_json: bool) -> None:
    """List the runs the token may see."""
    rows = call(as_json, lambda c: c.list_runs(project, status))["runs"]
    if as_json:
        emit_json(rows)
        return
    table = Table(title="runs")
    for column in ("run", "project", "status", "brief"):
        table.add_column(column)
    for row in rows:
        table.add_row(literal(row["run_id"]), literal(row["project"]), literal(row["status"]),
                      literal(trim(row["brief"], 60)))
    out().print(table)


@runs.command("show", short_help="A run's state.")
@click.argument("run_id")
@json_option
def run_show(run_id: str, as_json: bool) -> None:
    """Show RUN_ID's state."""
    state = call(as_json, lambda c: c.run(run_id))
    emit_json(state) if as_json else print_run(state)


@runs.command("plan", short_help="A run's plan.")
@click.argument("run_id")
@json_option
def run_plan(run_id: str, as_json: bool) -> None:
    """Show RUN_ID's current plan revision and its tasks."""
    plan = call(as_json, lambda c: c.plan(run_id))
    if as_json:
        emit_json(plan)
        return
    table = Table(title=f"plan revision {literal(plan['revision'])} of run {literal(run_id)}")
    for column in ("task", "kind", "state"):
        table.add_column(column)
    for task in plan["tasks"]:
        table.add_row(literal(task["task_id"]), literal(task["kind"]), literal(task.get("state") or ""))
    out().print(table)


@runs.command("journal", short_help="A run's journal and whether it verifies (exit 1 if not).")
@click.argument("run_id")
@json_option
def run_journal(run_id: str, as_json: bool) -> None:
    """Show RUN_ID's hash-chained journal (exit 1 when it does not verify)."""
    journal = call(as_json, lambda c: c.journal(run_id))
    if as_json:
        emit_json(journal)
    else:
        for entry in journal["entries"]:
            out().print(f"{entry['seq']:>4} {entry['type']:<24} {trim(entry['data'], 80)}", highlight=False,
                        markup=False)
        out().print(f"journal {'[green]valid[/]' if journal['valid'] else '[bold red]INVALID[/]'}", highlight=False)
    if not journal["valid"]:
        raise SystemExit(EXIT_CHECK_FAILED)


def run_operation(run_id: str, operation: str, body: dict[str, Any], request_id: str | None, as_json: bool) -> None:
    """POST one run operation and print the run's state after it."""
    state = call(as_json, lambda c: c.run_operation(run_id, operation, body, request_id=request_id))
    emit_json(state) if as_json else print_run(state)


@runs.command("resume", short_help="Resume a run in place (editor).")
@click.argument("run_id")
@click.option("--note", default=None)
@request_id_option
@json_option
def run_resume(run_id: str, note: str | None, request_id: str | None, as_json: bool) -> None:
    """Continue a paused, interrupted or unreconciled run."""
    run_operation(run_id, "resume", {"note": note} if note else {}, request_id, as_json)


@runs.command("handoff", short_help="Hand a run to another provider (operator).")
@click.argument("run_id")
@click.option("--agent", required=True, metavar="NAME")
@click.option("--note", default=None)
@request_id_option
@json_option
def run_handoff(run_id: str, agent: str, note: str | None, request_id: str | None, as_json: bool) -> None:
    """Hand RUN_ID to provider --agent (tested first)."""
    run_operation(run_id, "handoff", {"agent": agent, **({"note": note} if note else {})}, request_id, as_json)


@runs.command("retry", short_help="Retry a failed or cancelled run as a new run (editor).")
@click.argument("run_id")
@click.option("--provider", default=None)
@request_id_option
@json_option
def run_retry(run_id: str, provider: str | None, request_id: str | None, as_json: bool) -> None:
    """A fresh run with lineage to RUN_ID."""
    run_operation(run_id, "retry", {"provider": provider} if provider else {}, request_id, as_json)


@runs.command("cancel", short_help="Cancel a run (operator).")
@click.argument("run_id")
@click.option("--reason", default=None)
@request_id_option
@json_option
def run_cancel(run_id: str, reason: str | None, request_id: str | None, as_json: bool) -> None:
    """Finish RUN_ID as cancelled."""
    run_operation(run_id, "cancel", {"reason": reason} if reason else {}, request_id, as_json)


@runs.command("execution-requests", short_help="A run's execution requests and their status.")
@click.argument("run_id")
@json_option
def run_execution_requests(run_id: str, as_json: bool) -> None:
    """List RUN_ID's execution requests (publication, cancellation, remote tasks)."""
    rows = call(as_json, lambda c: c.execution_requests(run_id))["requests"]
    if as_json:
        emit_json(rows)
        return
    table = Table(title=f"execution requests of run {literal(run_id)}")
    for column in ("request", "kind", "attempt", "status", "reason"):
        table.add_column(column)
    for row in rows:
        table.add_row(literal(row["request_id"]), literal(row["kind"]), literal(row["attempt"]), literal(row["status"]),
                      literal(trim(row["reason"])))
    out().print(table)


@runs.command("reconcile-execution-request", short_help="Settle a request from retained evidence (operator).")
@click.argument("run_id")
@click.argument("request_id")
@click.option("--reconciliation-id", required=True, metavar="HEX", help="32 lower-case hex characters.")
@json_option
def run_reconcile(run_id: str, request_id: str, reconciliation_id: str, as_json: bool) -> None:
    """Reconcile REQUEST_ID of RUN_ID: exit 4 when the server finds no proof (the request stays unknown)."""
    result = call(as_json, lambda c: c.reconcile_execution_request(run_id, request_id, reconciliation_id))
    if as_json:
        emit_json(result)
        return
    out().print(f"request {request_id}: {'settled' if result.get('settled') else 'not settled'} "
                f"({result.get('outcome')})", highlight=False, markup=False)


def parse_json_object(text: str, field: str, as_json: bool) -> dict[str, Any]:
    """``text`` as a JSON object; invalid input (exit 6) naming ``field`` otherwise."""
    with handled(as_json):
        try:
            value = json.loads(text)
        except ValueError as error:
            raise InvalidInput(f"--{field} is not JSON: {error}", field=field) from error
        if not isinstance(value, dict):
            raise InvalidInput(f"--{field} must be a JSON object", field=field)
        return value


def print_request(request: dict[str, Any]) -> None:
    """One execution request in a line."""
    result = (request.get("receipt") or {}).get("result") or {}
    evidence = result.get("pr_url") or result.get("pushed_commit") or result.get("job_id") or result.get("version")
    out().print(f"request {request['request_id']} ({request['kind']} attempt {request['attempt']}): "
                f"{request['status']}" + (f" - {evidence}" if evidence else "") + f" - {request['reason']}",
                highlight=False, markup=False)


@runs.command("publish", short_help="Publish a succeeded run (operator; a worker carries it out).")
@click.argument("run_id")
@click.option("--publisher", default="git", show_default=True)
@click.option("--branch", default=None)
@click.option("--title", default=None)
@request_id_option
@json_option
def run_publish(run_id: str, publisher: str, branch: str | None, title: str | None, request_id: str | None,
                as_json: bool) -> None:
    """Admit publishing RUN_ID's verified source; exit 4 if refused (unresolved or repeated publication)."""
    request = call(as_json, lambda c: c.publish(run_id, publisher=publisher, branch=branch, title=title,
                                                request_id=request_id))
    emit_json(request) if as_json else print_request(request)


@runs.command("remote-task", short_help="Deploy, roll back or write knowledge from a succeeded run (operator).")
@click.argument("run_id")
@click.option("--kind", required=True, type=click.Choice(["deploy", "rollback", "knowledge_write"]))
@click.option("--provider", required=True)
@click.option("--parameters", default="{}", metavar="JSON")
@request_id_option
@json_option
def run_remote_task(run_id: str, kind: str, provider: str, parameters: str, request_id: str | None,
                    as_json: bool) -> None:
    """Admit a remote task of RUN_ID; its evidence will be the provider's job id or version."""
    values = parse_json_object(parameters, "parameters", as_json)
    request = call(as_json, lambda c: c.remote_task(run_id, kind, provider, values, request_id=request_id))
    emit_json(request) if as_json else print_request(request)


@runs.command("inspect-remote", short_help="Ask a request's provider, read-only, what it shows (operator).")
@click.argument("run_id")
@click.argument("request_id")
@json_option
def run_inspect_remote(run_id: str, request_id: str, as_json: bool) -> None:
    """What the provider shows now for REQUEST_ID (kept in the request's stream before any next step)."""
    found = call(as_json, lambda c: c.inspect_remote(run_id, request_id))
    emit_json(found) if as_json else out().print_json(data=found)


@runs.command("resolve-request", short_help="Record what happened to an unknown request (operator).")
@click.argument("run_id")
@click.argument("request_id")
@click.option("--resolution", required=True, type=click.Choice(["occurred", "not_occurred", "abandoned_unknown"]))
@click.option("--note", required=True)
@click.option("--resolution-id", default=None)
@json_option
def run_resolve_request(run_id: str, request_id: str, resolution: str, note: str, resolution_id: str | None,
                        as_json: bool) -> None:
    """Resolve REQUEST_ID after inspect-remote retained what the provider shows."""
    request = call(as_json, lambda c: c.resolve_request(run_id, request_id, resolution, note, resolution_id))
    emit_json(request) if as_json else print_request(request)


@runs.command("resolve-task", short_help="Record what happened to a run task stuck unknown (operator).")
@click.argument("run_id")
@click.argument("effect_id")
@click.option("--resolution", required=True, type=click.Choice(["not_occurred", "abandoned_unknown"]))
@click.option("--note", required=True)
@click.option("--resolution-id", default=None)
@json_option
def run_resolve_task(run_id: str, effect_id: str, resolution: str, note: str, resolution_id: str | None,
                     as_json: bool) -> None:
    """not_occurred: the run tries the task again; abandoned_unknown: it fails."""
    state = call(as_json, lambda c: c.resolve_task(run_id, effect_id, resolution, note, resolution_id))
    emit_json(state) if as_json else out().print(f"run {run_id}: {state['status']}", highlight=False, markup=False)


# --- projects ----------------------------------------------------------------------------------


@remote_group.group("projects", short_help="The projects you have a role in.")
def projects() -> None:
    """Projects through the server."""


@projects.command("list", short_help="List projects and your role in each.")
@json_option
def project_list(as_json: bool) -> None:
    """List the projects the token has a role in."""
    rows = call(as_json, lambda c: c.list_projects())["projects"]
    if as_json:
        emit_json(rows)
        return
    table = Table(title="projects")
    for column in ("project", "role", "registered", "origin"):
        table.add_column(column)
    for row in rows:
        origin = f"CORRUPT (first bad event #{row['corrupt'].get('first_bad_seq')})" if row.get("corrupt") \
            else str(row.get("origin", ""))
        table.add_row(literal(row["name"]), literal(row["role"]), "yes" if row["registered"] else "no",
                      literal(origin))
    out().print(table)


@projects.command("show", short_help="A registered project.")
@click.argument("name")
@json_option
def project_show(name: str, as_json: bool) -> None:
    """Show project NAME: origin, default branch, policy."""
    project = call(as_json, lambda c: c.project(name))
    emit_json(project) if as_json else out().print_json(data=project)


__all__ = ["remote_group"]
