"""Soak of the effect kernel: the model-based check of tests/kernel/model.py for minutes instead of seconds.

Exact command (from the repository root, in the test environment)::

    .venv/bin/python bench/soak.py --minutes 5 --stores sqlite,postgres

Each scenario is drawn from a seed (threads alone or sharing commits; parallel calls of every semantics in
one response; another connection approving, denying, resolving, interrupting and writing meanwhile; one in
four crashes after a random append and is recovered by a new Harness). After every step the rules of issue
21 are checked (see the module docstring of tests/kernel/model.py). A broken rule stops the soak with the
seed that broke it (``python bench/soak.py --seed N`` runs that one scenario again) and exit status 1.

Prints a human table per store, then one JSON line per figure
``{"bench": "soak", "metric": ..., "value": ..., "unit": ...}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for entry in (str(ROOT / "src"), str(ROOT)):
    if entry not in sys.path:
        sys.path.insert(0, entry)

from tests.kernel.model import InvariantBroken, draw, run_scenario  # noqa: E402

from jixu.ledger import SQLiteStore, Store  # noqa: E402
from jixu.ledger.postgres import PostgresStore  # noqa: E402


@contextmanager
def opener_of(kind: str, directory: Path) -> Iterator[Callable[[], Store]]:
    """New connections to a fresh ledger of ``kind`` (a throwaway PostgreSQL from pgserver, or a SQLite file)."""
    if kind == "sqlite":
        path = directory / "soak.db"
        yield lambda: SQLiteStore(path)
        return
    import os

    dsn = os.environ.get("JIXU_BENCH_POSTGRES_DSN")
    if dsn:
        yield lambda: PostgresStore(dsn, max_size=4)
        return
    import pgserver

    server = pgserver.get_server(tempfile.mkdtemp(prefix="jixu-soak-pg-"), cleanup_mode="stop")
    try:
        uri = server.get_uri()
        yield lambda: PostgresStore(uri, max_size=4)
    finally:
        server.cleanup()


def soak(kind: str, seconds: float, first_seed: int) -> dict[str, float]:
    """Run scenarios on one store kind for ``seconds``; the counts."""
    counts = {"scenarios": 0.0, "crashes": 0.0, "steps": 0.0, "tool_calls": 0.0, "unsafe_calls": 0.0}
    with tempfile.TemporaryDirectory() as directory, opener_of(kind, Path(directory)) as opener:
        deadline = time.monotonic() + seconds
        seed = first_seed
        while time.monotonic() < deadline:
            try:
                outcome = asyncio.run(run_scenario(draw(seed), opener))
            except InvariantBroken as broken:
                print(f"{kind}: seed {seed} broke a rule: {broken}", file=sys.stderr)
                raise SystemExit(1) from broken
            counts["scenarios"] += 1
            counts["crashes"] += outcome.crashed
            counts["steps"] += outcome.steps
            counts["tool_calls"] += outcome.calls
            counts["unsafe_calls"] += outcome.unsafe_calls
            seed += 1
        counts["seconds"] = seconds
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="minutes per store kind (default 5)")
    parser.add_argument("--stores", default="sqlite,postgres", help="sqlite, postgres")
    parser.add_argument("--first-seed", type=int, default=1_000_000, help="the first scenario's seed")
    parser.add_argument("--seed", type=int, default=None, help="run this one scenario on SQLite and stop")
    args = parser.parse_args()
    if args.seed is not None:
        with tempfile.TemporaryDirectory() as directory, opener_of("sqlite", Path(directory)) as opener:
            asyncio.run(run_scenario(draw(args.seed), opener))
        print(f"seed {args.seed}: every rule held")
        return
    results = {kind: soak(kind, args.minutes * 60, args.first_seed) for kind in args.stores.split(",")}
    print(f"{'store':10} {'scenarios':>10} {'crashes':>8} {'steps':>8} {'tool calls':>11} {'unsafe':>8} {'minutes':>8}")
    for kind, counts in results.items():
        print(f"{kind:10} {counts['scenarios']:>10.0f} {counts['crashes']:>8.0f} {counts['steps']:>8.0f} "
              f"{counts['tool_calls']:>11.0f} {counts['unsafe_calls']:>8.0f} {counts['seconds'] / 60:>8.1f}")
    print("every rule held in every scenario")
    for kind, counts in results.items():
        for metric, value in counts.items():
            unit = "s" if metric == "seconds" else "count"
            print(json.dumps({"bench": "soak", "metric": f"{kind}_{metric}", "value": value, "unit": unit}))


if __name__ == "__main__":
    main()
