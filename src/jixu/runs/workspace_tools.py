"""Tools that let an agent work in one run's workspace: read, list, write, edit, run a command.

:func:`workspace_tools` returns jixu tools bound to one workspace directory,
each declaring the semantics it really has (SPEC section 3), because the
thread runtime retries or waits according to them:

========================  ==============  ==============================================================
tool                      semantics       why
========================  ==============  ==============================================================
``read_file``             ``read_only``   changes nothing
``list_files``            ``read_only``   changes nothing (``.git`` directories are skipped)
``write_file``            ``idempotent``  writing the same bytes to the same path twice leaves the same
                                          file and returns the same result (the idempotency key is not
                                          needed: the content is the identity). The write is atomic
                                          (temporary file + rename), so a crash leaves the old or the new
                                          content, never a mix.
``edit_file``             ``unsafe``      replaces exactly one occurrence of ``old``; applying it twice
                                          fails or, when ``new`` contains ``old``, changes more. To make a
                                          repeat detectable it refuses, with ``ToolError`` code
                                          ``already_applied``, when ``old`` is absent and ``new`` is present
                                          exactly once (it never guesses that the edit happened).
``run_command``           ``unsafe``      a command can do anything. It runs without a shell in the
                                          workspace, in its own process group, with a timeout; on timeout
                                          (or cancellation) the whole group is killed, and processes the
                                          command left in its group are killed when it exits.
========================  ==============  ==============================================================

Confinement: every path is relative to the workspace root. Absolute paths,
paths whose ``..`` leads outside, and paths that leave the workspace through
a symlink are refused; writes (``write_file``, ``edit_file``) must also match
one of ``allowed_paths`` and may never touch ``.git``. Each refusal is a
:class:`~jixu.threads.tools.ToolError` (a determinate failure: nothing
happened), with a ``code`` naming the rule.

Globs (``allowed_paths``, ``list_files``'s ``pattern``) match the whole
workspace-relative POSIX path: ``*`` and ``?`` do not cross ``/``, ``**``
does (``**/`` also matches no directory at all), ``[...]`` is a character
class. ``**`` allows everything; ``src/**`` everything under ``src``;
``*.py`` only top-level Python files. :func:`path_allowed` applies the same
rule.

``run_command`` inherits the worker's environment without variables whose
names look like secrets (``*KEY*``, ``*TOKEN*``, ``*SECRET*``,
``*PASSWORD*``, ``*CREDENTIAL*``), unless ``env`` is given. Processes that a
command detaches into another session escape the group kill, and a worker
killed by SIGKILL cannot kill the command it was running: the run's
reconciliation of the workspace is what settles such outcomes.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import posixpath
import re
import secrets
import signal
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import IO, Any

from jixu.errors import InvalidInput
from jixu.threads.tools import Tool, ToolError, tool

MAX_READ_BYTES = 5_000_000
"""Files larger than this are not read (``too_large``)."""
MAX_WRITE_BYTES = 5_000_000
"""Content larger than this is not written (``too_large``)."""
MAX_READ_CHARS = 100_000
"""``read_file`` returns at most this many characters of the selected lines."""
MAX_LINES = 2_000
"""``read_file`` returns at most this many lines per call, whatever ``max_lines`` asks."""
MAX_LISTED = 2_000
"""``list_files`` refuses (``too_many``) when more files match; narrow the path or pattern."""
OUTPUT_HEAD = 8_000
OUTPUT_TAIL = 8_000
"""``run_command`` keeps the first and last this many bytes of stdout and of stderr."""
DRAIN_TIMEOUT = 2.0
"""Seconds to wait for a cancelled command to be reaped after its group was killed."""

_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)


# --- globs and confinement ----------------------------------------------------------------


@lru_cache(maxsize=256)
def compile_glob(pattern: str) -> re.Pattern[str]:
    """The regular expression matching workspace-relative paths for ``pattern`` (see the module docstring)."""
    if not isinstance(pattern, str) or not pattern or "\x00" in pattern:
        raise InvalidInput(f"glob {pattern!r} must be a non-empty string", field="pattern")
    if pattern.startswith("/"):
        raise InvalidInput(f"glob {pattern!r} must be relative to the workspace (no leading '/')", field="pattern")
    while pattern.startswith("./"):
        pattern = pattern[2:]
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1:end]
            negate = body.startswith("!")
            body = body[1:] if negate else body
            out.append("[" + ("^" if negate else "") + body.replace("\\", "\\\\") + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    try:
        return re.compile("".join(out) + r"\Z", re.DOTALL)
    except re.error as error:
        raise InvalidInput(f"glob {pattern!r} is malformed: {error}", field="pattern") from None


def path_allowed(relative: str, patterns: Sequence[str]) -> bool:
    """Whether the workspace-relative POSIX path ``relative`` matches one of ``patterns``."""
    return any(compile_glob(p).match(relative) is not None for p in patterns)


def check_globs(allowed_paths: Sequence[str]) -> tuple[str, ...]:
    """``allowed_paths`` as a tuple, after checking it is a non-empty list of valid globs (InvalidInput)."""
    if isinstance(allowed_paths, str) or not isinstance(allowed_paths, Sequence) or not allowed_paths:
        raise InvalidInput("allowed_paths must be a non-empty list of globs, e.g. ['**'] or ['src/**']",
                           field="allowed_paths")
    patterns = tuple(allowed_paths)
    for pattern in patterns:
        compile_glob(pattern)
    return patterns


def _is_git_metadata(relative: str) -> bool:
    return ".git" in relative.split("/")


class Workspace:
    """One workspace root and the rules confining paths to it (what the tools share)."""

    def __init__(self, root: Path, allowed_paths: Sequence[str] = ("**",)) -> None:
        if not isinstance(root, str | os.PathLike):
            raise InvalidInput("the workspace must be a path", field="root")
        resolved = Path(root).resolve()
        if not resolved.is_dir():
            raise InvalidInput(f"workspace {root} is not a directory", field="root")
        self.root = resolved
        self.allowed_paths = check_globs(allowed_paths)

    def resolve(self, path: str, *, write: bool = False) -> tuple[Path, str]:
        """The real path inside the workspace for ``path`` and its workspace-relative form; ToolError if refused."""
        if not isinstance(path, str) or not path.strip() or "\x00" in path:
            raise ToolError(f"path {path!r} must be a non-empty relative path", code="invalid_path",
                            data={"path": str(path)})
        if os.path.isabs(path) or path.startswith(("/", "\\")):
            raise ToolError(f"path {path!r} is absolute; give a path relative to the workspace root",
                            code="absolute_path", data={"path": path})
        normal = posixpath.normpath(path)
        if normal == ".." or normal.startswith("../"):
            raise ToolError(f"path {path!r} leads outside the workspace", code="outside_workspace",
                            data={"path": path})
        try:
            real = (self.root / normal).resolve()
        except (OSError, RuntimeError):  # a symlink loop
            raise ToolError(f"path {path!r} cannot be resolved (a symlink loop?)", code="invalid_path",
                            data={"path": path}) from None
        if real != self.root and self.root not in real.parents:
            raise ToolError(f"path {path!r} leaves the workspace through a symlink", code="outside_workspace",
                            data={"path": path})
        relative = real.relative_to(self.root).as_posix()
        if write:
            if relative == ".":
                raise ToolError("the workspace root itself cannot be written", code="is_directory",
                                data={"path": path})
            if _is_git_metadata(relative):
                raise ToolError(f"path {path!r} is inside .git; the run's git metadata is not writable",
                                code="not_allowed", data={"path": path})
            if not path_allowed(relative, self.allowed_paths):
                raise ToolError(f"path {relative!r} is outside the allowed paths {list(self.allowed_paths)}",
                                code="not_allowed", data={"path": relative, "allowed_paths":
                                                          list(self.allowed_paths)})
        return real, relative


@contextlib.contextmanager
def _os_errors(relative: str, doing: str) -> Iterator[None]:
    """Report an operating-system refusal as a determinate ToolError (a write is atomic: nothing was replaced)."""
    try:
        yield
    except OSError as error:
        raise ToolError(f"cannot {doing} {relative}: {error.strerror or error}", code="os_error",
                        data={"path": relative}) from None


def _atomic_write(target: Path, data: bytes) -> None:
    """Replace ``target``'s content with ``data`` through a temporary file in its directory."""
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.parent / f".{target.name}.jixu-{secrets.token_hex(4)}.tmp"
    try:
        with temporary.open("xb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        with contextlib.suppress(FileNotFoundError):
            os.chmod(temporary, target.stat().st_mode & 0o7777)
        os.replace(temporary, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()


# --- command output -----------------------------------------------------------------------


def _excerpt(handle: IO[bytes]) -> tuple[str, int]:
    """The head and tail of what a command wrote to ``handle`` (a temporary file), and its size in bytes."""
    size = handle.seek(0, os.SEEK_END)
    handle.seek(0)
    if size <= OUTPUT_HEAD + OUTPUT_TAIL:
        return handle.read(size).decode("utf-8", errors="replace"), size
    head = handle.read(OUTPUT_HEAD)
    handle.seek(size - OUTPUT_TAIL)
    tail = handle.read(OUTPUT_TAIL)
    omitted = size - OUTPUT_HEAD - OUTPUT_TAIL
    return (head.decode("utf-8", errors="replace") + f"\n[... {omitted} bytes omitted ...]\n"
            + tail.decode("utf-8", errors="replace")), size


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def command_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment commands run with: ``env`` as given, else this process's without secret-looking names."""
    if env is not None:
        return dict(env)
    cleaned = {k: v for k, v in os.environ.items() if not _SECRET_NAME.search(k)}
    cleaned["GIT_TERMINAL_PROMPT"] = "0"
    return cleaned


# --- the tools ----------------------------------------------------------------------------


def workspace_tools(root: Path, *, allowed_paths: Sequence[str] = ("**",), command_timeout: float = 120.0,
                    env: Mapping[str, str] | None = None) -> list[Tool]:
    """The five workspace tools bound to ``root`` (see the module docstring for their semantics and rules).

    ``command_timeout`` is the default and the upper bound of ``run_command``'s
    timeout; ``env`` replaces the (secret-scrubbed) inherited environment of commands.
    Raises :class:`~jixu.errors.InvalidInput` for a missing root or a bad glob or timeout.
    """
    workspace = Workspace(root, allowed_paths)
    if isinstance(command_timeout, bool) or not isinstance(command_timeout, int | float) \
            or not math.isfinite(command_timeout) or command_timeout <= 0:
        raise InvalidInput("command_timeout must be a positive number of seconds", field="command_timeout")
    default_timeout = float(command_timeout)
    environment = command_environment(env)

    def read_file(path: str, start_line: int = 1, max_lines: int = 400) -> str:
        """Read a text file of the workspace: lines start_line.. (1-based), at most max_lines of them.

        The lines are returned verbatim; when the file has more lines, a final
        bracketed note says which lines were shown and how to read on.
        """
        real, relative = workspace.resolve(path)
        if start_line < 1 or max_lines < 1:
            raise ToolError("start_line and max_lines must be >= 1", code="invalid_argument",
                            data={"start_line": start_line, "max_lines": max_lines})
        if not real.exists():
            raise ToolError(f"{relative} does not exist", code="not_found", data={"path": relative})
        if real.is_dir():
            raise ToolError(f"{relative} is a directory; use list_files", code="is_directory",
                            data={"path": relative})
        with _os_errors(relative, "read"):
            size = real.stat().st_size
            if size > MAX_READ_BYTES:
                raise ToolError(f"{relative} has {size} bytes; the limit is {MAX_READ_BYTES}", code="too_large",
                                data={"path": relative, "bytes": size})
            data = real.read_bytes()
        if b"\x00" in data[:8192]:
            raise ToolError(f"{relative} looks binary (it contains NUL bytes)", code="binary",
                            data={"path": relative})
        lines = data.decode("utf-8", errors="replace").splitlines(keepends=True)
        if lines and start_line > len(lines):
            raise ToolError(f"{relative} has only {len(lines)} lines", code="invalid_argument",
                            data={"path": relative, "lines": len(lines)})
        first = start_line - 1
        chosen = lines[first:first + min(max_lines, MAX_LINES)]
        text = "".join(chosen)
        cut = len(text) > MAX_READ_CHARS
        if cut:
            text = text[:MAX_READ_CHARS]
        last = first + len(chosen)
        if cut or first > 0 or last < len(lines):
            shown = f"lines {start_line}-{last}" + (f" (cut at {MAX_READ_CHARS} characters)" if cut else "")
            more = f"; call read_file with start_line={last + 1} to read on" if last < len(lines) else ""
            if text and not text.endswith("\n"):
                text += "\n"
            text += f"[{relative} has {len(lines)} lines; this shows {shown}{more}]"
        return text

    def list_files(path: str = ".", pattern: str = "**/*") -> list[str]:
        """List the files under a directory of the workspace whose path (relative to that directory) matches
        the glob pattern (* and ? stay within one directory, ** crosses directories). Returns paths relative
        to the workspace root, sorted; .git directories are skipped."""
        real, relative = workspace.resolve(path)
        try:
            matcher = compile_glob(pattern)
        except InvalidInput as error:
            raise ToolError(error.message, code="invalid_argument", data={"pattern": pattern}) from None
        if not real.exists():
            raise ToolError(f"{relative} does not exist", code="not_found", data={"path": relative})
        if not real.is_dir():
            raise ToolError(f"{relative} is not a directory", code="not_a_directory", data={"path": relative})
        found: list[str] = []
        for directory, dirnames, filenames in os.walk(real, followlinks=False):
            dirnames[:] = sorted(d for d in dirnames if d != ".git")
            here = Path(directory)
            for filename in filenames:
                if filename == ".git":
                    continue
                candidate = here / filename
                if candidate.is_symlink():
                    target = candidate.resolve()
                    if (target != workspace.root and workspace.root not in target.parents) or not target.is_file():
                        continue
                if matcher.match(candidate.relative_to(real).as_posix()) is None:
                    continue
                found.append(candidate.relative_to(workspace.root).as_posix())
                if len(found) > MAX_LISTED:
                    raise ToolError(f"more than {MAX_LISTED} files match; narrow the path or the pattern",
                                    code="too_many", data={"path": relative, "pattern": pattern})
        return sorted(found)

    def write_file(path: str, content: str) -> str:
        """Create or replace a file of the workspace with content (UTF-8); missing directories are created.
        Writing the same content again changes nothing and returns the same answer."""
        real, relative = workspace.resolve(path, write=True)
        if real.is_dir():
            raise ToolError(f"{relative} is a directory", code="is_directory", data={"path": relative})
        data = content.encode("utf-8")
        if len(data) > MAX_WRITE_BYTES:
            raise ToolError(f"content has {len(data)} bytes; the limit is {MAX_WRITE_BYTES}", code="too_large",
                            data={"path": relative, "bytes": len(data)})
        with _os_errors(relative, "write"):
            if not (real.is_file() and real.read_bytes() == data):
                _atomic_write(real, data)
        return f"wrote {len(data)} bytes to {relative}"

    def edit_file(path: str, old: str, new: str) -> str:
        """Replace the one occurrence of the exact text old with new in a workspace file.

        Fails (changing nothing) when old is empty, equal to new, absent or
        present more than once (include more surrounding text to make it
        unique). When old is absent but new is present exactly once, fails with
        code already_applied: the edit was probably made already; read the file
        to check.
        """
        real, relative = workspace.resolve(path, write=True)
        if not old:
            raise ToolError("old must not be empty; use write_file to create a file", code="invalid_argument",
                            data={"path": relative})
        if old == new:
            raise ToolError("old and new are the same; nothing to change", code="invalid_argument",
                            data={"path": relative})
        if not real.is_file():
            raise ToolError(f"{relative} is not an existing file", code="not_found", data={"path": relative})
        try:
            with _os_errors(relative, "read"):
                text = real.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise ToolError(f"{relative} is not UTF-8 text; it cannot be edited safely", code="binary",
                            data={"path": relative}) from None
        count = text.count(old)
        if count == 0:
            if new and text.count(new) == 1:
                raise ToolError(f"already applied? old is absent from {relative} and new occurs exactly once; "
                                "nothing was changed", code="already_applied", data={"path": relative})
            raise ToolError(f"old text not found in {relative}; nothing was changed", code="not_found",
                            data={"path": relative})
        if count > 1:
            raise ToolError(f"old text occurs {count} times in {relative}; include more context to make it "
                            "unique. Nothing was changed", code="ambiguous", data={"path": relative,
                                                                                   "occurrences": count})
        data = text.replace(old, new, 1).encode("utf-8")
        with _os_errors(relative, "write"):
            _atomic_write(real, data)
        return f"replaced 1 occurrence in {relative} (now {len(data)} bytes)"

    async def run_command(argv: list[str], timeout: float | None = None) -> dict[str, Any]:
        """Run a program in the workspace root: argv is the program and its arguments (no shell; to use
        shell syntax pass ["sh", "-c", "..."]). timeout is in seconds (default and maximum: the configured
        command timeout); on timeout the command and its process group are killed. Returns exit_status
        (negative: killed by that signal), timed_out, duration_s and excerpts of stdout and stderr."""
        if not argv or not all(isinstance(a, str) and "\x00" not in a for a in argv) or not argv[0]:
            raise ToolError("argv must be a non-empty list of strings (program first)", code="invalid_argument",
                            data={"argv": list(argv)})
        if timeout is not None and (not math.isfinite(timeout) or timeout <= 0):
            raise ToolError("timeout must be a positive number of seconds", code="invalid_argument",
                            data={"timeout": timeout if math.isfinite(timeout) else str(timeout)})
        limit = default_timeout if timeout is None else min(float(timeout), default_timeout)
        # Output goes to unlinked temporary files, not pipes: a process the command detached from its
        # group cannot hold the call open, and a huge output costs disk, not memory.
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            started = time.monotonic()
            try:
                process = await asyncio.create_subprocess_exec(
                    *argv, cwd=workspace.root, env=environment, stdin=asyncio.subprocess.DEVNULL,
                    stdout=out, stderr=err, start_new_session=True)
            except FileNotFoundError:
                raise ToolError(f"command not found: {argv[0]}", code="command_not_found",
                                data={"argv": argv}) from None
            except PermissionError:
                raise ToolError(f"not executable: {argv[0]}", code="not_executable",
                                data={"argv": argv}) from None
            except OSError as error:
                raise ToolError(f"cannot start {argv[0]}: {error}", code="cannot_start",
                                data={"argv": argv}) from None
            timed_out = False
            try:
                try:
                    await asyncio.wait_for(process.wait(), limit)
                except TimeoutError:
                    timed_out = True
                    _kill_group(process.pid)
                    await process.wait()
                _kill_group(process.pid)  # what the command left running in its group does not outlive it
            except BaseException:  # cancelled (the turn was interrupted or drained): stop the command too
                _kill_group(process.pid)
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(process.wait(), DRAIN_TIMEOUT)
                raise
            duration = round(time.monotonic() - started, 3)
            stdout, stdout_bytes = _excerpt(out)
            stderr, stderr_bytes = _excerpt(err)
        return {"argv": list(argv), "exit_status": process.returncode, "timed_out": timed_out,
                "timeout_s": limit, "duration_s": duration, "stdout": stdout, "stderr": stderr,
                "stdout_bytes": stdout_bytes, "stderr_bytes": stderr_bytes}

    return [
        tool(read_file, semantics="read_only"),
        tool(list_files, semantics="read_only"),
        tool(write_file, semantics="idempotent"),
        tool(edit_file, semantics="unsafe"),
        tool(run_command, semantics="unsafe", timeout=default_timeout + 30.0),
    ]


__all__ = ["Workspace", "check_globs", "command_environment", "compile_glob", "path_allowed", "workspace_tools"]
