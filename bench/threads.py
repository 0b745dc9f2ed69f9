"""Threads benchmark: durable agent-step overhead and ``open_thread`` time on long threads.

Run from a checkout with ``PYTHONPATH=src python bench/threads.py`` or, after
``pip install .``, ``python bench/threads.py``. ``--quick`` runs smaller sizes.

1. **Step overhead.** One turn in which a ``ScriptedModel(fn)`` calls a no-op
   ``read_only`` tool ``--steps`` times (default 300), then replies. An agent
   step is one model call plus one tool call: six durable events (intent,
   dispatch marker and receipt of each). Measured on SQLite with
   ``synchronous=FULL`` (the default: every append is fsynced), and for
   comparison on the in-memory store. Per-step time is the median of the gaps
   between consecutive model calls (and the mean is turn time / steps); both
   include everything the harness does per step, nothing is subtracted.
   The same is measured once more on a thread that already has 10k events of
   history, to show how the per-step cost depends on the history length.
2. **open_thread.** Threads of about 1k / 10k / 100k events (many turns of
   ten tool steps each) are written straight to the ledger in large batches
   with ``synchronous=NORMAL`` (building only), the same event shapes the
   harness writes, then validated by opening them. The checkpoint is written
   by the harness itself (``wait()`` on the opened thread). Measured: a fresh
   Harness on a FULL store opening the thread with that checkpoint, and opening
   a copy of the file whose checkpoints were deleted (full projection).
   Medians over ``--reps`` repetitions, in ms.

Prints a table, then one JSON line per figure:
``{"bench": "threads", "metric": ..., "value": ..., "unit": ...}``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jixu.ledger import MemoryStore, NewEvent, SQLiteStore, Store, content_hash, new_id
from jixu.threads import Agent, Harness, ModelResponse, ScriptedModel, ToolCall, tool
from jixu.threads.log import stream_of
from jixu.threads.model import Step

Figure = tuple[str, str, float, str]  # (label, metric, value, unit)
STEPS_PER_TURN = 10
BUILD_BATCH = 2000


@tool(semantics="read_only")
def noop() -> None:
    """Do nothing (the benchmark's tool)."""


class StepClock:
    """A model script: call ``noop`` ``steps`` times per turn, then reply; time every model call."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.stamps: list[float] = []

    def __call__(self, messages: list[dict[str, Any]]) -> Step:
        self.stamps.append(time.perf_counter())
        done = 0
        for message in reversed(messages):
            if message["role"] == "user":
                break
            if message["role"] == "assistant":
                done += 1
        return ToolCall("noop") if done < self.steps else "done"


def agent(script: StepClock | None = None, *, max_steps: int = 1000) -> Agent:
    model = ScriptedModel(script if script is not None else StepClock(STEPS_PER_TURN), keep_calls=False)
    return Agent("bench", model, tools=[noop], max_steps=max_steps)


# --- 1. step overhead ------------------------------------------------------------------------------------


async def one_turn(harness: Harness, clock: StepClock, thread_id: str | None = None) -> tuple[float, int, int]:
    """(seconds, events written, steps) of one turn of ``clock.steps`` tool steps plus the reply."""
    thread = await (harness.open_thread(thread_id) if thread_id else harness.create_thread())
    before = thread.state().seq
    clock.stamps.clear()
    start = time.perf_counter()
    await thread.send("go")
    state = await thread.wait()
    elapsed = time.perf_counter() - start
    if state.status != "idle" or state.last_reply != "done":
        raise SystemExit(f"benchmark turn did not finish: {state.status} {state.reason} {state.turns[-1]}")
    return elapsed, state.seq - before, clock.steps


def step_figures(name: str, label: str, runs: list[tuple[float, int, int, list[float]]]) -> list[Figure]:
    gaps = [b - a for *_, stamps in runs for a, b in itertools.pairwise(stamps)]
    seconds = [elapsed / steps for elapsed, _events, steps, _stamps in runs]
    # A turn writes turn.started, six events per step, the replying model call (3) and turn.ended.
    events_per_step = statistics.median((events - 5) / steps for _e, events, steps, _s in runs)
    return [
        (f"{label}: agent step (model + tool call), median", f"step_ms_median_{name}",
         statistics.median(gaps) * 1000, "ms"),
        (f"{label}: agent step, mean (turn time / steps)", f"step_ms_mean_{name}",
         statistics.median(seconds) * 1000, "ms"),
        (f"{label}: events per step", f"events_per_step_{name}", events_per_step, "events"),
    ]


async def bench_steps(workdir: Path, steps: int, reps: int) -> list[Figure]:
    figures: list[Figure] = []
    for name, label, make in (
        ("sqlite_full", "SQLite FULL", lambda i: SQLiteStore(workdir / f"steps-{i}.db", synchronous="FULL")),
        ("memory", "memory", lambda i: MemoryStore()),
    ):
        runs = []
        for i in range(reps):
            clock = StepClock(steps)
            store: Store = make(i)
            harness = Harness(agent(clock, max_steps=steps + 1), store)
            elapsed, events, count = await one_turn(harness, clock)
            runs.append((elapsed, events, count, list(clock.stamps)))
            store.close()
        figures.extend(step_figures(name, label, runs))
    return figures


async def bench_late_steps(path: Path, thread_id: str, steps: int, history: int) -> list[Figure]:
    """Step overhead on a thread that already has ``history`` events (SQLite FULL, fresh harness)."""
    clock = StepClock(steps)
    with SQLiteStore(path, synchronous="FULL") as store:
        harness = Harness(agent(clock, max_steps=steps + 1), store)
        elapsed, events, count = await one_turn(harness, clock, thread_id)
    runs = [(elapsed, events, count, list(clock.stamps))]
    tag = f"{history // 1000}k"
    return [
        (f"SQLite FULL after {tag} events: agent step, median", f"step_ms_median_sqlite_full_after_{tag}_events",
         statistics.median(b - a for a, b in itertools.pairwise(clock.stamps)) * 1000, "ms"),
        (f"SQLite FULL after {tag} events: agent step, mean", f"step_ms_mean_sqlite_full_after_{tag}_events",
         runs[0][0] / count * 1000, "ms"),
    ]


# --- 2. long threads -------------------------------------------------------------------------------------


def turn_events(thread_id: str, first_seq: int, steps: int) -> Iterator[NewEvent]:
    """One completed turn of ``steps`` noop tool steps and a reply, shaped exactly as the harness writes it."""
    meta = {"actor": "jixu", "thread_id": thread_id}
    turn_id = new_id()
    seq = first_seq
    messages = 0

    def event(event_type: str, data: dict[str, Any]) -> NewEvent:
        nonlocal seq
        seq += 1
        return NewEvent(event_type, data, meta)

    yield event("turn.started", {"turn_id": turn_id, "input": "go"})
    messages += 1
    for step in range(steps + 1):
        model_eid = new_id()
        args = {"turn_id": turn_id, "context_seq": seq, "messages": messages}
        args_hash = content_hash(args)
        yield event("model.requested", {
            "effect_id": model_eid, "name": "scripted", "args": args, "args_hash": args_hash,
            "semantics": "read_only", "idempotency_key": f"jixu:{model_eid}", "requires_approval": False,
            "turn_id": turn_id})
        yield event("model.dispatched", {"effect_id": model_eid, "attempt": 1,
                                         "idempotency_key": f"jixu:{model_eid}", "args_hash": args_hash})
        last = step == steps
        response = (ModelResponse(text="done", model="scripted", stop_reason="end_turn") if last else
                    ModelResponse(tool_calls=(ToolCall("noop"),), model="scripted", stop_reason="tool_use"))
        result = response.to_result(model_eid)
        yield event("model.completed", {"effect_id": model_eid, "attempt": 1, "result": result})
        messages += 1
        if last:
            break
        tool_eid = new_id()
        tool_args: dict[str, Any] = {}
        tool_hash = content_hash(tool_args)
        yield event("tool.requested", {
            "effect_id": tool_eid, "name": "noop", "args": tool_args, "args_hash": tool_hash,
            "semantics": "read_only", "idempotency_key": f"jixu:{tool_eid}", "requires_approval": False,
            "turn_id": turn_id, "call_id": result["tool_calls"][0]["id"]})
        yield event("tool.dispatched", {"effect_id": tool_eid, "attempt": 1, "name": "noop",
                                        "args_hash": tool_hash, "idempotency_key": f"jixu:{tool_eid}"})
        yield event("tool.completed", {"effect_id": tool_eid, "attempt": 1, "result": None})
        messages += 1
    yield event("turn.ended", {"turn_id": turn_id, "outcome": "completed", "reply": "done"})


async def build_thread(path: Path, target: int) -> tuple[str, int, float]:
    """A thread of about ``target`` events in a new file (NORMAL while building); returns (id, events, s)."""
    start = time.perf_counter()
    with SQLiteStore(path, synchronous="NORMAL") as store:
        harness = Harness(agent(), store)
        thread = await harness.create_thread()
        stream = stream_of(thread.thread_id)
        head = 1
        pending: list[NewEvent] = []
        per_turn = 6 * STEPS_PER_TURN + 5
        while head + len(pending) < target:
            room = target - head - len(pending)
            steps = STEPS_PER_TURN if room >= per_turn else max(0, (room - 5) // 6)
            pending.extend(turn_events(thread.thread_id, head + len(pending), steps))
            if len(pending) >= BUILD_BATCH:
                store.append(stream, pending, head)
                head += len(pending)
                pending = []
        if pending:
            store.append(stream, pending, head)
            head += len(pending)
        # Validate with the real projection, then let the harness write its checkpoint.
        opened = await harness.open_thread(thread.thread_id)
        state = await opened.wait()
        if state.status != "idle" or state.analysis.has_corruption or state.seq != head:
            raise SystemExit(f"built thread is not a clean idle thread: {state.status} {state.reason}")
        if opened.log.store.read_checkpoint(stream, "thread") is None:
            raise SystemExit("the harness wrote no checkpoint for the built thread")
    return thread.thread_id, head, time.perf_counter() - start


async def open_ms(path: Path, thread_id: str, reps: int, expect_checkpoint: str) -> float:
    """Median ms for a fresh Harness (FULL store) to open the thread."""
    times = []
    for _ in range(reps):
        with SQLiteStore(path, synchronous="FULL") as store:
            harness = Harness(agent(), store)
            start = time.perf_counter()
            thread = await harness.open_thread(thread_id)
            times.append(time.perf_counter() - start)
            if thread.checkpoint_status != expect_checkpoint or thread.state().status != "idle":
                raise SystemExit(f"open used checkpoint {thread.checkpoint_status!r}, expected "
                                 f"{expect_checkpoint!r}; status {thread.state().status}")
    return statistics.median(times) * 1000


def without_checkpoint(path: Path) -> Path:
    """A copy of the ledger file with every checkpoint deleted."""
    copy = path.with_name(path.stem + "-nocp.db")
    with SQLiteStore(path) as _store:  # checkpoint the WAL into the main file before copying
        pass
    shutil.copyfile(path, copy)
    conn = sqlite3.connect(copy)
    try:
        conn.execute("DELETE FROM jixu_checkpoints")
        conn.commit()
    finally:
        conn.close()
    return copy


async def bench_open(workdir: Path, sizes: list[int], reps: int, notes: list[str],
                     late_steps: int) -> list[Figure]:
    figures: list[Figure] = []
    late: list[Figure] = []
    for target in sizes:
        path = workdir / f"long-{target}.db"
        thread_id, events, build_s = await build_thread(path, target)
        tag = f"{target // 1000}k" if target >= 1000 else str(target)
        notes.append(f"built a {events}-event thread in {build_s:.1f}s (NORMAL, batches of {BUILD_BATCH})")
        bare = without_checkpoint(path)
        with_cp = await open_ms(path, thread_id, reps, "used")
        without = await open_ms(bare, thread_id, reps, "none")
        figures.append((f"open_thread, {events} events, with checkpoint", f"open_thread_ms_{tag}_checkpoint",
                        with_cp, "ms"))
        figures.append((f"open_thread, {events} events, no checkpoint", f"open_thread_ms_{tag}_no_checkpoint",
                        without, "ms"))
        if target == 10_000 and late_steps:
            late = await bench_late_steps(path, thread_id, late_steps, target)
    return figures + late


# --- output ---------------------------------------------------------------------------------------------


async def run_all(args: argparse.Namespace, workdir: Path, notes: list[str]) -> list[Figure]:
    figures = await bench_steps(workdir, args.steps, args.reps)
    figures += await bench_open(workdir, args.sizes, args.reps, notes, args.late_steps)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smaller sizes (100 steps; 1k and 10k events)")
    parser.add_argument("--steps", type=int, default=None, help="tool steps in the overhead turn (default 300)")
    parser.add_argument("--reps", type=int, default=None, help="repetitions per figure (default 3)")
    parser.add_argument("--dir", default=None, help="directory for the temporary databases")
    args = parser.parse_args(argv)
    args.steps = args.steps or (100 if args.quick else 300)
    args.reps = args.reps or (2 if args.quick else 3)
    args.sizes = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    args.late_steps = 20 if args.quick else 50
    if args.steps < 2 or args.reps < 1:
        parser.error("--steps must be >= 2 and --reps >= 1")

    with tempfile.TemporaryDirectory(prefix="jixu-bench-threads-", dir=args.dir) as tmp:
        started = time.perf_counter()
        notes: list[str] = []
        figures = asyncio.run(run_all(args, Path(tmp), notes))
        elapsed = time.perf_counter() - started

    print(f"jixu threads benchmark - Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
          f"{platform.machine()}, {os.cpu_count()} CPUs, dir {args.dir or tempfile.gettempdir()}")
    print(f"{args.steps} tool steps per turn x {args.reps} runs; threads of {args.sizes} events; "
          f"medians of {args.reps}; {elapsed:.1f}s")
    for note in notes:
        print(note)
    width = max(len(label) for label, *_ in figures)
    print(f"{'measure':<{width}}  {'value':>12}  unit")
    print(f"{'-' * width}  {'-' * 12}  ----")
    for label, _metric, value, unit in figures:
        print(f"{label:<{width}}  {value:>12,.3f}  {unit}")
    print()
    for _label, metric, value, unit in figures:
        print(json.dumps({"bench": "threads", "metric": metric, "value": round(value, 4), "unit": unit}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
