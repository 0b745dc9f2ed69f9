"""``jixu demo`` as a newcomer runs it: an empty directory, no arguments, a real SIGKILLed worker."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jixu.ledger import SQLiteStore, verify_all
from tests.helpers import python_env

pytestmark = pytest.mark.crash


def demo(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jixu", "demo", *args], capture_output=True, text=True,
                          env=python_env(), cwd=cwd, timeout=120, check=False)


def demo_ids(stdout: str) -> tuple[str, str]:
    """The thread id and the refund's effect id the demo printed."""
    thread = re.search(r"jixu threads events \S+ (\w{26})", stdout)
    effect = re.search(r"Effect (\w{26}) \(issue_refund\) is unknown", stdout)
    assert thread and effect, stdout
    return thread.group(1), effect.group(1)


def lines_for(outside: Path, effect_id: str) -> list[str]:
    return [line for line in outside.read_text(encoding="utf-8").splitlines() if f"effect={effect_id} " in line + " "]


def test_the_demo_runs_in_an_empty_directory_and_tells_the_whole_story(tmp_path: Path) -> None:
    result = demo(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for word in ("SIGKILL", "unknown", "probe", "probe:issue_refund", "waiting",
                 "occurred", "demo-operator", "Replay", "replay", "Fork", "fork", "Refund for order 42 issued.",
                 "no driver was called", "hash chain valid", "not_inherited", "jixu threads show jixu.db",
                 "jixu verify jixu.db"):
        assert word in out, word
    thread_id, effect_id = demo_ids(out)
    outside = tmp_path / "outside-system.log"
    assert len(lines_for(outside, effect_id)) == 1
    assert (tmp_path / "jixu.db").exists()
    with SQLiteStore(tmp_path / "jixu.db") as store:
        reports = verify_all(store)
        assert reports and all(r.valid for r in reports)
        events = store.read(f"thread/{thread_id}")
    refund = [e for e in events if e.data.get("effect_id") == effect_id]
    assert [e.type for e in refund] == ["tool.requested", "tool.dispatched", "tool.outcome_resolved"], \
        "no receipt, never retried, settled by a resolution"
    [by_probe, by_operator] = [e for e in events if e.type == "tool.outcome_resolved"]
    assert by_probe.data["effect_id"] == effect_id and by_probe.data["resolution"] == "occurred"
    assert by_probe.data["actor"] == "probe:issue_refund"
    assert effect_id in by_probe.data["evidence"]["found"]["text"]
    assert by_probe.data["resolution_id"] in {e.data["effect_id"] for e in events if e.type == "probe.completed"}
    [mail] = [e for e in events if e.type == "tool.requested" and e.data["name"] == "notify_customer"]
    assert by_operator.data["effect_id"] == mail.data["effect_id"] and by_operator.data["actor"] == "demo-operator"
    assert mail.data["effect_id"] in by_operator.data["note"]
    assert len(lines_for(tmp_path / "outbox.log", mail.data["effect_id"])) == 1
    assert [e.type for e in events][-1] == "turn.ended"


def test_the_demo_can_run_again_in_the_same_directory(tmp_path: Path) -> None:
    first = demo(tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    second = demo(tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    (thread_1, effect_1), (thread_2, effect_2) = demo_ids(first.stdout), demo_ids(second.stdout)
    assert thread_1 != thread_2 and effect_1 != effect_2
    outside = tmp_path / "outside-system.log"
    assert len(outside.read_text(encoding="utf-8").splitlines()) == 2
    assert len(lines_for(outside, effect_1)) == len(lines_for(outside, effect_2)) == 1
    assert len((tmp_path / "outbox.log").read_text(encoding="utf-8").splitlines()) == 2
    listed = subprocess.run([sys.executable, "-m", "jixu", "threads", "list", "jixu.db", "--json"],
                            capture_output=True, text=True, env=python_env(), cwd=tmp_path, timeout=60, check=False)
    assert listed.returncode == 0
    assert {thread_1, thread_2} <= {row["thread_id"] for row in json.loads(listed.stdout)}


def test_the_demo_takes_a_store_and_an_outside_file(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    result = demo(tmp_path, "--store", "sub/demo.db", "--outside", "payments.log")
    assert result.returncode == 0, result.stdout + result.stderr
    _, effect_id = demo_ids(result.stdout)
    assert len(lines_for(tmp_path / "payments.log", effect_id)) == 1
    assert (tmp_path / "sub" / "demo.db").exists() and not (tmp_path / "jixu.db").exists()
    assert "jixu verify sub/demo.db" in result.stdout


FAKE_WORKER = """
import signal, sys
from jixu.cli import demo
demo.Demo.run_worker = lambda self, thread_id: -signal.SIGKILL  # claims a crash, but no worker ever ran
from jixu.cli.main import cli
sys.argv = ["jixu", "demo"]
cli()
"""


def test_the_demo_fails_loudly_when_its_story_is_violated(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-c", FAKE_WORKER], capture_output=True, text=True, env=python_env(),
                            cwd=tmp_path, timeout=120, check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "expectation was violated" in result.stderr and "expected one issue_refund effect" in result.stderr


def test_the_demo_refuses_a_directory_as_the_outside_file(tmp_path: Path) -> None:
    (tmp_path / "outside-system.log").mkdir()
    result = demo(tmp_path)
    assert result.returncode == 2 and "is a directory" in result.stderr


@pytest.mark.parametrize("store", ["memory://", "sqlite:///x.db", "postgresql://u@h/db"])
def test_the_demo_refuses_a_store_url_and_creates_nothing(tmp_path: Path, store: str) -> None:
    """`--store memory://` made a SQLite file named `memory:` (the option is a file path)."""
    result = demo(tmp_path, "--store", store)
    assert result.returncode == 2 and "give the path of a SQLite file" in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == []
