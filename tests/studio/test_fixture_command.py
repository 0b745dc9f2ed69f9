"""`jixu studio-fixture` as a newcomer runs it: what it prints, what it recorded, and a second run beside the first."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from jixu.ledger import SQLiteStore
from jixu.runs import Runs
from jixu.server.auth import authenticate
from jixu.threads.log import ThreadLog
from tests.studio.conftest import _env

T = TypeVar("T")


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    # Its own thread: the session's Playwright browser keeps an event loop running in this one.
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def _fixture(tmp_path: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "jixu", "studio-fixture", "--store", "studio.db", "--port", "8499"],
                          cwd=tmp_path, capture_output=True, text=True, env=_env(), timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_fixture_prints_tokens_and_the_serve_command_and_records_every_case(tmp_path: Path) -> None:
    out = _fixture(tmp_path)
    operator = re.search(r"operator\s+(jixu_\S+)", out)
    viewer = re.search(r"viewer\s+(jixu_\S+)", out)
    assert operator and viewer, out
    assert "http://127.0.0.1:8499/studio" in out
    assert "--agent jixu.cli.studio:fixture_agent --providers jixu.cli.studio:fixture_providers" in out
    threads = re.findall(r"thread (\w{26})", out)
    runs = re.findall(r"run\s+(\w{26})", out)
    assert len(threads) == 2 and len(runs) == 2, out
    assert (tmp_path / "studio.db.studio-fixture" / "studio-demo" / "origin.git" / "HEAD").exists()

    store = SQLiteStore(tmp_path / "studio.db")
    try:
        assert authenticate(store, f"Bearer {operator.group(1)}").roles == {"studio-demo": "operator"}
        assert authenticate(store, f"Bearer {viewer.group(1)}").roles == {"studio-demo": "viewer"}
        unknown, parked = (ThreadLog.load(store, t).snapshot() for t in threads)
        assert [w["state"] for w in unknown.waiting_on] == ["unknown"]
        assert [w["state"] for w in parked.waiting_on] == ["parked"]
        service = Runs(store, tmp_path / "elsewhere", {}, owner="test-reader")
        failed_check, published = (_run(service.state(r)) for r in runs)
        assert (failed_check.status, failed_check.pause_reason) == ("paused", "quota")
        verify = next(t for t in failed_check.plan.tasks if t.kind == "verify")
        assert verify.evidence is not None and verify.evidence["checks"][0]["exit_status"] == 1
        assert published.status == "succeeded"
        [request] = _run(service.execution_requests(published.run_id))
        assert request.status == "needs_reconciliation"
    finally:
        store.close()

    again = _fixture(tmp_path)  # the same store again: a second project beside the first
    assert "project studio-demo-2" in again


def test_an_unreachable_store_is_exit_5_and_leaves_no_directory_behind(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "jixu", "studio-fixture", "--store", "postgresql://u@127.0.0.1:1/x"],
                          cwd=tmp_path, capture_output=True, text=True, env=_env(), timeout=120, check=False)
    assert done.returncode == 5, done.stdout + done.stderr
    assert list(tmp_path.iterdir()) == [], "it made ./jixu-studio-fixture before finding the store unreachable"
