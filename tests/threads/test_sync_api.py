"""Threads driven from synchronous code (decision 0036).

Two rules, on real SQLite files:

* **Loop teardown never cuts a call.** A program that sends in one ``asyncio.run`` and waits in another (two
  web handlers) leaves an unsafe call that was in flight when the first loop ended *completed*, with its
  receipt, never ``unknown``; the turn goes on at the next ``wait()``, on whatever loop makes it.
* **The synchronous facade** (:class:`~jixu.SyncHarness`) runs every call on an event loop of its own, in a
  daemon thread, through the async API: several OS threads may use one facade at once, and closing it gives
  every lease back.
"""

from __future__ import annotations

import asyncio
import json
import socketserver
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest

from jixu import (
    Agent,
    Harness,
    HarnessClosed,
    InvalidInput,
    ScriptedModel,
    SyncHarness,
    ThreadBusy,
    ToolCall,
    ToolContext,
    tool,
)
from jixu.ledger import SQLiteStore
from tests.helpers import ROOT, python_env
from tests.threads import sync_child

SENT: list[str] = []
"""Every email a tool of this module actually sent (the outside world's record)."""
IN_FLIGHT = threading.Event()
"""Set when an email tool of this module has started (its call is in flight)."""


@tool(semantics="unsafe")
async def send_email_async(to: str, ctx: ToolContext) -> str:
    """Send an email; the mail server takes a moment to accept it."""
    IN_FLIGHT.set()
    await asyncio.sleep(0.05)
    SENT.append(f"{to} {ctx.effect_id}")
    return f"sent to {to}"


@tool(semantics="unsafe")
def send_email(to: str, ctx: ToolContext) -> str:
    """Send an email (a plain function: it runs in a worker thread)."""
    IN_FLIGHT.set()
    time.sleep(0.05)
    SENT.append(f"{to} {ctx.effect_id}")
    return f"sent to {to}"


def _mailer(email_tool: object = send_email) -> Agent:
    return Agent(name="mailer", model=ScriptedModel([ToolCall(getattr(email_tool, "name", "send_email"),
                                                              {"to": "a@example.com"}), "Sent."]),
                 tools=[email_tool])  # type: ignore[list-item]


async def _until_in_flight() -> None:
    """Return (and so end the handler's asyncio.run) once the email is in flight."""
    while not IN_FLIGHT.is_set():
        await asyncio.sleep(0.001)


def _tool_receipts(path: Path, thread_id: str) -> list[str]:
    with SQLiteStore(path) as store:
        return [e.type for e in store.read(f"thread/{thread_id}") if e.type.startswith("tool.")]


# --- the async API across two event loops ---------------------------------------------------------------


def _two_loops(tmp_path: Path, email_tool: object) -> None:
    """Handler one sends in its own asyncio.run; handler two waits in another: the email goes out once, its
    receipt says so, and the turn finishes."""
    SENT.clear()
    IN_FLIGHT.clear()
    harness = Harness(_mailer(email_tool), f"sqlite:///{tmp_path}/t.db")

    async def send_handler() -> str:
        thread = await harness.create_thread()
        await thread.send("Email a@example.com")
        await _until_in_flight()
        return thread.thread_id

    thread_id = asyncio.run(send_handler())  # its loop ends with the turn under way

    async def wait_handler() -> tuple[str, str | None, dict[str, str]]:
        thread = await harness.open_thread(thread_id)
        state = await thread.wait()
        return state.status, state.last_reply, {d.name or "": d.state for d in state.effects.values()}

    status, reply, effects = asyncio.run(wait_handler())
    harness.close()
    assert len(SENT) == 1, f"the email goes out exactly once: {SENT}"
    assert _tool_receipts(tmp_path / "t.db", thread_id) == ["tool.requested", "tool.dispatched", "tool.completed"]
    assert effects[email_tool.name] == "completed"  # type: ignore[attr-defined]
    assert (status, reply) == ("idle", "Sent.")


def test_an_async_call_in_flight_when_asyncio_run_ends_is_not_cut(tmp_path: Path) -> None:
    _two_loops(tmp_path, send_email_async)


def test_a_plain_function_call_in_flight_when_asyncio_run_ends_keeps_its_receipt(tmp_path: Path) -> None:
    _two_loops(tmp_path, send_email)


def test_the_end_of_asyncio_run_waits_for_the_call_and_gives_the_turn_back(tmp_path: Path) -> None:
    """When the first loop is gone, the email's receipt is already durable and the lease released: the next
    wait (here: another process, another owner) continues the turn at once, and nothing is called twice."""
    SENT.clear()
    IN_FLIGHT.clear()
    harness = Harness(_mailer(send_email_async), f"sqlite:///{tmp_path}/t.db", owner="handler-one")

    async def send_handler() -> str:
        thread = await harness.create_thread()
        await thread.send("Email a@example.com")
        await _until_in_flight()
        return thread.thread_id

    thread_id = asyncio.run(send_handler())
    assert _tool_receipts(tmp_path / "t.db", thread_id) == ["tool.requested", "tool.dispatched", "tool.completed"]
    with SQLiteStore(tmp_path / "t.db") as store:
        lease = store.get_lease(f"thread/{thread_id}/turn")
        assert lease is not None and lease.released, "the loop's end gave the turn back"
    harness.close()
    other = Harness(_mailer(send_email_async), f"sqlite:///{tmp_path}/t.db", owner="handler-two")

    async def wait_handler() -> tuple[str, str | None]:
        state = await (await other.open_thread(thread_id)).wait()
        return state.status, state.last_reply

    assert asyncio.run(wait_handler()) == ("idle", "Sent.")
    other.close()
    assert len(SENT) == 1


def test_twenty_threads_in_flight_when_asyncio_run_ends_lose_no_receipt(tmp_path: Path) -> None:
    """Many threads on one loop share commits: their receipts are queued behind one another when the loop ends.
    Every call in flight still gets its receipt (none cut, none dispatched without one)."""
    started: set[str] = set()

    @tool(semantics="unsafe")
    async def notify(ctx: ToolContext) -> str:
        """Notify someone (takes a moment)."""
        started.add(ctx.effect_id)
        await asyncio.sleep(0.001 * (len(started) % 7))
        return "notified"

    def step(messages: list[dict[str, Any]]) -> Any:
        return "Done." if messages[-1]["role"] == "tool" else ToolCall("notify")

    harness = Harness(Agent("notifier", ScriptedModel(step), tools=[notify]), f"sqlite:///{tmp_path}/t.db")

    async def send_handler() -> list[str]:
        threads = [await harness.create_thread() for _ in range(20)]
        await asyncio.gather(*(thread.send("go") for thread in threads))
        while len(started) < 10:
            await asyncio.sleep(0.001)
        return [thread.thread_id for thread in threads]

    thread_ids = asyncio.run(send_handler())

    async def wait_handler() -> list[tuple[str, list[str]]]:
        states = [await (await harness.open_thread(thread_id)).wait() for thread_id in thread_ids]
        return [(s.status, [d.state for d in s.effects.values() if d.kind == "tool"]) for s in states]

    assert asyncio.run(wait_handler()) == [("idle", ["completed"])] * 20
    harness.close()
    assert len(started) == 20


def test_an_interruption_still_cuts_the_call_in_flight(tmp_path: Path) -> None:
    """Only teardown is refused: an operator's interrupt cuts the call, recorded as unknown (it may have
    happened)."""

    @tool(semantics="unsafe")
    async def deploy(ctx: ToolContext) -> str:
        """Deploy (takes long)."""
        SENT.append(ctx.effect_id)
        await asyncio.sleep(30)
        return "deployed"

    SENT.clear()
    harness = Harness(Agent("deployer", ScriptedModel([ToolCall("deploy"), "done"]), tools=[deploy]),
                      f"sqlite:///{tmp_path}/t.db")

    async def scenario() -> tuple[str, list[str]]:
        thread = await harness.create_thread()
        await thread.send("deploy")
        while not SENT:
            await asyncio.sleep(0.005)
        state = await thread.interrupt("stop")
        return state.status, [d.state for d in state.effects.values() if d.kind == "tool"]

    assert asyncio.run(scenario()) == ("waiting", ["unknown"])
    harness.close()


def test_two_handles_of_one_thread_share_one_agent_loop(tmp_path: Path) -> None:
    """Web handlers open the same thread: a second handle never starts a second loop on the turn (it would take
    the claim from the first mid-call); it follows the first, and a second send is refused."""
    SENT.clear()
    gate = asyncio.Event()

    @tool(semantics="unsafe")
    async def gated_email(to: str, ctx: ToolContext) -> str:
        """Send an email once the gate opens."""
        await gate.wait()
        SENT.append(f"{to} {ctx.effect_id}")
        return f"sent to {to}"

    harness = Harness(_addressed_mailer(gated_email), f"sqlite:///{tmp_path}/t.db")

    async def scenario() -> None:
        first = await harness.create_thread()
        second = await harness.open_thread(first.thread_id)  # idle now: a handle of its own
        assert second is not first
        await first.send("a@example.com")
        assert await harness.open_thread(first.thread_id) is first, "the handle at work is the one opened"
        waiting = asyncio.ensure_future(second.wait())
        await asyncio.sleep(0.05)
        with pytest.raises(ThreadBusy):
            await second.send("b@example.com")
        gate.set()
        one, two = await asyncio.gather(first.wait(), waiting)
        assert (one.status, one.last_reply) == (two.status, two.last_reply) == ("idle", "Sent.")
        assert [d.state for d in two.effects.values() if d.kind == "tool"] == ["completed"]
        assert not [e for e in await second.events() if e.type == "turn.claimed"], "nobody took the claim over"

    asyncio.run(scenario())
    harness.close()
    assert len(SENT) == 1


# --- the synchronous facade -------------------------------------------------------------------------------


def _addressed_mailer(email_tool: object = send_email) -> Agent:
    """A mailer that emails the address the user wrote, then says so."""

    def step(messages: list[dict[str, Any]]) -> Any:
        if messages[-1]["role"] == "tool":
            return "Sent."
        return ToolCall(getattr(email_tool, "name", "send_email"), {"to": messages[-1]["content"]})

    return Agent(name="mailer", model=ScriptedModel(step), tools=[email_tool])  # type: ignore[list-item]


def _verified(path: Path) -> None:
    with SQLiteStore(path) as store:
        for info in store.list_streams("thread/", limit=1000):
            assert store.verify(info.stream).valid, info.stream


def test_run_sync_sends_and_waits_on_the_harness_loop_and_close_gives_the_lease_back(tmp_path: Path) -> None:
    SENT.clear()
    with SyncHarness(_addressed_mailer(), f"sqlite:///{tmp_path}/t.db") as harness:
        thread = harness.create_thread()
        state = thread.run_sync("a@example.com")
        assert (state.status, state.last_reply) == ("idle", "Sent.")
        assert [e.type for e in thread.events() if e.type.startswith("tool.")] == [
            "tool.requested", "tool.dispatched", "tool.completed"]
        assert thread.state() == state and not thread.running
        assert [s.thread_id for s in harness.list_threads()] == [thread.thread_id]
        # The agent loop ran on the harness's own loop, not on this (loop-less) OS thread.
        assert harness.harness.home_loop is not None and thread.thread.home_loop is harness.harness.home_loop
        thread.send("b@example.com")
    assert harness.closed
    assert sorted(s.split()[0] for s in SENT) == ["a@example.com", "b@example.com"]
    with SQLiteStore(tmp_path / "t.db") as store:
        lease = store.get_lease(f"thread/{thread.thread_id}/turn")
        assert lease is not None and lease.released, "closing gave the lease back"
    with pytest.raises(HarnessClosed):
        thread.state()
    with pytest.raises(HarnessClosed):
        harness.create_thread()
    harness.close()  # again: nothing
    _verified(tmp_path / "t.db")


def test_many_os_threads_share_one_facade_on_one_store(tmp_path: Path) -> None:
    """Web-server style: 8 OS threads, each with its own conversation of three turns, plus readers of one
    shared thread; every email goes out once and every chain verifies."""
    SENT.clear()
    errors: list[BaseException] = []
    with SyncHarness(_addressed_mailer(), f"sqlite:///{tmp_path}/t.db") as harness:
        shared = harness.create_thread()
        shared.send("shared@example.com")

        def worker(n: int) -> None:
            try:
                thread = harness.create_thread(metadata={"worker": n})
                for turn in range(3):
                    state = thread.run_sync(f"w{n}-{turn}@example.com", timeout=30)
                    assert (state.status, state.last_reply) == ("idle", "Sent."), state.reason
                seen = harness.open_thread(shared.thread_id).wait(timeout=30)
                assert seen.last_reply == "Sent."
            except BaseException as error:  # reported below, on the test's thread
                errors.append(error)

        workers = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
        for started in workers:
            started.start()
        for started in workers:
            started.join(60)
        assert not errors, errors
        assert len(harness.list_threads()) == 9
    sent = sorted(s.split()[0] for s in SENT)
    expected = sorted([f"w{n}-{t}@example.com" for n in range(8) for t in range(3)] + ["shared@example.com"])
    assert sent == expected, "every email exactly once"
    _verified(tmp_path / "t.db")


def test_one_thread_used_from_several_os_threads_runs_one_turn_at_a_time(tmp_path: Path) -> None:
    SENT.clear()
    with SyncHarness(_addressed_mailer(), f"sqlite:///{tmp_path}/t.db") as harness:
        thread_id = harness.create_thread().thread_id
        outcomes: list[str] = []
        lock = threading.Lock()

        def handler(n: int) -> None:
            try:
                harness.open_thread(thread_id).send(f"h{n}@example.com")
                outcome = "sent"
            except ThreadBusy:
                outcome = "busy"
            with lock:
                outcomes.append(outcome)

        handlers = [threading.Thread(target=handler, args=(n,)) for n in range(6)]
        for started in handlers:
            started.start()
        for started in handlers:
            started.join(30)
        state = harness.open_thread(thread_id).wait(timeout=30)
    assert outcomes.count("sent") >= 1 and len(outcomes) == 6
    assert len(SENT) == outcomes.count("sent") == len(state.turns), (outcomes, SENT)
    assert state.status == "idle"


def test_wait_with_a_timeout_leaves_the_turn_running(tmp_path: Path) -> None:
    gate = threading.Event()

    @tool(semantics="unsafe")
    def slow_email(to: str) -> str:
        """Send an email once the gate opens."""
        gate.wait(10)
        return f"sent to {to}"

    with SyncHarness(_addressed_mailer(slow_email), f"sqlite:///{tmp_path}/t.db") as harness:
        thread = harness.create_thread()
        thread.send("a@example.com")
        with pytest.raises(TimeoutError, match=r"did not finish within 0\.1 s"):
            thread.wait(timeout=0.1)
        assert thread.running, "the turn goes on after the caller stopped waiting"
        gate.set()
        assert thread.wait(timeout=10).last_reply == "Sent."


def test_the_async_api_of_a_facade_harness_runs_on_its_loop(tmp_path: Path) -> None:
    """An ``await`` on another loop (an async route next to sync handlers) is carried out on the harness's loop,
    and an asyncio.run that ends meanwhile takes nothing with it."""
    SENT.clear()
    IN_FLIGHT.clear()
    with SyncHarness(_addressed_mailer(send_email_async), f"sqlite:///{tmp_path}/t.db") as facade:
        harness = facade.harness

        async def send_handler() -> str:
            thread = await harness.create_thread()
            await thread.send("a@example.com")
            await _until_in_flight()
            assert thread.running
            return thread.thread_id

        thread_id = asyncio.run(send_handler())
        state = facade.open_thread(thread_id).wait(timeout=10)
        assert (state.status, state.last_reply) == ("idle", "Sent.")

        async def wait_handler() -> str | None:
            return (await (await harness.open_thread(thread_id)).wait()).last_reply

        assert asyncio.run(wait_handler()) == "Sent."
    assert len(SENT) == 1


def test_a_facade_called_from_its_own_loop_refuses_instead_of_hanging(tmp_path: Path) -> None:
    holder: list[SyncHarness] = []

    @tool(semantics="read_only")
    async def peek() -> str:
        """Call the synchronous facade from the harness's own loop (a mistake)."""
        try:
            holder[0].list_threads()
        except ThreadBusy as error:
            return str(error)
        return "no error"

    agent = Agent("peeker", ScriptedModel([ToolCall("peek"), "done"]), tools=[peek])
    with SyncHarness(agent, f"sqlite:///{tmp_path}/t.db") as harness:
        holder.append(harness)
        state = harness.create_thread().run_sync("peek", timeout=10)
        [result] = [e.data["result"] for e in harness.open_thread(state.thread_id).events()
                    if e.type == "tool.completed"]
        assert "its own event loop" in result


def test_a_harness_whose_threads_run_elsewhere_cannot_move(tmp_path: Path) -> None:
    gate = threading.Event()

    @tool(semantics="read_only")
    def look() -> str:
        """Wait for the gate."""
        gate.wait(10)
        return "seen"

    harness = Harness(Agent("looker", ScriptedModel([ToolCall("look"), "done"]), tools=[look]),
                      f"sqlite:///{tmp_path}/t.db")

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("look")
        with pytest.raises(ThreadBusy, match="before its threads run"):
            harness.sync()
        gate.set()
        await thread.wait()

    asyncio.run(scenario())
    facade = harness.sync()
    assert harness.sync() is facade
    facade.close()
    with pytest.raises(InvalidInput):
        SyncHarness(harness, "sqlite:///elsewhere.db")


# --- a WSGI application: one handler sends, another waits, a third approves -----------------------------------


@tool(semantics="unsafe", requires_approval=True)
def send_approved_email(to: str, ctx: ToolContext) -> str:
    """Send an email once an operator approved it."""
    SENT.append(f"{to} {ctx.effect_id}")
    return f"sent to {to}"


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def _mail_app(harness: SyncHarness) -> Callable[[dict[str, Any], Any], list[bytes]]:
    """A synchronous WSGI app: ``POST /threads`` sends, ``GET /threads/<id>`` waits, ``POST
    /threads/<id>/approve/<effect>`` approves; each request is one handler on a server thread."""

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        method, parts = environ["REQUEST_METHOD"], environ["PATH_INFO"].strip("/").split("/")
        if method == "POST" and parts == ["threads"]:
            body = json.loads(environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)))
            thread = harness.create_thread()
            thread.send(body["to"])
            answer: dict[str, Any] = {"thread_id": thread.thread_id}
        elif method == "GET" and len(parts) == 2:
            state = harness.open_thread(parts[1]).wait(timeout=10)
            answer = {"status": state.status, "reply": state.last_reply,
                      "parked": [w["effect_id"] for w in state.waiting_on]}
        elif method == "POST" and len(parts) == 4 and parts[2] == "approve":
            state = harness.open_thread(parts[1]).approve(parts[3], actor="reviewer")
            answer = {"status": state.status}
        else:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found"]
        start_response("200 OK", [("Content-Type", "application/json")])
        return [json.dumps(answer).encode()]

    return app


def _request(base: str, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    with urllib.request.urlopen(urllib.request.Request(base + path, data=data, method=method), timeout=30) as r:
        answer: dict[str, Any] = json.loads(r.read())
        return answer


def test_a_wsgi_app_sends_in_one_request_and_waits_and_approves_in_others(tmp_path: Path) -> None:
    SENT.clear()
    with SyncHarness(_addressed_mailer(send_approved_email), f"sqlite:///{tmp_path}/t.db") as harness:
        server = make_server("127.0.0.1", 0, _mail_app(harness), server_class=_ThreadingServer,
                             handler_class=_QuietHandler)
        serving = threading.Thread(target=server.serve_forever, daemon=True)
        serving.start()
        base = f"http://127.0.0.1:{server.server_port}"
        answers: dict[int, dict[str, Any]] = {}

        def client(n: int) -> None:
            created = _request(base, "POST", "/threads", {"to": f"c{n}@example.com"})
            waiting = _request(base, "GET", f"/threads/{created['thread_id']}")
            assert waiting["status"] == "waiting" and len(waiting["parked"]) == 1, waiting
            _request(base, "POST", f"/threads/{created['thread_id']}/approve/{waiting['parked'][0]}")
            answers[n] = _request(base, "GET", f"/threads/{created['thread_id']}")

        try:
            clients = [threading.Thread(target=client, args=(n,)) for n in range(6)]
            for started in clients:
                started.start()
            for started in clients:
                started.join(60)
        finally:
            server.shutdown()
            server.server_close()
    assert answers == {n: {"status": "idle", "reply": "Sent.", "parked": []} for n in range(6)}
    assert sorted(s.split()[0] for s in SENT) == sorted(f"c{n}@example.com" for n in range(6))
    _verified(tmp_path / "t.db")


# --- a process that ends without closing; another process opens the store -------------------------------------


@pytest.fixture
def outbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The mail server's log the child's tools and this process's write to."""
    monkeypatch.setenv(sync_child.OUTBOX, str(tmp_path / "outbox.log"))
    return tmp_path / "outbox.log"


def _child(tmp_path: Path, mode: str) -> list[str]:
    result = subprocess.run([sys.executable, "-m", "tests.threads.sync_child", f"sqlite:///{tmp_path}/t.db", mode],
                            cwd=ROOT, env=python_env(), capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.split()


def _sent(outbox: Path) -> list[str]:
    return outbox.read_text(encoding="utf-8").splitlines() if outbox.exists() else []


def test_a_script_that_exits_with_a_call_in_flight_finishes_it_and_gives_the_lease_back(tmp_path: Path,
                                                                                      outbox: Path) -> None:
    thread_id, *_ = _child(tmp_path, "in_flight")
    [email] = _sent(outbox)
    with SQLiteStore(tmp_path / "t.db") as store:
        lease = store.get_lease(f"thread/{thread_id}/turn")
        assert lease is not None and lease.released, "the exit gave the turn back"
        tools = [e for e in store.read(f"thread/{thread_id}") if e.type.startswith("tool.")]
    assert [e.type for e in tools] == ["tool.requested", "tool.dispatched", "tool.completed"]
    assert email.split()[1] == tools[0].data["effect_id"]
    with SyncHarness(sync_child.agent("in_flight"), f"sqlite:///{tmp_path}/t.db", owner="parent") as harness:
        state = harness.open_thread(thread_id).wait(timeout=10)
    assert (state.status, state.last_reply) == ("idle", "Sent.")
    assert len(_sent(outbox)) == 1, "nothing was sent again"
    _verified(tmp_path / "t.db")


def test_a_parked_call_left_by_a_closed_process_is_approved_by_another(tmp_path: Path, outbox: Path) -> None:
    thread_id, status = _child(tmp_path, "parked")
    assert status == "waiting" and _sent(outbox) == []
    with SyncHarness(sync_child.agent("parked"), f"sqlite:///{tmp_path}/t.db", owner="parent") as harness:
        thread = harness.open_thread(thread_id)
        state = thread.state()
        [parked] = state.waiting_on
        assert state.status == "waiting" and (parked["state"], parked["name"]) == ("parked", "send_email_approved")
        thread.approve(parked["effect_id"], note="checked the address")
        state = thread.wait(timeout=10)
    assert (state.status, state.last_reply) == ("idle", "Sent.")
    [email] = _sent(outbox)
    assert email.split()[1] == parked["effect_id"]
    _verified(tmp_path / "t.db")


def test_a_harness_finds_a_threads_handles_by_id_and_forgets_those_nobody_holds(tmp_path: Path) -> None:
    """A worker holds hundreds of handles; the one at work is found by the thread's id, and a handle the program
    dropped leaves nothing behind in the harness (no id kept for every thread it ever opened)."""
    import gc

    harness = Harness(_addressed_mailer(), f"sqlite:///{tmp_path}/t.db")

    async def scenario() -> None:
        kept = [await harness.create_thread() for _ in range(3)]
        dropped = [(await harness.create_thread()).thread_id for _ in range(50)]
        again = await harness.open_thread(kept[0].thread_id)
        gc.collect()
        handles = harness._threads
        assert {t.thread_id for t in handles.all()} == {t.thread_id for t in kept}
        assert handles.of(kept[0].thread_id) in ([kept[0], again], [again, kept[0]])
        assert all(handles.of(thread_id) == [] for thread_id in dropped)
        assert set(handles._by_id) == {t.thread_id for t in kept}, "dropped handles leave no key"
        del again
        gc.collect()
        assert handles.of(kept[0].thread_id) == [kept[0]]

    asyncio.run(scenario())
    harness.close()


def test_handles_made_and_dropped_in_many_threads_at_once_are_always_found_and_leave_nothing() -> None:
    """A handle's end may free it in any thread (a synchronous caller's, the harness's loop): the index never
    loses a live handle to another handle's end, and ends in every thread leave no entry behind."""
    import gc
    import threading

    from jixu.threads.harness import _Handles

    class Handle:  # what the index needs of a Thread
        def __init__(self, thread_id: str) -> None:
            self.thread_id = thread_id

    handles = _Handles()
    kept = Handle("t-kept")
    handles.add(kept)  # type: ignore[arg-type]
    misses: list[str] = []

    def churn(n: int) -> None:
        for i in range(3000):
            thread_id = f"t-{i % 7}"
            handle = Handle(thread_id)
            handles.add(handle)  # type: ignore[arg-type]
            if handle not in handles.of(thread_id) or kept not in handles.of("t-kept"):
                misses.append(f"{n}:{i}")
            del handle

    workers = [threading.Thread(target=churn, args=(n,)) for n in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    gc.collect()
    assert misses == []
    assert handles.all() == [kept]
    assert set(handles._by_id) == {"t-kept"}
