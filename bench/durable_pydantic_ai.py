"""A pydantic-ai agent made durable two ways: by jixu (``JixuAgent``) and by pydantic-ai's own DBOS integration
(``pydantic_ai.durable_exec.dbos.DBOSAgent`` on a SQLite system database).

Run with the peers environment and this checkout first on the path::

    PYTHONPATH=src bench/.venv-peers/bin/python bench/durable_pydantic_ai.py [--quick]

(Not ``bench/pydantic_ai.py``: run as a script, that name would shadow the ``pydantic_ai`` package it measures.)

1. **A SIGKILL between an unsafe side effect and its receipt.** The agent (pydantic-ai's offline
   ``FunctionModel``: it calls ``charge`` once, then answers) charges order 7; the charge is a fsynced line in a
   file. ``--kills`` times per system, a process starts the run and SIGKILLs itself right after the line is
   written, before the system records that the call finished; a new process then recovers the run (jixu: the
   same ``JixuAgent.run`` with the thread id, the call's probe looking the charge up by its idempotency key;
   DBOS: ``DBOS.launch()`` recovers the pending workflow, awaited with ``retrieve_workflow``). The figure is how
   often the file ends with two charges. Under DBOS the side effect is a ``@DBOS.step`` (a checkpointed step,
   as DBOS recommends for side effects), run from the function tool; DBOS records a step's output after it
   returns, so a kill before that runs it again. jixu records the call's dispatch before it runs, finds it
   ``unknown`` and never runs an unsafe call again without evidence.
2. **What recording costs per agent step.** The same agent with ``--steps`` calls of a trivial tool, then an
   answer (``--steps + 1`` model requests), run ``--runs`` times after one warm-up run: plain pydantic-ai,
   under jixu (SQLite file, the tool ``unsafe``: its intent is committed before the call, its receipt after),
   and under ``DBOSAgent`` (SQLite system database; DBOS checkpoints each model request; a function tool runs
   in workflow code, unrecorded). The figure is the median wall time of a run divided by its model requests.

Every process is forked from this one after the imports, so a kill and a recovery cost milliseconds, not an
interpreter start. After the human table, each figure is printed as one JSON line
(``{"bench", "metric", "value", "unit"}``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from jixu import NotOccurred, Occurred, ProbeQuery
from jixu.integrations.pydantic_ai import JixuAgent, current_effect
from outside import lines, write_line  # bench/outside.py (bench/ is the script's directory)

BENCH = "pydantic_ai"
PROMPT = "Charge order 7."


# --- processes ----------------------------------------------------------------------------------


def forked(work: Callable[[Callable[[Any], None]], Any], timeout: float = 120.0) -> tuple[int, list[Any]]:
    """Run ``work(say)`` in a forked child; (its exit status or -signal, what it said with ``say``, in order)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read)
        code = 0

        def say(value: Any) -> None:
            os.write(write, (json.dumps(value) + "\n").encode())

        try:
            warnings.simplefilter("ignore")
            say(work(say))
        except BaseException as error:
            say({"error": f"{type(error).__name__}: {error}"})
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
        if time.monotonic() > deadline:  # pragma: no cover - a hung child
            os.kill(pid, signal.SIGKILL)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    return code, [json.loads(line) for line in b"".join(chunks).decode().splitlines() if line]




# --- the agent ----------------------------------------------------------------------------------


def scripted(steps: int) -> Callable[[list[ModelMessage], AgentInfo], ModelResponse]:
    """The 'LLM': call the agent's one tool ``steps`` times, one call per response, then answer."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = sum(isinstance(p, ToolReturnPart) for m in messages for p in m.parts)
        if done >= steps:
            return ModelResponse(parts=[TextPart(f"done after {done} calls")])
        tool = info.function_tools[0].name
        return ModelResponse(parts=[ToolCallPart(tool, {"order": 7}, tool_call_id=f"call_{done}")])

    return respond


def charging_agent(charge: Callable[[int], Any]) -> Agent[None, str]:
    """An ordinary pydantic-ai agent whose one tool charges an order through ``charge``."""
    agent = Agent(FunctionModel(scripted(1)), name="shop")

    @agent.tool_plain
    def charge_order(order: int) -> Any:
        """Charge an order."""
        return charge(order)

    return agent


def find_charge(bank: Path) -> Callable[[ProbeQuery], Any]:
    def probe(query: ProbeQuery) -> Occurred | NotOccurred:
        for number, line in enumerate(lines(bank), start=1):
            if f"key={query.idempotency_key}" in line:
                return Occurred(result=f"receipt {number}", evidence={"line": number})
        return NotOccurred(evidence={"searched": len(lines(bank))})

    return probe


# --- 1. kills -----------------------------------------------------------------------------------


def jixu_trial(directory: Path) -> dict[str, Any]:
    """One kill and one recovery under jixu; what the bank holds after them."""
    url, bank = f"sqlite:///{directory / 'jixu.db'}", directory / "bank.log"

    def durable(crash: bool) -> JixuAgent:
        def charge(order: int) -> str:
            write_line(bank, f"charge order={order} key={current_effect().idempotency_key}")
            if crash:
                os.kill(os.getpid(), signal.SIGKILL)
            return f"receipt {len(lines(bank))}"

        return JixuAgent(charging_agent(charge), url, probes={"charge_order": find_charge(bank)})

    def crash(say: Callable[[Any], None]) -> None:
        agent = durable(True)
        thread_id = agent.new_thread_sync()
        say({"thread_id": thread_id})
        agent.run_sync(PROMPT, thread_id=thread_id)

    code, said = forked(crash)
    thread_id = said[0]["thread_id"]
    killed = code == -signal.SIGKILL and len(lines(bank)) == 1

    def recover(say: Callable[[Any], None]) -> str:
        with durable(False) as agent:
            return str(agent.run_sync(PROMPT, thread_id=thread_id).output)

    code, said = forked(recover)
    return {"killed": killed, "finished": code == 0, "charges": len(lines(bank)), "said": said[-1]}


def dbos_trial(directory: Path) -> dict[str, Any]:
    """One kill and one recovery under pydantic-ai's DBOS integration; what the bank holds after them."""
    bank = directory / "bank.log"
    workflow_id = f"charge-{directory.name}"

    def setup(crash: bool) -> Any:
        from dbos import DBOS
        from pydantic_ai.durable_exec.dbos import DBOSAgent

        DBOS(config={"name": "jixu-bench-pydantic-ai", "system_database_url": f"sqlite:///{directory / 'dbos.db'}",
                     "log_level": "ERROR", "console_log_level": "ERROR"})

        @DBOS.step(name="bank_charge")
        def bank_charge(order: int) -> str:
            write_line(bank, f"charge order={order} step={DBOS.step_id}")
            if crash:
                os.kill(os.getpid(), signal.SIGKILL)
            return f"receipt {len(lines(bank))}"

        agent = DBOSAgent(charging_agent(bank_charge))
        DBOS.launch()
        return agent

    def crash(say: Callable[[Any], None]) -> None:
        from dbos import SetWorkflowID

        agent = setup(True)
        with SetWorkflowID(workflow_id):
            asyncio.run(agent.run(PROMPT))

    code, _ = forked(crash)
    killed = code == -signal.SIGKILL and len(lines(bank)) == 1

    def recover(say: Callable[[Any], None]) -> str:
        from dbos import DBOS

        setup(False)
        try:
            return str(DBOS.retrieve_workflow(workflow_id).get_result().output)  # launch() recovered it
        finally:
            DBOS.destroy()

    code, said = forked(recover)
    return {"killed": killed, "finished": code == 0, "charges": len(lines(bank)), "said": said[-1]}


def kills(system: str, count: int, root: Path) -> dict[str, Any]:
    trial = {"jixu": jixu_trial, "dbos": dbos_trial}[system]
    outcomes = []
    for index in range(count):
        directory = root / f"{system}-{index}"
        directory.mkdir()
        outcomes.append(trial(directory))
    problems = [o for o in outcomes if not o["killed"]]
    if problems:
        raise SystemExit(f"{system}: {len(problems)} trials were not killed between effect and receipt: "
                         f"{problems[:3]}")
    return {"kills": count, "twice": sum(o["charges"] >= 2 for o in outcomes),
            "once": sum(o["charges"] == 1 for o in outcomes),
            "finished": sum(o["finished"] for o in outcomes), "example": outcomes[0]["said"]}


# --- 2. overhead --------------------------------------------------------------------------------


def stepping_agent(steps: int) -> Agent[None, str]:
    agent = Agent(FunctionModel(scripted(steps)), name="stepper")

    @agent.tool_plain
    def work(order: int) -> int:
        """A trivial tool."""
        return order + 1

    return agent


def timed(run_once: Callable[[int], Any], runs: int) -> list[float]:
    run_once(-1)  # warm-up
    elapsed = []
    for index in range(runs):
        start = time.perf_counter()
        run_once(index)
        elapsed.append(time.perf_counter() - start)
    return elapsed


def overhead(system: str, steps: int, runs: int, root: Path) -> dict[str, Any]:
    directory = root / f"overhead-{system}"
    directory.mkdir()

    def measure(say: Callable[[Any], None]) -> list[float]:
        agent = stepping_agent(steps)
        if system == "plain":
            return timed(lambda i: agent.run_sync(PROMPT), runs)
        if system == "jixu":
            durable = JixuAgent(agent, directory / "jixu.db")
            return timed(lambda i: durable.run_sync(PROMPT, thread_id=durable.new_thread_sync()), runs)
        from dbos import DBOS, SetWorkflowID
        from pydantic_ai.durable_exec.dbos import DBOSAgent

        DBOS(config={"name": "jixu-bench-pydantic-ai-overhead",
                     "system_database_url": f"sqlite:///{directory / 'dbos.db'}", "log_level": "ERROR",
                     "console_log_level": "ERROR"})
        dbos_agent = DBOSAgent(agent)
        DBOS.launch()

        def once(index: int) -> None:
            with SetWorkflowID(f"run-{index}"):
                asyncio.run(dbos_agent.run(PROMPT))

        try:
            return timed(once, runs)
        finally:
            DBOS.destroy()

    code, said = forked(measure)
    if code != 0:
        raise SystemExit(f"overhead {system}: {said}")
    elapsed = said[-1]
    median = statistics.median(elapsed)
    return {"runs": runs, "median_run_ms": median * 1000, "ms_per_step": median * 1000 / (steps + 1)}


# --- report -------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=50, help="kills per system (default 50)")
    parser.add_argument("--steps", type=int, default=10, help="tool calls per overhead run (default 10)")
    parser.add_argument("--runs", type=int, default=10, help="timed overhead runs per system (default 10)")
    parser.add_argument("--quick", action="store_true", help="5 kills per system, 3 runs of 5 steps")
    args = parser.parse_args()
    if args.quick:
        args.kills, args.steps, args.runs = 5, 5, 3
    figures: list[tuple[str, float, str]] = []
    with tempfile.TemporaryDirectory(prefix="jixu-bench-pydantic-ai-") as tmp:
        root = Path(tmp)
        crashes = {system: kills(system, args.kills, root) for system in ("dbos", "jixu")}
        costs = {system: overhead(system, args.steps, args.runs, root) for system in ("plain", "jixu", "dbos")}

    print(f"1. SIGKILL between the unsafe side effect and its receipt, {args.kills} kills per system")
    print(f"   {'system':<8} {'ran twice':>10} {'ran once':>9} {'finished':>9}")
    for system, found in crashes.items():
        print(f"   {system:<8} {found['twice']:>10} {found['once']:>9} {found['finished']:>9}")
        figures += [(f"{system}_ran_twice", found["twice"], "kills"), (f"{system}_kills", found["kills"], "kills"),
                    (f"{system}_finished", found["finished"], "runs")]
    print(f"2. recording overhead: {args.steps} tool calls + answer ({args.steps + 1} model requests), median of "
          f"{args.runs} runs")
    print(f"   {'system':<8} {'ms/run':>9} {'ms/step':>9} {'x plain':>8}")
    plain = costs["plain"]["ms_per_step"]
    for system, found in costs.items():
        ratio = found["ms_per_step"] / plain
        print(f"   {system:<8} {found['median_run_ms']:>9.2f} {found['ms_per_step']:>9.3f} {ratio:>8.1f}")
        figures.append((f"{system}_ms_per_step", found["ms_per_step"], "ms"))
        if system != "plain":
            figures.append((f"{system}_vs_plain", ratio, "ratio"))
    figures.append(("jixu_vs_dbos", costs["jixu"]["ms_per_step"] / costs["dbos"]["ms_per_step"], "ratio"))
    for metric, value, unit in figures:
        print(json.dumps({"bench": BENCH, "metric": metric, "value": round(value, 4), "unit": unit}))


if __name__ == "__main__":
    sys.exit(main())
