"""Check commands: run a project's checks in a workspace and observe what they did.

A check is ``{name, argv, timeout_s}`` from the frozen policy. It runs
without a shell, in the workspace, in a process group of its own, with stdin
closed and stdout+stderr captured together in a temporary file outside the
workspace. On timeout (or cancellation) the whole group is killed with
SIGKILL; after a normal exit, stragglers it left in its group are killed too.

The evidence of one check (a JSON object, recorded in the verify receipt):

| field | meaning |
|---|---|
| ``name``, ``argv`` | what ran |
| ``exit_status`` | the exit code; negative for a signal; ``null`` when it timed out or could not start |
| ``timed_out`` | ``true`` when the timeout killed it |
| ``duration_s`` | wall-clock seconds (3 decimals) |
| ``output_digest`` | sha256 of everything it wrote (stdout and stderr interleaved) |
| ``output_bytes`` | how many bytes that was |
| ``output_excerpt`` | the last :data:`EXCERPT_BYTES` of it, decoded as UTF-8 (invalid bytes replaced) |
| ``error`` | why it could not start (``null`` otherwise) |
| ``passed`` | ``exit_status == 0`` and not timed out |
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from jixu.ledger.encoding import JSONObject
from jixu.runs.processes import ProcessHook, start_gated, wait_group_gone

EXCERPT_BYTES = 4000
"""How much of a check's output (its end) is kept verbatim in the journal."""


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (nothing if it is gone)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def digest_output(handle: IO[bytes]) -> tuple[str, int, str]:
    """``(sha256, size, excerpt)`` of everything written to ``handle`` (the excerpt: its last bytes)."""
    handle.seek(0)
    digest = hashlib.sha256()
    size = 0
    while chunk := handle.read(1 << 16):
        digest.update(chunk)
        size += len(chunk)
    handle.seek(max(0, size - EXCERPT_BYTES))
    excerpt = handle.read().decode("utf-8", "replace")
    return digest.hexdigest(), size, excerpt


async def run_process(argv: list[str], cwd: Path, timeout_s: float, *, env: dict[str, str] | None = None,
                      stdin_text: str | None = None, stdout: IO[bytes], stderr: IO[bytes] | None = None,
                      started: ProcessHook | None = None) -> tuple[int | None, bool, str | None]:
    """Run ``argv`` in its own process group; ``(exit_status, timed_out, start_error)``.

    Output goes to the given files (``stderr`` ``None``: into ``stdout``). The
    group is SIGKILLed on timeout, on cancellation, and after a normal exit.
    With ``started`` the program is started behind the gate of
    :mod:`jixu.runs.processes`: the hook records the group's identity before
    the program runs, and on every way out this waits until no process of the
    group remains (so a receipt recorded after it is never followed by one of
    its processes).
    """
    with contextlib.ExitStack() as stack:
        stdin: IO[bytes] | int = subprocess.DEVNULL
        if stdin_text is not None:
            stdin_file = stack.enter_context(tempfile.TemporaryFile())
            stdin_file.write(stdin_text.encode("utf-8"))
            stdin_file.seek(0)
            stdin = stdin_file
        options: dict[str, object] = {"cwd": str(cwd), "env": env, "stdin": stdin, "stdout": stdout,
                                      "stderr": stderr if stderr is not None else subprocess.STDOUT}
        identity: JSONObject | None = None
        try:
            if started is None:
                process = await asyncio.create_subprocess_exec(*argv, start_new_session=True, **options)  # type: ignore[arg-type]
            else:
                async def record(found: JSONObject) -> None:
                    nonlocal identity
                    identity = found
                    await started(found)

                process, failure = await start_gated(argv, started=record, **options)
                if failure is not None:
                    return None, False, failure
        except OSError as error:
            return None, False, f"{type(error).__name__}: {error}"
        try:
            await asyncio.wait_for(process.wait(), timeout_s)
        except TimeoutError:
            kill_group(process.pid)
            await process.wait()
            await _gone(identity)
            return None, True, None
        except BaseException:
            kill_group(process.pid)
            with contextlib.suppress(BaseException):
                await asyncio.shield(process.wait())
            with contextlib.suppress(BaseException):
                await asyncio.shield(_gone(identity))
            raise
        kill_group(process.pid)  # anything it left running in its group
        await _gone(identity)
        return process.returncode, False, None


async def _gone(identity: JSONObject | None) -> None:
    """After SIGKILL of a recorded group: wait (bounded) until none of its processes remains."""
    if identity is not None:
        await asyncio.to_thread(wait_group_gone, identity, 10.0)


async def run_check(check: JSONObject, workspace: Path, *, env: dict[str, str] | None = None,
                    started: ProcessHook | None = None) -> JSONObject:
    """Run one policy check in ``workspace``; its evidence (see the module docstring). Never raises for the
    check's own failure (a failing or hanging check is evidence, not an error)."""
    argv = [str(a) for a in check["argv"]]
    timeout_s = float(check["timeout_s"])
    began = time.monotonic()
    with tempfile.TemporaryFile() as output:
        exit_status, timed_out, error = await run_process(argv, workspace, timeout_s, env=env, stdout=output,
                                                          started=started)
        duration = round(time.monotonic() - began, 3)
        digest, size, excerpt = digest_output(output)
    return {"name": check["name"], "argv": argv, "exit_status": exit_status, "timed_out": timed_out,
            "duration_s": duration, "timeout_s": timeout_s, "output_digest": digest, "output_bytes": size,
            "output_excerpt": excerpt, "error": error,
            "passed": exit_status == 0 and not timed_out}


async def run_checks(checks: list[JSONObject], workspace: Path, *, env: dict[str, str] | None = None,
                     started: Callable[[str], ProcessHook] | None = None) -> list[JSONObject]:
    """Run every check in order (all of them, even after a failure); their evidence. ``started(name)``: the
    hook that records each check's process group before it runs (see :func:`run_process`)."""
    return [await run_check(check, workspace, env=env,
                            started=None if started is None else started(str(check["name"])))
            for check in checks]


__all__ = ["EXCERPT_BYTES", "digest_output", "kill_group", "run_check", "run_checks", "run_process"]
