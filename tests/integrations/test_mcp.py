"""MCP tools as jixu tools (issue 25), against real MCP servers: tests/integrations/mcp_server.py, written with
the SDK's MCPServer, run as a subprocess over stdio and as a real uvicorn process over streamable HTTP.

What they prove: the semantics the annotations give and their overrides; an agent calling MCP tools through
the thread's path, the idempotency key reaching the server (argument and ``_meta``) and nothing called again on
reopen; ``isError`` of a read-only tool and bad arguments as determinate failures, ``isError`` of an unsafe tool
as an unknown outcome; a server SIGKILLed during an unsafe call leaves it
``unknown`` and it is not sent again, while a read-only call is sent again to a server started anew; a server
that cannot be started again is a determinate failure (nothing sent); MCP tools as durable steps; and the
clear error without the extra. Every server call is counted in a journal file the server writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

import jixu
from jixu import Agent, Harness, ScriptedModel, ToolCall
from jixu.errors import InvalidInput, MCPConnectionError, StepFailed, StepOutcomeUnknown, ToolInputError
from jixu.integrations import mcp as jixu_mcp
from jixu.ledger import SQLiteStore
from jixu.threads.log import stream_of
from tests.helpers import ROOT, python_env

SERVER = Path(__file__).with_name("mcp_server.py")


def _journal(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _calls(path: Path, tool: str) -> list[dict[str, Any]]:
    return [entry for entry in _journal(path) if entry["tool"] == tool]


def _stdio(tmp_path: Path, journal: Path, env: dict[str, str] | None = None, script: Path = SERVER,
           **options: Any) -> jixu_mcp.Connection:
    errlog = open(tmp_path / "server.stderr", "a")  # noqa: SIM115 - the SDK writes the server's stderr there
    return jixu_mcp.connect_stdio(sys.executable, [str(script)], env={"MCP_JOURNAL": str(journal), **(env or {})},
                                  errlog=errlog, **options)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _http_server(journal: Path, env: dict[str, str] | None = None,
                 port: int | None = None) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A real uvicorn process serving the test server over streamable HTTP on ``port`` (default: a free one)."""
    port = port if port is not None else _free_port()
    process = subprocess.Popen([sys.executable, str(SERVER), "--http", str(port)],
                               env={**python_env(), "MCP_JOURNAL": str(journal), **(env or {})},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the MCP test server did not start (exit {process.poll()})") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp", process
    finally:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """One HTTP server for the tests that do not kill theirs: its URL and journal."""
    journal = tmp_path_factory.mktemp("shop") / "journal.jsonl"
    with _http_server(journal) as (url, _):
        yield url, journal


async def _kill_when_called(journal: Path, tool: str) -> int:
    """SIGKILL the server process serving ``tool`` as soon as the call has reached it; its pid."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        calls = _calls(journal, tool)
        if calls:
            pid = int(calls[-1]["pid"])
            os.kill(pid, signal.SIGKILL)
            return pid
        await asyncio.sleep(0.02)
    raise AssertionError(f"{tool} never reached the server")


def _requested(store: SQLiteStore, stream: str) -> list[dict[str, Any]]:
    return [event.data for event in store.read(stream) if event.type == "tool.requested"]


# --- tools and their semantics --------------------------------------------------------------------


def test_tools_take_name_description_schema_and_semantics_from_the_server_and_overrides_win(
        shop: tuple[str, Path]) -> None:
    url, _ = shop

    async def scenario() -> None:
        async with jixu_mcp.connect_http(url) as server:
            assert server.server_name == "jixu-test-shop"
            tools = {tool.name: tool for tool in server.tools()}
            assert {name: tool.semantics for name, tool in tools.items()} == {
                "price": "read_only", "reserve": "idempotent", "charge": "unsafe", "send_note": "unsafe",
                "ship": "unsafe", "stock_count": "read_only"}  # "stock.count" on the server: a dot is no jixu name
            assert tools["price"].description == "The price of a product, in cents."
            assert tools["price"].parameters["required"] == ["sku"]
            # charge declares idempotency_key: jixu fills it in, so the model is not shown it
            assert set(tools["charge"].parameters["properties"]) == {"order", "cents"}
            assert tools["charge"].parameters["required"] == ["order", "cents"]
            with pytest.raises(ToolInputError) as bad:
                tools["price"].validate_args({"sku": 7})
            assert bad.value.details["path"] == "args.sku"

        async with jixu_mcp.connect_http(url, semantics={"send_note": "idempotent", "price": "unsafe"},
                                         requires_approval={"charge"}, prefix="shop_",
                                         names={"stock.count": "count_stock"}, include={"price", "send_note",
                                                                                        "charge", "stock.count"}
                                         ) as server:
            tools = {tool.name: tool for tool in server.tools()}
            assert {name: tool.semantics for name, tool in tools.items()} == {
                "shop_price": "unsafe", "shop_charge": "unsafe", "shop_send_note": "idempotent",
                "count_stock": "read_only"}
            assert tools["shop_charge"].requires_approval and not tools["shop_price"].requires_approval
            assert server.tool("stock.count").name == "count_stock"

        async with jixu_mcp.connect_http(url, trust_annotations=False, semantics={"reserve": "idempotent"}) as server:
            assert {tool.name: tool.semantics for tool in server.tools()} == {
                "price": "unsafe", "reserve": "idempotent", "charge": "unsafe", "send_note": "unsafe",
                "ship": "unsafe", "stock_count": "unsafe"}

        with pytest.raises(InvalidInput, match="lists no tool refund"):
            async with jixu_mcp.connect_http(url, semantics={"refund": "unsafe"}):
                pass
        with pytest.raises(InvalidInput, match="unknown option semantic"):
            jixu_mcp.connect_http(url, semantic={"price": "unsafe"})  # type: ignore[call-arg]

    asyncio.run(scenario())


# --- an agent calling MCP tools -------------------------------------------------------------------


def test_an_agent_calls_mcp_tools_over_stdio_durably_with_the_idempotency_key(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    script = [ToolCall("price", {"sku": "apple"}), ToolCall("charge", {"order": "o-1", "cents": 120}), "Paid 1.20."]

    async def scenario() -> None:
        async with _stdio(tmp_path, journal) as server:
            with SQLiteStore(tmp_path / "t.db") as store:
                agent = Agent("clerk", ScriptedModel(script), tools=[*server.tools()])
                thread = await Harness(agent, store).create_thread()
                await thread.send("buy an apple")
                state = await thread.wait()
                assert state.status == "idle" and state.last_reply == "Paid 1.20."
                tool_messages = [m for m in state.messages if m["role"] == "tool"]
                assert json.loads(tool_messages[0]["content"]) == {"sku": "apple", "cents": 120}  # structured
                assert json.loads(tool_messages[1]["content"]) == {"result": "charged 120 for o-1"}

                requested = {intent["name"]: intent for intent in _requested(store, thread.stream)}
                charge_intent = requested["charge"]
                assert charge_intent["args"] == {"order": "o-1", "cents": 120}  # the key is not an argument recorded
                [charge] = _calls(journal, "charge")
                key = charge_intent["idempotency_key"]
                assert charge["args"]["idempotency_key"] == key  # filled in as the declared argument
                assert charge["meta"][jixu_mcp.META_IDEMPOTENCY_KEY] == key  # and in _meta
                assert charge["meta"][jixu_mcp.META_EFFECT_ID] == charge_intent["effect_id"]
                assert charge["meta"][jixu_mcp.META_ATTEMPT] == 1
                [price] = _calls(journal, "price")
                assert price["meta"][jixu_mcp.META_IDEMPOTENCY_KEY] == requested["price"]["idempotency_key"]
                assert "idempotency_key" not in price["args"]  # price declares none: _meta only

                reopened = await Harness(agent, store).open_thread(thread.thread_id)
                assert (await reopened.wait()).status == "idle"
        assert len(_journal(journal)) == 2  # reopening called nothing again

    asyncio.run(scenario())


def test_an_agent_calls_mcp_tools_over_streamable_http(tmp_path: Path, shop: tuple[str, Path]) -> None:
    url, journal = shop
    note = f"note {tmp_path.name}"
    script = [ToolCall("send_note", {"text": note}), ToolCall("reserve", {"sku": "pear", "quantity": 2}), "Done."]

    async def scenario() -> None:
        async with jixu_mcp.connect_http(url) as server:
            with SQLiteStore(tmp_path / "t.db") as store:
                thread = await Harness(Agent("clerk", ScriptedModel(script), tools=server.tools()), store
                                       ).create_thread()
                await thread.send("note and reserve")
                state = await thread.wait()
                assert state.status == "idle" and state.last_reply == "Done."
                [intent] = [i for i in _requested(store, thread.stream) if i["name"] == "send_note"]
                [sent] = [c for c in _calls(journal, "send_note") if c["args"]["text"] == note]
                assert sent["meta"][jixu_mcp.META_IDEMPOTENCY_KEY] == intent["idempotency_key"]
                assert state.effects[intent["effect_id"]].state == "completed"

    asyncio.run(scenario())


def test_is_error_and_bad_arguments_are_determinate_failures(tmp_path: Path, shop: tuple[str, Path]) -> None:
    url, journal = shop
    script = [ToolCall("price", {"sku": "plum"}), ToolCall("price", {"sku": 5}), "No plums."]

    async def scenario() -> None:
        async with jixu_mcp.connect_http(url) as server:
            with SQLiteStore(tmp_path / "t.db") as store:
                thread = await Harness(Agent("clerk", ScriptedModel(script), tools=server.tools()), store
                                       ).create_thread()
                before = len(_calls(journal, "price"))
                await thread.send("price a plum")
                state = await thread.wait()
                assert state.status == "idle" and state.last_reply == "No plums."
                first, second = [m for m in state.messages if m["role"] == "tool"]
                assert first["status"] == "error" and "no product 'plum'" in first["content"]
                assert "mcp_tool_error" in first["content"]
                assert second["status"] == "error" and "args.sku" in second["content"]
                # isError: the server answered, the outcome is known; the bad arguments never left the process
                for intent in _requested(store, thread.stream):
                    assert state.effects[intent["effect_id"]].state == "completed"
                assert [c["args"] for c in _calls(journal, "price")[before:]] == [{"sku": "plum"}]

    asyncio.run(scenario())


@pytest.mark.parametrize("declared", [False, True], ids=["unsafe", "errors-before-acting"])
def test_is_error_of_an_unsafe_tool_leaves_its_outcome_unknown_unless_its_errors_come_before_it_acts(
        tmp_path: Path, shop: tuple[str, Path], declared: bool) -> None:
    """The server SDK answers an exception raised after the tool acted with isError. Taken as a determinate
    failure, the model was told the shipment failed and shipped again (two parcels); now the call is unknown and the
    thread waits for its probe or an operator, unless the tool is declared to report its errors before acting."""
    url, journal = shop
    script = [ToolCall("ship", {"order": "lost"}), ToolCall("ship", {"order": "lost"}), "Shipped it."]
    options = {"errors_before_acting": ["ship"]} if declared else {}

    async def scenario() -> None:
        async with jixu_mcp.connect_http(url, **options) as server:
            with SQLiteStore(tmp_path / "t.db") as store:
                thread = await Harness(Agent("clerk", ScriptedModel(script), tools=server.tools()), store
                                       ).create_thread()
                before = len(_calls(journal, "ship"))
                await thread.send("ship the lost order")
                state = await thread.wait()
                [first, *_] = _requested(store, thread.stream)
                decision = state.effects[first["effect_id"]]
                if declared:  # the model is told, and calls again (as it would without jixu)
                    assert state.status == "idle" and decision.state == "completed"
                    assert len(_calls(journal, "ship")[before:]) == 2
                else:
                    assert state.status == "waiting" and decision.state == "unknown", (state.status, decision)
                    assert len(_calls(journal, "ship")[before:]) == 1, "shipped once, never again"
                    [failed] = [e for e in store.read(thread.stream) if e.type == "tool.failed"]
                    assert failed.data["indeterminate"] is True
                    assert failed.data["error"]["code"] == "mcp_tool_outcome_unknown"

    asyncio.run(scenario())


def test_errors_before_acting_must_name_listed_tools(tmp_path: Path, shop: tuple[str, Path]) -> None:
    url, _journal = shop

    async def scenario() -> None:
        with pytest.raises(InvalidInput, match="errors_before_acting"):
            async with jixu_mcp.connect_http(url, errors_before_acting=["shipp"]):
                pass

    asyncio.run(scenario())


# --- a server that dies during a call ---------------------------------------------------------------


@pytest.mark.crash
@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_an_unsafe_call_whose_server_is_killed_is_unknown_and_not_sent_again(
        tmp_path: Path, transport: str) -> None:
    journal = tmp_path / "journal.jsonl"
    script = [ToolCall("charge", {"order": "o-9", "cents": 999}), "Charged."]
    hang = {"MCP_HANG": "charge"}

    async def run_until_killed(server: jixu_mcp.Connection, store: SQLiteStore) -> str:
        thread = await Harness(Agent("clerk", ScriptedModel(script), tools=server.tools()), store).create_thread()
        await thread.send("charge o-9")
        killer = asyncio.create_task(_kill_when_called(journal, "charge"))
        state = await asyncio.wait_for(thread.wait(), 60)
        await killer
        [intent] = _requested(store, thread.stream)
        decision = state.effects[intent["effect_id"]]
        assert state.status == "waiting" and decision.state == "unknown" and decision.attempts == 1
        assert [w["effect_id"] for w in state.waiting_on] == [intent["effect_id"]]
        return thread.thread_id

    async def scenario() -> None:
        with SQLiteStore(tmp_path / "t.db") as store:
            if transport == "stdio":
                async with _stdio(tmp_path, journal, hang) as server:
                    thread_id = await run_until_killed(server, store)
                async with _stdio(tmp_path, journal) as server:  # a new server that would answer
                    reopened = await Harness(Agent("clerk", ScriptedModel(script), tools=server.tools()), store
                                             ).open_thread(thread_id)
                    assert (await reopened.wait()).status == "waiting"
            else:
                with _http_server(journal, hang) as (url, _):
                    async with jixu_mcp.connect_http(url) as server:
                        thread_id = await run_until_killed(server, store)
                with _http_server(journal) as (url, _):
                    async with jixu_mcp.connect_http(url) as server:
                        reopened = await Harness(Agent("clerk", ScriptedModel(script), tools=server.tools()),
                                                 store).open_thread(thread_id)
                        assert (await reopened.wait()).status == "waiting"
        assert len(_calls(journal, "charge")) == 1  # sent once, never again

    asyncio.run(scenario())


@pytest.mark.crash
def test_a_read_only_call_whose_server_is_killed_is_sent_again_to_a_new_server(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    hang = {"MCP_HANG": "price", "MCP_HANG_ONCE": str(tmp_path / "hung-once")}
    script = [ToolCall("price", {"sku": "pear"}), "Pears are 0.90."]

    async def scenario() -> None:
        async with _stdio(tmp_path, journal, hang) as server:
            with SQLiteStore(tmp_path / "t.db") as store:
                thread = await Harness(Agent("clerk", ScriptedModel(script), tools=server.tools()), store
                                       ).create_thread()
                await thread.send("price pears")
                killed = await _kill_when_called(journal, "price")
                state = await asyncio.wait_for(thread.wait(), 60)
                assert state.status == "idle" and state.last_reply == "Pears are 0.90."
                [intent] = _requested(store, thread.stream)
                assert state.effects[intent["effect_id"]].attempts == 2
        first, second = _calls(journal, "price")
        assert first["pid"] == killed and second["pid"] != killed  # the stdio server was started again
        assert first["meta"][jixu_mcp.META_IDEMPOTENCY_KEY] == second["meta"][jixu_mcp.META_IDEMPOTENCY_KEY]
        assert [first["meta"][jixu_mcp.META_ATTEMPT], second["meta"][jixu_mcp.META_ATTEMPT]] == [1, 2]

    asyncio.run(scenario())


@pytest.mark.crash
def test_a_server_that_died_and_cannot_start_again_fails_the_call_determinately(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    script_copy = tmp_path / "mcp_server.py"
    script_copy.write_text(SERVER.read_text())
    model = [ToolCall("charge", {"order": "o-2", "cents": 5}), "Could not charge."]

    async def scenario() -> None:
        async with _stdio(tmp_path, journal, script=script_copy) as server:
            pid = (await server.call("stock.count"), _calls(journal, "stock.count")[-1]["pid"])[1]
            os.kill(pid, signal.SIGKILL)
            script_copy.unlink()  # the server cannot be started again
            session = server._session
            assert session is not None
            await asyncio.wait_for(session.ended.wait(), 30)  # the client saw its stdout end
            with SQLiteStore(tmp_path / "t.db") as store:
                thread = await Harness(Agent("clerk", ScriptedModel(model), tools=server.tools()), store
                                       ).create_thread()
                await thread.send("charge o-2")
                state = await thread.wait()
                assert state.status == "idle" and state.last_reply == "Could not charge."
                [intent] = _requested(store, thread.stream)
                assert state.effects[intent["effect_id"]].state == "completed"  # known: nothing was sent
                [message] = [m for m in state.messages if m["role"] == "tool"]
                assert message["status"] == "error" and "mcp_unavailable" in message["content"]
        assert _calls(journal, "charge") == []

    asyncio.run(scenario())


def test_a_server_that_cannot_be_started_is_a_clear_error(tmp_path: Path) -> None:
    async def scenario() -> None:
        with pytest.raises(MCPConnectionError, match="cannot connect to the MCP server"):
            async with jixu_mcp.connect_stdio(sys.executable, ["-c", "import sys; sys.exit(3)"],
                                              errlog=open(tmp_path / "err", "w")):
                pass

    asyncio.run(scenario())


# --- durable steps ---------------------------------------------------------------------------------


def test_mcp_tools_as_durable_steps_run_once(tmp_path: Path, shop: tuple[str, Path]) -> None:
    url, journal = shop
    order = f"step-{tmp_path.name}"
    seen: list[str] = []

    async def checkout(server: jixu_mcp.Connection, thread_id: str | None, crash: bool) -> tuple[Any, Any]:
        async with jixu.durable(tmp_path / "t.db", thread_id, name="checkout") as run:
            seen.append(run.thread_id)
            price = await server.step(run, "price", {"sku": "apple"})
            charged = await server.step(run, "charge", {"order": order, "cents": price["cents"]})
            with pytest.raises(StepFailed, match="no product 'kiwi'"):  # isError: the step failed, for good
                await server.step(run, "price", {"sku": "kiwi"})
            with pytest.raises(ToolInputError):  # checked before anything is recorded
                await server.step(run, "charge", {"order": order})
            if crash:
                raise RuntimeError("the code stops after its steps")
            return price, charged

    async def scenario() -> None:
        async with jixu_mcp.connect_http(url) as server:
            with pytest.raises(RuntimeError):
                await checkout(server, None, crash=True)
            price, charged = await checkout(server, seen[0], crash=False)  # the unfinished run, again
            assert price == {"sku": "apple", "cents": 120} and charged == {"result": f"charged 120 for {order}"}
        [call] = [c for c in _calls(journal, "charge") if c["args"]["order"] == order]  # charged once
        assert call["args"]["idempotency_key"] == call["meta"][jixu_mcp.META_IDEMPOTENCY_KEY]
        with SQLiteStore(tmp_path / "t.db") as store:
            keys = {i["idempotency_key"] for i in _requested(store, stream_of(seen[0])) if i["name"] == "price"}
        assert len([c for c in _calls(journal, "price") if c["meta"][jixu_mcp.META_IDEMPOTENCY_KEY] in keys]) == 2

    asyncio.run(scenario())


@pytest.mark.crash
def test_an_unsafe_step_whose_server_is_killed_is_unknown(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"

    async def scenario() -> None:
        async with _stdio(tmp_path, journal, {"MCP_HANG": "charge"}) as server:
            # The block catches the unknown step and ends; its run stays unfinished, and the exit says so.
            with pytest.raises(StepOutcomeUnknown, match="stays unfinished"):
                async with jixu.durable(tmp_path / "t.db", name="checkout") as run:
                    killer = asyncio.create_task(_kill_when_called(journal, "charge"))
                    with pytest.raises(StepOutcomeUnknown, match="jixu threads resolve"):
                        await server.step(run, "charge", {"order": "o-3", "cents": 1})
                    await killer
        assert len(_calls(journal, "charge")) == 1

    asyncio.run(scenario())


# --- without the extra --------------------------------------------------------------------------------


def test_without_the_sdk_the_import_names_the_extra() -> None:
    code = ("import sys; sys.modules['mcp'] = None\n"
            "try:\n    import jixu.integrations.mcp\nexcept ImportError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", code], env=python_env(), capture_output=True, text=True,
                          timeout=120, cwd=ROOT, check=False)
    assert 'pip install "jixu[mcp]"' in done.stdout, done.stdout + done.stderr


# --- the pure mappings -------------------------------------------------------------------------------


def test_results_and_annotations_map_as_documented() -> None:
    assert jixu_mcp.semantics_from_annotations({"readOnlyHint": True, "idempotentHint": False}) == "read_only"
    assert jixu_mcp.semantics_from_annotations({"readOnlyHint": False, "idempotentHint": True}) == "idempotent"
    assert jixu_mcp.semantics_from_annotations({"destructiveHint": False}) == "unsafe"
    assert jixu_mcp.semantics_from_annotations(None) == "unsafe"
    text = {"type": "text", "text": "hi"}
    image = {"type": "image", "data": "AAAA", "mimeType": "image/png"}
    assert jixu_mcp.tool_result({"content": [text], "structuredContent": {"a": 1}}, tool="t") == {"a": 1}
    assert jixu_mcp.tool_result({"content": [text, {"type": "text", "text": "there"}]}, tool="t") == "hi\nthere"
    assert jixu_mcp.tool_result({"content": [text, image]}, tool="t") == {"content": [text, image]}
    assert jixu_mcp.tool_result({"content": []}, tool="t") is None
    with pytest.raises(jixu.ToolError) as failed:
        jixu_mcp.tool_result({"content": [text], "isError": True}, tool="t")
    assert failed.value.code == "mcp_tool_error" and failed.value.message == "hi"


# --- the example ------------------------------------------------------------------------------------


def test_the_example_runs_offline(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "mcp_tools.py")], env=python_env(),
                          capture_output=True, text=True, timeout=180, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "tool price: read_only",
        "tool charge: unsafe",
        "idle - Charged 1.20 for order o-7.",
        '  price -> {"result": 120}',
        '  charge -> {"result": "charged 120 cents for o-7"}',
        "reopened: idle; tool calls recorded before 2, after 2, all completed",
    ]


@pytest.mark.crash
def test_a_restarted_http_server_is_met_with_a_new_session_and_the_refused_call_did_not_run(tmp_path: Path) -> None:
    """An audit: after the server restarted (a deploy), every call on the connection failed with "-32600: Session
    not found", recorded as an unknown outcome (an unsafe call that never reached the server then waited for an
    operator), and the session was never replaced. The refusal is a call not run, and the next call opens a new
    session."""
    journal = tmp_path / "journal.jsonl"
    port = _free_port()
    url = f"http://127.0.0.1:{port}/mcp"

    async def restarted() -> None:
        with contextlib.ExitStack() as first:
            first.enter_context(_http_server(journal, port=port))
            async with jixu_mcp.connect_http(url) as server:
                assert await server.call("price", {"sku": "apple"}) == {"sku": "apple", "cents": 120}
                first.close()  # the server is killed; the same URL is served again by a new process
                with _http_server(journal, port=port):
                    with pytest.raises(jixu.ToolError) as refused:
                        await server.call("charge", {"order": "o-9", "cents": 5})
                    assert refused.value.code == "mcp_not_run", refused.value.message
                    assert _calls(journal, "charge") == [], "the call never reached a server"
                    assert await server.call("price", {"sku": "pear"}) == {"sku": "pear", "cents": 90}

    asyncio.run(restarted())


@pytest.mark.crash
def test_a_server_started_again_with_a_tool_listed_otherwise_refuses_that_tool_unsent(tmp_path: Path) -> None:
    """An audit: a session replaced after the server died kept the first listing: a call built on the old schema
    was sent to a tool that now takes other arguments (recorded unknown), and a tool that lost its read-only hint
    was still retried as read-only. A tool the new session lists otherwise is refused, nothing sent; the others go
    on."""
    journal = tmp_path / "journal.jsonl"
    script_copy = tmp_path / "mcp_server.py"
    script_copy.write_text(SERVER.read_text())

    async def scenario() -> None:
        async with _stdio(tmp_path, journal, script=script_copy) as server:
            assert await server.call("price", {"sku": "apple"}) == {"sku": "apple", "cents": 120}
            changed = script_copy.read_text().replace("async def price(sku: str, ctx: Context)",
                                                      "async def price(sku: str, currency: str, ctx: Context)")
            assert changed != script_copy.read_text()
            script_copy.write_text(changed)  # its next start lists price with another schema
            os.kill(int(_calls(journal, "price")[-1]["pid"]), signal.SIGKILL)
            session = server._session
            assert session is not None
            await asyncio.wait_for(session.ended.wait(), 30)
            assert await server.call("stock.count") == {"result": 3}  # started again: it runs
            with pytest.raises(jixu.ToolError) as refused:
                await server.call("price", {"sku": "pear"})
            assert refused.value.code == "mcp_tool_changed" and "inputSchema" in refused.value.message
            assert len(_calls(journal, "price")) == 1, "the call was not sent"

    asyncio.run(scenario())


class _AnswersOddly(BaseHTTPRequestHandler):
    """A streamable-HTTP MCP server, by hand, that runs ``send_mail`` and then answers the call with what the SDK's
    client turns into -32600 though the tool ran: a 202 with no body, or a body that is no JSON nor event stream."""

    mode = "202"
    ran: ClassVar[list[dict[str, Any]]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Mcp-Session-Id", "s1")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        message = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        method = message.get("method")
        if "id" not in message:
            return self._reply(202, b"")
        if method == "initialize":
            result: dict[str, Any] = {"protocolVersion": message["params"]["protocolVersion"],
                                      "capabilities": {"tools": {}}, "serverInfo": {"name": "odd", "version": "1"}}
        elif method == "tools/list":
            result = {"tools": [{"name": "send_mail", "inputSchema": {"type": "object", "properties": {}}}]}
        elif method == "tools/call":
            type(self).ran.append(message)  # the side effect happens here
            if self.mode == "202":
                return self._reply(202, b"")
            return self._reply(200, b"<html>sent</html>", "text/html")
        else:
            result = {}
        return self._reply(200, json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}).encode())

    def do_DELETE(self) -> None:
        self._reply(200, b"")


@pytest.mark.parametrize("mode", ["202", "html"])
def test_an_invalid_request_answer_after_the_server_ran_the_tool_leaves_it_unknown(mode: str) -> None:
    """The review of -32600 as "not run": the SDK's client answers -32600 also when the server ran the call and
    then answered with a 202 or an unexpected content type. Only its "session not found / terminated" is a call
    not run; these stay an unknown outcome (a model told "not run" would send the mail again)."""
    handler = type("Handler", (_AnswersOddly,), {"mode": mode, "ran": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    async def scenario() -> None:
        async with jixu_mcp.connect_http(f"http://127.0.0.1:{server.server_port}/mcp") as connection:
            with pytest.raises(MCPConnectionError, match="its outcome is unknown"):
                await connection.call("send_mail", {})

    try:
        asyncio.run(scenario())
    finally:
        server.shutdown()
        server.server_close()
    assert len(handler.ran) == 1


def test_a_listing_changed_only_in_words_or_order_is_the_same_tool() -> None:
    """The review of `mcp_tool_changed`: annotations absent or `{}`, an explicit false hint, a title, a property's
    description or the order of `required` made a tool count as changed (every call refused until reconnecting);
    what calls rest on (the semantics its hints give, the arguments' schema) is what is compared."""
    from jixu.integrations.mcp import _Listed

    first = {"name": "ship", "annotations": {},
             "inputSchema": {"type": "object", "required": ["order", "title"],
                             "properties": {"order": {"type": "string"}, "title": {"type": "string"}}}}
    connection = jixu_mcp.connect(lambda: None)
    listed = _Listed(first, "ship", None)
    same = {"name": "ship", "description": "Ship it.", "annotations": {"readOnlyHint": False, "title": "Ship"},
            "inputSchema": {"type": "object", "required": ["title", "order"], "title": "ship_args",
                            "properties": {"order": {"type": "string", "description": "The order id."},
                                           "title": {"type": "string", "title": "Title"}}}}
    connection._last_listing = [same]
    assert connection._changed(listed) is None
    connection._last_listing = [{**same, "annotations": {"readOnlyHint": True}}]
    assert connection._changed(listed) == "its annotations changed"
    without_title = {**same["inputSchema"], "properties": {"order": {"type": "string"}}}  # an argument gone
    connection._last_listing = [{**same, "inputSchema": without_title}]
    assert connection._changed(listed) == "its inputSchema changed"
    connection._last_listing = []
    assert connection._changed(listed) == "no longer listed"
