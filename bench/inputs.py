"""Input POSTs at once: what ``jixu serve`` spends to accept K inputs, without a worker running them.

Exact command (from the repository root; needs the ``server`` extra)::

    PYTHONPATH=src:. .venv/bin/python bench/inputs.py            # --k 1000 --in-flight 100 --reps 3

A real ``jixu serve --no-worker`` process on a fresh SQLite file (synchronous FULL) listens on 127.0.0.1;
the driver creates K threads over the API, then sends all K inputs (``POST /api/v1/threads/{id}/inputs``),
``--in-flight`` at a time over as many keep-alive connections, as ``bench/fleet.py``'s serve run does.
Figures per repetition (each on a fresh server and file): inputs answered per second, and the server
process's CPU (user + system, from ``/proc``) per input over the sending phase: the second is the steadier
figure on a shared machine. Checked: every input answered 202, and the store holds one pending queue row per
thread afterwards.

Prints a human table, then one JSON line per figure ``{"bench": "inputs", "metric": ..., "value": ...,
"unit": ...}`` (the median over the repetitions).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT / "src", ROOT):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import httpx  # noqa: E402
from bench.api import free_port  # noqa: E402
from bench.fleet import cpu_of  # noqa: E402

from jixu import Agent, ScriptedModel  # noqa: E402
from jixu.ledger import open_store  # noqa: E402
from jixu.server.auth import create_token  # noqa: E402


def agent() -> Agent:
    """The agent new threads are recorded under (never run here: the server has no worker)."""
    return Agent("bench-inputs", ScriptedModel(lambda messages: "ok", keep_calls=False))


def one_run(k: int, in_flight: int) -> tuple[float, float]:
    """(inputs per second, server CPU ms per input) of one fresh server."""
    with tempfile.TemporaryDirectory(prefix="jixu-inputs-") as tmp:
        url = f"sqlite:///{tmp}/inputs.db"
        with open_store(url) as store:
            _info, token = create_token(store, "bench", roles={"bench": "editor"}, actor="bench")
        port = free_port()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]))
        log_path = Path(tmp) / "serve.log"
        with log_path.open("w") as log:
            server = subprocess.Popen([sys.executable, "-m", "jixu", "serve", "--store", url, "--port", str(port),
                                       "--agent", "bench.inputs:agent", "--no-worker"], env=env, stdout=log,
                                      stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while "startup complete" not in log_path.read_text():
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"jixu serve did not start:\n{log_path.read_text()}")
                time.sleep(0.05)
            rate, cpu_ms = asyncio.run(drive(f"http://127.0.0.1:{port}/api/v1", token, k, in_flight, server.pid))
        finally:
            server.terminate()
            server.wait(30)
        with open_store(url) as store:
            pending = len(store.list_work(state="pending"))
        if pending != k:
            raise SystemExit(f"{pending} queued turns in the store after {k} inputs")
        return rate, cpu_ms


async def drive(base: str, token: str, k: int, in_flight: int, pid: int) -> tuple[float, float]:
    limits = httpx.Limits(max_connections=in_flight)
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"}, limits=limits,
                                 timeout=120) as http:
        gate = asyncio.Semaphore(in_flight)

        async def create() -> str:
            async with gate:
                made = await http.post("/threads", json={"project": "bench"})
                made.raise_for_status()
                return str(made.json()["thread_id"])

        threads = await asyncio.gather(*(create() for _ in range(k)))

        async def send(i: int, thread_id: str) -> None:
            async with gate:
                sent = await http.post(f"/threads/{thread_id}/inputs", json={"input": f"task {i}"})
                if sent.status_code != 202:
                    raise SystemExit(f"input {i}: {sent.status_code} {sent.text[:300]}")

        cpu_before, started = cpu_of(pid), time.monotonic()
        await asyncio.gather(*(send(i, thread_id) for i, thread_id in enumerate(threads)))
        elapsed, cpu = time.monotonic() - started, cpu_of(pid) - cpu_before
        return k / elapsed, cpu / k * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--k", type=int, default=1000, help="threads, one input each")
    parser.add_argument("--in-flight", type=int, default=100, help="inputs sent at once (and connections)")
    parser.add_argument("--reps", type=int, default=3, help="fresh servers, one after the other")
    args = parser.parse_args(argv)
    runs = [one_run(args.k, args.in_flight) for _ in range(args.reps)]
    rates, cpus = [rate for rate, _ in runs], [cpu for _, cpu in runs]
    print(f"jixu serve --no-worker, SQLite FULL: {args.k} inputs, {args.in_flight} in flight, {args.reps} runs")
    print(f"  inputs per second      median {statistics.median(rates):8.1f}   runs {', '.join(f'{r:.1f}' for r in rates)}")
    print(f"  server CPU per input   median {statistics.median(cpus):8.2f} ms   runs {', '.join(f'{c:.2f}' for c in cpus)}")
    print(json.dumps({"bench": "inputs", "metric": "inputs_per_s", "value": round(statistics.median(rates), 2),
                      "unit": "inputs/s"}))
    print(json.dumps({"bench": "inputs", "metric": "server_cpu_per_input", "value": round(statistics.median(cpus), 3),
                      "unit": "ms CPU/input"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
