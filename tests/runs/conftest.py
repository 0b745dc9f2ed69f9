"""Helpers for the worker suites: real worker processes (``python -m jixu worker``) over real stores."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jixu.ledger import Store
from jixu.threads.log import ThreadLog
from tests.conftest import StoreFactory
from tests.helpers import ROOT, python_env, run_jixu

WAIT = 30.0
"""The longest any single wait in these suites may take."""


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = WAIT, interval: float = 0.01) -> float:
    """Poll ``predicate`` until it holds; fail naming ``what`` after ``timeout`` seconds. Returns seconds waited."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
    return time.monotonic() - start


class WorkerProcess:
    """One ``jixu worker`` process; its output goes to a file (read with :meth:`output`)."""

    def __init__(self, url: str, agent: str, tmp_path: Path, name: str, *options: str,
                 env: dict[str, str] | None = None, session: bool = False) -> None:
        self.name = name
        self.log_path = tmp_path / f"worker-{name}-{time.monotonic_ns()}.log"
        self._log = self.log_path.open("w")
        args = [sys.executable, "-m", "jixu", "worker", "--store", url, "--agent", f"tests.runs.agents:{agent}",
                "--owner", name, "--poll-interval", "0.02", *options]
        self.process = subprocess.Popen(args, env={**python_env(), **(env or {})}, cwd=ROOT, text=True,
                                        stdout=self._log, stderr=subprocess.STDOUT, start_new_session=session)
        self.pid = self.process.pid

    def output(self) -> str:
        """Everything the worker printed so far."""
        return self.log_path.read_text()

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def wait(self, timeout: float = WAIT) -> int:
        """Wait for the process to exit; its exit code."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired as error:
            raise AssertionError(f"worker {self.name} did not exit within {timeout}s:\n{self.output()}") from error

    def stop(self, timeout: float = WAIT) -> int:
        """SIGTERM (after SIGCONT, in case it is stopped) and wait; the exit code."""
        if self.process.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(WAIT)
        self._log.close()


Spawn = Callable[..., WorkerProcess]


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Spawn]:
    """``workers(url, name, *options, agent=..., env=..., session=...)`` starts a worker process (with
    ``session``, in a session of its own: it leads its process group, as a shell's job or a service does); all
    are killed at teardown."""
    started: list[WorkerProcess] = []

    def start(url: str, name: str, *options: str, agent: str = "counter_agent",
              env: dict[str, str] | None = None, session: bool = False) -> WorkerProcess:
        worker = WorkerProcess(url, agent, tmp_path, name, *options, env=env, session=session)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.kill()


@pytest.fixture
def postgres(tmp_path: Path, postgres_dsn: str) -> Iterator[StoreFactory]:
    """A fresh PostgreSQL schema in the session's server."""
    factory = StoreFactory("postgres", tmp_path, postgres_dsn)
    yield factory
    factory.close()


@pytest.fixture
def sqlite(tmp_path: Path) -> Iterator[StoreFactory]:
    """A SQLite ledger file."""
    factory = StoreFactory("sqlite", tmp_path)
    yield factory
    factory.close()


def outside_lines(path: Path) -> list[list[str]]:
    """The outside system's records: ``[thread_id, effect_id, idempotency_key, pid, time]`` per call."""
    if not path.exists():
        return []
    return [line.split() for line in path.read_text().splitlines() if line.strip()]


def jixu(*args: str, timeout: float = WAIT) -> subprocess.CompletedProcess[str]:
    """Run the ``jixu`` CLI as an operator would."""
    return run_jixu(*args, cwd=ROOT, timeout=timeout)


def jixu_json(*args: str) -> tuple[int, Any]:
    """Run a ``--json`` CLI command; its exit code and parsed output."""
    result = jixu(*args, "--json")
    try:
        return result.returncode, json.loads(result.stdout)
    except ValueError as error:
        raise AssertionError(f"not JSON (exit {result.returncode}): {result.stdout}\n{result.stderr}") from error


def thread_state(store: Store, thread_id: str) -> dict[str, Any]:
    """A thread's public state as a dict."""
    return ThreadLog.load(store, thread_id).snapshot().to_dict()


__all__ = ["WAIT", "Spawn", "WorkerProcess", "jixu", "jixu_json", "outside_lines", "thread_state", "wait_until"]
