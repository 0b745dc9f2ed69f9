"""OpenAI Agents SDK agents made durable: jixu's DurableRunner against DBOS's DBOSRunner (decision 0033).

Run with the peers venv (DBOS and its integration live only there)::

    PYTHONPATH=src bench/.venv-peers/bin/python bench/openai_agents.py          # --quick for a smoke run

Both parts drive the same unchanged ``agents.Agent``: its model is the SDK's own ``OpenAIChatCompletionsModel``
talking to ``bench/fake_openai.py`` (the OpenAI wire format, no latency), its tool ``append_line`` (no
arguments) appends one fsynced line to a file. Every run is a forked child of this process (forked after the
imports, before any thread or event loop exists), so each starts alike and a SIGKILL takes only the child.

1. **Kills** (``--kills`` each, default 50): a child runs the agent and SIGKILLs itself inside the tool, right
   after its line is durable and before the system records the call's result. A second child (a new
   process, as after a restart) recovers the run, and the file says how often the tool really ran.

   - ``dbos``: ``DBOSRunner.run`` in a ``@DBOS.workflow()``, the tool a ``@DBOS.step()`` as DBOS's README
     says, SQLite system database; the recovering child calls ``DBOS.launch()`` (which recovers pending
     workflows) and waits for the workflow's result.
   - ``jixu``: ``DurableRunner`` on SQLite, the tool ``unsafe`` with a probe (find the line by the call's
     idempotency key); the recovering child runs the agent again with the thread id.
   - ``jixu_no_probe``: the same without a probe: the rerun stops with ``StepOutcomeUnknown`` for an operator
     (counted as ``stopped``) instead of guessing.

2. **Overhead** per agent step (one model call and one tool call): the agent runs ``--steps`` model calls
   (all but the last one call the trivial tool) under plain ``Runner.run``, under jixu's ``DurableRunner``
   (SQLite, ``synchronous=FULL``) and under ``DBOSRunner`` (SQLite system database, the tool a
   ``@DBOS.step``), ``--reps`` runs each, interleaved; ms per step of the median run, and ratios to plain.

Prints a human table, then one JSON line per figure: ``{"bench": "openai_agents", "metric", "value", "unit"}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402

from jixu import NotOccurred, Occurred, ProbeQuery, StepOutcomeUnknown  # noqa: E402
from jixu.integrations.openai_agents import DurableRunner, ToolPolicy, current_effect  # noqa: E402
from outside import lines, write_line  # noqa: E402  (bench/outside.py: bench/ is the script's directory)

set_tracing_disabled(True)

CHILD_SECONDS = 120
"""A child still running after this is killed by its own alarm (reported, never waited for forever)."""
Figure = tuple[str, str, float, str]


# --- the agent ------------------------------------------------------------------------------




def line_tool(path: Path | None, *, crash: bool, key: Callable[[], str], wrap: Callable[[Any], Any] = lambda f: f
              ) -> Any:
    """The unsafe tool: one durable line in ``path`` (nothing when ``path`` is None), then, when ``crash``,
    SIGKILL before anything records that it ran. ``wrap`` decorates the function first (``DBOS.step()``)."""

    async def append_line() -> str:
        """Append one line to the log."""
        if path is not None:
            write_line(path, f"line key={key()}")
        if crash:
            os.kill(os.getpid(), signal.SIGKILL)
        return "appended"

    return function_tool(wrap(append_line))


def agent(base_url: str, tool: Any) -> Agent[Any]:
    client = AsyncOpenAI(base_url=base_url, api_key="sk-bench", max_retries=0)
    return Agent(name="appender", instructions="Append lines when asked.",
                 model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client), tools=[tool])


# --- forked children ------------------------------------------------------------------------


def forked(fn: Callable[..., Any], *args: Any) -> tuple[int, Any]:
    """Run ``fn(*args)`` in a forked child; (its exit code, negative for a signal; what it returned, as JSON)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read)
        signal.alarm(CHILD_SECONDS)
        code = 0
        try:
            os.write(write, json.dumps(fn(*args)).encode())
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), json.loads(data) if data else None


def dbos_app(url: str, base_url: str, path: Path | None, crash: bool, max_turns: int = 10) -> Any:
    """DBOS configured on ``url`` with the workflow that runs the agent by ``DBOSRunner`` (not launched)."""
    from dbos import DBOS
    from dbos_openai_agents import DBOSRunner

    DBOS(config={"name": "jixu-bench-openai-agents", "system_database_url": url, "log_level": "WARNING"})
    tool = line_tool(path, crash=crash, key=lambda: str(DBOS.workflow_id), wrap=DBOS.step())

    @DBOS.workflow()
    async def run_agent(prompt: str) -> str:
        result = await DBOSRunner.run(agent(base_url, tool), prompt, max_turns=max_turns)
        return str(result.final_output)

    return run_agent


def dbos_crash(url: str, base_url: str, path: str, workflow_id: str) -> str:
    from dbos import DBOS, SetWorkflowID

    run_agent = dbos_app(url, base_url, Path(path), crash=True)
    DBOS.launch()
    with SetWorkflowID(workflow_id):
        asyncio.run(run_agent(f"append ({workflow_id})"))
    return "the tool never killed this process"


def dbos_recover(url: str, base_url: str, path: str, workflow_id: str) -> dict[str, Any]:
    from dbos import DBOS

    dbos_app(url, base_url, Path(path), crash=False)
    DBOS.launch()  # recovers this executor's pending workflows
    try:
        return {"final": DBOS.retrieve_workflow(workflow_id).get_result()}
    finally:
        DBOS.destroy()


def jixu_runner(url: str, path: Path, probe: bool) -> DurableRunner:
    def find_line(query: ProbeQuery) -> Occurred | NotOccurred:
        if any(f"key={query.idempotency_key}" in line for line in lines(path)):
            return Occurred(result="appended")
        return NotOccurred()

    return DurableRunner(url, tools={"append_line": ToolPolicy("unsafe", probe=find_line if probe else None)})


def jixu_crash(url: str, base_url: str, path: str, marker: str, probe: bool) -> str:
    tool = line_tool(Path(path), crash=True, key=lambda: current_effect().idempotency_key)
    jixu_runner(url, Path(path), probe).run_sync(agent(base_url, tool), f"append ({marker})",
                                                 started=lambda thread_id: Path(marker).write_text(thread_id))
    return "the tool never killed this process"


def jixu_recover(url: str, base_url: str, path: str, marker: str, probe: bool) -> dict[str, Any]:
    tool = line_tool(Path(path), crash=False, key=lambda: current_effect().idempotency_key)
    try:
        result = jixu_runner(url, Path(path), probe).run_sync(agent(base_url, tool), f"append ({marker})",
                                                              thread_id=Path(marker).read_text())
    except StepOutcomeUnknown as error:
        return {"stopped": error.code}
    return {"final": str(result.final_output)}


def kills(system: str, n: int, base_url: str, work: Path) -> dict[str, int]:
    """``n`` kills between the tool's side effect and its receipt; how often the tool ran once, twice, ..."""
    counts = {"kills": 0, "ran_once": 0, "ran_twice": 0, "finished": 0, "stopped": 0, "errors": 0}
    url = f"sqlite:///{work / f'{system}.db'}"
    for i in range(n):
        path = str(work / f"{system}-{i}.log")
        if system == "dbos":
            crash, recover = (dbos_crash, (url, base_url, path, f"wf-{i}")), (dbos_recover, (url, base_url, path,
                                                                                           f"wf-{i}"))
        else:
            args = (url, base_url, path, str(work / f"{system}-{i}.thread"), system == "jixu")
            crash, recover = (jixu_crash, args), (jixu_recover, args)
        code, _ = forked(crash[0], *crash[1])
        if code != -signal.SIGKILL:
            counts["errors"] += 1
            continue
        counts["kills"] += 1
        code, answer = forked(recover[0], *recover[1])
        ran = len(lines(Path(path)))
        counts["ran_once"] += ran == 1
        counts["ran_twice"] += ran >= 2
        if code != 0 or not isinstance(answer, dict):
            counts["errors"] += 1
        elif "stopped" in answer:
            counts["stopped"] += 1
        else:
            counts["finished"] += 1
    return counts


# --- overhead -------------------------------------------------------------------------------


def timed_run(system: str, base_url: str, work: str, index: int, steps: int) -> float:
    """Seconds of one whole agent run under ``system`` (``plain``, ``jixu``, ``dbos``), in this (forked) child."""
    prompt = f"steps ({system} {index})"
    turns = steps + 1  # the SDK's max_turns counts model calls
    if system == "dbos":
        from dbos import DBOS

        run_agent = dbos_app(f"sqlite:///{Path(work) / f'dbos-overhead-{index}.db'}", base_url, None, crash=False,
                             max_turns=turns)
        DBOS.launch()
        try:
            start = time.perf_counter()
            asyncio.run(run_agent(prompt))
            return time.perf_counter() - start
        finally:
            DBOS.destroy()
    tool = line_tool(None, crash=False, key=lambda: "")
    sdk_agent = agent(base_url, tool)
    if system == "plain":
        start = time.perf_counter()
        Runner.run_sync(sdk_agent, prompt, max_turns=turns)
        return time.perf_counter() - start
    runner = DurableRunner(f"sqlite:///{Path(work) / f'jixu-overhead-{index}.db'}", tools={"append_line": "unsafe"})
    start = time.perf_counter()
    runner.run_sync(sdk_agent, prompt, max_turns=turns)
    return time.perf_counter() - start


def overhead(steps: int, reps: int, base_url: str, work: Path) -> dict[str, float]:
    """ms per agent step (the median run) per system."""
    times: dict[str, list[float]] = {"plain": [], "jixu": [], "dbos": []}
    for index in range(reps):
        for system, found in times.items():
            code, seconds = forked(timed_run, system, base_url, str(work), index, steps)
            if code != 0:
                raise SystemExit(f"the {system} run failed (exit {code})")
            found.append(float(seconds))
    return {system: statistics.median(found) * 1000 / steps for system, found in times.items()}


# --- main -----------------------------------------------------------------------------------


def fake_server(steps: int) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "fake_openai.py"), "--port", "0", "--latency", "0",
                             "--jitter", "0", "--steps", str(steps)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    port = proc.stdout.readline().split()[1]
    return proc, f"http://127.0.0.1:{port}/v1"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--kills", type=int, default=50, help="SIGKILLs per system")
    parser.add_argument("--steps", type=int, default=20, help="model calls per overhead run")
    parser.add_argument("--reps", type=int, default=5, help="overhead runs per system")
    parser.add_argument("--quick", action="store_true", help="3 kills, 10 steps, 2 reps")
    parser.add_argument("--dir", default=None, help="directory for the databases and files")
    parser.add_argument("--only", choices=("kills", "overhead"), default=None, help="run one part only")
    args = parser.parse_args(argv)
    if args.quick:
        args.kills, args.steps, args.reps = 3, 10, 2
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="jixu-oai-bench-", dir=args.dir) as tmp:
        work = Path(tmp)
        one_call, base_one = fake_server(2)
        many_calls, base_many = fake_server(args.steps)
        try:
            if args.only != "overhead":
                print(f"kills between the tool's side effect and its receipt ({args.kills} each)")
                print(f"{'system':<15}{'kills':>7}{'ran once':>10}{'ran twice':>11}{'finished':>10}{'stopped':>9}"
                      f"{'errors':>8}")
            for system in ("dbos", "jixu", "jixu_no_probe") if args.only != "overhead" else ():
                found = kills(system, args.kills, base_one, work)
                print(f"{system:<15}{found['kills']:>7}{found['ran_once']:>10}{found['ran_twice']:>11}"
                      f"{found['finished']:>10}{found['stopped']:>9}{found['errors']:>8}")
                for metric in ("kills", "ran_twice", "ran_once", "finished", "stopped", "errors"):
                    figures.append((system, f"{system}_{metric}", found[metric], "count"))
            per_step = overhead(args.steps, args.reps, base_many, work) if args.only != "kills" else {}
        finally:
            for proc in (one_call, many_calls):
                proc.terminate()
                proc.wait()
    if per_step:
        print(f"\noverhead per agent step ({args.steps} model calls per run, median of {args.reps} runs)")
        print(f"{'system':<10}{'ms/step':>10}{'x plain':>10}")
        for system, ms in per_step.items():
            print(f"{system:<10}{ms:>10.2f}{ms / per_step['plain']:>10.2f}")
            figures.append((system, f"{system}_ms_per_step", ms, "ms"))
        for system in ("jixu", "dbos"):
            figures.append((system, f"{system}_over_plain", per_step[system] / per_step["plain"], "ratio"))
        figures.append(("jixu", "jixu_over_dbos", per_step["jixu"] / per_step["dbos"], "ratio"))
    print()
    for _label, metric, value, unit in figures:
        print(json.dumps({"bench": "openai_agents", "metric": metric, "value": round(value, 4), "unit": unit}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
