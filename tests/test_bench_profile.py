"""bench/profile.py's reading of py-spy's raw samples (the profiler itself runs only in the benchmark's venv)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _profile_module() -> ModuleType:
    if "bench_profile" in sys.modules:
        return sys.modules["bench_profile"]
    spec = importlib.util.spec_from_file_location("bench_profile", ROOT / "bench" / "profile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_profile"] = module  # its dataclass looks its module up while being made
    spec.loader.exec_module(module)
    return module


def _commit_line() -> int:
    lines = (ROOT / "src" / "jixu" / "ledger" / "sqlite.py").read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if 'execute("COMMIT")' in line)


def test_samples_are_summarised_by_thread_area_function_and_line() -> None:
    profile = _profile_module()
    loop = ("thread (1): MainThread;<module> (compare.py:700);run_concurrent_loop (compare.py:371);"
            "Thread._loop (jixu/threads/thread.py:261)")
    raw = "\n".join([
        f"{loop};ThreadProjection.apply (jixu/threads/projection.py:526) 6",
        f"{loop};ordinary_decision_text (jixu/recovery/decision_text.py:106) 3",
        "thread (2): asyncio_0;_worker (concurrent/futures/thread.py:83);"
        f"SQLiteStore._commit_group (jixu/ledger/sqlite.py:{_commit_line()}) 4",
        "thread (2): asyncio_0;_worker (concurrent/futures/thread.py:81) 2",
        "thread (2): asyncio_0;_worker (concurrent/futures/thread.py:83);prepare (jixu/ledger/event.py:180);"
        "canonical_text (jixu/ledger/encoding.py:128) 5",
        # Outside the measured work: start-up on the main thread, and an import inside the run.
        "thread (1): MainThread;<module> (compare.py:20);<module> (jixu/__init__.py:3) 7",
        f"{loop};_call_with_frames_removed (<frozen importlib._bootstrap>:241) 1",
        "not a sample line",
    ])

    def measured(thread: str, frames: list[str]) -> bool:
        return thread != "MainThread" or any(frame.startswith("run_concurrent_loop ") for frame in frames)

    summary = profile.summarise("concurrency", "a test", raw, measured)
    assert summary.samples == 20 and summary.left_out == 8
    assert summary.by_thread == {"MainThread": 9, "commit thread (executor)": 11}
    assert summary.by_area == {
        "thread projection (reducer, mark, rollback)": 6,
        "resolver (decisions, decision text)": 3,
        profile.COMMIT_AREA[0]: 4,
        profile.WAIT_AREA[0]: 2,
        "events: encode, seal, hash, decode, ids": 5,
    }
    assert summary.self_by_function.most_common(1) == [("ThreadProjection.apply (jixu/threads/projection.py)", 6)]
    assert summary.total_by_function["Thread._loop (jixu/threads/thread.py)"] == 9
    assert summary.total_by_function["prepare (jixu/ledger/event.py)"] == 5
    assert summary.self_by_line[f"jixu/ledger/sqlite.py:{_commit_line()} SQLiteStore._commit_group"] == 4
    figures = {figure["metric"]: figure["value"] for figure in profile.figures([summary])}
    assert figures["concurrency_projection_share"] == 30.0
    assert figures["concurrency_sqlite_commit_share"] == 20.0
    assert figures["concurrency_samples"] == 20
    text = "\n".join(profile.render([summary], 250, 3))
    assert "30.0 %  thread projection (reducer, mark, rollback)" in text
    assert "8 more of start-up and set-up left out" in text


def test_a_frame_is_read_into_function_file_and_line() -> None:
    profile = _profile_module()
    assert profile.parse_frame("Thread._loop (jixu/threads/thread.py:261)") == (
        "Thread._loop", "jixu/threads/thread.py", "261")
    assert profile.parse_frame("_call_with_frames_removed (<frozen importlib._bootstrap>:241)")[2] == "241"
    assert profile.parse_frame("thread_run (libpython3.11.so.1.0)") == ("thread_run", "libpython3.11.so.1.0", "")
    assert profile.area_of("jixu/ledger/sqlite.py", "1") == (
        "SQLite store: statements, row building", "sqlite_store")
    assert profile.area_of("somewhere/else.py") == profile.OTHER
