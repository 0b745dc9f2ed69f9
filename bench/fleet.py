"""Fleet benchmark: K concurrent agent turns against a model with a real latency, served by jixu's real path.

Exact command (from the repository root; the peers and ``openai`` live only in the benchmark's gitignored venv)::

    bench/.venv-peers/bin/pip install openai dbos langgraph langgraph-checkpoint-sqlite aiosqlite \\
        langgraph-checkpoint-postgres "psycopg[binary]" pgserver
    bench/.venv-peers/bin/pip install -e ".[server,postgres]"   # jixu itself, with what `jixu serve` needs
    bench/.venv-peers/bin/python bench/fleet.py                 # --k 100,500,1000 --latency 1.0 ...

The model is ``bench/fake_openai.py``, a fake OpenAI-compatible Chat Completions server in its own process on
127.0.0.1, answering every call after ``--latency`` seconds (small jitter): a tool call for the first
``--steps - 1`` calls of a turn, then a reply. It counts the calls it served and, per conversation, the time
between the end of one answer and the arrival of the next call.

Systems, each against the same server, one after the other, each on a fresh database:

- **jixu worker**: K threads of an agent whose model is jixu's ``OpenAIModel`` (``base_url`` the fake server,
  streamed as by default) and whose tool is ``unsafe`` and takes ``--tool-seconds`` (10 ms); K turns queued
  with ``submit_turn``, then ``jixu worker --concurrency ceil(K / processes)`` with 1 or 2 processes on SQLite
  (synchronous FULL) or PostgreSQL, until the queue is empty (``--exit-when-idle``).
- **jixu serve**: ``jixu serve --agent ... --concurrency K``; K threads are created over its HTTP API, then all K
  inputs are sent at once (``POST /api/v1/threads/{id}/inputs``); run by its in-process worker (``serve``) or by
  two worker processes beside it (``serve2``: ``--worker-processes 2 --concurrency ceil(K / 2)``; the CPU counted
  is the server's and its workers').
- **DBOS**: an async workflow per turn on a queue with ``worker_concurrency=K``, one ``@DBOS.step`` per model
  call (the official ``openai`` async client) and one per tool call.
- **LangGraph**: the usual async two-node graph (model node with the ``openai`` client, ``ToolNode``) with
  ``AsyncSqliteSaver`` (WAL, synchronous FULL) or ``AsyncPostgresSaver``, ``durability="sync"``, K concurrent
  ``ainvoke`` calls.

Figures per run: model calls/s over the span from the first call's arrival to the last answer, against the
ideal K / latency; turns/s over the same span; the latency the system adds to an agent step beyond the model's
own (the gap between an answer and the next call of the same conversation, less the tool's own time; p50,
p99); when the last turn made its first call, after the first turn did (the ramp of starting K turns);
process CPU per agent step (user + system of the system's own processes from when they are ready to
when they are done: the fake server, the database server and the driver are not counted); the peak RSS of
its largest process. Ratios jixu/DBOS and jixu/LangGraph of model calls/s. Every run is checked: the server
served exactly K x steps calls, every turn ended with its reply (jixu: every chain verifies, one dispatch
per tool call).

Prints a human table, then one JSON line per figure ``{"bench": "fleet", "metric": ..., "value": ...,
"unit": ...}``. PostgreSQL: ``JIXU_BENCH_POSTGRES_DSN`` or a throwaway server from the ``pgserver`` wheel.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT / "src", ROOT):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

Figure = tuple[str, str, float, str]  # (label, metric, value, unit)
TICK = os.sysconf("SC_CLK_TCK")
ENV_URL, ENV_TOOL, ENV_STREAM, ENV_STEPS = "FLEET_BASE_URL", "FLEET_TOOL_SECONDS", "FLEET_STREAM", "FLEET_STEPS"
ENV_POOLS = "FLEET_HTTP_POOLS"


def openai_client(base_url: str, pools: int) -> Any:
    """The official ``openai.AsyncOpenAI`` for every system; with ``pools`` > 1 its HTTP client spreads the
    requests round robin over that many connection pools (the same for every system).

    One pool's bookkeeping grows with the requests in flight in it (measured here: ~2.7 ms of CPU per call
    alone, ~25 ms each with 300 at once, ~2.6 ms with those 300 spread over 50 pools), so with hundreds of
    calls in flight the HTTP client, not the runtime, sets the pace; ``--http-pools`` shows each system
    without that limit."""
    import openai

    if pools <= 1:
        return openai.AsyncOpenAI(base_url=base_url, api_key="fleet", max_retries=0)
    import itertools

    import httpx2

    class Spread(httpx2.AsyncBaseTransport):
        def __init__(self) -> None:
            limits = httpx2.Limits(max_connections=1000, max_keepalive_connections=1000)
            self.pools = [httpx2.AsyncHTTPTransport(limits=limits) for _ in range(pools)]
            self.next = itertools.cycle(self.pools)

        async def handle_async_request(self, request: Any) -> Any:
            return await next(self.next).handle_async_request(request)

        async def aclose(self) -> None:
            for pool in self.pools:
                await pool.aclose()

    return openai.AsyncOpenAI(base_url=base_url, api_key="fleet", max_retries=0,
                              http_client=httpx2.AsyncClient(transport=Spread(), timeout=60))


# --- the agent jixu's workers run (module-level factory: ``--agent bench.fleet:fleet_agent``) ---------------


def fleet_agent() -> Any:
    """jixu's agent for the fleet: ``OpenAIModel`` on the fake server, one ``unsafe`` tool of ~10 ms."""
    from jixu import Agent, tool
    from jixu.threads.openai import OpenAIModel

    seconds = float(os.environ.get(ENV_TOOL, "0.01"))

    @tool(name="charge", semantics="unsafe")
    async def charge() -> str:
        """Charge the order once (a retry could charge twice)."""
        await asyncio.sleep(seconds)
        return "charged"

    pools = int(os.environ.get(ENV_POOLS, "1"))
    model = OpenAIModel("fake-model", client=openai_client(os.environ[ENV_URL], pools) if pools > 1 else None,
                        base_url=os.environ[ENV_URL], api_key="fleet", stream=os.environ.get(ENV_STREAM, "1") == "1")
    return Agent("fleet", model, tools=[charge], max_steps=int(os.environ.get(ENV_STEPS, "5")) + 2)


# --- peers (each in a child process of the peers' interpreter) --------------------------------------------


def _ready(spec: dict[str, Any]) -> None:
    """Tell the parent this child is set up (its CPU from here on is the run's)."""
    print("READY", flush=True)
    sys.stdin.readline()  # the parent reads our CPU, then says go


async def _model_call(client: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                      stream: bool) -> dict[str, Any]:
    """One Chat Completions call with the official client: the assistant message as a dict."""
    if not stream:
        completion = await client.chat.completions.create(model="fake-model", messages=messages, tools=tools)
        message = completion.choices[0].message
        calls = [{"id": c.id, "type": "function", "function": {"name": c.function.name,
                                                               "arguments": c.function.arguments}}
                 for c in message.tool_calls or []]
        return {"role": "assistant", "content": message.content, **({"tool_calls": calls} if calls else {})}
    chunks = await client.chat.completions.create(model="fake-model", messages=messages, tools=tools, stream=True,
                                                  stream_options={"include_usage": True})
    text: list[str] = []
    slots: dict[int, dict[str, Any]] = {}
    async for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if delta.content:
            text.append(delta.content)
        for part in delta.tool_calls or []:
            slot = slots.setdefault(part.index, {"id": None, "name": "", "arguments": ""})
            slot["id"] = part.id or slot["id"]
            if part.function is not None:
                slot["name"] += part.function.name or ""
                slot["arguments"] += part.function.arguments or ""
    calls = [{"id": s["id"], "type": "function", "function": {"name": s["name"], "arguments": s["arguments"]}}
             for _i, s in sorted(slots.items())]
    return {"role": "assistant", "content": "".join(text) or None, **({"tool_calls": calls} if calls else {})}


TOOLS = [{"type": "function", "function": {"name": "charge", "description": "Charge the order once.",
                                           "parameters": {"type": "object", "properties": {}}}}]


def run_dbos(spec: dict[str, Any]) -> dict[str, Any]:
    from dbos import DBOS

    k, seconds, stream = int(spec["k"]), float(spec["tool_seconds"]), bool(spec["stream"])
    client = openai_client(spec["base_url"], int(spec["pools"]))
    DBOS(config={"name": "jixu-bench-fleet", "system_database_url": spec["url"]})

    @DBOS.step()
    async def model_step(messages: list[dict[str, Any]]) -> dict[str, Any]:
        return await _model_call(client, messages, TOOLS, stream)

    @DBOS.step()
    async def tool_step(call_id: str) -> str:
        await asyncio.sleep(seconds)
        return "charged"

    @DBOS.workflow()
    async def agent(task: str) -> str:
        messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
        while True:
            reply = await model_step(messages)
            messages.append(reply)
            if not reply.get("tool_calls"):
                return str(reply["content"])
            for call in reply["tool_calls"]:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": await tool_step(call["id"])})

    DBOS.launch()
    queue = DBOS.register_queue("fleet", worker_concurrency=k)

    async def main() -> list[str]:
        handles = [await queue.enqueue_async(agent, f"task {i}") for i in range(k)]
        return [await handle.get_result() for handle in handles]

    try:
        _ready(spec)
        replies = asyncio.run(main())
    finally:
        DBOS.destroy()
    from importlib.metadata import version
    return {"replies": replies, "version": version("dbos")}


def run_langgraph(spec: dict[str, Any]) -> dict[str, Any]:
    from importlib.metadata import version
    from typing import Annotated, TypedDict

    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool as lc_tool
    from langgraph.graph import END, START, StateGraph
    from langgraph.graph.message import add_messages
    from langgraph.prebuilt import ToolNode, tools_condition

    k, seconds, stream = int(spec["k"]), float(spec["tool_seconds"]), bool(spec["stream"])
    client = openai_client(spec["base_url"], int(spec["pools"]))

    @lc_tool
    async def charge() -> str:
        """Charge the order once."""
        await asyncio.sleep(seconds)
        return "charged"

    AgentState = TypedDict("AgentState", {"messages": Annotated[list[BaseMessage], add_messages]})  # noqa: UP013

    def as_openai(message: BaseMessage) -> dict[str, Any]:
        if isinstance(message, HumanMessage):
            return {"role": "user", "content": message.content}
        if isinstance(message, ToolMessage):
            return {"role": "tool", "tool_call_id": message.tool_call_id, "content": str(message.content)}
        assert isinstance(message, AIMessage)
        calls = [{"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": json.dumps(c["args"])}}
                 for c in message.tool_calls]
        return {"role": "assistant", "content": message.content or None, **({"tool_calls": calls} if calls else {})}

    async def model(state: AgentState) -> dict[str, Any]:
        reply = await _model_call(client, [as_openai(m) for m in state["messages"]], TOOLS, stream)
        calls = [{"name": c["function"]["name"], "args": json.loads(c["function"]["arguments"] or "{}"), "id": c["id"]}
                 for c in reply.get("tool_calls", [])]
        return {"messages": [AIMessage(content=reply["content"] or "", tool_calls=calls)]}

    graph = StateGraph(AgentState)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([charge]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition, ["tools", END])
    graph.add_edge("tools", "model")

    async def drive(saver: Any) -> list[str]:
        app = graph.compile(checkpointer=saver)

        async def one(i: int) -> str:
            out = await app.ainvoke({"messages": [HumanMessage(content=f"task {i}")]},
                                    {"configurable": {"thread_id": f"fleet-{i}"}, "recursion_limit": 50},
                                    durability="sync")
            return str(out["messages"][-1].content)

        return await asyncio.gather(*(one(i) for i in range(k)))

    async def main() -> tuple[list[str], str, str]:
        url = spec["url"]
        if url.startswith("sqlite:///"):
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

            async with AsyncSqliteSaver.from_conn_string(url.removeprefix("sqlite:///")) as saver:
                await saver.setup()
                await saver.conn.execute("PRAGMA synchronous = FULL")
                async with saver.conn.execute("PRAGMA journal_mode") as cursor:
                    mode = (await cursor.fetchone())[0]
                async with saver.conn.execute("PRAGMA synchronous") as cursor:
                    sync = (await cursor.fetchone())[0]
                _ready(spec)
                return await drive(saver), f"journal_mode={mode} synchronous={sync}", "langgraph-checkpoint-sqlite"
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        from psycopg_pool import AsyncConnectionPool

        async with AsyncConnectionPool(url, max_size=20, kwargs={"autocommit": True, "prepare_threshold": 0},
                                       open=False) as pool:
            saver = AsyncPostgresSaver(pool)
            await saver.setup()
            _ready(spec)
            return await drive(saver), "pool max_size=20", "langgraph-checkpoint-postgres"

    replies, notes, package = asyncio.run(main())
    return {"replies": replies, "notes": notes,
            "version": f"{version('langgraph')} ({package} {version(package)})"}


def child_main(spec: dict[str, Any]) -> None:
    runner = {"dbos": run_dbos, "langgraph": run_langgraph}[spec["kind"]]
    result = runner(spec)
    print("RESULT " + json.dumps(result), flush=True)


# --- measuring processes ----------------------------------------------------------------------------------


def cpu_of(pid: int) -> float:
    """User + system CPU seconds of a running process so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def peak_rss_of(pid: int) -> float:
    """The peak resident set (VmHWM) of a running process, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Process:
    """A measured child: its output lines, its CPU from when it is ready, its peak RSS at its end."""

    def __init__(self, args: list[str], env: dict[str, str], ready: str, stdin: bool = False) -> None:
        self.popen = subprocess.Popen(args, env=env, cwd=ROOT, text=True, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, stdin=subprocess.PIPE if stdin else None)
        self.lines: list[str] = []
        self.ready_text = ready
        self.is_ready = threading.Event()
        self.base_cpu = 0.0
        self.cpu = 0.0
        self.rss_mb = 0.0
        self.code: int | None = None
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            if not self.is_ready.is_set() and self.ready_text in line:
                with contextlib.suppress(OSError):
                    self.base_cpu = cpu_of(self.popen.pid)
                self.is_ready.set()
            self.lines.append(line.rstrip("\n"))

    def wait_ready(self, timeout: float = 60) -> None:
        if not self.is_ready.wait(timeout):
            raise SystemExit(f"{self.popen.args[:4]} did not get ready:\n" + "\n".join(self.lines[-30:]))

    def go(self) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write("go\n")
        self.popen.stdin.flush()

    def sample(self) -> None:
        """CPU and peak RSS now (for a process that goes on running afterwards)."""
        self.cpu = cpu_of(self.popen.pid) - self.base_cpu
        self.rss_mb = peak_rss_of(self.popen.pid)

    def reap(self, timeout: float = 600) -> int:
        """Wait for the end (os.wait4: its CPU and peak RSS)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                pid, status, usage = os.wait4(self.popen.pid, os.WNOHANG)
            except ChildProcessError:  # already reaped (by Popen itself): no usage figures to read
                self.code = self.popen.wait()
                self.reader.join(10)
                return self.code
            if pid:
                break
            if time.monotonic() > deadline:
                self.popen.kill()
                raise SystemExit(f"{self.popen.args[:4]} did not finish:\n" + "\n".join(self.lines[-30:]))
            time.sleep(0.02)
        self.popen.returncode = self.code = os.waitstatus_to_exitcode(status)
        if not self.cpu:
            self.cpu = usage.ru_utime + usage.ru_stime - self.base_cpu
            self.rss_mb = usage.ru_maxrss / 1024
        self.reader.join(10)
        return self.code

    def result(self) -> dict[str, Any]:
        found = [line for line in self.lines if line.startswith("RESULT ")]
        if self.code != 0 or not found:
            raise SystemExit(f"child failed ({self.code}):\n" + "\n".join(self.lines[-40:]))
        data: dict[str, Any] = json.loads(found[-1].removeprefix("RESULT "))
        return data


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")] if p)
    env.update(extra or {})
    return env


# --- the fake model server ----------------------------------------------------------------------------------


class FakeServer:
    def __init__(self, latency: float, jitter: float, steps: int) -> None:
        self.process = subprocess.Popen([sys.executable, str(ROOT / "bench" / "fake_openai.py"), "--latency",
                                         str(latency), "--jitter", str(jitter), "--steps", str(steps)],
                                        stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        self.port = int(line.split()[1])
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def _call(self, method: str, path: str) -> dict[str, Any]:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", method=method,
                                         data=b"{}" if method == "POST" else None)
        with urllib.request.urlopen(request, timeout=30) as answer:
            data: dict[str, Any] = json.loads(answer.read())
            return data

    def reset(self) -> None:
        self._call("POST", "/stats/reset")

    def stats(self) -> dict[str, Any]:
        return self._call("GET", "/stats")

    def close(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(10)


# --- the runs ---------------------------------------------------------------------------------------------------


def queue_fleet(url: str, k: int) -> list[str]:
    """K threads of the fleet agent, each with one queued turn; their ids."""
    from jixu.ledger import open_store
    from jixu.scheduling import create_thread_for, submit_turn

    agent = fleet_agent()
    store = open_store(url)
    try:
        threads = [create_thread_for(store, agent, project="fleet") for _ in range(k)]
        for i, thread_id in enumerate(threads):
            submit_turn(store, thread_id, f"task {i}")
        return threads
    finally:
        store.close()


def check_jixu(url: str, threads: list[str], steps: int) -> dict[str, int]:
    """Every turn ended with its reply, one dispatch per tool call, every chain valid."""
    from jixu.ledger import open_store

    faults = {"unfinished": 0, "dispatch_mismatch": 0, "invalid_chains": 0, "claimed_left": 0}
    store = open_store(url)
    try:
        for thread_id in threads:
            events = store.read(f"thread/{thread_id}")
            ended = [e for e in events if e.type == "turn.ended"]
            if [e.data.get("outcome") for e in ended] != ["completed"]:
                faults["unfinished"] += 1
            if len([e for e in events if e.type == "tool.dispatched"]) != steps - 1:
                faults["dispatch_mismatch"] += 1
            if not store.verify(f"thread/{thread_id}").valid:
                faults["invalid_chains"] += 1
        faults["claimed_left"] = len(store.list_work(state="claimed"))
    finally:
        store.close()
    return faults


def run_jixu_workers(args: argparse.Namespace, server: FakeServer, url: str, k: int, processes: int) -> dict[str, Any]:
    threads = queue_fleet(url, k)
    server.reset()
    concurrency = math.ceil(k / processes)
    workers = [Process([sys.executable, "-m", "jixu", "worker", "--store", url, "--agent", "bench.fleet:fleet_agent",
                        "--owner", f"fleet-{i}", "--concurrency", str(concurrency), "--exit-when-idle", "--quiet",
                        "--poll-interval", "0.05"], child_env(), ready="started on")
               for i in range(1, processes + 1)]
    for worker in workers:
        worker.wait_ready()
    codes = [worker.reap() for worker in workers]
    if any(codes):
        raise SystemExit("a worker failed:\n" + "\n".join(line for w in workers for line in w.lines[-20:]))
    stats = server.stats()
    return {"stats": stats, "cpu": sum(w.cpu for w in workers), "rss_mb": max(w.rss_mb for w in workers),
            "faults": check_jixu(url, threads, args.steps), "notes": f"{processes} x --concurrency {concurrency}"}


def children_of(pid: int) -> list[int]:
    """The process ids of ``pid``'s children (Linux /proc)."""
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


DRIVER_CLIENTS = 10
DRIVER_CONNECTIONS = 10
"""How the serve runs' driver spreads its 100 requests in flight (see ``run_jixu_serve``)."""


def run_jixu_serve(args: argparse.Namespace, server: FakeServer, url: str, k: int,
                   processes: int = 0) -> dict[str, Any]:
    import httpx

    from jixu.ledger import open_store
    from jixu.server.auth import create_token

    with open_store(url) as store:
        _info, token = create_token(store, "fleet", roles={"fleet": "editor"}, actor="bench")
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    concurrency = math.ceil(k / processes) if processes else k
    serve = Process([sys.executable, "-m", "jixu", "serve", "--store", url, "--agent", "bench.fleet:fleet_agent",
                     "--concurrency", str(concurrency), "--port", str(port), "--owner", "fleet-serve",
                     "--worker-processes", str(processes)], child_env(),
                    ready="Application startup complete")
    workers: list[int] = []

    def cpu_now() -> float:  # the server's process and its worker processes
        return cpu_of(serve.popen.pid) + sum(cpu_of(pid) for pid in workers)

    try:
        serve.wait_ready()
        workers = children_of(serve.popen.pid)
        if len(workers) != processes:
            raise SystemExit(f"jixu serve has {len(workers)} worker processes, expected {processes}")
        base = f"http://127.0.0.1:{port}/api/v1"

        async def drive() -> list[str]:
            # 100 requests in flight over DRIVER_CLIENTS clients of DRIVER_CONNECTIONS connections each: one httpx
            # client with 100 connections spent ~8.7 ms of this process's CPU per request (its pool's work grows
            # with its connections), 106 requests/s for any endpoint, so the driver, not the server, was measured.
            limits = httpx.Limits(max_connections=DRIVER_CONNECTIONS)
            clients = [httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"}, limits=limits,
                                         timeout=120) for _ in range(DRIVER_CLIENTS)]
            try:
                gates = [asyncio.Semaphore(DRIVER_CONNECTIONS) for _ in clients]

                async def create(i: int) -> str:
                    async with gates[i % DRIVER_CLIENTS]:
                        made = await clients[i % DRIVER_CLIENTS].post("/threads", json={"project": "fleet"})
                        made.raise_for_status()
                        return str(made.json()["thread_id"])

                threads = await asyncio.gather(*(create(i) for i in range(k)))
                server.reset()
                serve.base_cpu = cpu_now()

                async def send(i: int, thread_id: str) -> None:
                    async with gates[i % DRIVER_CLIENTS]:
                        sent = await clients[i % DRIVER_CLIENTS].post(f"/threads/{thread_id}/inputs",
                                                                      json={"input": f"task {i}"})
                        if sent.status_code != 202:
                            raise SystemExit(f"send {sent.status_code}: {sent.text[:300]}")

                started = time.monotonic()
                await asyncio.gather(*(send(i, t) for i, t in enumerate(threads)))
                inputs_seconds.append(time.monotonic() - started)
                return list(threads)
            finally:
                for client in clients:
                    await client.aclose()

        inputs_seconds: list[float] = []
        threads = asyncio.run(drive())
        expected = k * args.steps
        deadline = time.monotonic() + 300
        with open_store(url) as store:
            while True:
                done = len(store.list_work(state="done"))
                if done >= k or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        stats = server.stats()
        if stats["requests"] != expected:
            print(f"warning: serve run: {stats['requests']} model calls, expected {expected}", file=sys.stderr)
        serve.sample()
        serve.cpu = cpu_now() - serve.base_cpu
        serve.rss_mb = max([serve.rss_mb, *(peak_rss_of(pid) for pid in workers)])
    finally:
        serve.popen.send_signal(signal.SIGTERM)
        serve.reap()
    notes = f"{processes} worker processes x --concurrency {concurrency}" if processes else f"--concurrency {k}"
    return {"stats": stats, "cpu": serve.cpu, "rss_mb": serve.rss_mb, "faults": check_jixu(url, threads, args.steps),
            "notes": notes, "inputs_seconds": inputs_seconds[0]}


def run_peer(args: argparse.Namespace, server: FakeServer, kind: str, url: str, k: int) -> dict[str, Any]:
    spec = {"kind": kind, "url": url, "k": k, "base_url": server.base_url, "tool_seconds": args.tool_seconds,
            "stream": args.stream, "pools": args.http_pools}
    server.reset()
    child = Process([sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)], child_env(),
                    ready="READY", stdin=True)
    child.wait_ready(120)
    child.go()
    child.reap()
    result = child.result()
    stats = server.stats()
    expected = f"done after {args.steps} calls"
    wrong = sum(1 for reply in result["replies"] if reply != expected)
    return {"stats": stats, "cpu": child.cpu, "rss_mb": child.rss_mb, "faults": {"wrong_replies": wrong},
            "notes": result.get("notes", ""), "version": result.get("version", "")}


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def figures_of(label: str, run: dict[str, Any], k: int, args: argparse.Namespace) -> list[Figure]:
    stats = run["stats"]
    calls = int(stats["requests"])
    span = float(stats["last_answer"]) - float(stats["first_request"])
    ideal = k / args.latency
    added = [(gap - args.tool_seconds) * 1000 for gap in stats["gaps"]]
    figures: list[Figure] = [
        (label, "model_calls_per_s", calls / span, "calls/s"),
        (label, "ideal_fraction", 100 * calls / span / ideal, "% of ideal"),
        (label, "turns_per_s", k / span, "turns/s"),
        (label, "added_latency_p50", percentile(added, 0.5), "ms/step"),
        (label, "added_latency_p99", percentile(added, 0.99), "ms/step"),
        # When the last of the K turns made its first call, after the first one did: the ramp of starting them.
        (label, "last_first_call", 1000 * (float(stats["first_calls"][-1]) - float(stats["first_request"])), "ms"),
        (label, "cpu_per_step", 1000 * run["cpu"] / calls, "ms CPU/step"),
        (label, "peak_rss", run["rss_mb"], "MB"),
        (label, "model_calls", calls, "calls"),
        (label, "connections_per_call", int(stats.get("connections", 0)) / max(1, calls), "connections/call"),
    ]
    bad = sum(run["faults"].values()) + (calls != k * args.steps)
    if "inputs_seconds" in run:  # jixu serve: how long the K input POSTs took to be answered
        figures.append((label, "inputs_sent_in", run["inputs_seconds"], "s"))
    figures.append((label, "faults", bad, "faults"))
    if bad:
        print(f"warning: {label}: faults {run['faults']}, {calls} calls (expected {k * args.steps})", file=sys.stderr)
    return figures


def metric_name(label: str, metric: str) -> str:
    return f"{label.replace(' ', '_').replace(',', '').replace('/', '_')}_{metric}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--k", default="100,500", help="concurrent turns per run, comma-separated (e.g. 100,500,1000)")
    parser.add_argument("--latency", type=float, default=1.0, help="the model's latency in seconds")
    parser.add_argument("--jitter", type=float, default=0.02, help="latency jitter, a fraction of it")
    parser.add_argument("--steps", type=int, default=5, help="model calls per turn (all but the last call a tool)")
    parser.add_argument("--tool-seconds", type=float, default=0.01, help="the tool's own time")
    parser.add_argument("--no-stream", dest="stream", action="store_false", help="unstreamed model calls")
    parser.add_argument("--http-pools", type=int, default=1,
                        help="connection pools of each system's openai client (1: the SDK's default client)")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--systems", default="jixu,jixu2,serve,serve2,dbos,langgraph",
                        help="jixu (one worker), jixu2 (two workers), serve (its worker in the server's process), "
                             "serve2 (jixu serve --worker-processes 2), dbos, langgraph")
    args = parser.parse_args(argv)
    if args.child:
        child_main(json.loads(args.child))
        return 0
    os.environ.setdefault(ENV_TOOL, str(args.tool_seconds))
    os.environ[ENV_STREAM] = "1" if args.stream else "0"
    os.environ[ENV_STEPS] = str(args.steps)
    os.environ[ENV_POOLS] = str(args.http_pools)
    from bench.compare import cpu_model, fresh_database, postgres

    sizes = [int(k) for k in args.k.split(",")]
    systems = args.systems.split(",")
    backends = args.backends.split(",")
    server = FakeServer(args.latency, args.jitter, args.steps)
    os.environ[ENV_URL] = server.base_url
    figures: list[Figure] = []
    notes: list[str] = []
    started = time.time()
    workdir = Path(tempfile.mkdtemp(prefix="jixu-fleet-"))
    counter = iter(range(1, 10_000))
    try:
        with contextlib.ExitStack() as stack:
            dsn = stack.enter_context(postgres())[0] if "postgres" in backends else ""
            for k in sizes:
                for backend in backends:
                    def url(backend: str = backend) -> str:
                        n = next(counter)
                        if backend == "sqlite":
                            return f"sqlite:///{workdir / f'fleet-{n}.db'}"
                        return fresh_database(dsn, f"jixu_fleet_{n}")

                    per_system: dict[str, list[Figure]] = {}
                    for system in systems:
                        label = f"K={k} {backend} {system}"
                        if system == "jixu":
                            run = run_jixu_workers(args, server, url(), k, 1)
                        elif system == "jixu2":
                            run = run_jixu_workers(args, server, url(), k, 2)
                        elif system in ("serve", "serve2"):
                            if backend != "sqlite" and "sqlite" in backends:
                                continue  # the HTTP path once per size, on the embedded store
                            run = run_jixu_serve(args, server, url(), k, 2 if system == "serve2" else 0)
                        else:
                            run = run_peer(args, server, system, url(), k)
                        if run.get("notes") or run.get("version"):
                            notes.append(f"{label}: {run.get('version', '')} {run.get('notes', '')}".strip())
                        found = figures_of(label, run, k, args)
                        per_system[system] = found
                        figures += found
                        print(f"{label}: " + ", ".join(f"{m} {v:,.2f}" for _l, m, v, _u in found[:7]),
                              file=sys.stderr, flush=True)
                    rate = {s: next(v for _l, m, v, _u in f if m == "model_calls_per_s") for s, f in per_system.items()}
                    for mine in ("jixu", "jixu2"):
                        for peer in ("dbos", "langgraph"):
                            if mine in rate and peer in rate:
                                figures.append((f"K={k} {backend}", f"ratio_{mine}_{peer}", rate[mine] / rate[peer],
                                                "x"))
    finally:
        server.close()
    import platform
    import sqlite3

    print(f"jixu fleet benchmark - {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          f"{time.time() - started:.0f}s")
    print(f"machine: nproc {os.cpu_count()}, CPU {cpu_model()}, Python {platform.python_version()}, "
          f"SQLite {sqlite3.sqlite_version}")
    print(f"model latency {args.latency:g}s (jitter ±{100 * args.jitter:g}%), {args.steps} model calls per turn "
          f"({args.steps - 1} tool calls of {1000 * args.tool_seconds:g} ms), streamed: {args.stream}, "
          f"HTTP pools per client: {args.http_pools}")
    for note in notes:
        print(f"  {note}")
    width = max(len(f"{label}: {metric}") for label, metric, _v, _u in figures)
    for label, metric, value, unit in figures:
        print(f"{label + ': ' + metric:<{width}}  {value:>12,.2f}  {unit}")
    for label, metric, value, unit in figures:
        print(json.dumps({"bench": "fleet", "metric": metric_name(label, metric), "value": round(value, 4),
                          "unit": unit}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
