"""Helpers for the runs suites: a real bare git origin holding a tiny Python project, a git shim that counts
clones, policies, scripted steps, and the child process the crash tests SIGKILL.

The project: ``calc.py`` with a bug (``add`` subtracts), ``check.py`` (exit 0 when ``add(2, 3) == 5``),
``.gitignore``. ``check.py`` also honours ``JIXU_TEST_CHECK_HOLD``: while that file exists it waits (after
touching ``<hold>.reached``), so a test can kill a worker in the middle of a verification.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from jixu.ledger import Store
from jixu.runs import ImplementContext, ImplementResult, Project, register_project

REAL_GIT = shutil.which("git") or "/usr/bin/git"
GIT_ENV = {"GIT_AUTHOR_NAME": "Test", "GIT_AUTHOR_EMAIL": "test@example.com", "GIT_COMMITTER_NAME": "Test",
           "GIT_COMMITTER_EMAIL": "test@example.com", "GIT_CONFIG_NOSYSTEM": "1"}

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
STILL_WRONG = "def add(a, b):\n    return a * b\n"
CHECK = """\
import os
import sys
import time

hold = os.environ.get("JIXU_TEST_CHECK_HOLD")
if hold and os.path.exists(hold):
    open(hold + ".reached", "w").close()
    while os.path.exists(hold):
        time.sleep(0.02)

from calc import add

result = add(2, 3)
print(f"add(2, 3) = {result}")
sys.exit(0 if result == 5 else 1)
"""

SHIM = """\
#!/bin/sh
REAL="{real}"
case " $* " in
  *" clone "*)
    if [ -n "$JIXU_TEST_GIT_LOG" ]; then echo clone >> "$JIXU_TEST_GIT_LOG"; fi
    "$REAL" "$@"
    status=$?
    if [ -n "$JIXU_TEST_CLONE_HOLD" ] && [ -e "$JIXU_TEST_CLONE_HOLD" ]; then
      touch "$JIXU_TEST_CLONE_HOLD.reached"
      while [ -e "$JIXU_TEST_CLONE_HOLD" ]; do sleep 0.02; done
    fi
    exit $status
    ;;
esac
exec "$REAL" "$@"
"""


def git(*args: str, cwd: Path | None = None) -> str:
    """Run the real git with a fixed identity; its stdout."""
    result = subprocess.run([REAL_GIT, *args], cwd=cwd, capture_output=True, text=True, check=False,
                            env={**os.environ, **GIT_ENV})
    assert result.returncode == 0, f"git {args} failed: {result.stderr}"
    return result.stdout.strip()


def make_origin(base: Path, name: str = "origin") -> Path:
    """A bare repository with the tiny project on ``main``; its path."""
    work = base / f"{name}-src"
    work.mkdir(parents=True)
    (work / "calc.py").write_text(BUGGY)
    (work / "check.py").write_text(CHECK)
    (work / ".gitignore").write_text("__pycache__/\n*.pyc\n")
    git("init", "-q", "-b", "main", cwd=work)
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "a buggy calculator", cwd=work)
    bare = base / f"{name}.git"
    git("clone", "-q", "--bare", str(work), str(bare))
    return bare


def policy(*, repairs: int = 1, timeout: float = 30.0, checks: list[dict[str, Any]] | None = None,
           allowed_paths: list[str] | None = None) -> dict[str, Any]:
    """The project policy: ``python -B check.py`` as the one check."""
    body: dict[str, Any] = {
        "checks": checks or [{"name": "unit", "argv": [sys.executable, "-B", "check.py"], "timeout_s": timeout}],
        "limits": {"max_repair_attempts": repairs}}
    if allowed_paths is not None:
        body["allowed_paths"] = allowed_paths
    return body


def register(store: Store, origin: Path, name: str = "calc", **options: Any) -> Project:
    return register_project(store, name, str(origin), policy(**options))


def install_git_shim(base: Path) -> tuple[Path, Path]:
    """A directory with a ``git`` that logs each clone to the returned log file; put the directory first on PATH."""
    shim_dir = base / "shim"
    shim_dir.mkdir()
    shim = shim_dir / "git"
    shim.write_text(SHIM.format(real=REAL_GIT))
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return shim_dir, base / "clones.log"


def clones(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def write(relative: str, text: str, summary: str = "edited") -> Callable[[Path, ImplementContext], ImplementResult]:
    """A scripted step writing one file."""
    def step(workspace: Path, context: ImplementContext) -> ImplementResult:
        (workspace / relative).parent.mkdir(parents=True, exist_ok=True)
        (workspace / relative).write_text(text)
        return ImplementResult(summary, {"file": relative})
    return step


def fix(workspace: Path, context: ImplementContext) -> ImplementResult:
    (workspace / "calc.py").write_text(FIXED)
    return ImplementResult("fixed add", {"attempt": context.attempt})


def types(entries: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in entries]


def events_of(entries: list[dict[str, Any]], event_type: str) -> list[dict[str, Any]]:
    return [e for e in entries if e["type"] == event_type]


def task_events(entries: list[dict[str, Any]], kind: str, phase: str) -> list[dict[str, Any]]:
    """``task.<phase>`` entries of tasks of ``kind`` (phase ``requested``, ``dispatched``, ``completed`` …)."""
    effects = {e["data"]["effect_id"] for e in entries if e["type"] == "task.requested" and e["data"]["name"] == kind}
    return [e for e in entries if e["type"] == f"task.{phase}" and e["data"].get("effect_id") in effects]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# --- the crash child -----------------------------------------------------------------------------

CHILD = """
import asyncio, sys, time
from pathlib import Path
from jixu.ledger import open_store
from jixu.runs import ImplementResult, Runs, ScriptedProvider

url, root, run_id, mode, marker, owner, ttl = sys.argv[1:8]

def step(workspace, context):
    if mode == "implement":
        (workspace / "partial.txt").write_text("half of the work\\n")
        Path(marker).write_text("reached")
        while True:
            time.sleep(0.05)
    (workspace / "calc.py").write_text("def add(a, b):\\n    return a + b\\n")
    return ImplementResult("fixed add")

runs = Runs(open_store(url), root, {"scripted": ScriptedProvider("scripted", [step])}, owner=owner,
            lease_ttl=float(ttl))
asyncio.run(runs.execute(run_id))
"""


class CrashChild:
    """A process executing one run, in its own process group, to be SIGKILLed (with its git children)."""

    def __init__(self, url: str, root: Path, run_id: str, mode: str, marker: Path, *, owner: str = "crash-worker",
                 ttl: float = 30.0, env: dict[str, str] | None = None) -> None:
        from tests.helpers import python_env

        self.log = marker.parent / f"child-{mode}.log"
        self._out = self.log.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-c", CHILD, url, str(root), run_id, mode, str(marker), owner, str(ttl)],
            env={**python_env(), **(env or {})}, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_for(self, path: Path, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self.process.poll() is not None:
                raise AssertionError(f"the child exited ({self.process.returncode}) early:\n{self.log.read_text()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {path}:\n{self.log.read_text()}")
            time.sleep(0.01)

    def kill(self) -> None:
        """SIGKILL the whole process group (the worker and any git it is running)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)
        self._out.close()
        assert self.process.returncode == -signal.SIGKILL


@contextmanager
def studio_browser(store: Store, workspace_root: Path, token: str) -> Iterator[Any]:
    """A live server over ``store`` with the Studio (a provider ``scripted`` that fixes), and an httpx client
    logged in to it with ``token``."""
    import httpx

    from jixu.runs import ScriptedProvider
    from jixu.server import create_app
    from jixu.server.studio import studio_router
    from tests.server.conftest import LiveServer
    from tests.studio.conftest import http_login

    server = LiveServer(create_app(store, providers={"scripted": ScriptedProvider("scripted", [fix])},
                                   workspace_root=workspace_root, routers=[studio_router()]))
    server.start()
    try:
        with httpx.Client(base_url=server.url, timeout=20) as browser:
            http_login(browser, token)
            yield browser
    finally:
        server.stop()
