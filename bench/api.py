"""HTTP API load test: 50 concurrent clients sending inputs and reading events, on SQLite and PostgreSQL.

Run from a checkout with ``PYTHONPATH=src python bench/api.py`` (``--duration 60`` seconds per store by
default; ``--clients 50``; ``--stores sqlite,postgres``). PostgreSQL: ``JIXU_BENCH_POSTGRES_DSN`` when set,
else a throwaway server from the ``pgserver`` wheel.

For each store a real ``jixu serve`` process (uvicorn, with its in-process worker running an echo agent)
listens on 127.0.0.1. Each client owns one thread and loops for the duration: send an input (``POST
.../inputs`` with an ``Idempotency-Key``), then read the thread's new events (``GET .../events?after_seq=``)
every 20 ms until its turn's ``turn.ended`` arrives. Figures: latency of sends, of event reads and of a
whole turn as a client sees it (send -> completion read), p50 and p99; inputs and requests per second.

Afterwards the server is stopped and the ledger is checked directly: every thread's chain verifies, its
seqs are 1..n without gaps, no event id repeats, it holds exactly one ``turn.started`` per input the
client sent and one ``turn.ended`` per turn, and the events the client read over HTTP are exactly the
stored ones (zero lost, zero duplicated).

Prints a table, then one JSON line per figure: ``{"bench": "api", "metric": ..., "value": ..., "unit": ...}``
(metrics named ``<store>_<figure>``, e.g. ``sqlite_send_p99``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT / "src", ROOT):  # run as a script from a checkout; the server imports bench.api
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import httpx  # noqa: E402

from jixu import Agent, ScriptedModel  # noqa: E402
from jixu.ledger import open_store  # noqa: E402
from jixu.server.auth import create_token  # noqa: E402

Figure = tuple[str, str, float, str]  # (label, metric, value, unit)
TURN_TIMEOUT = 120.0


def agent() -> Agent:
    """The served agent: replies ``echo: <input>`` (one model call per turn)."""
    return Agent("bench-echo", ScriptedModel(lambda messages: f"echo: {messages[-1].get('content')}", keep_calls=False))


@dataclass
class ClientLog:
    """What one client did and saw."""

    thread_id: str = ""
    inputs: int = 0
    completed: int = 0
    seen: list[dict[str, Any]] = field(default_factory=list)
    send_ms: list[float] = field(default_factory=list)
    read_ms: list[float] = field(default_factory=list)
    turn_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def served(store_url: str, workdir: Path) -> Iterator[str]:
    """A ``jixu serve`` process over ``store_url`` with the echo agent; its base URL."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    log = (workdir / "serve.log").open("w")
    process = subprocess.Popen([sys.executable, "-m", "jixu", "serve", "--store", store_url, "--port", str(port),
                                "--agent", "bench.api:agent", "--workspace-root", str(workdir / "ws")],
                               cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/api/v1/health").status_code == 200:
                break
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"jixu serve did not start: {(workdir / 'serve.log').read_text()[-2000:]}")
        time.sleep(0.1)
    try:
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
        log.close()


async def client_loop(http: httpx.AsyncClient, log: ClientLog, stop_at: float) -> None:
    """One client: its own thread, then send -> read events until the turn completes, until ``stop_at``."""
    made = await http.post("/threads", json={"project": "bench"})
    made.raise_for_status()
    log.thread_id = made.json()["thread_id"]
    after = 0
    while time.monotonic() < stop_at:
        start = time.perf_counter()
        sent = await http.post(f"/threads/{log.thread_id}/inputs", json={"input": f"message {log.inputs}"},
                               headers={"Idempotency-Key": secrets.token_hex(16)})
        log.send_ms.append((time.perf_counter() - start) * 1000)
        if sent.status_code != 202:
            log.errors.append(f"send {sent.status_code}: {sent.text[:200]}")
            await asyncio.sleep(0.05)
            continue
        log.inputs += 1
        turn_id = sent.json()["turn_id"]
        done = False
        while not done:
            began = time.perf_counter()
            page = await http.get(f"/threads/{log.thread_id}/events", params={"after_seq": after, "limit": 1000})
            log.read_ms.append((time.perf_counter() - began) * 1000)
            page.raise_for_status()
            for event in page.json()["events"]:
                log.seen.append(event)
                after = event["seq"]
                if event["type"] == "turn.ended" and event["data"].get("turn_id") == turn_id:
                    done = True
            if not done:
                if time.perf_counter() - start > TURN_TIMEOUT:
                    log.errors.append(f"turn {turn_id} did not end within {TURN_TIMEOUT} s")
                    return
                await asyncio.sleep(0.02)
        log.completed += 1
        log.turn_ms.append((time.perf_counter() - start) * 1000)


async def load(url: str, token: str, clients: int, duration: float) -> tuple[list[ClientLog], float]:
    """Run the clients for ``duration`` seconds (each then finishes its turn in flight); logs and seconds."""
    limits = httpx.Limits(max_connections=clients * 2, max_keepalive_connections=clients * 2)
    async with httpx.AsyncClient(base_url=f"{url}/api/v1", headers={"Authorization": f"Bearer {token}"},
                                 limits=limits, timeout=120) as http:
        logs = [ClientLog() for _ in range(clients)]
        start = time.monotonic()
        await asyncio.gather(*(client_loop(http, log, start + duration) for log in logs))
        return logs, time.monotonic() - start


def check_ledger(store_url: str, logs: list[ClientLog]) -> dict[str, int]:
    """Compare the stored events with what the clients sent and read; counts of each kind of fault."""
    faults = {"invalid_chains": 0, "gaps": 0, "duplicate_ids": 0, "lost_inputs": 0, "duplicated_inputs": 0,
              "unfinished_turns": 0, "read_mismatches": 0, "events": 0}
    with open_store(store_url, create=False) as store:
        for log in logs:
            stream = f"thread/{log.thread_id}"
            events = store.read(stream)
            faults["events"] += len(events)
            faults["invalid_chains"] += 0 if store.verify(stream).valid else 1
            faults["gaps"] += 0 if [e.seq for e in events] == list(range(1, len(events) + 1)) else 1
            faults["duplicate_ids"] += len(events) - len({e.id for e in events})
            started = sum(1 for e in events if e.type == "turn.started")
            completed = sum(1 for e in events if e.type == "turn.ended")
            faults["lost_inputs"] += max(0, log.inputs - started)
            faults["duplicated_inputs"] += max(0, started - log.inputs)
            faults["unfinished_turns"] += started - completed
            stored = [(e.seq, e.id, e.hash) for e in events[: len(log.seen)]]
            read = [(e["seq"], e["id"], e["hash"]) for e in log.seen]
            faults["read_mismatches"] += 0 if stored == read else 1
    return faults


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def bench_store(label: str, store_url: str, clients: int, duration: float, workdir: Path) -> list[Figure]:
    """Serve ``store_url``, load it, check it; the figures."""
    with open_store(store_url) as store:
        _info, token = create_token(store, "bench", roles={"bench": "editor"}, actor="bench")
    with served(store_url, workdir) as url:
        logs, seconds = asyncio.run(load(url, token, clients, duration))
    faults = check_ledger(store_url, logs)
    sends = [ms for log in logs for ms in log.send_ms]
    reads = [ms for log in logs for ms in log.read_ms]
    turns = [ms for log in logs for ms in log.turn_ms]
    inputs = sum(log.inputs for log in logs)
    errors = sum(len(log.errors) for log in logs)
    return [
        (label, "send_p50", round(percentile(sends, 0.5), 2), "ms"),
        (label, "send_p99", round(percentile(sends, 0.99), 2), "ms"),
        (label, "events_read_p50", round(percentile(reads, 0.5), 2), "ms"),
        (label, "events_read_p99", round(percentile(reads, 0.99), 2), "ms"),
        (label, "turn_p50", round(percentile(turns, 0.5), 2), "ms"),
        (label, "turn_p99", round(percentile(turns, 0.99), 2), "ms"),
        (label, "inputs_per_second", round(inputs / seconds, 1), "inputs/s"),
        (label, "requests_per_second", round((len(sends) + len(reads) + clients) / seconds, 1), "requests/s"),
        (label, "inputs", inputs, "inputs"),
        (label, "requests", len(sends) + len(reads) + clients, "requests"),
        (label, "events_stored", faults["events"], "events"),
        (label, "events_read_over_http", sum(len(log.seen) for log in logs), "events"),
        (label, "chains_verified", len(logs) - faults["invalid_chains"], "threads"),
        (label, "invalid_chains", faults["invalid_chains"], "threads"),
        (label, "lost_inputs", faults["lost_inputs"], "inputs"),
        (label, "duplicated_inputs", faults["duplicated_inputs"], "inputs"),
        (label, "duplicate_event_ids", faults["duplicate_ids"], "events"),
        (label, "seq_gaps", faults["gaps"], "threads"),
        (label, "unfinished_turns", faults["unfinished_turns"], "turns"),
        (label, "read_mismatches", faults["read_mismatches"], "threads"),
        (label, "request_errors", errors, "requests"),
        (label, "seconds", round(seconds, 1), "s"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0, help="Seconds of load per store (default 60).")
    parser.add_argument("--clients", type=int, default=50, help="Concurrent clients (default 50).")
    parser.add_argument("--stores", default="sqlite,postgres", help="Comma-separated: sqlite, postgres.")
    args = parser.parse_args()
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="jixu-bench-api-") as tmp:
        for kind in [s.strip() for s in args.stores.split(",") if s.strip()]:
            workdir = Path(tmp) / kind
            workdir.mkdir()
            if kind == "sqlite":
                figures += bench_store("sqlite", f"sqlite:///{workdir / 'api.db'}", args.clients, args.duration,
                                       workdir)
            elif kind == "postgres":
                from bench.workers import fresh_schema, postgres

                with postgres() as (dsn, _how):
                    url = fresh_schema(dsn, f"jixu_bench_api_{os.getpid()}")
                    figures += bench_store("postgres", url, args.clients, args.duration, workdir)
            else:
                parser.error(f"unknown store {kind!r}")
    print(f"jixu HTTP API: {args.clients} clients, {args.duration:g} s per store, {os.cpu_count()} cores")
    print(f"{'store':<10} {'metric':<24} {'value':>12} unit")
    for label, metric, value, unit in figures:
        print(f"{label:<10} {metric:<24} {value:>12} {unit}")
    for label, metric, value, unit in figures:
        print(json.dumps({"bench": "api", "metric": f"{label}_{metric}", "value": value, "unit": unit}))


if __name__ == "__main__":
    main()
