"""``jixu threads create|send`` against a store: the local counterparts of the API's create and send."""

from __future__ import annotations

import json
from pathlib import Path

from jixu.ledger import SQLiteStore
from jixu.scheduling import thread_work_key
from tests.server.test_cli_remote import jixu


def test_a_thread_created_and_sent_input_locally_is_run_by_a_worker(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'local.db'}"
    made = jixu("threads", "create", store, "--agent", "tests.server.agents:agent", "--project", "demo",
                "--actor", "cli:alice", "--json")
    assert made.returncode == 0, made.stderr
    thread_id = json.loads(made.stdout)["thread_id"]
    sent = jixu("threads", "send", store, thread_id, "hello local", "--actor", "cli:alice", "--json")
    assert sent.returncode == 0, sent.stderr
    with SQLiteStore(tmp_path / "local.db") as opened:
        work = opened.get_work(thread_work_key(thread_id))
        assert work is not None and work.group == "demo"
        started = [e for e in opened.read(f"thread/{thread_id}") if e.type == "turn.started"]
        assert len(started) == 1 and started[0].meta["actor"] == "cli:alice"
    busy = jixu("threads", "send", store, thread_id, "again")
    assert busy.returncode == 4  # a turn is already active
    ran = jixu("worker", "--store", store, "--agent", "tests.server.agents:agent", "--exit-when-idle",
               "--poll-interval", "0.02")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    shown = json.loads(jixu("threads", "show", store, thread_id, "--json").stdout)
    assert shown["last_reply"] == "echo: hello local"
    missing = jixu("threads", "create", store, "--agent", "no.such.module:agent")
    assert missing.returncode == 6
