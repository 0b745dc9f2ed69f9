"""Where the time goes: sampling profiles (py-spy) of the two workloads of docs/performance.md whose targets
are missed, summarised by area and by function.

Exact command (from the repository root; py-spy lives only in the benchmark's own venv)::

    bench/.venv-peers/bin/pip install py-spy
    bench/.venv-peers/bin/python bench/profile.py            # add --write-docs to update docs/performance.md

Profiles, each of its own subprocess (py-spy samples every thread of it at ``--rate`` Hz and leaves out
the threads it sees as idle; a thread blocked on a lock or in epoll may still count, so those waits are an
area of their own):

- ``concurrency``: 64 threads on one event loop with ``group_commits`` on one SQLite file (FULL), the
  no-op ``async def`` tool, ``--steps`` agent steps each (the workload of compare.py's concurrency figure,
  run by compare.py's own child).
- ``replay``: a ~``--events``-event thread is built first (not profiled), then a process replays it
  ``--reps`` times (``jixu.ledger.projection.replay`` through ``ThreadProjection``, as compare.py does).

Only the samples of the measured work are summarised: for ``concurrency`` the samples inside compare.py's
``run_concurrent_loop`` or on another thread than the main one, for ``replay`` those inside ``replay``;
imports are left out too (the start-up's count is printed). Each sample is put in the area of its
innermost Python frame (time inside a C call, such as an SQLite
statement, a JSON scan or a SHA-256, counts for the Python line that called it). Prints the tables, then one
JSON line per area share ``{"bench": "profile", "metric": ..., "value": ..., "unit": "%"}``.
``--write-docs`` rewrites the profile section of docs/performance.md from this run.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "performance.md"
BEGIN_MARK = "<!-- profile.py: begin -->"
END_MARK = "<!-- profile.py: end -->"

COMMIT_AREA = ("SQLite COMMIT: WAL writes and the fsync (its wait is not CPU)", "sqlite_commit")
WAIT_AREA = ("waiting in epoll or for executor work (idle, or polling)", "waiting")
# Frames where a thread waits with the GIL released; py-spy may count them as active.
_WAITS = ("selectors.py", "concurrent/futures/thread.py", "threading.py", "queue.py")
# (label, key, path prefixes of the innermost Python frame); the first match wins.
AREAS: list[tuple[str, str, tuple[str, ...]]] = [
    ("SQLite store: statements, row building", "sqlite_store",
     ("jixu/ledger/sqlite.py", "jixu/ledger/store.py")),
    ("events: encode, seal, hash, decode, ids", "events",
     ("jixu/ledger/encoding.py", "jixu/ledger/event.py", "jixu/ledger/chain.py", "jixu/ledger/ids.py")),
    ("group commit batcher", "batcher", ("jixu/ledger/batching.py",)),
    ("fold loop", "fold", ("jixu/ledger/projection.py",)),
    ("resolver (decisions, decision text)", "resolver", ("jixu/recovery/",)),
    ("thread projection (reducer, mark, rollback)", "projection", ("jixu/threads/projection.py",)),
    ("agent loop, thread log, decide", "agent_loop", ("jixu/threads/", "jixu/")),
    ("asyncio (tasks, futures, callbacks)", "asyncio", ("asyncio/",)),
    ("benchmark's agent (scripted model, tool)", "bench_agent", ("compare.py", "threads.py", "profile.py")),
]
OTHER = ("other (start-up, imports, stdlib)", "other")
_FRAME = re.compile(r"^(?P<function>.*) \((?P<where>[^()]*?)(?::(?P<line>\d+))?\)$")


@dataclass
class Profile:
    """The samples of one py-spy run, summarised."""

    name: str
    title: str
    samples: int = 0
    notes: list[str] = field(default_factory=list)
    left_out: int = 0
    """Samples outside the measured work (start-up, imports, building the workload)."""
    by_area: Counter[str] = field(default_factory=Counter)
    by_thread: Counter[str] = field(default_factory=Counter)
    self_by_function: Counter[str] = field(default_factory=Counter)
    total_by_function: Counter[str] = field(default_factory=Counter)
    self_by_line: Counter[str] = field(default_factory=Counter)


def parse_frame(frame: str) -> tuple[str, str, str]:
    """``(function, file, line)`` of a py-spy frame ``function (file:line)``."""
    match = _FRAME.match(frame)
    if match is None:
        return frame, "", ""
    return match["function"], match["where"], match["line"] or ""


@functools.cache
def _source_lines(path: str) -> list[str]:
    try:
        return (ROOT / "src" / path).read_text().splitlines()
    except OSError:
        return []


def _source_line(path: str, number: str) -> str:
    """Line ``number`` of jixu's ``path`` (``jixu/...``), or ""."""
    lines = _source_lines(path)
    return lines[int(number) - 1] if number.isdigit() and 0 < int(number) <= len(lines) else ""


def area_of(path: str, number: str = "") -> tuple[str, str]:
    """The ``(label, key)`` of the area of an innermost frame in ``path`` at line ``number``."""
    if path == "jixu/ledger/sqlite.py" and 'execute("COMMIT")' in _source_line(path, number):
        return COMMIT_AREA
    if any(path.startswith(wait) for wait in _WAITS):
        return WAIT_AREA
    for label, key, prefixes in AREAS:
        if any(path.startswith(prefix) or f"/{prefix}" in path for prefix in prefixes):
            return label, key
    return OTHER


def summarise(name: str, title: str, raw: str, measured: Callable[[str, list[str]], bool]) -> Profile:
    """Read py-spy's ``--format raw`` output (``frame;frame;... count``, outermost first), keeping the
    samples for which ``measured(thread, frames)`` holds."""
    profile = Profile(name, title)
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = "?"
        if frames and frames[0].startswith("thread ("):
            thread = frames.pop(0).split(": ", 1)[-1]
            thread = "commit thread (executor)" if thread.startswith("asyncio_") else thread
        if not frames:
            continue
        if not measured(thread, frames) or any("importlib" in frame for frame in frames):
            profile.left_out += count
            continue
        parsed = [parse_frame(frame) for frame in frames]
        function, path, number = parsed[-1]
        label = area_of(path, number)[0]
        profile.samples += count
        profile.by_thread[thread] += count
        profile.by_area[label] += count
        profile.self_by_function[f"{function} ({path})"] += count
        profile.self_by_line[f"{path}:{number} {function}"] += count
        for each in {f"{f} ({p})" for f, p, _ in parsed if p.startswith("jixu/")}:
            profile.total_by_function[each] += count
    return profile


def py_spy() -> str:
    """The py-spy executable: next to this interpreter, else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise SystemExit("py-spy is not installed: bench/.venv-peers/bin/pip install py-spy")
    return found


def record(command: list[str], rate: int, workdir: Path, name: str) -> str:
    """Run ``command`` under py-spy (every thread, idle ones left out) and return the raw samples."""
    out = workdir / f"{name}.txt"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT / "src"), str(ROOT / "bench"),
                                                    env.get("PYTHONPATH", "")] if p)
    done = subprocess.run([py_spy(), "record", "--format", "raw", "--rate", str(rate), "--threads", "--output",
                           str(out), "--", *command], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, timeout=900, check=False)
    if done.returncode != 0 or not out.exists():
        # py-spy needs to read the child's memory (ptrace): say what it said, e.g. a permission it lacks.
        raise SystemExit(f"py-spy failed on the {name} profile (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return out.read_text()


def replay_child(path: str, thread_id: str, reps: int) -> None:
    """The profiled process of the ``replay`` profile: replay the thread ``reps`` times."""
    from jixu.ledger import SQLiteStore
    from jixu.ledger.projection import replay
    from jixu.threads.log import stream_of
    from jixu.threads.projection import ThreadProjection

    with SQLiteStore(path) as store:
        for _ in range(reps):
            replay(store, stream_of(thread_id), ThreadProjection())


def gc_child(path: str, threads: int, steps: int) -> None:
    """The concurrency workload without the profiler, timing the cyclic GC's collections (py-spy puts a
    collection in whatever line allocated the object that set it off)."""
    import gc

    from compare import run_concurrent_loop

    started: dict[int, float] = {}
    spent = [0.0, 0.0, 0.0]
    count = [0, 0, 0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        generation = info["generation"]
        if phase == "start":
            started[generation] = time.perf_counter()
        elif generation in started:
            spent[generation] += time.perf_counter() - started.pop(generation)
            count[generation] += 1

    gc.callbacks.append(on_gc)
    cpu = time.process_time()
    result = run_concurrent_loop(path, threads, steps)
    cpu = time.process_time() - cpu
    gc.callbacks.remove(on_gc)
    print("RESULT " + json.dumps({"cpu_s": cpu, "gc_s": spent, "collections": count,
                                  "tool_calls": result["tool_calls"], "elapsed": result["elapsed"]}))


def measure_gc(args: argparse.Namespace, workdir: Path) -> list[str]:
    """Run :func:`gc_child` in a subprocess and describe what the collections cost."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT / "src"), str(ROOT / "bench"),
                                                    env.get("PYTHONPATH", "")] if p)
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "profile.py"), "--gc-child",
                           str(workdir / "gc.db"), str(args.threads), str(args.steps)],
                          check=True, env=env, capture_output=True, text=True, timeout=900)
    line = [each for each in done.stdout.splitlines() if each.startswith("RESULT ")][-1]
    result = json.loads(line[len("RESULT "):])
    gc_total = sum(result["gc_s"])
    steps = result["tool_calls"]
    per_generation = ", ".join(f"generation {n}: {c} in {1000 * t:.0f} ms"
                               for n, (c, t) in enumerate(zip(result["collections"], result["gc_s"], strict=True)))
    return [f"  the same run without the profiler: {steps / result['elapsed']:,.0f} calls/s, "
            f"{1e6 * result['cpu_s'] / steps:.0f} us of process CPU per agent step, of which the cyclic GC "
            f"{1e6 * gc_total / steps:.0f} us ({100 * gc_total / result['cpu_s']:.1f} %)",
            f"  GC collections: {per_generation}"]


def profile_concurrency(args: argparse.Namespace, workdir: Path) -> Profile:
    spec = {"kind": "concurrent_loop", "url": str(workdir / "concurrency.db"), "threads": args.threads,
            "steps": args.steps}
    start = time.perf_counter()
    raw = record([sys.executable, str(ROOT / "bench" / "compare.py"), "--child", json.dumps(spec)],
                 args.rate, workdir, "concurrency")
    wall = time.perf_counter() - start
    return summarise("concurrency", f"{args.threads} threads on one event loop (group_commits), SQLite FULL, "
                     f"{args.steps} agent steps each; {wall:.1f} s under py-spy", raw,
                     lambda thread, frames: thread != "MainThread"
                     or any(frame.startswith("run_concurrent_loop ") for frame in frames))


def profile_replay(args: argparse.Namespace, workdir: Path) -> Profile:
    from threads import build_thread

    path = workdir / "replay.db"
    thread_id, count, _ = asyncio.run(build_thread(path, args.events))
    start = time.perf_counter()
    raw = record([sys.executable, str(ROOT / "bench" / "profile.py"), "--replay-child", str(path), thread_id,
                  str(args.reps)], args.rate, workdir, "replay")
    wall = time.perf_counter() - start
    return summarise("replay", f"replay of a {count:,}-event thread, {args.reps} times; "
                     f"{wall:.1f} s under py-spy", raw,
                     lambda _thread, frames: any(frame.startswith("replay (jixu/ledger/projection.py") for frame in frames))


def render(profiles: list[Profile], rate: int, top: int) -> list[str]:
    """The human tables of ``profiles``."""
    lines = [f"py-spy, {rate} samples/s per thread; threads py-spy sees as idle left out (one blocked on a "
             "lock or in epoll may still count: 'waiting'); shares of all samples kept"]
    for profile in profiles:
        total = max(profile.samples, 1)

        def pct(count: int, total: int = total) -> str:
            return f"{100 * count / total:5.1f} %"

        lines += ["", f"{profile.name}: {profile.title}; {profile.samples:,} samples "
                  f"({profile.left_out:,} more of start-up and set-up left out)", ""]
        lines += profile.notes
        if len(profile.by_thread) > 1:
            lines += ["  by thread:"] + [f"    {pct(n)}  {thread}" for thread, n in profile.by_thread.most_common()]
        lines += ["  by area (innermost Python frame):"]
        lines += [f"    {pct(n)}  {label}" for label, n in profile.by_area.most_common()]
        lines += [f"  functions by own time (top {top}):"]
        lines += [f"    {pct(n)}  {name}" for name, n in profile.self_by_function.most_common(top)]
        lines += [f"  jixu functions by time including callees (top {top}):"]
        lines += [f"    {pct(n)}  {name}" for name, n in profile.total_by_function.most_common(top)]
        lines += [f"  lines by own time (top {top}):"]
        lines += [f"    {pct(n)}  {where}" for where, n in profile.self_by_line.most_common(top)]
    return lines


def figures(profiles: list[Profile]) -> list[dict[str, object]]:
    """One JSON figure per area share of each profile."""
    keys = {label: key for label, key, _ in AREAS} | dict([OTHER, COMMIT_AREA, WAIT_AREA])
    out: list[dict[str, object]] = []
    for profile in profiles:
        for label, count in sorted(profile.by_area.items()):
            out.append({"bench": "profile", "metric": f"{profile.name}_{keys[label]}_share",
                        "value": round(100 * count / max(profile.samples, 1), 2), "unit": "%"})
        out.append({"bench": "profile", "metric": f"{profile.name}_samples", "value": profile.samples,
                    "unit": "samples"})
    return out


def write_docs(lines: list[str]) -> None:
    """Replace the profile block of docs/performance.md with ``lines``."""
    text = DOC.read_text()
    if BEGIN_MARK not in text or END_MARK not in text:
        raise SystemExit(f"{DOC}: the markers {BEGIN_MARK} / {END_MARK} are missing")
    head, rest = text.split(BEGIN_MARK, 1)
    _, tail = rest.split(END_MARK, 1)
    DOC.write_text(head + BEGIN_MARK + "\n\n```\n" + "\n".join(lines) + "\n```\n\n" + END_MARK + tail)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--profiles", default="concurrency,replay", help="which: concurrency,replay")
    parser.add_argument("--rate", type=int, default=250, help="samples per second per thread")
    parser.add_argument("--threads", type=int, default=64)
    parser.add_argument("--steps", type=int, default=200, help="agent steps per thread (concurrency)")
    parser.add_argument("--events", type=int, default=100_000, help="events of the replayed thread")
    parser.add_argument("--reps", type=int, default=10, help="replays of the thread")
    parser.add_argument("--top", type=int, default=12, help="rows of the function and line tables")
    parser.add_argument("--keep", type=Path, help="keep py-spy's raw samples (NAME.txt) in this directory")
    parser.add_argument("--write-docs", action="store_true", help="update the profile section of " + str(DOC))
    parser.add_argument("--gc-child", nargs=3, metavar=("PATH", "THREADS", "STEPS"), help=argparse.SUPPRESS)
    parser.add_argument("--replay-child", nargs=3, metavar=("PATH", "THREAD_ID", "REPS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.gc_child:
        gc_child(args.gc_child[0], int(args.gc_child[1]), int(args.gc_child[2]))
        return 0
    if args.replay_child:
        replay_child(args.replay_child[0], args.replay_child[1], int(args.replay_child[2]))
        return 0
    chosen = [name.strip() for name in args.profiles.split(",") if name.strip()]
    unknown = set(chosen) - {"concurrency", "replay"}
    if unknown:
        parser.error(f"unknown profile(s): {', '.join(sorted(unknown))}")
    sys.path.insert(0, str(ROOT / "bench"))
    sys.path.insert(0, str(ROOT / "src"))
    py_spy()  # fail before any work when it is missing
    profiles = []
    with tempfile.TemporaryDirectory(prefix="jixu-profile-") as tmp:
        workdir = Path(tmp)
        if "concurrency" in chosen:
            profiles.append(profile_concurrency(args, workdir))
            profiles[-1].notes = measure_gc(args, workdir)
        if "replay" in chosen:
            profiles.append(profile_replay(args, workdir))
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            for raw in workdir.glob("*.txt"):
                shutil.copy(raw, args.keep / raw.name)
    header = [f"jixu profile - {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
              f"nproc {os.cpu_count()}, Python {sys.version.split()[0]}"]
    lines = header + render(profiles, args.rate, args.top)
    print("\n".join(lines))
    for figure in figures(profiles):
        print(json.dumps(figure))
    if args.write_docs:
        write_docs(lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
