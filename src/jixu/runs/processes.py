"""The processes a run starts: recorded before they run, stopped and waited for when the run's work must end.

Every program a run starts for a task (an agent CLI through
:class:`~jixu.runs.CommandProvider`, a policy check) runs in a process group
of its own, started through a *gate*: a tiny interpreter that waits on a pipe
before it ``exec``s the program. Between the two the group's identity
(:func:`~jixu.kernel.ownership.group_identity`: host, boot id, pid namespace,
pid = pgid, start time) is handed to the caller's ``started`` hook, which
records it durably (``run.process_started`` in the run's journal). Only then
is the program let go. A worker killed in between leaves nothing running: the
gate reads end-of-file and exits without starting the program.

:func:`stop_group` ends a recorded group from any process on the same machine:
SIGTERM, a grace period, SIGKILL, and a wait until no process of the group
remains (by :func:`~jixu.kernel.ownership.group_members`, so a recycled pid is
never signalled as the group). A group recorded on another machine, in
another pid namespace or before a reboot cannot be checked from here: it is
reported ``unverifiable`` and nothing is signalled.

A process that leaves its group on purpose (``setsid``, ``setpgid``) is not
followed; nor is one whose parent re-parents it elsewhere. A cgroup per task
would be; decision 0028 says why it is not used yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any, Final

from jixu.kernel.ownership import STOP_GRACE_S, group_identity, stop_group, wait_group_gone
from jixu.ledger.encoding import JSONObject

ProcessHook = Callable[[JSONObject], Awaitable[None]]
"""Called with a started group's identity before its program runs; records it (or raises: nothing runs)."""

DEFAULT_GRACE_S: Final = STOP_GRACE_S
"""Seconds between SIGTERM and SIGKILL when a run's processes are stopped."""

GATE: Final = """
import os, sys
go, err = int(sys.argv[1]), int(sys.argv[2])
if os.read(go, 1) != b"1":
    os._exit(0)
os.close(go)
os.set_inheritable(err, False)
try:
    os.execvp(sys.argv[3], sys.argv[3:])
except OSError as error:
    os.write(err, f"{type(error).__name__}: {error}".encode("utf-8", "replace"))
    os._exit(127)
"""
"""The gate: wait for the go byte (end of file: the starter is gone, run nothing), then become the program.
The error pipe is close-on-exec, so the starter reads end of file once the program runs, or why it could not."""


async def start_gated(argv: list[str], *, started: ProcessHook, **options: Any) -> tuple[asyncio.subprocess.Process,
                                                                                        str | None]:
    """Start ``argv`` in a session of its own behind the gate; ``(process, start error)``.

    ``started`` receives the group's identity before the program runs. If it
    raises, the gate is killed, nothing runs, and the error propagates. A start
    error (no such executable, …) comes back as text, as from ``exec``.
    """
    go_read, go_write = os.pipe()
    err_read, err_write = os.pipe()
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-c", GATE, str(go_read), str(err_write), *argv, pass_fds=(go_read, err_write),
            start_new_session=True, **options)
    except BaseException:
        for fd in (go_read, go_write, err_read, err_write):
            os.close(fd)
        raise
    os.close(go_read)
    os.close(err_write)
    try:
        try:
            await started(group_identity(process.pid))
        except BaseException as refused:
            os.close(go_write)  # the gate reads end of file and exits: nothing runs
            go_write = -1
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            try:
                await asyncio.shield(process.wait())
            except asyncio.CancelledError:
                if isinstance(refused, asyncio.CancelledError):
                    raise refused from None
                # A cancel (a drain) that came while the killed gate was reaped goes on: the hook's error is its
                # context, and the caller stops as cancelled instead of carrying on with a failure.
                raise asyncio.CancelledError() from refused
            except Exception:  # the gate is killed; how its reaping went changes nothing
                pass
            raise
        os.write(go_write, b"1")
        os.close(go_write)
        go_write = -1
        failure = await asyncio.to_thread(_read_all, err_read)
    finally:
        if go_write >= 0:
            os.close(go_write)
        os.close(err_read)
    if failure:
        await process.wait()
        return process, failure
    return process, None


def _read_all(fd: int) -> str:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


__all__ = ["DEFAULT_GRACE_S", "GATE", "ProcessHook", "start_gated", "stop_group", "wait_group_gone"]
