"""Ledger benchmark: durable appends against raw sqlite3, verify, read and resolver throughput.

Run from a checkout with ``PYTHONPATH=src python bench/ledger.py`` or, after
``pip install .``, ``python bench/ledger.py``. Options: ``--events`` (size of
the verify/read/resolver stream, default 100000), ``--appends`` (single-event
appends per run, default 2000), ``--dir`` (where the temporary databases go;
jixu and the raw baseline always share it, so they see the same fsync).

Prints a table, then one JSON line per figure:
``{"bench": "ledger", "metric": ..., "value": ..., "unit": ...}``.
Throughputs are best of 3 runs; append latencies are the median over all runs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from jixu.ledger.encoding import content_hash
from jixu.ledger.event import NewEvent, utc_now_text
from jixu.ledger.ids import new_id
from jixu.ledger.sqlite import SQLiteStore

RUNS = 3
BATCH = 1000
RAW_SCHEMA = """CREATE TABLE events (
    position    INTEGER PRIMARY KEY,
    id          TEXT NOT NULL,
    stream      TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    type        TEXT NOT NULL,
    data        TEXT NOT NULL,
    meta        TEXT NOT NULL,
    recorded_at TEXT NOT NULL,
    prev_hash   TEXT NOT NULL,
    hash        TEXT NOT NULL,
    UNIQUE (stream, seq),
    UNIQUE (id)
)"""
RAW_INSERT = ("INSERT INTO events (id, stream, seq, type, data, meta, recorded_at, prev_hash, hash) "
              "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")

Figure = tuple[str, str, float, str]  # (label, metric, value, unit)


# --- workloads ------------------------------------------------------------------------------------------


def step_event(i: int) -> NewEvent:
    """A small agent event, the kind appended one at a time."""
    return NewEvent(
        "agent.step",
        {"step": i, "kind": "model.turn", "summary": f"turn {i}: planned the next tool call", "tokens": 812},
        {"actor": "agent:bench", "correlation_id": f"run-{i // 100}", "schema": 1},
    )


def raw_rows(stream: str, count: int) -> list[tuple[Any, ...]]:
    """Rows like jixu stores for ``step_event`` (precomputed: the baseline pays only for SQLite)."""
    rows = []
    prev = "0" * 64
    for i in range(count):
        event = step_event(i)
        data = json.dumps(event.data, sort_keys=True, separators=(",", ":"))
        meta = json.dumps(event.meta, sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(f"{prev}{data}{meta}".encode()).hexdigest()
        rows.append((new_id(), stream, i + 1, event.type, data, meta, utc_now_text(), prev, digest))
        prev = digest
    return rows


def lifecycle_events(total: int) -> Iterator[NewEvent]:
    """``total`` tool lifecycle events: requested, dispatched, completed per effect."""
    produced = 0
    effect = 0
    while True:
        effect += 1
        effect_id = f"eff-{effect:08d}"
        args = {"path": f"/srv/app/config/service-{effect % 97}.yaml", "mode": "read",
                "query": f"select status from deploys where id = {effect}", "limit": 50}
        args_hash = content_hash(args)
        key = f"idem-{effect_id}"
        meta = {"actor": "agent:bench", "correlation_id": f"thread-{effect // 50}", "schema": 1}
        for event in (
            NewEvent("tool.requested", {"effect_id": effect_id, "name": "fs.read", "args": args,
                                        "args_hash": args_hash, "semantics": "idempotent",
                                        "idempotency_key": key, "requires_approval": False}, meta),
            NewEvent("tool.dispatched", {"effect_id": effect_id, "attempt": 1, "name": "fs.read",
                                         "args_hash": args_hash, "idempotency_key": key}, meta),
            NewEvent("tool.completed", {"effect_id": effect_id, "attempt": 1,
                                        "result": {"ok": True, "status": "deployed", "rows": effect % 50,
                                                   "digest": args_hash[:32],
                                                   "note": "service healthy; no action needed"}}, meta),
        ):
            if produced == total:
                return
            produced += 1
            yield event


# --- measurements ---------------------------------------------------------------------------------------


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def best_of(fn: Callable[[], object], runs: int = RUNS) -> float:
    return min(timed(fn) for _ in range(runs))


def jixu_appends(path: Path, count: int) -> list[float]:
    """Latencies of ``count`` single-event durable appends (synchronous FULL)."""
    events = [step_event(i) for i in range(count)]
    latencies = []
    with SQLiteStore(path, synchronous="FULL") as store:
        for head, event in enumerate(events):
            start = time.perf_counter()
            store.append("bench/appends", [event], expected_seq=head)
            latencies.append(time.perf_counter() - start)
    return latencies


def raw_appends(path: Path, count: int) -> list[float]:
    """Latencies of ``count`` INSERT + COMMIT transactions with the same WAL + FULL settings."""
    rows = raw_rows("bench/appends", count)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute(RAW_SCHEMA)
        latencies = []
        for row in rows:
            start = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(RAW_INSERT, row)
            conn.execute("COMMIT")
            latencies.append(time.perf_counter() - start)
        return latencies
    finally:
        conn.close()


def bench_appends(workdir: Path, count: int) -> list[Figure]:
    jixu_rates, raw_rates = [], []
    jixu_lat: list[float] = []
    raw_lat: list[float] = []
    for run in range(RUNS):  # interleaved, so drift in the machine hits both alike
        lat = jixu_appends(workdir / f"jixu-appends-{run}.db", count)
        jixu_lat += lat
        jixu_rates.append(count / sum(lat))
        lat = raw_appends(workdir / f"raw-appends-{run}.db", count)
        raw_lat += lat
        raw_rates.append(count / sum(lat))
    jixu_median = statistics.median(jixu_lat) * 1000
    raw_median = statistics.median(raw_lat) * 1000
    return [
        ("jixu append (1 event, FULL)", "append_per_s", max(jixu_rates), "appends/s"),
        ("jixu append median latency", "append_median_ms", jixu_median, "ms"),
        ("raw sqlite3 INSERT+COMMIT", "raw_append_per_s", max(raw_rates), "appends/s"),
        ("raw sqlite3 median latency", "raw_append_median_ms", raw_median, "ms"),
        ("jixu / raw median latency (target <= 1.5)", "append_ratio_vs_raw", jixu_median / raw_median, "x"),
    ]


def build_stream(store: SQLiteStore, stream: str, total: int) -> float:
    """Append ``total`` lifecycle events in batches of ``BATCH``; return the elapsed seconds."""
    events = list(lifecycle_events(total))
    elapsed = 0.0
    for start in range(0, total, BATCH):
        batch = events[start:start + BATCH]
        elapsed += timed(lambda batch=batch, start=start: store.append(stream, batch, expected_seq=start))
    return elapsed


def bench_stream(workdir: Path, total: int, notes: list[str]) -> list[Figure]:
    stream = "bench/thread-1"
    figures: list[Figure] = []
    with SQLiteStore(workdir / "jixu-stream.db", synchronous="FULL") as store:
        build = build_stream(store, stream, total)
        figures.append((f"batched append ({BATCH}/batch)", "append_batch_events_per_s", total / build, "events/s"))

        report = store.verify(stream)
        if not report.valid or report.count != total:
            raise SystemExit(f"benchmark stream does not verify: {report}")
        figures.append(("verify", "verify_events_per_s", total / best_of(lambda: store.verify(stream)),
                        "events/s"))

        events = store.read(stream)
        figures.append(("read (parse to Event)", "read_events_per_s", total / best_of(lambda: store.read(stream)),
                        "events/s"))

    try:
        from jixu.recovery import RecoveryResolver
    except ImportError as exc:
        notes.append(f"resolver: unavailable ({exc}); no resolver figure")
        return figures
    resolver = RecoveryResolver()
    analysis = resolver.analyze(events)
    states: dict[str, int] = {}
    for decision in analysis.decisions.values():
        states[decision.state] = states.get(decision.state, 0) + 1
    if analysis.has_corruption:
        raise SystemExit(f"the resolver found corruption in the benchmark stream: {states}")
    notes.append(f"resolver sanity: {len(analysis.decisions)} effects, states {states}")
    figures.append(("RecoveryResolver.analyze", "resolver_events_per_s",
                    total / best_of(lambda: resolver.analyze(events)), "events/s"))
    return figures


# --- output ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--events", type=int, default=100_000, help="events in the verify/read/resolver stream")
    parser.add_argument("--appends", type=int, default=2000, help="single-event appends per run")
    parser.add_argument("--dir", default=None, help="directory for the temporary databases")
    args = parser.parse_args(argv)
    if args.events < 1 or args.appends < 1:
        parser.error("--events and --appends must be >= 1")

    with tempfile.TemporaryDirectory(prefix="jixu-bench-", dir=args.dir) as tmp:
        workdir = Path(tmp)
        started = time.perf_counter()
        notes: list[str] = []
        figures = bench_appends(workdir, args.appends) + bench_stream(workdir, args.events, notes)
        elapsed = time.perf_counter() - started

    print(f"jixu ledger benchmark - Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
          f"{platform.machine()}, {os.cpu_count()} CPUs, dir {args.dir or tempfile.gettempdir()}")
    print(f"{args.appends} single-event appends x {RUNS} runs; stream of {args.events} events; "
          f"best of {RUNS}; {elapsed:.1f}s")
    for note in notes:
        print(note)
    width = max(len(label) for label, *_ in figures)
    print(f"{'measure':<{width}}  {'value':>14}  unit")
    print(f"{'-' * width}  {'-' * 14}  ----")
    for label, _metric, value, unit in figures:
        print(f"{label:<{width}}  {value:>14,.3f}  {unit}")
    print()
    for _label, metric, value, unit in figures:
        print(json.dumps({"bench": "ledger", "metric": metric, "value": round(value, 4), "unit": unit}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
