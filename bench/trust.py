"""What trusting nothing unverified costs (decision 0025): open, open to act, verify, replay of a long thread.

Builds a thread of ``--events`` events (bench/threads.py's shapes, checkpoint written by the harness), then,
``--reps`` times each, best and median:

- ``open``: ``Harness.open_thread`` by a fresh harness (sealed checkpoint, O(tail)): target < 50 ms;
- ``open to act``: the same, then ``ThreadLog.open_to_act()``, what ``send`` (or any other act) crosses
  before it appends: the whole chain verified (the ledger's verdict): target < 500 ms;
- ``verify``: ``Store.verify`` (events/s, target >= 250,000) and ``trust.verdict`` (the same plus the sealed
  checkpoint's anchor and a recorded break);
- ``replay``: ``jixu.ledger.projection.replay`` through the thread projection (events/s, target >= 200,000).

``--json`` prints the figures as one JSON object. Run it with another checkout's ``src`` on ``PYTHONPATH``
to compare: what that code lacks (``open_to_act``, ``verdict``) is reported as ``null``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from jixu.ledger import SQLiteStore
from jixu.ledger.projection import replay
from jixu.threads import Harness
from jixu.threads.log import stream_of
from jixu.threads.projection import ThreadProjection
from threads import agent, build_thread


def timed(reps: int, fn: Callable[[], Any]) -> list[float]:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--dir", default=None, help="directory for the SQLite file")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="jixu-trust-", dir=args.dir) as tmp:
        path = Path(tmp) / "trust.db"
        thread_id, count, _built = asyncio.run(build_thread(path, args.events))
        stream = stream_of(thread_id)
        figures: dict[str, Any] = {"events": count}
        with SQLiteStore(path) as store:
            def open_once() -> Any:
                thread = asyncio.run(Harness(agent(), store).open_thread(thread_id))
                if thread.checkpoint_status != "used":
                    raise SystemExit(f"open_thread did not use the checkpoint: {thread.checkpoint_status}")
                return thread

            if open_once().state().status != "idle":
                raise SystemExit("the thread is not idle")
            opens = timed(args.reps, open_once)
            figures["open_ms"] = {"median": statistics.median(opens) * 1000, "best": min(opens) * 1000}
            if hasattr(open_once().log, "open_to_act"):
                def open_to_act() -> None:
                    open_once().log.open_to_act()

                acts = timed(args.reps, open_to_act)
                figures["open_to_act_ms"] = {"median": statistics.median(acts) * 1000, "best": min(acts) * 1000}
            else:
                figures["open_to_act_ms"] = None
            verifies = timed(args.reps, lambda: store.verify(stream))
            figures["verify_events_per_s"] = {"median": count / statistics.median(verifies),
                                              "best": count / min(verifies)}
            try:
                from jixu.ledger.trust import verdict
            except ImportError:
                figures["verdict_events_per_s"] = None
            else:
                verdicts = timed(args.reps, lambda: verdict(store, stream, checkpoints=("thread",)))
                figures["verdict_events_per_s"] = {"median": count / statistics.median(verdicts),
                                                   "best": count / min(verdicts)}
            replays = timed(args.reps, lambda: replay(store, stream, ThreadProjection()))
            figures["replay_events_per_s"] = {"median": count / statistics.median(replays),
                                              "best": count / min(replays)}
    if args.json:
        print(json.dumps(figures))
        return 0
    for name, value in figures.items():
        if isinstance(value, dict):
            print(f"{name:24} median {value['median']:>12,.1f}   best {value['best']:>12,.1f}")
        else:
            print(f"{name:24} {value}")
    for name, value in figures.items():
        if isinstance(value, dict):
            unit = "ms" if name.endswith("_ms") else "events/s"
            print(json.dumps({"bench": "trust", "metric": name, "value": round(value["median"], 4), "unit": unit}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
