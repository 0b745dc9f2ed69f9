"""Side-by-side benchmark: the same durable agent workload on jixu, DBOS and LangGraph, SQLite and PostgreSQL.

Exact command (from the repository root; the peers live only in this gitignored venv, never in jixu's
dependencies)::

    python3 -m venv bench/.venv-peers
    bench/.venv-peers/bin/pip install dbos langgraph langgraph-checkpoint-sqlite \\
        langgraph-checkpoint-postgres "psycopg[binary]" pgserver pyinstrument py-spy
    bench/.venv-peers/bin/pip install -e .
    bench/.venv-peers/bin/python bench/compare.py            # add --write-docs to regenerate docs/performance.md

Workload: N agent steps (``--steps``, default 200), each one scripted model call followed by one tool call;
variant A a no-op tool, variant B a tool that sleeps 1 ms. Every system runs it in a fresh subprocess of the
same interpreter, ``--reps`` times, interleaved (jixu, DBOS, LangGraph, jixu, ...), so drift in the shared
machine hits all of them alike:

- jixu: one thread, ``ScriptedModel`` calling the tool N times in one turn. Every model and tool call is an
  effect with intent, dispatch marker and receipt (6 hash-chained events per agent step), SQLite WAL with
  ``synchronous=FULL`` (the default), or PostgreSQL. The no-op tool (A) is an ``async def``: it has nothing
  to block on, so jixu runs it on its event loop (DBOS too runs its step inline); the 1 ms tool (B) is a
  blocking ``def``, which jixu runs in a worker thread. ``jixu_def`` (A only) is jixu with the no-op as a
  plain ``def``, so the cost of that worker-thread hop is shown as well.
- DBOS: one workflow; per agent step one ``@DBOS.step`` for the model call and one for the tool call.
  DBOS's own defaults for its system database (on SQLite: rollback journal, SQLite's default
  ``synchronous=FULL``).
- LangGraph: the usual two-node agent graph (model node, ``ToolNode``; ``tools_condition``) with
  ``SqliteSaver`` (its WAL; ``synchronous=FULL`` set explicitly) or ``PostgresSaver``, invoked with
  ``durability="sync"`` (every super-step's checkpoint is committed before the next step starts; the
  default ``"async"`` would let a step run before the previous checkpoint is durable).

Per-agent-step latency is the gap between consecutive model calls (so it contains one model call, one tool
call and all the bookkeeping between them); agent steps/s is N / (time of the whole run). Ratios are
jixu/peer of steps/s (higher is better for jixu).

The concurrency figure: K = 1, 8, 64 jixu threads in one process on one SQLite store (FULL), each driven by
its own OS thread and event loop, each running ``--concurrent-steps`` agent steps with the no-op tool
(``async def``); total durable tool calls per second; and the same threads on one event loop (the library:
one Harness, commits shared by the kernel's one commit path, decision 0024), also with the no-op as a plain
``def`` for the largest K. For the largest K, the path ``jixu worker`` runs: K queued turns run by one
``Worker`` with ``--concurrency K``, and by ``--processes`` workers with ``--concurrency K/processes`` each on
the same file, started together; repeated ``--reps`` times, interleaved, reported as median, lowest and
highest.

Recovery figures (SQLite): ``open_thread`` of a ~100k-event thread with a checkpoint, replay throughput,
verify throughput, the state's memory (tracemalloc of the projected state of that thread).

PostgreSQL: ``JIXU_BENCH_POSTGRES_DSN`` or a throwaway server from the ``pgserver`` wheel.

Prints a human table, then one JSON line per figure ``{"bench": "compare", "metric": ..., "value": ...,
"unit": ...}``. ``--write-docs`` rewrites the figures section of docs/performance.md from this run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

Figure = tuple[str, str, float, str]  # (label, metric, value, unit)
SYSTEMS = ("jixu", "dbos", "langgraph")
VARIANTS = {"A": 0.0, "B": 0.001}  # tool duration in seconds
JIXU_TOOL = {"A": "async", "B": "def"}
"""jixu's form of each variant's tool: the no-op as ``async def`` (nothing to block on, so it runs on jixu's
event loop, as DBOS runs its step inline), the 1 ms sleep as a blocking ``def`` (jixu runs every plain ``def``
tool in a worker thread, as LangGraph's ToolNode does). Variant A also runs ``jixu_def``: the same no-op as a
plain ``def``, so the worker-thread hop is measured and shown too."""
EXTRA = {"A": ("jixu_def",), "B": ()}
DOC = ROOT / "docs" / "performance.md"
BEGIN_MARK = "<!-- compare.py figures: begin -->"
END_MARK = "<!-- compare.py figures: end -->"


# --- one measured run (executed in a child process) -----------------------------------------------------


def _tool_work(seconds: float) -> None:
    if seconds:
        time.sleep(seconds)


def _gaps_ms(stamps: list[float]) -> list[float]:
    return [(b - a) * 1000 for a, b in itertools.pairwise(stamps)]


def jixu_tool(tool_seconds: float, kind: str) -> Any:
    """The benchmark's tool for jixu: ``async`` (run on the event loop) or ``def`` (run in a worker thread)."""
    from jixu import tool

    if kind == "async":
        @tool(name="work", semantics="read_only")
        async def work_async() -> None:
            """The benchmark's tool."""
            if tool_seconds:
                await asyncio.sleep(tool_seconds)

        return work_async
    if kind != "def":
        raise SystemExit(f"unknown tool kind {kind!r}")

    @tool(name="work", semantics="read_only")
    def work_def() -> None:
        """The benchmark's tool."""
        _tool_work(tool_seconds)

    return work_def


def run_jixu(url: str, steps: int, tool_seconds: float, tool_kind: str = "def") -> dict[str, Any]:
    from jixu import Agent, Harness, ScriptedModel, ToolCall
    from jixu.ledger import open_store

    stamps: list[float] = []
    work = jixu_tool(tool_seconds, tool_kind)

    def script(messages: list[dict[str, Any]]) -> Any:
        stamps.append(time.perf_counter())
        # The conversation is [user, (assistant, tool) x done]: steps done read off its length in O(1), as
        # DBOS's model step gets its counters (a scan back to the user message grows with the run).
        done = (len(messages) - 1) // 2
        return ToolCall("work") if done < steps else "done"

    async def main() -> float:
        store = open_store(url)
        try:
            harness = Harness(Agent("bench-compare", ScriptedModel(script, keep_calls=False), tools=[work], max_steps=steps + 1),
                              store)
            thread = await harness.create_thread()
            commits_before = getattr(store, "commit_count", None)
            start = time.perf_counter()
            await thread.send("go")
            state = await thread.wait()
            elapsed = time.perf_counter() - start
            if state.status != "idle" or state.last_reply != "done":
                raise SystemExit(f"jixu run did not finish: {state.status} {state.reason}")
            if commits_before is not None:
                commits.append(int(getattr(store, "commit_count", 0)) - commits_before)
            return elapsed
        finally:
            store.close()

    commits: list[int] = []
    elapsed = asyncio.run(main())
    from importlib.metadata import version
    return {"version": version("jixu"), "elapsed": elapsed, "gaps_ms": _gaps_ms(stamps[:steps + 1]),
            "commits_per_step": commits[0] / steps if commits else None}


def run_dbos(url: str, steps: int, tool_seconds: float) -> dict[str, Any]:
    from importlib.metadata import version

    from dbos import DBOS

    DBOS(config={"name": "jixu-bench-compare", "system_database_url": url})
    stamps: list[float] = []

    @DBOS.step()
    def model_step(messages: int, done: int) -> dict[str, Any]:
        stamps.append(time.perf_counter())
        if done < steps:
            return {"text": None, "tool_calls": [{"id": f"call_{done}", "name": "work", "args": {}}]}
        return {"text": "done", "tool_calls": []}

    @DBOS.step()
    def tool_step(call_id: str) -> dict[str, Any]:
        _tool_work(tool_seconds)
        return {"tool_call_id": call_id, "content": "null"}

    @DBOS.workflow()
    def agent(prompt: str) -> str:
        messages = 1
        done = 0
        while True:
            reply = model_step(messages, done)
            messages += 1
            if not reply["tool_calls"]:
                return str(reply["text"])
            for call in reply["tool_calls"]:
                tool_step(call["id"])
                messages += 1
            done += 1

    DBOS.launch()
    try:
        start = time.perf_counter()
        result = agent("go")
        elapsed = time.perf_counter() - start
        if result != "done":
            raise SystemExit(f"DBOS run returned {result!r}")
    finally:
        DBOS.destroy()
    return {"version": version("dbos"), "elapsed": elapsed, "gaps_ms": _gaps_ms(stamps)}


def run_langgraph(url: str, steps: int, tool_seconds: float) -> dict[str, Any]:
    from importlib.metadata import version
    from typing import Annotated, TypedDict

    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
    from langchain_core.tools import tool as lc_tool
    from langgraph.graph import END, START, StateGraph
    from langgraph.graph.message import add_messages
    from langgraph.prebuilt import ToolNode, tools_condition

    stamps: list[float] = []

    @lc_tool
    def work() -> None:
        """The benchmark's tool."""
        _tool_work(tool_seconds)

    # Functional form: this module's postponed annotations could not see these local imports.
    AgentState = TypedDict("AgentState", {"messages": Annotated[list[BaseMessage], add_messages]})  # noqa: UP013

    def model(state: AgentState) -> dict[str, Any]:
        stamps.append(time.perf_counter())
        done = (len(state["messages"]) - 1) // 2  # [human, (AI, tool) x done], as in run_jixu
        if done < steps:
            return {"messages": [AIMessage(content="", tool_calls=[{"name": "work", "args": {},
                                                                    "id": f"call_{done}"}])]}
        return {"messages": [AIMessage(content="done")]}

    graph = StateGraph(AgentState)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([work]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition, ["tools", END])
    graph.add_edge("tools", "model")

    def run(saver: Any) -> tuple[float, str]:
        app = graph.compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "bench-1"}, "recursion_limit": 2 * steps + 10}
        start = time.perf_counter()
        out = app.invoke({"messages": [HumanMessage(content="go")]}, config, durability="sync")
        return time.perf_counter() - start, str(out["messages"][-1].content)

    notes = ""
    if url.startswith("sqlite:///"):
        import sqlite3

        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(url.removeprefix("sqlite:///"), check_same_thread=False)
        saver = SqliteSaver(conn)
        saver.setup()
        conn.execute("PRAGMA synchronous = FULL")
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        sync = conn.execute("PRAGMA synchronous").fetchone()[0]
        notes = f"journal_mode={mode} synchronous={sync}"
        try:
            elapsed, reply = run(saver)
        finally:
            conn.close()
        package = "langgraph-checkpoint-sqlite"
    else:
        from langgraph.checkpoint.postgres import PostgresSaver

        with PostgresSaver.from_conn_string(url) as saver:
            saver.setup()
            elapsed, reply = run(saver)
        package = "langgraph-checkpoint-postgres"
    if reply != "done":
        raise SystemExit(f"LangGraph run ended with {reply!r}")
    return {"version": f"{version('langgraph')} ({package} {version(package)})", "elapsed": elapsed,
            "gaps_ms": _gaps_ms(stamps), "notes": notes}


def concurrent_agent(steps: int, tool_kind: str = "async") -> Any:
    """The concurrency runs' agent: ``steps`` no-op read-only tool calls, then ``done``."""
    from jixu import Agent, ScriptedModel, ToolCall

    work = jixu_tool(0.0, tool_kind)

    def script(messages: list[dict[str, Any]]) -> Any:
        done = (len(messages) - 1) // 2  # [user, (assistant, tool) x done], as in run_jixu
        return ToolCall("work") if done < steps else "done"

    return Agent("bench-concurrent", ScriptedModel(script, keep_calls=False), tools=[work], max_steps=steps + 1)


def run_concurrent(path: str, threads: int, steps: int, tool_kind: str = "async") -> dict[str, Any]:
    """``threads`` jixu threads on one SQLite store, each on its own OS thread + event loop."""
    from jixu import Harness
    from jixu.ledger import SQLiteStore

    store = SQLiteStore(path, synchronous="FULL")
    agent = concurrent_agent(steps, tool_kind)
    ready = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    def drive() -> None:
        async def main() -> None:
            harness = Harness(agent, store)
            thread = await harness.create_thread()
            ready.wait()
            await thread.send("go")
            state = await thread.wait()
            if state.status != "idle" or state.last_reply != "done":
                raise RuntimeError(f"thread ended {state.status} {state.reason}")

        try:
            asyncio.run(main())
        except BaseException as exc:  # reported by the parent
            errors.append(exc)
            with contextlib.suppress(threading.BrokenBarrierError):
                ready.abort()

    workers = [threading.Thread(target=drive) for _ in range(threads)]
    for worker in workers:
        worker.start()
    ready.wait()
    start = time.perf_counter()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - start
    commits = getattr(store, "commit_count", None)
    appends = getattr(store, "append_count", None)
    store.close()
    if errors:
        raise SystemExit(f"concurrent run failed: {errors[0]!r}")
    return {"elapsed": elapsed, "tool_calls": threads * steps, "commits": commits, "appends": appends}


def run_concurrent_loop(path: str, threads: int, steps: int, tool_kind: str = "async") -> dict[str, Any]:
    """``threads`` jixu threads on one event loop, one Harness (one SQLite store): their commits are shared."""
    from jixu import Harness
    from jixu.ledger import SQLiteStore

    store = SQLiteStore(path, synchronous="FULL")
    agent = concurrent_agent(steps, tool_kind)

    async def main() -> tuple[float, float, float, int, int]:
        harness = Harness(agent, store)
        made = [await harness.create_thread() for _ in range(threads)]
        started = time.time()
        start = time.perf_counter()
        # All turns start together (their turn.started events share one commit), as concurrent work would.
        await asyncio.gather(*(thread.send("go") for thread in made))
        states = await asyncio.gather(*(thread.wait() for thread in made))
        elapsed = time.perf_counter() - start
        bad = [s for s in states if s.status != "idle" or s.last_reply != "done"]
        if bad:
            raise SystemExit(f"a thread ended {bad[0].status} {bad[0].reason}")
        # Direct and batched appends alike.
        return elapsed, started, started + elapsed, store.commit_count, store.append_count

    try:
        elapsed, started, ended, commits, appends = asyncio.run(main())
    finally:
        store.close()
    return {"elapsed": elapsed, "started": started, "ended": ended, "tool_calls": threads * steps,
            "commits": commits, "appends": appends}


def queue_turns(path: str, threads: int, steps: int) -> None:
    """``threads`` threads of the concurrency agent with a queued turn each, in the work queue of ``path``."""
    from jixu.ledger import SQLiteStore
    from jixu.scheduling import create_thread_for, submit_turn

    store = SQLiteStore(path, synchronous="FULL")
    try:
        agent = concurrent_agent(steps)
        for _ in range(threads):
            submit_turn(store, create_thread_for(store, agent), "go")
    finally:
        store.close()


def run_worker(path: str, steps: int, concurrency: int, owner: str, start_at: float | None = None) -> dict[str, Any]:
    """The ``jixu worker`` path: one ``Worker`` with ``concurrency`` runs the queued turns of ``path`` until the
    queue is empty (each turn: ``steps`` agent steps of the concurrency agent)."""
    from jixu.ledger import SQLiteStore
    from jixu.scheduling import Worker, WorkerConfig

    store = SQLiteStore(path, synchronous="FULL")
    config = WorkerConfig(store_url=path, agent="bench.compare:concurrent_agent", owner=owner, concurrency=concurrency,
                          exit_when_idle=True, quiet=True, poll_interval=0.05, lease_ttl=30.0)
    worker = Worker(concurrent_agent(steps), store, config, report=lambda kind, text: None)

    async def main() -> tuple[float, float]:
        if start_at is not None:
            await asyncio.sleep(max(0.0, start_at - time.time()))
        started = time.time()
        await worker.run()
        return started, time.time()

    commits, appends = store.commit_count, store.append_count
    try:
        started, ended = asyncio.run(main())
    finally:
        store.close()
    if worker.stats.errors or worker.stats.lost:
        raise SystemExit(f"the worker reported {worker.stats.to_dict()}")
    return {"elapsed": ended - started, "started": started, "ended": ended,
            "tool_calls": worker.stats.finished * steps, "turns": worker.stats.finished,
            "commits": store.commit_count - commits, "appends": store.append_count - appends}


def run_workers(python: str, path: str, processes: int, threads: int, steps: int) -> dict[str, Any]:
    """``processes`` worker processes with concurrency ``threads // processes`` each, on ``threads`` queued turns
    in one SQLite file, started together; throughput over the wall time from the first start to the last end."""
    queue_turns(path, threads, steps)
    start_at = time.time() + 3.0  # after every process has started
    results: list[dict[str, Any]] = [{} for _ in range(processes)]

    def one(index: int) -> None:
        results[index] = child(python, {"kind": "worker", "url": path, "steps": steps, "start_at": start_at,
                                        "concurrency": max(1, threads // processes), "owner": f"bench-{index + 1}"})

    workers = [threading.Thread(target=one, args=(index,)) for index in range(processes)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if not all(results):
        raise SystemExit("a worker process failed")
    turns = sum(r["turns"] for r in results)
    if turns != threads:
        raise SystemExit(f"the workers finished {turns} turns of {threads}")
    wall = max(r["ended"] for r in results) - min(r["started"] for r in results)
    return {"elapsed": wall, "tool_calls": sum(r["tool_calls"] for r in results),
            "commits": sum(r["commits"] for r in results), "appends": sum(r["appends"] for r in results),
            "late": max(r["started"] for r in results) - start_at}


def child_main(spec: dict[str, Any]) -> None:
    kind = spec["kind"]
    if kind == "concurrent":
        result = run_concurrent(spec["url"], spec["threads"], spec["steps"], spec.get("tool", "async"))
    elif kind == "concurrent_loop":
        result = run_concurrent_loop(spec["url"], spec["threads"], spec["steps"], spec.get("tool", "async"))
    elif kind == "worker":
        result = run_worker(spec["url"], spec["steps"], spec["concurrency"], spec["owner"], spec.get("start_at"))
    elif kind == "recovery":
        result = run_recovery(spec["dir"], spec["events"], spec["reps"])
    elif kind == "jixu":
        result = run_jixu(spec["url"], spec["steps"], spec["tool_seconds"], spec.get("tool", "def"))
    else:
        runner: Callable[[str, int, float], dict[str, Any]] = {"dbos": run_dbos, "langgraph": run_langgraph}[kind]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = runner(spec["url"], spec["steps"], spec["tool_seconds"])
    print("RESULT " + json.dumps(result))


# --- recovery (executed in a child process) -------------------------------------------------------------


def run_recovery(workdir: str, events: int, reps: int) -> dict[str, Any]:
    import gc
    import tracemalloc

    sys.path.insert(0, str(ROOT / "bench"))
    from jixu.ledger import SQLiteStore
    from jixu.ledger.projection import replay
    from jixu.threads import Harness
    from jixu.threads.log import ThreadLog, stream_of
    from jixu.threads.projection import ThreadProjection
    from threads import agent as bench_agent
    from threads import build_thread

    path = Path(workdir) / "recovery.db"
    thread_id, count, _build = asyncio.run(build_thread(path, events))
    stream = stream_of(thread_id)
    opens, acts = [], []
    for _ in range(reps):
        with SQLiteStore(path) as store:
            harness = Harness(bench_agent(), store)
            start = time.perf_counter()
            thread = asyncio.run(harness.open_thread(thread_id))
            opens.append((time.perf_counter() - start) * 1000)
            if thread.checkpoint_status != "used":
                raise SystemExit(f"open_thread did not use the checkpoint: {thread.checkpoint_status}")
            start = time.perf_counter()
            thread.log.open_to_act()  # what send (any act) crosses first: the whole chain verified (decision 0025)
            acts.append((time.perf_counter() - start) * 1000)
    replays, verifies = [], []
    with SQLiteStore(path) as store:
        rows = list(store.read_rows(stream))
        for _ in range(reps):
            start = time.perf_counter()
            replay(store, stream, ThreadProjection())
            replays.append(time.perf_counter() - start)
            start = time.perf_counter()
            report = store.verify(stream)
            verifies.append(time.perf_counter() - start)
            if not report.valid:
                raise SystemExit("the recovery thread does not verify")
        del rows
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        log = ThreadLog.load(store, thread_id, verify=False)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        kept = log.state
    memory_mb = (after - before) / 1e6
    del kept
    return {"events": count, "open_ms": statistics.median(opens), "open_to_act_ms": statistics.median(acts),
            "replay_events_per_s": count / min(replays),
            "verify_events_per_s": count / min(verifies), "state_mb": memory_mb}


# --- orchestration --------------------------------------------------------------------------------------


def child(python: str, spec: dict[str, Any], timeout: float = 900) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT / "src"), env.get("PYTHONPATH", "")] if p)
    result = subprocess.run([python, str(Path(__file__).resolve()), "--child", json.dumps(spec)],
                            capture_output=True, text=True, timeout=timeout, check=False, env=env)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    if result.returncode != 0 or not lines:
        raise SystemExit(f"child {spec['kind']} failed ({result.returncode}):\n{result.stdout[-3000:]}\n"
                         f"{result.stderr[-3000:]}")
    data: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    return data


@contextlib.contextmanager
def postgres() -> Iterator[tuple[str, str]]:
    """(admin DSN, source): ``JIXU_BENCH_POSTGRES_DSN`` or a throwaway pgserver."""
    given = os.environ.get("JIXU_BENCH_POSTGRES_DSN") or os.environ.get("JIXU_TEST_POSTGRES_DSN")
    if given:
        yield given, "given DSN"
        return
    data_dir = tempfile.mkdtemp(prefix="jixu-compare-pg-")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        import pgserver

        server = pgserver.get_server(data_dir, cleanup_mode="stop")
    try:
        yield str(server.get_uri()), "throwaway pgserver"
    finally:
        server.cleanup()
        shutil.rmtree(data_dir, ignore_errors=True)


def fresh_database(dsn: str, name: str) -> str:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


def pg_setting(dsn: str, name: str) -> str:
    import psycopg

    with psycopg.connect(dsn) as conn:
        row = conn.execute(f"SHOW {name}").fetchone()
    return str(row[0]) if row else "?"


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def compare_backend(python: str, backend: str, url_for: Callable[[str, int], str], steps: int, reps: int,
                    variants: list[str], versions: dict[str, str], notes: list[str]) -> list[Figure]:
    figures: list[Figure] = []
    for variant in variants:
        systems = (SYSTEMS[0], *EXTRA[variant], *SYSTEMS[1:])
        runs: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
        for rep in range(reps):
            for system in systems:
                spec = {"kind": system, "url": url_for(f"{system}_{variant.lower()}_{rep}", rep), "steps": steps,
                        "tool_seconds": VARIANTS[variant]}
                if system.startswith("jixu"):
                    spec.update(kind="jixu", tool="def" if system == "jixu_def" else JIXU_TOOL[variant])
                result = child(python, spec)
                runs[system].append(result)
                versions[system.split("_")[0]] = result["version"]
                if result.get("notes") and f"{system} {backend}: {result['notes']}" not in notes:
                    notes.append(f"{system} {backend}: {result['notes']}")
        rates: dict[str, float] = {}
        tag = f"{backend}_{variant.lower()}"
        what = f"{backend} {variant} ({'no-op tool' if variant == 'A' else '1 ms tool'})"
        for system in systems:
            gaps = [g for r in runs[system] for g in r["gaps_ms"]]
            rate = statistics.median(steps / r["elapsed"] for r in runs[system])
            rates[system] = rate
            figures.append((f"{what}: {system} agent step median", f"{system}_{tag}_step_ms_median",
                            statistics.median(gaps), "ms"))
            figures.append((f"{what}: {system} agent step p99", f"{system}_{tag}_step_ms_p99", p99(gaps), "ms"))
            figures.append((f"{what}: {system} agent steps/s", f"{system}_{tag}_steps_per_s", rate, "steps/s"))
            per_step = [r["commits_per_step"] for r in runs[system] if r.get("commits_per_step") is not None]
            if per_step:
                figures.append((f"{what}: {system} durable commits per agent step",
                                f"{system}_{tag}_commits_per_step", statistics.median(per_step), "commits"))
        for mine in (SYSTEMS[0], *EXTRA[variant]):
            for peer in SYSTEMS[1:]:
                figures.append((f"{what}: ratio {mine}/{peer} (steps/s)", f"ratio_{tag}_{mine}_vs_{peer}",
                                rates[mine] / rates[peer], "x"))
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=200, help="agent steps per run")
    parser.add_argument("--reps", type=int, default=3, help="runs per system and variant (interleaved)")
    parser.add_argument("--variants", default="A,B", help="A (no-op tool), B (1 ms tool)")
    parser.add_argument("--backends", default="sqlite,postgres", help="sqlite, postgres")
    parser.add_argument("--concurrency", default="1,8,64", help="concurrent jixu threads (SQLite)")
    parser.add_argument("--concurrent-steps", type=int, default=50, help="agent steps per concurrent thread")
    parser.add_argument("--processes", type=int, default=2, help="processes sharing the largest concurrency run")
    parser.add_argument("--recovery-events", type=int, default=100_000, help="events of the long thread (0: skip)")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the runs (needs the peers)")
    parser.add_argument("--dir", default=None, help="directory for the temporary SQLite files")
    parser.add_argument("--write-docs", action="store_true", help="rewrite the figures in docs/performance.md")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child_main(json.loads(args.child))
        return 0
    variants = [v.strip().upper() for v in args.variants.split(",") if v.strip()]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    figures: list[Figure] = []
    notes: list[str] = []
    versions: dict[str, str] = {}
    started = time.perf_counter()
    pg_version = ""
    with tempfile.TemporaryDirectory(prefix="jixu-compare-", dir=args.dir) as tmp:
        workdir = Path(tmp)
        if "sqlite" in backends:
            figures += compare_backend(args.python, "sqlite", lambda name, _rep: f"sqlite:///{workdir / name}.db",
                                       args.steps, args.reps, variants, versions, notes)
        if "postgres" in backends:
            with postgres() as (dsn, source):
                pg_version = f"PostgreSQL {pg_setting(dsn, 'server_version')} ({source}; fsync={pg_setting(dsn, 'fsync')}, " \
                             f"synchronous_commit={pg_setting(dsn, 'synchronous_commit')})"
                figures += compare_backend(args.python, "postgres", lambda name, _rep: fresh_database(dsn, name),
                                           args.steps, args.reps, variants, versions, notes)
        counts = [int(n) for n in args.concurrency.split(",") if n.strip()]
        for count in counts:
            result = child(args.python, {"kind": "concurrent", "url": str(workdir / f"concurrent-{count}.db"),
                                         "threads": count, "steps": args.concurrent_steps})
            figures.append((f"SQLite, {count} concurrent threads: durable tool calls/s",
                            f"jixu_sqlite_concurrent_{count}_tool_calls_per_s",
                            result["tool_calls"] / result["elapsed"], "calls/s"))
            if result.get("commits"):
                figures.append((f"SQLite, {count} concurrent threads: appends per commit",
                                f"jixu_sqlite_concurrent_{count}_appends_per_commit",
                                result["appends"] / result["commits"], "appends"))
            result = child(args.python, {"kind": "concurrent_loop", "url": str(workdir / f"loop-{count}.db"),
                                         "threads": count, "steps": args.concurrent_steps})
            figures.append((f"SQLite, {count} threads on one event loop (library): durable tool calls/s",
                            f"jixu_sqlite_loop_{count}_tool_calls_per_s",
                            result["tool_calls"] / result["elapsed"], "calls/s"))
            figures.append((f"SQLite, {count} threads on one event loop (library): appends per commit",
                            f"jixu_sqlite_loop_{count}_appends_per_commit",
                            result["appends"] / result["commits"], "appends"))
        if counts:  # the same as above with the no-op tool as a plain def (a worker-thread hop per call)
            count = max(counts)
            # The largest runs move most with the machine's other load: run them --reps times, interleaved, and
            # report the median with the lowest and highest.
            # The path `jixu worker` runs: a Worker with --concurrency, in one process and in --processes.
            alone, spread = [], []
            for rep in range(args.reps):
                alone.append(run_workers(args.python, str(workdir / f"worker-{count}-rep{rep}.db"), 1, count,
                                         args.concurrent_steps))
                spread.append(run_workers(args.python, str(workdir / f"workers-{count}-rep{rep}.db"),
                                          args.processes, count, args.concurrent_steps))
            for runs, what, tag in ((alone, f"run by one jixu worker (--concurrency {count})", "worker"),
                                    (spread, f"run by {args.processes} jixu workers (--concurrency "
                                             f"{count // args.processes} each)", "workers")):
                rates = sorted(r["tool_calls"] / r["elapsed"] for r in runs)
                figures += [
                    (f"SQLite, {count} threads {what}: durable tool calls/s, median of {len(rates)}",
                     f"jixu_sqlite_{tag}_{count}_tool_calls_per_s_median", statistics.median(rates), "calls/s"),
                    (f"SQLite, {count} threads {what}: lowest of {len(rates)}",
                     f"jixu_sqlite_{tag}_{count}_tool_calls_per_s_min", rates[0], "calls/s"),
                    (f"SQLite, {count} threads {what}: highest of {len(rates)}",
                     f"jixu_sqlite_{tag}_{count}_tool_calls_per_s_max", rates[-1], "calls/s"),
                    (f"SQLite, {count} threads {what}: appends per commit",
                     f"jixu_sqlite_{tag}_{count}_repeated_appends_per_commit",
                     sum(r["appends"] for r in runs) / sum(r["commits"] for r in runs), "appends"),
                ]
            result = child(args.python, {"kind": "concurrent_loop", "url": str(workdir / f"loop-def-{count}.db"),
                                         "threads": count, "steps": args.concurrent_steps, "tool": "def"})
            figures.append((f"SQLite, {count} threads on one event loop (library), def tool: durable tool "
                            "calls/s", f"jixu_sqlite_loop_{count}_def_tool_calls_per_s",
                            result["tool_calls"] / result["elapsed"], "calls/s"))
        if args.recovery_events:
            result = child(args.python, {"kind": "recovery", "dir": str(workdir), "events": args.recovery_events,
                                         "reps": 5})
            tag = f"{result['events'] // 1000}k"
            figures += [
                (f"open_thread, {result['events']} events, with checkpoint", f"open_thread_ms_{tag}", result["open_ms"],
                 "ms"),
                (f"open_thread then open_to_act (the whole chain verified), {result['events']} events",
                 f"open_to_act_ms_{tag}", result["open_ms"] + result["open_to_act_ms"], "ms"),
                ("replay (read + project)", "replay_events_per_s", result["replay_events_per_s"], "events/s"),
                ("verify (hash chain)", "verify_events_per_s", result["verify_events_per_s"], "events/s"),
                (f"state memory of the {tag}-event thread", f"state_memory_mb_{tag}", result["state_mb"], "MB"),
            ]
    elapsed = time.perf_counter() - started
    header = machine_header(args, versions, pg_version, elapsed)
    print("\n".join(header))
    for note in notes:
        print(note)
    print(table(figures))
    print()
    for _label, metric, value, unit in figures:
        print(json.dumps({"bench": "compare", "metric": metric, "value": round(value, 4), "unit": unit}))
    if args.write_docs:
        write_docs(header, notes, figures)
    return 0


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def machine_header(args: argparse.Namespace, versions: dict[str, str], pg_version: str, elapsed: float) -> list[str]:
    import sqlite3

    lines = [
        f"jixu compare benchmark - {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"machine: nproc {os.cpu_count()}, CPU {cpu_model()}, Python {platform.python_version()}, "
        f"SQLite {sqlite3.sqlite_version}, {platform.system()} {platform.release()}",
        "versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
    ]
    if pg_version:
        lines.append(pg_version)
    lines.append(f"{args.steps} agent steps per run x {args.reps} reps (interleaved), variants {args.variants}; "
                 f"concurrency {args.concurrency} x {args.concurrent_steps} steps; {elapsed:.0f}s")
    return lines


def table(figures: list[Figure]) -> str:
    width = max(len(label) for label, *_ in figures)
    lines = [f"{'measure':<{width}}  {'value':>12}  unit", f"{'-' * width}  {'-' * 12}  ----"]
    lines += [f"{label:<{width}}  {value:>12,.3f}  {unit}" for label, _m, value, unit in figures]
    return "\n".join(lines)


def write_docs(header: list[str], notes: list[str], figures: list[Figure]) -> None:
    body = "\n".join([BEGIN_MARK, "", "```", *header, *notes, table(figures), "```", "", END_MARK])
    text = DOC.read_text() if DOC.exists() else f"# Performance\n\n{BEGIN_MARK}\n{END_MARK}\n"
    if BEGIN_MARK not in text or END_MARK not in text:
        text = text.rstrip() + f"\n\n{BEGIN_MARK}\n{END_MARK}\n"
    before, rest = text.split(BEGIN_MARK, 1)
    _old, after = rest.split(END_MARK, 1)
    DOC.write_text(before + body + after)
    print(f"wrote the figures into {DOC}")


if __name__ == "__main__":
    raise SystemExit(main())
