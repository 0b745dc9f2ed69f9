"""The workspace tools: each tool, its declared semantics, every confinement rule, command timeouts."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jixu.errors import InvalidInput
from jixu.runs import workspace_tools as module
from jixu.runs.workspace_tools import compile_glob, path_allowed, workspace_tools
from jixu.threads.tools import Tool, ToolContext, ToolError

CTX = ToolContext(effect_id="E1", idempotency_key="jixu:E1", attempt=1, thread_id="T1", turn_id="U1")


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("[core]\n")
    (root / "README.md").write_text("# demo\n")
    (root / "src" / "app.py").write_text("def add(a, b):\n    return a - b\n")
    (root / "src" / "pkg" / "util.py").write_text("X = 1\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("secret\n")
    return root


def tools_for(root: Path, **options: Any) -> dict[str, Tool]:
    return {t.name: t for t in workspace_tools(root, **options)}


def call(root: Path, name: str, _options: dict[str, Any] | None = None, **args: Any) -> Any:
    """Invoke a tool as the thread runtime does (schema validation, async invoke)."""
    return asyncio.run(tools_for(root, **(_options or {}))[name].invoke(args, CTX))


def refused(root: Path, name: str, code: str, _options: dict[str, Any] | None = None, **args: Any) -> ToolError:
    with pytest.raises(ToolError) as caught:
        call(root, name, _options, **args)
    assert caught.value.code == code, caught.value.to_dict()
    return caught.value


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie awaiting its reaper counts as dead)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return fields[0] != "Z"


def wait_dead(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def pids(tmp_path: Path) -> Iterator[list[Path]]:
    """Pid files of processes a test's commands start; any still running at teardown is killed."""
    files: list[Path] = []
    yield files
    for path in files:
        if path.exists() and path.read_text().strip():
            pid = int(path.read_text())
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


# --- declarations ---------------------------------------------------------------------------


def test_five_tools_with_honest_semantics(ws: Path) -> None:
    tools = tools_for(ws)
    assert {n: t.semantics for n, t in tools.items()} == {
        "read_file": "read_only", "list_files": "read_only", "write_file": "idempotent",
        "edit_file": "unsafe", "run_command": "unsafe"}
    assert not any(t.requires_approval for t in tools.values())
    assert tools["read_file"].parameters["properties"]["start_line"]["default"] == 1
    assert tools["run_command"].parameters["required"] == ["argv"]
    # Two workspaces give the same contracts: a thread can move between identical tool sets.
    other = ws.parent / "other"
    other.mkdir()
    assert [t.contract() for t in workspace_tools(ws)] == [t.contract() for t in workspace_tools(other)]


@pytest.mark.parametrize("options", [
    {"allowed_paths": []}, {"allowed_paths": "**"}, {"allowed_paths": ["/abs/**"]}, {"allowed_paths": [""]},
    {"command_timeout": 0}, {"command_timeout": -1.0}, {"command_timeout": float("inf")}, {"command_timeout": True},
])
def test_bad_configuration_is_refused(ws: Path, options: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput):
        workspace_tools(ws, **options)


def test_a_missing_workspace_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput):
        workspace_tools(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidInput):
        workspace_tools(tmp_path / "file")


@pytest.mark.parametrize(("pattern", "path", "expected"), [
    ("**", "a/b/c.py", True), ("**", "x", True),
    ("*.py", "a.py", True), ("*.py", "src/a.py", False),
    ("**/*.py", "a.py", True), ("**/*.py", "src/deep/a.py", True), ("**/*.py", "src/a.txt", False),
    ("src/**", "src/a/b.py", True), ("src/**", "srcx/a.py", False), ("src/**", "lib/src/a.py", False),
    ("src/*.py", "src/a.py", True), ("src/*.py", "src/a/b.py", False),
    ("docs/?.md", "docs/a.md", True), ("docs/?.md", "docs/ab.md", False),
    ("[ab].txt", "a.txt", True), ("[!ab].txt", "a.txt", False), ("[!ab].txt", "c.txt", True),
    ("./src/**", "src/a.py", True), ("a+b(c).txt", "a+b(c).txt", True), ("a.txt", "aXtxt", False),
])
def test_glob_semantics(pattern: str, path: str, expected: bool) -> None:
    assert path_allowed(path, [pattern]) is expected
    assert (compile_glob(pattern).match(path) is not None) is expected


# --- read_file ------------------------------------------------------------------------------


def test_read_file_returns_the_lines_verbatim(ws: Path) -> None:
    assert call(ws, "read_file", path="src/app.py") == "def add(a, b):\n    return a - b\n"
    assert call(ws, "read_file", path="./src/../src/app.py") == "def add(a, b):\n    return a - b\n"
    assert call(ws, "read_file", path=".git/config") == "[core]\n"  # reading git metadata is harmless


def test_read_file_windows_say_what_they_show(ws: Path) -> None:
    (ws / "long.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    text = call(ws, "read_file", path="long.txt", start_line=3, max_lines=2)
    assert text.startswith("line 3\nline 4\n")
    assert "[long.txt has 10 lines; this shows lines 3-4; call read_file with start_line=5" in text
    tail = call(ws, "read_file", path="long.txt", start_line=9)
    assert tail.startswith("line 9\nline 10\n") and "this shows lines 9-10]" in tail
    assert call(ws, "read_file", path="long.txt", max_lines=10) == "".join(f"line {i}\n" for i in range(1, 11))
    refused(ws, "read_file", "invalid_argument", path="long.txt", start_line=11)
    refused(ws, "read_file", "invalid_argument", path="long.txt", start_line=0)
    refused(ws, "read_file", "invalid_argument", path="long.txt", max_lines=0)
    (ws / "empty.txt").write_text("")
    assert call(ws, "read_file", path="empty.txt") == ""


def test_read_file_refusals(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    refused(ws, "read_file", "not_found", path="missing.py")
    refused(ws, "read_file", "is_directory", path="src")
    (ws / "blob.bin").write_bytes(b"\x00\x01\x02")
    refused(ws, "read_file", "binary", path="blob.bin")
    monkeypatch.setattr(module, "MAX_READ_BYTES", 4)
    refused(ws, "read_file", "too_large", path="README.md")


# --- list_files -----------------------------------------------------------------------------


def test_list_files_skips_git_and_matches_patterns(ws: Path) -> None:
    assert call(ws, "list_files") == ["README.md", "src/app.py", "src/pkg/util.py"]
    assert call(ws, "list_files", pattern="*.py") == []
    assert call(ws, "list_files", pattern="**/*.py") == ["src/app.py", "src/pkg/util.py"]
    assert call(ws, "list_files", path="src", pattern="*.py") == ["src/app.py"]
    assert call(ws, "list_files", path="src/pkg") == ["src/pkg/util.py"]


def test_list_files_refusals(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    refused(ws, "list_files", "not_found", path="nope")
    refused(ws, "list_files", "not_a_directory", path="README.md")
    refused(ws, "list_files", "invalid_argument", pattern="/abs")
    monkeypatch.setattr(module, "MAX_LISTED", 2)
    refused(ws, "list_files", "too_many")


def test_list_files_leaves_out_symlinks_that_leave_the_workspace(ws: Path) -> None:
    (ws / "escape.txt").symlink_to(ws.parent / "outside" / "secret.txt")
    (ws / "alias.py").symlink_to(ws / "src" / "app.py")
    (ws / "outdir").symlink_to(ws.parent / "outside")
    assert call(ws, "list_files") == ["README.md", "alias.py", "src/app.py", "src/pkg/util.py"]


# --- write_file -----------------------------------------------------------------------------


def test_write_file_creates_directories_and_is_idempotent(ws: Path) -> None:
    first = call(ws, "write_file", path="docs/notes/a.md", content="héllo\n")
    assert (ws / "docs" / "notes" / "a.md").read_text() == "héllo\n"
    before = (ws / "docs" / "notes" / "a.md").stat().st_mtime_ns
    time.sleep(0.01)
    assert call(ws, "write_file", path="docs/notes/a.md", content="héllo\n") == first  # same call, same answer
    assert (ws / "docs" / "notes" / "a.md").stat().st_mtime_ns == before  # and nothing touched
    assert first == "wrote 7 bytes to docs/notes/a.md"
    assert not [p for p in (ws / "docs" / "notes").iterdir() if p.name.endswith(".tmp")]


def test_write_file_replaces_content_and_keeps_the_mode(ws: Path) -> None:
    script = ws / "run.sh"
    script.write_text("echo old\n")
    script.chmod(0o755)
    call(ws, "write_file", path="run.sh", content="echo new\n")
    assert script.read_text() == "echo new\n"
    assert stat.S_IMODE(script.stat().st_mode) == 0o755


def test_write_file_refusals(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    refused(ws, "write_file", "is_directory", path="src", content="x")
    refused(ws, "write_file", "os_error", path="README.md/inner.txt", content="x")  # a file is no directory
    monkeypatch.setattr(module, "MAX_WRITE_BYTES", 3)
    refused(ws, "write_file", "too_large", path="big.txt", content="abcd")
    assert not (ws / "big.txt").exists()


# --- edit_file ------------------------------------------------------------------------------


def test_edit_file_replaces_exactly_one_occurrence(ws: Path) -> None:
    result = call(ws, "edit_file", path="src/app.py", old="return a - b", new="return a + b")
    assert result.startswith("replaced 1 occurrence in src/app.py")
    assert (ws / "src" / "app.py").read_text() == "def add(a, b):\n    return a + b\n"


def test_a_repeated_edit_is_detected_not_guessed(ws: Path) -> None:
    call(ws, "edit_file", path="src/app.py", old="return a - b", new="return a + b")
    error = refused(ws, "edit_file", "already_applied", path="src/app.py", old="return a - b", new="return a + b")
    assert "already applied?" in error.message
    assert (ws / "src" / "app.py").read_text() == "def add(a, b):\n    return a + b\n"


def test_why_edit_file_is_unsafe_a_second_application_can_change_more(ws: Path) -> None:
    # new contains old: applying the same edit twice really changes the file twice.
    call(ws, "edit_file", path="src/pkg/util.py", old="X = 1\n", new="X = 1\nY = 2\n")
    call(ws, "edit_file", path="src/pkg/util.py", old="X = 1\n", new="X = 1\nY = 2\n")
    assert (ws / "src" / "pkg" / "util.py").read_text() == "X = 1\nY = 2\nY = 2\n"


def test_edit_file_refusals_change_nothing(ws: Path) -> None:
    (ws / "dup.txt").write_text("a\na\n")
    refused(ws, "edit_file", "ambiguous", path="dup.txt", old="a", new="b")
    refused(ws, "edit_file", "not_found", path="dup.txt", old="zzz", new="b")
    refused(ws, "edit_file", "not_found", path="dup.txt", old="zzz", new="a")  # new present twice: no guess
    refused(ws, "edit_file", "invalid_argument", path="dup.txt", old="", new="b")
    refused(ws, "edit_file", "invalid_argument", path="dup.txt", old="a", new="a")
    refused(ws, "edit_file", "not_found", path="missing.txt", old="a", new="b")
    (ws / "latin.txt").write_bytes("caf\xe9".encode("latin-1"))
    refused(ws, "edit_file", "binary", path="latin.txt", old="caf", new="cafe")
    assert (ws / "dup.txt").read_text() == "a\na\n"


def test_edit_file_keeps_line_endings(ws: Path) -> None:
    (ws / "crlf.txt").write_bytes(b"one\r\ntwo\r\n")
    call(ws, "edit_file", path="crlf.txt", old="two", new="three")
    assert (ws / "crlf.txt").read_bytes() == b"one\r\nthree\r\n"


# --- confinement ----------------------------------------------------------------------------

WRITERS = [("write_file", {"content": "x"}), ("edit_file", {"old": "a", "new": "b"})]
READERS = [("read_file", {}), ("list_files", {})]


@pytest.mark.parametrize(("name", "extra"), READERS + WRITERS)
@pytest.mark.parametrize(("path", "code"), [
    ("/etc/passwd", "absolute_path"),
    ("../outside/secret.txt", "outside_workspace"),
    ("src/../../outside/secret.txt", "outside_workspace"),
    ("..", "outside_workspace"),
    ("", "invalid_path"),
])
def test_paths_outside_the_workspace_are_refused(ws: Path, name: str, extra: dict[str, Any], path: str,
                                                 code: str) -> None:
    refused(ws, name, code, path=path, **extra)
    assert (ws.parent / "outside" / "secret.txt").read_text() == "secret\n"


@pytest.mark.parametrize(("name", "extra"), READERS + WRITERS)
def test_symlinks_leaving_the_workspace_are_refused(ws: Path, name: str, extra: dict[str, Any]) -> None:
    (ws / "link").symlink_to(ws.parent / "outside")
    (ws / "file-link").symlink_to(ws.parent / "outside" / "secret.txt")
    target = "link" if name == "list_files" else "link/secret.txt"
    refused(ws, name, "outside_workspace", path=target, **extra)
    if name != "list_files":
        refused(ws, name, "outside_workspace", path="file-link", **extra)
    assert (ws.parent / "outside" / "secret.txt").read_text() == "secret\n"


def test_symlinks_within_the_workspace_work(ws: Path) -> None:
    (ws / "alias.py").symlink_to(ws / "src" / "app.py")
    assert call(ws, "read_file", path="alias.py").startswith("def add")
    call(ws, "write_file", path="alias.py", content="# replaced\n")
    assert (ws / "src" / "app.py").read_text() == "# replaced\n" and (ws / "alias.py").is_symlink()


def test_symlink_loops_are_refused(ws: Path) -> None:
    (ws / "loop").symlink_to(ws / "loop")
    with pytest.raises(ToolError) as caught:
        call(ws, "read_file", path="loop")
    assert caught.value.code in ("invalid_path", "not_found")


@pytest.mark.parametrize(("name", "extra"), WRITERS)
def test_writes_outside_allowed_paths_are_refused(ws: Path, name: str, extra: dict[str, Any]) -> None:
    options = {"allowed_paths": ["src/**", "docs/*.md"]}
    error = refused(ws, name, "not_allowed", options, path="README.md", **extra)
    assert error.data == {"path": "README.md", "allowed_paths": ["src/**", "docs/*.md"]}
    refused(ws, name, "not_allowed", options, path="docs/deep/x.md", **extra)
    # A symlink inside the workspace does not smuggle a write past the allowed paths.
    (ws / "src" / "readme-link").symlink_to(ws / "README.md")
    refused(ws, name, "not_allowed", options, path="src/readme-link", **extra)
    assert (ws / "README.md").read_text() == "# demo\n"
    assert call(ws, "write_file", options, path="docs/new.md", content="a\n") == "wrote 2 bytes to docs/new.md"


@pytest.mark.parametrize(("name", "extra"), WRITERS)
def test_git_metadata_is_never_writable(ws: Path, name: str, extra: dict[str, Any]) -> None:
    refused(ws, name, "not_allowed", path=".git/config", **extra)
    refused(ws, name, "not_allowed", path="src/.git/hooks/x", **extra)
    refused(ws, name, "is_directory", path=".", **extra)
    assert (ws / ".git" / "config").read_text() == "[core]\n"


def test_read_only_tools_read_outside_allowed_paths(ws: Path) -> None:
    options = {"allowed_paths": ["src/**"]}
    assert call(ws, "read_file", options, path="README.md") == "# demo\n"
    assert "README.md" in call(ws, "list_files", options)


# --- run_command ----------------------------------------------------------------------------


def test_run_command_runs_in_the_workspace_and_reports(ws: Path) -> None:
    result = call(ws, "run_command", argv=[sys.executable, "-c",
                                           "import os, sys; print(os.getcwd()); print('warn', file=sys.stderr); "
                                           "sys.exit(3)"])
    assert result["exit_status"] == 3 and result["timed_out"] is False
    assert result["stdout"].strip() == str(ws.resolve()) and result["stderr"] == "warn\n"
    assert result["stdout_bytes"] == len(result["stdout"].encode()) and result["timeout_s"] == 120.0
    assert result["argv"][0] == sys.executable and result["duration_s"] >= 0
    ok = call(ws, "run_command", argv=["sh", "-c", f"cd src && {sys.executable} -c 'import app; print(app.add(2, 2))'"],
              timeout=30)
    assert ok["exit_status"] == 0 and ok["stdout"] == "0\n"


def test_run_command_keeps_the_head_and_tail_of_long_output(ws: Path) -> None:
    result = call(ws, "run_command", argv=[sys.executable, "-c",
                                           "print('A' * 20000 + 'MIDDLE' + 'B' * 20000 + 'END')"])
    assert result["stdout_bytes"] == 40010
    assert result["stdout"].startswith("A" * 100) and result["stdout"].endswith("END\n")
    assert "bytes omitted" in result["stdout"] and "MIDDLE" not in result["stdout"]


def test_run_command_refusals_run_nothing(ws: Path) -> None:
    refused(ws, "run_command", "invalid_argument", argv=[])
    refused(ws, "run_command", "invalid_argument", argv=[""])
    refused(ws, "run_command", "invalid_argument", argv=["echo"], timeout=0)
    refused(ws, "run_command", "invalid_argument", argv=["echo"], timeout=-3)
    refused(ws, "run_command", "command_not_found", argv=["definitely-not-a-command-jixu"])
    (ws / "not-exec.sh").write_text("echo hi\n")
    refused(ws, "run_command", "not_executable", argv=["./not-exec.sh"])


def test_run_command_timeout_kills_the_process_group(ws: Path, pids: list[Path]) -> None:
    child_pid = ws / "child.pid"
    pids.append(child_pid)
    code = ("import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(child_pid)!r}, 'w').write(str(p.pid)); print('started', flush=True); time.sleep(60)")
    started = time.monotonic()
    result = call(ws, "run_command", argv=[sys.executable, "-c", code], timeout=1.5)
    assert time.monotonic() - started < 10
    assert result["timed_out"] is True and result["exit_status"] == -signal.SIGKILL
    assert result["timeout_s"] == 1.5 and result["stdout"] == "started\n"
    assert wait_dead(int(child_pid.read_text())), "the command's child survived the timeout"


def test_the_timeout_is_capped_by_the_configured_one(ws: Path) -> None:
    result = call(ws, "run_command", {"command_timeout": 0.5}, argv=["sleep", "30"], timeout=100)
    assert result["timed_out"] is True and result["timeout_s"] == 0.5


def test_background_processes_do_not_outlive_the_command(ws: Path, pids: list[Path]) -> None:
    bg_pid = ws / "bg.pid"
    pids.append(bg_pid)
    result = call(ws, "run_command", argv=["sh", "-c", f"sleep 60 & echo $! > {bg_pid}; echo done"])
    assert result["exit_status"] == 0 and result["stdout"] == "done\n" and result["timed_out"] is False
    assert wait_dead(int(bg_pid.read_text()))


def test_cancelling_a_command_kills_its_group(ws: Path, pids: list[Path]) -> None:
    pid_file = ws / "cmd.pid"
    pids.append(pid_file)
    run_command = tools_for(ws)["run_command"]

    async def scenario() -> None:
        task = asyncio.ensure_future(run_command.invoke(
            {"argv": ["sh", "-c", f"echo $$ > {pid_file}; exec sleep 60"]}, CTX))
        deadline = time.monotonic() + 10
        while not (pid_file.exists() and pid_file.read_text().strip()):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert wait_dead(int(pid_file.read_text()))


def test_commands_do_not_see_secret_looking_variables(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JIXU_TEST_API_KEY", "sk-should-not-leak")
    monkeypatch.setenv("JIXU_TEST_PLAIN", "visible")
    code = "import os; print(os.environ.get('JIXU_TEST_API_KEY'), os.environ.get('JIXU_TEST_PLAIN'))"
    assert call(ws, "run_command", argv=[sys.executable, "-c", code])["stdout"] == "None visible\n"
    given = call(ws, "run_command", {"env": {"ONLY": "this", "PATH": os.environ["PATH"]}},
                 argv=["sh", "-c", "echo $ONLY $JIXU_TEST_PLAIN"])
    assert given["stdout"] == "this\n"


def test_a_process_detached_from_the_group_does_not_hang_the_command(ws: Path, pids: list[Path]) -> None:
    pid_file = ws / "detached.pid"
    pids.append(pid_file)
    started = time.monotonic()
    code = ("import subprocess; p = subprocess.Popen(['sleep', '30'], start_new_session=True); "
            f"open({str(pid_file)!r}, 'w').write(str(p.pid)); print('out')")
    result = call(ws, "run_command", argv=[sys.executable, "-c", code])
    assert time.monotonic() - started < 10
    assert alive(int(pid_file.read_text()))  # out of reach of the group kill (the fixture ends it)
    assert result["exit_status"] == 0 and result["stdout"] == "out\n" and result["timed_out"] is False
