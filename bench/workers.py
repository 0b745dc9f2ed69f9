"""Workers benchmark on PostgreSQL: tool calls per second with 1, 2 and 4 worker processes, the durable
tool-call overhead, and DBOS steps on the same server in the same run.

Run from a checkout with ``PYTHONPATH=src python bench/workers.py`` (``--quick`` for smaller sizes).
PostgreSQL: ``JIXU_BENCH_POSTGRES_DSN`` when set, else a throwaway server from the ``pgserver`` wheel.

1. **Throughput.** ``--threads`` threads (default 60), each with one queued turn in which a
   ``ScriptedModel`` calls a no-op ``read_only`` tool ``--steps`` times (default 10) and then replies.
   A pool of N ``jixu worker`` processes (N = 1, 2, 4; a fresh schema each) is started and, once every
   worker is up, all threads are enqueued at once; measured from the first enqueue until the last turn is
   done. Figure: tool calls per second (threads x steps / seconds). Each worker runs one thread at a
   time; the machine's core count bounds the scaling (printed).
2. **Durable tool-call overhead.** One turn of ``--overhead-steps`` (default 200) steps in this process
   on PostgreSQL. A step is one model call plus one tool call: six durable events (intent, dispatch
   marker and receipt of each), all fenced by the turn lease. Median of the gaps between consecutive
   model calls, and the mean (turn time / steps).
3. **DBOS** (a peer, not a dependency of jixu): a workflow of the same number of no-op ``@DBOS.step``
   calls on the same server (its own database), run in a separate virtual environment
   (``bench/.venv-peers``, created on first use with ``pip install dbos``; ``--peers-python`` to use
   another interpreter, ``--skip-dbos`` to leave it out). It reports its figures back as JSON.

Prints a table, then one JSON line per figure: ``{"bench": "workers", "metric": ..., "value": ...,
"unit": ...}``, ratios included.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
PEERS_VENV = ROOT / "bench" / ".venv-peers"
Figure = tuple[str, str, float, str]  # (label, metric, value, unit)

for _path in (ROOT / "src", ROOT):  # run as a script from a checkout; workers import bench.workers
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from jixu import Agent, Harness, ScriptedModel, ToolCall, tool  # noqa: E402
from jixu.ledger import NewEvent, Store, open_store  # noqa: E402
from jixu.ledger.encoding import JSONObject  # noqa: E402
from jixu.scheduling import WorkerPool, create_thread_for  # noqa: E402
from jixu.threads.log import ThreadLog  # noqa: E402
from jixu.threads.model import Step  # noqa: E402


@tool(semantics="read_only")
def noop() -> None:
    """Do nothing (the benchmark's tool)."""


def _steps_done(messages: list[JSONObject]) -> int:
    done = 0
    for message in reversed(messages):
        if message.get("role") == "user":
            break
        if message.get("role") == "assistant":
            done += 1
    return done


class StepScript:
    """Call ``noop`` ``steps`` times per turn, then reply; time every model call."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.stamps: list[float] = []

    def __call__(self, messages: list[JSONObject]) -> Step:
        self.stamps.append(time.perf_counter())
        return ToolCall("noop") if _steps_done(messages) < self.steps else "done"


def bench_agent() -> Agent:
    """The workers' agent factory (``bench.workers:bench_agent``); ``JIXU_BENCH_STEPS`` tool calls per turn."""
    steps = int(os.environ.get("JIXU_BENCH_STEPS") or 10)
    return Agent("bench-workers", ScriptedModel(StepScript(steps), keep_calls=False), tools=[noop], max_steps=steps + 1)


# --- PostgreSQL ------------------------------------------------------------------------------------------


@contextmanager
def postgres() -> Iterator[tuple[str, str]]:
    """(admin DSN, how it was obtained): ``JIXU_BENCH_POSTGRES_DSN`` or a throwaway pgserver."""
    given = os.environ.get("JIXU_BENCH_POSTGRES_DSN")
    if given:
        yield given, "JIXU_BENCH_POSTGRES_DSN"
        return
    data_dir = tempfile.mkdtemp(prefix="jixu-bench-pg-")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        import pgserver

        server = pgserver.get_server(data_dir, cleanup_mode="stop")
    try:
        yield str(server.get_uri()), "throwaway pgserver"
    finally:
        server.cleanup()
        shutil.rmtree(data_dir, ignore_errors=True)


def fresh_schema(dsn: str, name: str) -> str:
    """Create an empty schema ``name``; a URL whose ``search_path`` is it."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
        conn.execute(f"CREATE SCHEMA {name}")
    return f"{dsn}{'&' if '?' in dsn else '?'}options={quote(f'-csearch_path={name}', safe='')}"


def server_version(dsn: str) -> str:
    import psycopg

    with psycopg.connect(dsn) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "?"


# --- 1. throughput ---------------------------------------------------------------------------------------


def queue_turns(store: Store, threads: int) -> list[str]:
    """``threads`` threads, each with one queued turn (not yet enqueued); their ids."""
    agent = bench_agent()
    ids = []
    for n in range(threads):
        thread_id = create_thread_for(store, agent, project=f"p{n % 3}")
        ThreadLog.load(store, thread_id).start_turn("go")
        ids.append(thread_id)
    return ids


def throughput(dsn: str, processes: int, threads: int, steps: int, workdir: Path) -> float:
    """Tool calls per second with ``processes`` worker processes."""
    url = fresh_schema(dsn, f"jixu_bench_workers_{processes}")
    store = open_store(url)
    try:
        ids = queue_turns(store, threads)
        log_path = workdir / f"pool-{processes}.log"
        env = {"JIXU_BENCH_STEPS": str(steps),
               "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
        with log_path.open("w") as log:
            pool = WorkerPool("bench.workers:bench_agent", url, processes=processes, owner_prefix=f"bench{processes}",
                              poll_interval=0.005, quiet=True, env=env, stdout=log, stderr=subprocess.STDOUT)
            pool.start()
            try:
                deadline = time.monotonic() + 60
                while log_path.read_text().count(" started on ") < processes:
                    if time.monotonic() > deadline or any(code is not None for code in pool.wait(0)):
                        raise SystemExit(f"the workers did not start:\n{log_path.read_text()}")
                    time.sleep(0.01)
                start = time.perf_counter()
                for thread_id in ids:
                    store.enqueue(f"thread/{thread_id}", ThreadLog.load(store, thread_id).state.metadata["project"])
                deadline = time.monotonic() + 600
                while len(store.list_work(state="done")) < threads:
                    if time.monotonic() > deadline:
                        raise SystemExit(f"the workers did not finish:\n{log_path.read_text()}")
                    time.sleep(0.02)
                elapsed = time.perf_counter() - start
            finally:
                codes = pool.stop()
        if codes != [0] * processes:
            raise SystemExit(f"workers exited {codes}:\n{log_path.read_text()}")
        for thread_id in ids:
            events = store.read(f"thread/{thread_id}")
            ended = [e for e in events if e.type == "turn.ended"]
            if [e.data.get("outcome") for e in ended] != ["completed"]:
                raise SystemExit(f"thread {thread_id} did not complete exactly once")
        return threads * steps / elapsed
    finally:
        store.close()


# --- 2. durable tool-call overhead -----------------------------------------------------------------------


async def overhead(dsn: str, steps: int) -> tuple[float, float, int]:
    """(median step ms, mean step ms, events per step) of one long turn on PostgreSQL."""
    url = fresh_schema(dsn, "jixu_bench_overhead")
    script = StepScript(steps)
    agent = Agent("bench-overhead", ScriptedModel(script, keep_calls=False), tools=[noop], max_steps=steps + 1)
    store = open_store(url)
    try:
        harness = Harness(agent, store)
        thread = await harness.create_thread()
        # Warm the connection pool and the code paths with one short turn first.
        store.append("bench/warmup", [NewEvent("bench.warmup", {})], 0)
        start = time.perf_counter()
        await thread.send("go")
        state = await thread.wait()
        elapsed = time.perf_counter() - start
        if state.status != "idle" or state.last_reply != "done":
            raise SystemExit(f"the overhead turn did not finish: {state.status} {state.reason}")
        gaps = [b - a for a, b in itertools.pairwise(script.stamps)]
        # A turn writes turn.started, turn.claimed, six events per step, the replying model call (3), turn.ended.
        events_per_step = (state.seq - 1 - 6) / steps
        return statistics.median(gaps) * 1000, elapsed / steps * 1000, round(events_per_step)
    finally:
        store.close()


# --- 3. DBOS ---------------------------------------------------------------------------------------------

DBOS_SCRIPT = r"""
import json, statistics, sys, time, itertools
from dbos import DBOS
import dbos as dbos_package

url, steps = sys.argv[1], int(sys.argv[2])
DBOS(config={"name": "jixu-bench-peer", "system_database_url": url})
stamps = []

@DBOS.step()
def noop_step(i: int) -> int:
    stamps.append(time.perf_counter())
    return i

@DBOS.workflow()
def many_steps(n: int) -> int:
    for i in range(n):
        noop_step(i)
    return n

DBOS.launch()
many_steps(5)  # warm up
stamps.clear()
start = time.perf_counter()
many_steps(steps)
elapsed = time.perf_counter() - start
gaps = [b - a for a, b in itertools.pairwise(stamps)]
version = getattr(dbos_package, "__version__", None)
if version is None:
    from importlib.metadata import version as dist_version
    version = dist_version("dbos")
print(json.dumps({"dbos_version": version, "steps": steps, "step_ms_median": statistics.median(gaps) * 1000,
                  "step_ms_mean": elapsed / steps * 1000}))
DBOS.destroy()
"""


def peers_python(given: str | None) -> str:
    """The interpreter of the peers' virtual environment (created, with dbos, when missing)."""
    if given:
        return given
    python = PEERS_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
    probe = subprocess.run([str(python), "-c", "import dbos"], capture_output=True, check=False)
    if probe.returncode != 0:
        subprocess.run([str(python), "-m", "pip", "install", "-q", "dbos"], check=True)
    return str(python)


def dbos_database(dsn: str, name: str) -> str:
    """Create an empty database ``name`` on the server; a URL for it (DBOS keeps its tables there)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


def dbos_steps(dsn: str, steps: int, python: str) -> dict[str, Any]:
    url = dbos_database(dsn, "jixu_bench_dbos")
    result = subprocess.run([python, "-c", DBOS_SCRIPT, url, str(steps)], capture_output=True, text=True,
                            timeout=600, check=False)
    if result.returncode != 0:
        raise SystemExit(f"the DBOS run failed:\n{result.stdout}\n{result.stderr}")
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


# --- main ------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--threads", type=int, default=60, help="threads (one turn each) per throughput run")
    parser.add_argument("--steps", type=int, default=10, help="tool calls per turn in the throughput runs")
    parser.add_argument("--processes", default="1,2,4", help="worker process counts to measure")
    parser.add_argument("--overhead-steps", type=int, default=200, help="steps of the overhead turn and of DBOS")
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--skip-dbos", action="store_true", help="leave the DBOS comparison out")
    parser.add_argument("--peers-python", default=None, help="a Python with dbos installed")
    args = parser.parse_args()
    if args.quick:
        args.threads, args.overhead_steps = 24, 60
    counts = [int(n) for n in args.processes.split(",")]
    figures: list[Figure] = []
    with postgres() as (dsn, source), tempfile.TemporaryDirectory(prefix="jixu-bench-workers-") as tmp:
        version = server_version(dsn)
        for processes in counts:
            rate = throughput(dsn, processes, args.threads, args.steps, Path(tmp))
            figures.append((f"tool calls/s with {processes} worker process(es)",
                            f"tool_calls_per_s_{processes}_workers", rate, "calls/s"))
        median_ms, mean_ms, events = asyncio.run(overhead(dsn, args.overhead_steps))
        figures.append(("durable agent step (model + tool call), median", "step_ms_median_postgres", median_ms, "ms"))
        figures.append(("durable agent step, mean (turn time / steps)", "step_ms_mean_postgres", mean_ms, "ms"))
        figures.append(("durable events per step", "events_per_step", float(events), "events"))
        figures.append(("durable effect (half a step: intent + dispatch + receipt), median",
                        "effect_ms_median_postgres", median_ms / 2, "ms"))
        dbos: dict[str, Any] | None = None
        if not args.skip_dbos:
            dbos = dbos_steps(dsn, args.overhead_steps, peers_python(args.peers_python))
            figures.append((f"DBOS {dbos['dbos_version']} step, median", "dbos_step_ms_median",
                            float(dbos["step_ms_median"]), "ms"))
            figures.append(("DBOS step, mean", "dbos_step_ms_mean", float(dbos["step_ms_mean"]), "ms"))
            figures.append(("ratio: jixu agent step / DBOS step (medians)", "ratio_step_vs_dbos_step",
                            median_ms / float(dbos["step_ms_median"]), "x"))
            figures.append(("ratio: jixu durable effect / DBOS step (medians)", "ratio_effect_vs_dbos_step",
                            median_ms / 2 / float(dbos["step_ms_median"]), "x"))
        if len(counts) > 1:
            base = next(f[2] for f in figures if f[1] == f"tool_calls_per_s_{counts[0]}_workers")
            for processes in counts[1:]:
                rate = next(f[2] for f in figures if f[1] == f"tool_calls_per_s_{processes}_workers")
                figures.append((f"ratio: {processes} workers / {counts[0]} worker", f"ratio_{processes}_vs_"
                                f"{counts[0]}_workers", rate / base, "x"))
    print(f"jixu workers benchmark: PostgreSQL {version} ({source}), Python {platform.python_version()}, "
          f"{os.cpu_count()} cores; {args.threads} threads x {args.steps} tool calls per throughput run, "
          f"{args.overhead_steps} steps for the overhead and DBOS")
    width = max(len(label) for label, *_ in figures)
    for label, _metric, value, unit in figures:
        print(f"  {label:<{width}}  {value:>10.3f} {unit}")
    for _label, metric, value, unit in figures:
        print(json.dumps({"bench": "workers", "metric": metric, "value": round(value, 4), "unit": unit}))


if __name__ == "__main__":
    main()
