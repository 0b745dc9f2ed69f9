"""``jixu studio-fixture``: a store with something for every Studio control, for a newcomer's first look.

It records, in one project (``studio-demo``, or ``studio-demo-N`` when taken):

* a thread whose unsafe tool call ``charge_card`` lost its answer (``unknown``:
  only an operator can say what happened) and a thread whose ``refund`` call
  waits for approval (``parked``);
* a run whose check failed, whose repair attempt then hit the provider's
  quota (``paused``: resume it), with the failed check's evidence in its
  journal;
* a succeeded run whose publication request was dispatched and then lost its
  answer (``needs_reconciliation``: reconciling it finds no proof, 409);
* an operator and a viewer token for the project (printed once).

``jixu serve`` continues this work when started with the fixture's agent and
providers (:func:`fixture_agent`, :func:`fixture_providers`), as printed.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

from jixu.cli.output import console, emit_json, handled, json_option, literal
from jixu.errors import InvalidInput, ProjectNotFound
from jixu.ledger import Store, open_store
from jixu.ledger.encoding import JSONObject
from jixu.runs import (
    GitPublisher,
    Provider,
    ProviderError,
    PublicationContext,
    Runs,
    ScriptedProvider,
    get_project,
    register_project,
    write_files,
)
from jixu.runs.scripted_provider import StepFunction
from jixu.scheduling import Worker, WorkerConfig, create_thread_for, submit_turn
from jixu.server.auth import create_token
from jixu.threads import Agent, ScriptedModel, ToolCall, tool
from jixu.threads.log import ThreadLog

PROJECT = "studio-demo"
PROVIDER = "fixture-agent"
AGENT_SPEC = "jixu.cli.studio:fixture_agent"
PROVIDERS_SPEC = "jixu.cli.studio:fixture_providers"
PROVIDER_SETTINGS: JSONObject = {"script": "studio-fixture", "note": "a scripted stand-in for a coding agent"}
CHECK_CODE = ("import pathlib, sys\n"
              "ok = pathlib.Path('FIXED').exists()\n"
              "print('checking that the fix is in place ...')\n"
              "print('ok: FIXED is present' if ok else 'FAIL: FIXED is missing, the bug is still there')\n"
              "sys.exit(0 if ok else 1)\n")
GIT_ENV = {"GIT_AUTHOR_NAME": "jixu fixture", "GIT_AUTHOR_EMAIL": "fixture@jixu.invalid",
           "GIT_COMMITTER_NAME": "jixu fixture", "GIT_COMMITTER_EMAIL": "fixture@jixu.invalid"}


# --- the agent and providers `jixu serve` continues the fixture's work with ------------------------


@tool(semantics="unsafe")
async def charge_card(amount: int) -> str:
    """Charge the customer's card (the fixture's gateway always hangs up: the outcome stays unknown)."""
    raise ConnectionResetError("the payment gateway hung up before answering")


@tool(semantics="unsafe", requires_approval=True)
async def refund(amount: int) -> str:
    """Refund the customer (needs an operator's approval)."""
    return f"refunded {amount}"


def _script(messages: list[dict[str, Any]]) -> str | ToolCall:
    last = messages[-1]
    if last.get("role") != "user":
        # After a tool result or an operator's decision: finish the turn with a plain reply.
        return "Done: the operator's decision is recorded and the conversation can go on."
    text = str(last.get("content") or "").lower()
    if "charge" in text:
        return ToolCall("charge_card", {"amount": 42})
    if "refund" in text:
        return ToolCall("refund", {"amount": 7})
    return f"echo: {last.get('content')}"


def fixture_agent() -> Agent:
    """The fixture's agent (``jixu serve --agent jixu.cli.studio:fixture_agent``)."""
    return Agent("studio-fixture", ScriptedModel(_script), tools=[charge_card, refund])


def _fix() -> StepFunction:
    return write_files({"FIXED": "the bug is fixed\n", "NOTES.md": "Fixed by the fixture's scripted agent.\n"},
                       "wrote the fix")


def fixture_providers() -> dict[str, Provider]:
    """The fixture's run provider, as ``jixu serve`` runs it: every call writes the fix (the check passes)."""
    return {PROVIDER: ScriptedProvider(PROVIDER, [_fix() for _ in range(50)], settings=PROVIDER_SETTINGS)}


class LostAnswerPublisher(GitPublisher):
    """Pushes for real, then loses the answer: the publication happened, but no receipt says so."""

    async def publish(self, context: PublicationContext) -> JSONObject:
        """Push, then fail as a dropped connection would (after dispatch: the outcome stays unknown)."""
        await super().publish(context)
        raise ConnectionResetError("the origin hung up before confirming the push")


# --- building the fixture -------------------------------------------------------------------------


@dataclass
class Fixture:
    """What :func:`build_fixture` made: ids, tokens and where things are."""

    store: str
    project: str
    origin: str
    workspace_root: str
    unknown_thread: str
    parked_thread: str
    failed_check_run: str
    publication_run: str
    publication_request: str
    operator_token: str
    viewer_token: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                   env={**os.environ, **GIT_ENV})


def make_origin(base: Path) -> Path:
    """A bare git repository with a tiny project on ``main`` (the project's authorized origin)."""
    work = base / "origin-src"
    bare = base / "origin.git"
    if bare.exists():
        return bare
    work.mkdir(parents=True, exist_ok=True)
    (work / "README.md").write_text("A tiny project for the jixu Studio fixture.\n", encoding="utf-8")
    (work / "app.py").write_text("def total(items):\n    return sum(items) + 1  # the bug\n", encoding="utf-8")
    _git("init", "-q", "-b", "main", cwd=work)
    _git("add", "-A", cwd=work)
    _git("commit", "-q", "-m", "a tiny project with a bug", cwd=work)
    _git("clone", "-q", "--bare", str(work), str(bare), cwd=base)
    return bare


def _free_project(store: Store) -> str:
    for number in range(1, 1000):
        name = PROJECT if number == 1 else f"{PROJECT}-{number}"
        try:
            get_project(store, name)
        except ProjectNotFound:
            return name
    raise InvalidInput("this store has 999 fixture projects already; use a fresh store", field="store")


async def _thread_work(store: Store, store_url: str, thread_ids: list[str], timeout: float = 60.0) -> None:
    """Run the queued turns as a worker would, until each of ``thread_ids`` waits for an operator.

    The worker is stopped then rather than when the queue is empty: the store may hold other work (an earlier
    fixture's, another application's) that this worker leaves alone.
    """
    config = WorkerConfig(store_url=store_url, agent=AGENT_SPEC, owner="studio-fixture", quiet=True,
                          poll_interval=0.02, drain_timeout=5)
    worker = Worker(fixture_agent(), store, config, report=lambda kind, message: None)
    running = asyncio.create_task(worker.run())
    deadline = asyncio.get_running_loop().time() + timeout
    try:
        while True:
            statuses = [ThreadLog.load(store, thread_id).status() for thread_id in thread_ids]
            if all(status == "waiting" for status in statuses):
                return
            if running.done() or asyncio.get_running_loop().time() > deadline:
                raise InvalidInput(f"the fixture's threads did not reach their waiting state within {timeout:.0f}s "
                                   f"({statuses})", field="store")
            await asyncio.sleep(0.05)
    finally:
        worker.stop("the fixture's threads are recorded")
        await running


async def _build(store: Store, store_url: str, base: Path, project: str) -> Fixture:
    origin = make_origin(base)
    policy: JSONObject = {"checks": [{"name": "tests", "argv": [sys.executable, "-c", CHECK_CODE],
                                      "timeout_s": 60}],
                          "limits": {"max_repair_attempts": 1}}
    register_project(store, project, str(origin), policy, actor="studio-fixture")
    actor = "studio-fixture"

    unknown_thread = create_thread_for(store, fixture_agent(), project=project, actor=actor)
    submit_turn(store, unknown_thread, "Please charge the customer 42 for order 1001.", actor=actor)
    parked_thread = create_thread_for(store, fixture_agent(), project=project, actor=actor)
    submit_turn(store, parked_thread, "Please refund the customer 7 for order 1002.", actor=actor)
    await _thread_work(store, store_url, [unknown_thread, parked_thread])

    workspaces = base / "workspaces"
    # The failed check: the first implementation does not fix the bug, the check fails, the repair attempt
    # then finds the provider's quota exhausted: the run pauses for an operator.
    flaky = ScriptedProvider(PROVIDER, [write_files({"NOTES.md": "Looked at the bug; not fixed yet.\n"}, "notes"),
                                        ProviderError("the provider's monthly credits are exhausted", kind="quota")],
                             settings=PROVIDER_SETTINGS)
    runs = Runs(store, workspaces, {PROVIDER: flaky}, owner="studio-fixture", actor=actor)
    failed_check_run = await runs.create_run(project, "Fix the off-by-one in app.total", provider=PROVIDER,
                                             actor=actor)
    await runs.execute(failed_check_run)

    # The unresolved publication: a run that succeeds, published by a publisher that loses its answer.
    good = ScriptedProvider(PROVIDER, [_fix()], settings=PROVIDER_SETTINGS)
    runs = Runs(store, workspaces, {PROVIDER: good}, owner="studio-fixture", actor=actor,
                publishers={"git": LostAnswerPublisher()})
    publication_run = await runs.create_run(project, "Fix the off-by-one and publish it", provider=PROVIDER,
                                            actor=actor)
    await runs.execute(publication_run)
    request = await runs.request_publication(publication_run, publisher="git", actor=actor)
    await runs.execute_request(request)

    _info, operator = create_token(store, f"{project}-operator", roles={project: "operator"}, actor=actor)
    _info, viewer = create_token(store, f"{project}-viewer", roles={project: "viewer"}, actor=actor)
    return Fixture(store=store_url, project=project, origin=str(origin), workspace_root=str(workspaces),
                   unknown_thread=unknown_thread, parked_thread=parked_thread, failed_check_run=failed_check_run,
                   publication_run=publication_run, publication_request=request, operator_token=operator,
                   viewer_token=viewer)


def default_fixture_dir(store_url: str) -> Path:
    """Where the fixture's origin and workspaces go by default: beside a SQLite file, else the current directory."""
    text = store_url.removeprefix("sqlite:///").removeprefix("sqlite://")
    if "://" not in text and text not in ("", ":memory:"):
        path = Path(text.split("?", 1)[0]).expanduser().resolve()
        return path.parent / f"{path.name}.studio-fixture"
    return Path("jixu-studio-fixture").resolve()


def build_fixture(store_url: str, base: Path | None = None) -> Fixture:
    """Record the Studio fixture in the store at ``store_url`` (origin and workspaces under ``base``)."""
    if store_url.startswith("memory:") or store_url == ":memory:":
        raise InvalidInput("the fixture must outlive this command: give a SQLite file or a PostgreSQL URL",
                           field="store")
    root = (base or default_fixture_dir(store_url)).expanduser().resolve()
    store = open_store(store_url)  # first: an unreachable store leaves no directory behind
    try:
        root.mkdir(parents=True, exist_ok=True)
        project = _free_project(store)
        return asyncio.run(_build(store, store.url or store_url, root / project, project))
    finally:
        store.close()


def serve_command_line(fixture: Fixture, port: int) -> str:
    """The ``jixu serve`` command that continues the fixture's work."""
    return (f"jixu serve --store {fixture.store} --port {port} --agent {AGENT_SPEC} --providers {PROVIDERS_SPEC} "
            f"--workspace-root {fixture.workspace_root}")


@click.command("studio-fixture", short_help="Record threads and runs that show every Studio control.")
@click.option("--store", "store_url", envvar="JIXU_STORE", required=True, metavar="URL",
              help="The ledger: a SQLite path or sqlite:/// URL, or postgresql://… (default $JIXU_STORE).")
@click.option("--dir", "base", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="Where the project's bare git origin and the runs' workspaces go "
                   "[default: <store file>.studio-fixture beside a SQLite store].")
@click.option("--port", type=click.IntRange(1, 65535), default=8420, show_default=True,
              help="The port the printed `jixu serve` command and URL use.")
@json_option
def studio_fixture_command(store_url: str, base: Path | None, port: int, as_json: bool) -> None:
    """Record, in STORE, a project with a thread whose unsafe effect is unknown, a thread waiting for
    approval, a run whose check failed (paused: resume it), a succeeded run whose publication needs
    reconciliation, and an operator and a viewer token. Prints the tokens (once) and how to serve it.

    Exit codes: 0 done, 4 conflict, 5 store problem, 6 invalid input.
    """
    with handled(as_json):
        fixture = build_fixture(store_url, base)
    url = f"http://127.0.0.1:{port}/studio"
    if as_json:
        emit_json({**fixture.to_dict(), "url": url, "serve": serve_command_line(fixture, port)})
        return
    lines = [
        f"[bold]Studio fixture[/] recorded in {literal(fixture.store)} (project [bold]{literal(fixture.project)}[/])",
        f"  thread {fixture.unknown_thread}  waiting: charge_card's outcome is unknown -> resolve it",
        f"  thread {fixture.parked_thread}  waiting: refund needs approval -> approve or deny it",
        f"  run    {fixture.failed_check_run}  check failed, repair paused on quota -> resume it",
        f"  run    {fixture.publication_run}  succeeded; publication {fixture.publication_request} "
        "needs reconciliation",
        "",
        "Tokens (shown once; paste one into the Studio's login page):",
        f"  operator  {fixture.operator_token}",
        f"  viewer    {fixture.viewer_token}",
        "",
        "Serve it (the agent and provider continue the fixture's work):",
        f"  {serve_command_line(fixture, port)}",
        f"then open {url}",
    ]
    for line in lines:
        console.print(line, highlight=False, markup=line.startswith("[bold]"), soft_wrap=True)


__all__ = ["Fixture", "build_fixture", "fixture_agent", "fixture_providers", "studio_fixture_command"]
