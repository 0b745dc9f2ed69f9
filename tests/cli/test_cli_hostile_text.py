"""Text the CLI did not write itself is printed as data, never as Rich console markup.

A model's reply, a turn's input, the tool name a model chose, a tool's result or error, an operator's note or
actor name, an event's data, a run's brief, a check's command and output, a token's name, and what a jixu server
answered can hold ``[/bold]`` (which made Rich raise ``MarkupError``: the command died with exit 1) or
``[red]FAILED[/red] [link=https://evil.example]ticket[/link]`` (which Rich rendered as styled text and a link, so
prompt-injected output could spoof what an operator sees). Every store here is real (a Harness, the runs engine,
the ledger), and every command must exit as it normally does and print the brackets exactly as written.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from jixu import Agent, Harness, ScriptedModel, ToolCall, tool
from jixu.ledger import SQLiteStore
from jixu.ledger.encoding import JSONObject
from jixu.threads.model import Step
from tests.cli.test_cli_runs import Env, make_env
from tests.helpers import run_jixu

LINK = "[link=https://evil.example]ticket[/link]"
HOSTILE = f"[/bold] [red]FAILED[/red] {LINK} bad [/] reply :warning:"
"""What an attacker writes: an unmatched closing tag first, then a style, a link, the bare closing tag, an emoji code."""
MARKERS = ("[/bold]", "[red]FAILED[/red]", LINK)
"""The pieces that must appear exactly as written (each fits a table cell whole)."""
BAD_TOOL = "[red]nope[/red]"
"""The name of a tool the model asked for that does not exist."""
SHORT = "bad [/] reply"


def printed(result: subprocess.CompletedProcess[str], *markers: str, code: int = 0) -> str:
    """Assert ``result`` exited ``code`` without a markup error and printed every marker literally; its stdout."""
    assert "MarkupError" not in result.stderr, result.stderr
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    for marker in markers:
        assert marker in result.stdout, (marker, result.stdout)
    assert "\\[" not in result.stdout, result.stdout  # escaped once, never shown escaped
    return result.stdout


# --- threads -------------------------------------------------------------------------------------


@tool(semantics="read_only")
def echo(text: str) -> str:
    """Echo a text back; the tool's result is attacker-controlled."""
    return f"tool said {HOSTILE}"


@tool(semantics="unsafe")
def charge(order: str) -> str:
    """Charge an order; the gateway's error message is attacker-controlled, and the outcome is unknown."""
    raise RuntimeError(f"gateway said {HOSTILE}")


def script(messages: list[JSONObject]) -> Step:
    """Reply with the hostile text (after calling the tool the input names)."""
    last = messages[-1]
    text = str(last.get("content"))
    if last.get("role") == "tool":
        return HOSTILE
    if text.startswith("echo"):
        return ToolCall("echo", {"text": HOSTILE})
    if text.startswith("charge"):
        return ToolCall("charge", {"order": HOSTILE})
    if text.startswith("unknown"):
        return ToolCall(BAD_TOOL, {"x": HOSTILE})
    if text.startswith("short"):
        return SHORT
    return "all good"


@dataclass
class Hostile:
    """A store whose threads carry hostile text in every field the CLI prints."""

    db: Path
    replied: str
    """Its input, its tool's result and its reply are hostile."""
    short: str
    """Its reply is ``bad [/] reply``."""
    normal: str
    """Nothing hostile in it."""
    unknown_tool: str
    """The model asked for a tool named ``[red]nope[/red]``."""
    charged: str
    """An unsafe call failed with a hostile error: its outcome is unknown."""
    charge_effect: str

    def jixu(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_jixu(*args)


async def _build(db: Path) -> Hostile:
    async with Harness(Agent("ops", ScriptedModel(script), tools=[echo, charge]), db) as harness:
        ids: list[str] = []
        for text in (f"echo {HOSTILE}", "short", "hello", f"unknown {HOSTILE}", f"charge {HOSTILE}"):
            thread = await harness.create_thread()
            await thread.send(text)
            await thread.wait()
            ids.append(thread.thread_id)
        charged = await harness.open_thread(ids[4], resume=False)
        effect = next(e for e, d in charged.state().effects.items() if d.name == "charge")
    return Hostile(db, *ids, effect)


@pytest.fixture
def hostile(tmp_path: Path) -> Hostile:
    return asyncio.run(_build(tmp_path / "hostile.db"))


def corrupt(store: Hostile) -> str:
    """Append an effect event with a hostile effect id to the normal thread (through the ledger: its chain stays
    valid, the thread becomes corrupt); the thread's id."""
    data = json.dumps({"effect_id": "[/bold] [red]FAILED[/red]", "result": SHORT})
    result = store.jixu("ledger", "append", str(store.db), f"thread/{store.normal}", "tool.completed", data,
                        "--force")
    assert result.returncode == 0, result.stderr
    return store.normal


def test_threads_list_prints_every_thread_and_their_hostile_replies_literally(hostile: Hostile) -> None:
    out = printed(hostile.jixu("threads", "list", str(hostile.db)), *MARKERS, SHORT, "all good")
    for thread_id in (hostile.replied, hostile.short, hostile.normal, hostile.unknown_tool, hostile.charged):
        assert thread_id in out
    result = hostile.jixu("threads", "list", str(hostile.db), "--json")  # JSON is not markup: the text as stored
    assert result.returncode == 0
    rows = {row["thread_id"]: row for row in json.loads(result.stdout)}
    assert rows[hostile.replied]["last_reply"] == HOSTILE
    assert rows[hostile.short]["last_reply"] == SHORT


def test_threads_show_prints_the_turn_input_and_reply_literally(hostile: Hostile) -> None:
    out = printed(hostile.jixu("threads", "show", str(hostile.db), hostile.replied), *MARKERS)
    assert "echo [/bold] [red]FAILED[/red]" in out  # the turn's input
    assert ":warning:" in out  # an emoji code is text too


def test_threads_show_prints_the_tool_name_the_model_chose_literally(hostile: Hostile) -> None:
    printed(hostile.jixu("threads", "show", str(hostile.db), hostile.unknown_tool), BAD_TOOL)


def test_threads_events_prints_event_data_literally(hostile: Hostile) -> None:
    printed(hostile.jixu("threads", "events", str(hostile.db), hostile.replied), "[/bold]", "[red]FAILED[/red]")


def test_threads_replay_prints_the_last_reply_literally(hostile: Hostile) -> None:
    printed(hostile.jixu("threads", "replay", str(hostile.db), hostile.replied), *MARKERS)


def test_threads_verify_prints_a_hostile_corruption_detail_literally(hostile: Hostile) -> None:
    thread_id = corrupt(hostile)
    printed(hostile.jixu("threads", "verify", str(hostile.db), thread_id), "[/bold] [red]FAILED[/red]", code=1)


def test_an_operators_hostile_note_and_name_are_printed_literally(hostile: Hostile) -> None:
    actor, note = "ops[/]", "[red]FAILED[/red] [/bold]"
    resolved = hostile.jixu("threads", "resolve", str(hostile.db), hostile.charged, hostile.charge_effect,
                            "--resolution", "not_occurred", "--note", note, "--actor", actor)
    printed(resolved, f"by {actor}", "[red]FAILED[/red]", "[/bold]")  # the effect's row names actor and note
    printed(hostile.jixu("threads", "show", str(hostile.db), hostile.charged), f"by {actor}", "[red]FAILED[/red]",
            "[/bold]")


def test_threads_fork_prints_the_childs_hostile_input_literally(hostile: Hostile) -> None:
    events = json.loads(hostile.jixu("threads", "events", str(hostile.db), hostile.short, "--json").stdout)
    printed(hostile.jixu("threads", "fork", str(hostile.db), hostile.short, "--at", events[-1]["id"],
                         "--input", HOSTILE), *MARKERS)


def test_turns_list_prints_a_corrupt_threads_hostile_error_literally(hostile: Hostile) -> None:
    corrupt(hostile)
    printed(hostile.jixu("turns", "list", str(hostile.db)), "[/bold]")


def test_ledger_events_and_effects_print_hostile_data_and_tool_names_literally(hostile: Hostile) -> None:
    printed(hostile.jixu("ledger", "events", str(hostile.db), f"thread/{hostile.replied}"), "[/bold]")
    printed(hostile.jixu("effects", str(hostile.db), f"thread/{hostile.unknown_tool}"), "[red]nop")  # 80 columns


def test_a_store_path_with_brackets_is_printed_literally(hostile: Hostile, tmp_path: Path) -> None:
    odd = tmp_path / "[red]ops[" / "bold]"  # a path holding "[red]ops[/bold]/"
    odd.mkdir(parents=True)
    moved = odd / "store.db"
    hostile.db.rename(moved)
    printed(run_jixu("threads", "list", str(moved)), "[red]ops[/bold]/store.db")
    printed(run_jixu("ledger", "streams", str(moved)), "[red]ops[/bold]/store.db")


# --- runs, projects, execution requests ------------------------------------------------------------


PROVIDERS = f"""\
from jixu.runs import ImplementResult, ScriptedProvider


def scribble(workspace, context):
    (workspace / "status.txt").write_text("still broken\\n")
    return ImplementResult({HOSTILE!r})


def providers():
    return {{"scribbler": ScriptedProvider("scribbler", [scribble] * 5)}}
"""
CHECK_OUTPUT = "[/bold] [red]FAILED[/red] check"


@pytest.fixture
def runs_env(tmp_path: Path) -> Env:
    env = make_env(tmp_path)
    (tmp_path / "hostile_run_providers.py").write_text(PROVIDERS)
    check = shlex.join([sys.executable, "-c", f"print({CHECK_OUTPUT!r}); raise SystemExit(1)"])
    code, body = env.json("projects", "register", str(env.db), "calc", "--origin", str(env.origin),
                          "--check", f"unit={check}", "--check-timeout", "30", "--max-repair-attempts", "0")
    assert code == 0, body
    return env


def test_runs_print_a_hostile_brief_provider_summary_check_and_operator_literally(runs_env: Env) -> None:
    env, db, spec = runs_env, str(runs_env.db), "hostile_run_providers:providers"
    executed = env.jixu("runs", "create", db, "calc", "--brief", HOSTILE, "--provider", "scribbler", "--providers",
                        spec, "--execute")
    printed(executed, "[/bold]", "[red]FAILED[/red]", code=1)  # the run fails its check: exit 1
    run_id = executed.stdout.splitlines()[0].strip()
    printed(env.jixu("runs", "show", db, run_id), *MARKERS, CHECK_OUTPUT, code=0)
    printed(env.jixu("runs", "list", db), "[/bold]", "[red]FAILED[/red]")
    printed(env.jixu("runs", "journal", db, run_id), *MARKERS)
    printed(env.jixu("runs", "plan", db, run_id), "[/bold]", "[red]FAILED[/red]")
    printed(env.jixu("projects", "show", db, "calc"), "[red]FAILED[/red]")

    code, created = env.json("runs", "create", db, "calc", "--brief", "another", "--provider", "scribbler",
                             "--providers", spec)
    assert code == 0, created
    actor = "ops [/] [red]root[/red]"
    printed(env.jixu("runs", "cancel", db, created["run_id"], "--actor", actor, "--reason", HOSTILE), actor)
    printed(env.jixu("runs", "show", db, created["run_id"]), *MARKERS)
    printed(env.jixu("runs", "execution-requests", db, created["run_id"]), actor)  # the cancellation's actor


# --- jixu remote: what a server answered ----------------------------------------------------------


@dataclass
class Served:
    url: str
    token: str
    store: Hostile


@pytest.fixture
def served(hostile: Hostile) -> Iterator[Served]:
    """A real jixu server (uvicorn in a thread) over the hostile store, with an admin token."""
    import uvicorn

    from jixu.server import create_app, create_token

    store = SQLiteStore(hostile.db)
    _info, secret = create_token(store, "root", admin=True, actor="test")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(store), log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the test server did not start"
        time.sleep(0.01)
    try:
        yield Served(f"http://127.0.0.1:{sock.getsockname()[1]}", secret, hostile)
    finally:
        server.should_exit = True
        thread.join(20)
        sock.close()
        store.close()


def remote(served: Served, *args: str) -> subprocess.CompletedProcess[str]:
    return run_jixu("remote", *args, env={"JIXU_SERVER": served.url, "JIXU_TOKEN": served.token})


def test_remote_threads_print_what_the_server_answered_literally(served: Served) -> None:
    hostile = served.store
    shown = printed(remote(served, "threads", "show", hostile.unknown_tool), "[/bold]", "[red]FAILED[/red]")
    [row] = [line for line in shown.splitlines() if "rejected_before_dispatch" in line]  # the effects table's row
    assert BAD_TOOL in row, shown
    printed(remote(served, "threads", "show", hostile.replied), "[/bold]", "[red]FAILED[/red]")
    printed(remote(served, "threads", "events", hostile.replied), "[/bold]", "[red]FAILED[/red]")
    replayed = printed(remote(served, "threads", "replay", hostile.unknown_tool))
    assert BAD_TOOL in next(line for line in replayed.splitlines() if "rejected_before_dispatch" in line), replayed
    answered = remote(served, "threads", "show", hostile.replied, "--json")
    assert answered.returncode == 0 and json.loads(answered.stdout)["last_reply"] == HOSTILE


ESCAPES = ("\x1b]8;;https://evil.example\x1b\\CLICK-ME\x1b]8;;\x1b\\ \x1b[31mred\x1b[0m \x1b]0;owned\x07"
           "\x1b[2K\r done")
"""Terminal escape sequences a reply may carry: a hyperlink, a colour, a window title, a line erased."""
BACKSLASH = "path C:\\temp\\"


def test_terminal_escapes_in_stored_text_are_shown_not_sent_to_the_terminal(tmp_path: Path) -> None:
    """An audit: a reply's escape sequences reached the operator's terminal through `threads show` (an OSC 8 link,
    colours, a window title, an erased line); and a reply ending in a backslash was shown with two."""
    async def build() -> str:
        answers = iter([ESCAPES, BACKSLASH])
        agent = Agent("ops", ScriptedModel(lambda messages: next(answers)), tools=[])
        async with Harness(agent, tmp_path / "escapes.db") as harness:
            thread = await harness.create_thread()
            for text in (f"say {ESCAPES}", "and a path"):
                await thread.send(text)
                await thread.wait()
            return thread.thread_id

    thread_id = asyncio.run(build())
    for command in (("threads", "show"), ("threads", "list"), ("threads", "events"), ("threads", "replay")):
        args = (*command, str(tmp_path / "escapes.db")) + ((thread_id,) if command[1] != "list" else ())
        result = run_jixu(*args)
        assert result.returncode == 0, result.stderr
        assert "\x1b" not in result.stdout and "\x07" not in result.stdout and "\r" not in result.stdout, command
        if command[1] in ("show", "list", "replay"):
            assert "C:\\temp\\" in result.stdout and "C:\\temp\\\\" not in result.stdout, (command, result.stdout)
    shown = run_jixu("threads", "show", str(tmp_path / "escapes.db"), thread_id).stdout
    assert "\\x1b]8;;https://evil.example" in shown  # the sequence is shown as text
