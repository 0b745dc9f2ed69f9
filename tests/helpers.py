"""Test helpers: build hash-chained events without a store, run child processes, a slow SQLite store."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from jixu.ledger.event import GENESIS_HASH, Event, NewEvent, prepare, seal
from jixu.ledger.sqlite import SQLiteStore
from jixu.ledger.store import AppendRequest

ROOT = Path(__file__).resolve().parent.parent

EXAMPLE_SCALE = float(os.environ.get("JIXU_EXAMPLE_SCALE", "1"))
"""Multiplies the examples of the heavy property tests; ``bench/properties.py`` runs them with 10."""


def examples(count: int) -> int:
    """The ``max_examples`` of a heavy property test: ``count`` in the test run (bounded, so CI stays fast),
    ``count`` x ``JIXU_EXAMPLE_SCALE`` when the bench runs them deep."""
    return max(1, round(count * EXAMPLE_SCALE))


def chain(specs: Iterable[tuple[str, dict[str, Any]]], stream: str = "test/1",
          recorded_at: str = "2026-01-01T00:00:00.000000Z") -> list[Event]:
    """Hash-chained events from ``(type, data)`` pairs, as a store would seal them."""
    events: list[Event] = []
    prev = GENESIS_HASH
    for seq, (event_type, data) in enumerate(specs, start=1):
        row = seal(prepare(NewEvent(event_type, data)), stream=stream, seq=seq, prev_hash=prev,
                   recorded_at=recorded_at)
        events.append(row.to_event())
        prev = row.hash
    return events


def python_env() -> dict[str, str]:
    """The environment for a child Python that imports jixu from this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")])
    return env


PROC_CHILDREN = Path("/proc/self/task").exists()
"""Whether this system lists a process's children in ``/proc`` (Linux): :func:`children_of` needs it."""


def children_of(pid: int) -> list[int]:
    """The process ids of ``pid``'s children (Linux's ``/proc``; see :data:`PROC_CHILDREN`)."""
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def process_exited(pid: int) -> bool:
    """True once ``pid`` is gone or a zombie (an orphan's new parent may not have reaped it yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):  # gone before or while being read
        return True


OWN_PROCESS = frozenset({"worker", "serve", "demo"})
"""Commands that run until a signal, install handlers or kill themselves: always a child process."""


def run_jixu(*args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None,
             timeout: float = 120, own_process: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``jixu args…`` and return its exit code, stdout and stderr as a child process would give them.

    Commands that finish by themselves run in this process through Click's runner (a child's start-up, ~0.4 s of
    imports, is most of a short command's time, and the suite makes hundreds of such calls); ``own_process``, and
    the commands of :data:`OWN_PROCESS`, run ``python -m jixu`` as a child. ``env`` holds variables set on top of
    this process's environment; an uncaught exception exits 1 with its traceback on
    stderr, as in a child.
    """
    if own_process or (args and args[0] in OWN_PROCESS):
        return subprocess.run([sys.executable, "-m", "jixu", *args], capture_output=True, text=True, cwd=cwd,
                              env=python_env() if env is None else {**python_env(), **env}, timeout=timeout,
                              check=False)
    from click.testing import CliRunner

    from jixu.cli.main import cli

    changes = {key: value for key, value in (env or {}).items() if os.environ.get(key) != value}
    with contextlib.chdir(cwd or os.getcwd()):
        result = CliRunner().invoke(cli, list(args), env=changes, prog_name="jixu")
    stderr = result.stderr
    if result.exc_info is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(*result.exc_info))
    return subprocess.CompletedProcess(["jixu", *args], result.exit_code, result.stdout, stderr)


def spawn_python(code: str, *args: str) -> subprocess.Popen[str]:
    """Start ``python -c code args…`` with jixu importable; stdout/stderr piped as text."""
    return subprocess.Popen([sys.executable, "-c", code, *args], env=python_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


class SlowCommits(SQLiteStore):
    """A SQLite store whose shared commits (``append_many``) take 0.2 s more, so something can happen
    during one (a waiter cancelled, a program failing)."""

    def append_many(self, requests: Sequence[AppendRequest]) -> list[Any]:
        time.sleep(0.2)
        return super().append_many(requests)


class CommitHeld(SQLiteStore):
    """A SQLite store that holds the first shared commit (``append_many``, in the commit thread) carrying an event
    of type ``held``: ``entered`` is set when it is held, and it goes on once ``release`` is set (or after 30 s)."""

    def __init__(self, path: Path, held: str) -> None:
        super().__init__(path)
        self.held = held
        self.entered, self.release = threading.Event(), threading.Event()

    def append_many(self, requests: Sequence[AppendRequest]) -> list[Any]:
        if not self.entered.is_set() and any(getattr(e, "type", "") == self.held
                                             for request in requests for e in request.events):
            self.entered.set()
            self.release.wait(30)
        return super().append_many(requests)
