"""Crash -> the thread continuing in another process, and what the heartbeat of a lease costs (issue 23).

For each store (SQLite, and PostgreSQL from the ``pgserver`` wheel unless ``--no-postgres``) and each
scenario, ``--reps`` times:

- a child process runs a thread until its ``unsafe`` tool is running and is killed there with SIGKILL;
- at once a new process (the default owner name, the default lease) opens the thread, resolves the unknown
  call ``occurred`` and waits for the turn to finish; the figure is the time from the SIGKILL to the thread's
  finished state, seen by the recovering process (so it includes that process's start and imports);
- ``same machine``: the recovering process proves the dead owner gone (boot id, pid namespace, pid, start
  time) and takes over at once;
- ``other machine``: the recovering process claims another boot id, so nothing is proven and it retries
  every 100 ms until the dead owner's lease expires by the store's clock; it runs with ``takeover="safe"``
  (as a worker fleet does, ``jixu worker --takeover safe``): an expired claim is taken over once the resolver
  finds no effect in doubt, here after the operator's resolution.

The heartbeat figure: the median time of one lease renewal on each store, the renewals per second a worker
holding ``--turns`` turns makes (one per turn every ``ttl / 3`` seconds), and the share of one core that
takes.

After the human table, each figure is printed as one JSON line (``{"bench", "metric", "value", "unit"}``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this checkout's jixu, as the child processes get it

CRASHING = r"""
import asyncio, sys
from jixu import Agent, Harness, ScriptedModel, ToolCall, tool

@tool(semantics="unsafe")
async def refund(order: int) -> str:
    '''Refund an order (the process dies while it runs).'''
    print("RUNNING", flush=True)
    await asyncio.sleep(3600)
    return "refunded"

async def main() -> None:
    harness = Harness(Agent("refunder", ScriptedModel([ToolCall("refund", {"order": 42}), "Refunded."]),
                            tools=[refund]), sys.argv[1])
    thread = await harness.create_thread()
    print("THREAD", thread.thread_id, flush=True)
    await thread.send("refund order 42")
    await thread.wait()

asyncio.run(main())
"""

RECOVERING = r"""
import asyncio, json, sys, time
from jixu import Agent, Harness, ScriptedModel, ToolCall, tool
from jixu.errors import TurnOwned
from jixu.kernel import ownership

url, thread_id, elsewhere = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
if elsewhere:  # seen from another machine: another boot id, so no death can be proven
    ownership._IDENTITY = (ownership.os.getpid(), {**ownership.process_identity(), "boot_id": "another-machine"})

@tool(semantics="unsafe")
async def refund(order: int) -> str:
    '''Refund an order.'''
    return "refunded"

async def main() -> None:
    harness = Harness(Agent("refunder", ScriptedModel([ToolCall("refund", {"order": 42}), "Refunded."]),
                            tools=[refund]), url, takeover="safe" if elsewhere else "never")
    thread = await harness.open_thread(thread_id)
    [waiting] = thread.state().waiting_on
    while True:
        try:
            await thread.resolve_tool_outcome(waiting["effect_id"], "occurred", note="found in the ledger")
            break
        except TurnOwned:
            await asyncio.sleep(0.1)
    while True:
        try:
            state = await thread.wait()
            break
        except TurnOwned:
            await asyncio.sleep(0.1)
    events = await thread.events()
    claims = [e.data.get("reason") for e in events if e.type == "turn.claimed"]
    print("DONE " + json.dumps({"status": state.status, "at": time.time(), "claims": claims,
                                "dispatches": [e.type for e in events].count("tool.dispatched")}), flush=True)

asyncio.run(main())
"""


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}


def crash_and_continue(url: str, elsewhere: bool) -> dict[str, Any]:
    """One crash mid-call and its recovery in a new process; seconds from the SIGKILL to the finished turn."""
    child = subprocess.Popen([sys.executable, "-c", CRASHING, url], env=env(), text=True, stdout=subprocess.PIPE)
    assert child.stdout is not None
    thread_id = ""
    for line in child.stdout:
        if line.startswith("THREAD "):
            thread_id = line.split()[1]
        if line.startswith("RUNNING"):
            break
    killed_at = time.time()
    child.send_signal(signal.SIGKILL)
    child.wait()
    recovery = subprocess.run([sys.executable, "-c", RECOVERING, url, thread_id, "1" if elsewhere else "0"],
                              check=False, env=env(), text=True, capture_output=True, timeout=120)
    done = [line for line in recovery.stdout.splitlines() if line.startswith("DONE ")]
    if recovery.returncode != 0 or not done:
        raise SystemExit(f"the recovery failed:\n{recovery.stdout}\n{recovery.stderr}")
    result: dict[str, Any] = json.loads(done[0].removeprefix("DONE "))
    if result["status"] != "idle" or result["dispatches"] != 1:
        raise SystemExit(f"the recovery did not finish the thread as it should: {result}")
    result["seconds"] = result["at"] - killed_at
    return result


def heartbeat_seconds(url: str, renewals: int) -> float:
    """The median time of one lease renewal."""
    from jixu.kernel import DEFAULT_LEASE_TTL
    from jixu.ledger.urls import open_store

    with open_store(url) as store:
        fence = store.acquire_lease("bench-heartbeat", "bench", DEFAULT_LEASE_TTL)
        times = []
        for _ in range(renewals):
            started = time.perf_counter()
            store.renew_lease(fence, DEFAULT_LEASE_TTL)
            times.append(time.perf_counter() - started)
        store.release_lease(fence)
    return statistics.median(times)


@contextmanager
def postgres(enabled: bool) -> Iterator[str | None]:
    if not enabled:
        yield None
        return
    import pgserver

    with tempfile.TemporaryDirectory(prefix="jixu-takeover-pg-") as data:
        server = pgserver.get_server(data, cleanup_mode="stop")
        try:
            yield server.get_uri()
        finally:
            server.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--turns", type=int, default=1000, help="turns one worker holds, for the heartbeat share")
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args(argv)
    from jixu.kernel import DEFAULT_LEASE_TTL

    figures: list[tuple[str, str, float, str]] = []
    with tempfile.TemporaryDirectory(prefix="jixu-takeover-") as tmp, postgres(not args.no_postgres) as pg:
        stores = [("sqlite", f"sqlite:///{Path(tmp) / 'takeover.db'}")]
        if pg is not None:
            stores.append(("postgres", pg))
        for backend, url in stores:
            for scenario, elsewhere in (("same machine", False), ("other machine", True)):
                runs = [crash_and_continue(url, elsewhere) for _ in range(args.reps)]
                expected = "took_over_expired" if elsewhere else "took_over_dead_owner"
                if not all(expected in run["claims"] for run in runs):
                    raise SystemExit(f"{backend} {scenario}: the claims were {[run['claims'] for run in runs]}")
                tag = scenario.replace(" ", "_")
                figures.append((f"{backend}: crash -> continuing in another process, {scenario}",
                                f"takeover_{tag}_s_{backend}", statistics.median(r["seconds"] for r in runs), "s"))
            renewal = heartbeat_seconds(url, 300)
            per_second = args.turns / (DEFAULT_LEASE_TTL / 3)
            figures.append((f"{backend}: one lease renewal", f"heartbeat_ms_{backend}", renewal * 1000, "ms"))
            figures.append((f"{backend}: renewals/s of a worker holding {args.turns} turns", f"heartbeats_per_s_{args.turns}_turns_{backend}",
                            per_second, "1/s"))
            figures.append((f"{backend}: share of one core those renewals take", f"heartbeat_core_share_{args.turns}_turns_{backend}",
                            per_second * renewal * 100, "%"))
    print(f"default lease {DEFAULT_LEASE_TTL:.0f} s, heartbeat every {DEFAULT_LEASE_TTL / 3:.1f} s, {args.reps} reps (median)")
    for label, _metric, value, unit in figures:
        print(f"{label:72} {value:10.3f} {unit}")
    for _label, metric, value, unit in figures:
        print(json.dumps({"bench": "takeover", "metric": metric, "value": round(value, 4), "unit": unit}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
