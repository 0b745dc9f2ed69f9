"""``jixu serve``, ``jixu tokens`` and ``jixu remote`` as real processes, and the README's curl session.

One ``jixu serve`` subprocess (with its in-process worker) over a SQLite file;
tokens made with ``jixu tokens create --store``; the CLI's remote mode and
curl talk to it over HTTP.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.helpers import ROOT, python_env, run_jixu

README = ROOT / "README.md"


@dataclass
class Served:
    url: str
    store: str
    tokens: dict[str, str]


def jixu(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_jixu(*args, cwd=ROOT, env=env)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("serve")
    store = f"sqlite:///{tmp / 'served.db'}"
    tokens: dict[str, str] = {}
    for name, args in {"admin": ["--admin", "--name", "root"], "editor": ["--project", "demo", "--role", "editor"],
                       "viewer": ["--project", "demo", "--role", "viewer"],
                       "other": ["--project", "elsewhere", "--role", "operator"]}.items():
        made = jixu("tokens", "create", "--store", store, *args, "--json")
        assert made.returncode == 0, made.stderr
        tokens[name] = json.loads(made.stdout)["secret"]
    port = free_port()
    log = (tmp / "serve.log").open("w")
    process = subprocess.Popen([sys.executable, "-m", "jixu", "serve", "--store", store, "--port", str(port),
                                "--agent", "tests.server.agents:agent", "--workspace-root", str(tmp / "ws")],
                               cwd=ROOT, env=python_env(), stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{url}/api/v1/health").status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert process.poll() is None and time.monotonic() < deadline, (tmp / "serve.log").read_text()
        time.sleep(0.1)
    try:
        yield Served(url, store, tokens)
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(30)
        log.close()
        assert code == 0, (tmp / "serve.log").read_text()


def remote(served: Served, who: str, *args: str) -> subprocess.CompletedProcess[str]:
    return jixu("remote", *args, env={"JIXU_SERVER": served.url, "JIXU_TOKEN": served.tokens[who]})


def test_the_readme_curl_session_creates_a_thread_sends_input_and_reads_its_events(served: Served) -> None:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## The HTTP API: `jixu serve`"):]
    [session] = re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)[:1]
    script = session.replace("http://127.0.0.1:8420", served.url)
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=60,
                            env={**python_env(), "JIXU_TOKEN": served.tokens["editor"]}, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    queued = json.loads(result.stdout.splitlines()[0])
    assert queued["queued"] is True and queued["turn_id"]
    page = json.loads(result.stdout.splitlines()[1])
    types = [e["type"] for e in page["events"]]
    assert types[:2] == ["thread.created", "turn.started"]
    assert "event: thread.created" in result.stdout and "id: 1" in result.stdout


def test_the_remote_cli_runs_a_thread_and_maps_problems_to_exit_codes(served: Served) -> None:
    made = remote(served, "editor", "threads", "create", "--project", "demo", "--json")
    assert made.returncode == 0, made.stderr
    thread_id = json.loads(made.stdout)["thread_id"]
    sent = remote(served, "editor", "threads", "send", thread_id, "hello remote", "--wait", "30", "--json")
    assert sent.returncode == 0, sent.stderr
    assert json.loads(sent.stdout)["state"]["last_reply"] == "echo: hello remote"
    shown = remote(served, "viewer", "threads", "show", thread_id)
    assert shown.returncode == 0 and "idle" in shown.stdout and "echo: hello remote" in shown.stdout
    events = remote(served, "viewer", "threads", "events", thread_id, "--json")
    assert [json.loads(line)["seq"] for line in events.stdout.splitlines()][:2] == [1, 2]
    assert remote(served, "viewer", "threads", "verify", thread_id).returncode == 0
    listed = remote(served, "viewer", "threads", "list", "--json")
    assert thread_id in {row["thread_id"] for row in json.loads(listed.stdout)}
    refused = remote(served, "viewer", "threads", "send", thread_id, "more")
    assert refused.returncode == 7 and "forbidden" in refused.stderr
    hidden = remote(served, "other", "threads", "show", thread_id, "--json")
    assert hidden.returncode == 3 and json.loads(hidden.stdout)["error"]["code"] == "thread_not_found"
    bad = remote(served, "editor", "threads", "create", "--project", "has spaces")
    assert bad.returncode == 6
    nobody = jixu("remote", "threads", "list", env={"JIXU_SERVER": served.url, "JIXU_TOKEN": ""})
    assert nobody.returncode == 7
    whoami = remote(served, "editor", "whoami", "--json")
    assert json.loads(whoami.stdout)["roles"] == {"demo": "editor"}
    idle = remote(served, "editor", "threads", "resume", thread_id, "--note", "nothing paused", "--json")
    assert idle.returncode == 4 and json.loads(idle.stdout)["error"]["code"] == "turn_not_paused", idle.stdout


def test_tokens_are_managed_through_the_server_with_an_admin_token(served: Served) -> None:
    env = {"JIXU_SERVER": served.url, "JIXU_TOKEN": served.tokens["admin"]}
    made = jixu("tokens", "create", "--project", "demo", "--role", "viewer", "--name", "ci", "--json", env=env)
    assert made.returncode == 0, made.stderr
    token = json.loads(made.stdout)
    listed = jixu("tokens", "list", "--json", env=env)
    assert token["token"]["token_id"] in {t["token_id"] for t in json.loads(listed.stdout)}
    revoked = jixu("tokens", "revoke", token["token"]["token_id"], "--json", env=env)
    assert revoked.returncode == 0 and json.loads(revoked.stdout)["revoked"] is True
    refused = jixu("tokens", "list", env={"JIXU_SERVER": served.url, "JIXU_TOKEN": served.tokens["editor"]})
    assert refused.returncode == 7
    local = jixu("tokens", "list", "--store", served.store, "--json")
    assert len(json.loads(local.stdout)) == 5


@pytest.mark.parametrize("server", ["notaurl", "ftp://host", "http://"])
def test_a_server_that_is_not_an_http_url_is_invalid_input_not_unreachable(server: str) -> None:
    """It was exit 5 ("cannot reach the jixu server"), as if the network were down."""
    result = jixu("remote", "--server", server, "--token", "t", "threads", "list")
    assert result.returncode == 6 and "is not an http:// or https:// URL" in result.stderr, result.stderr


def test_tokens_create_needs_a_role_and_a_project(tmp_path: Path) -> None:
    result = jixu("tokens", "create", "--store", f"sqlite:///{tmp_path / 't.db'}", "--project", "demo")
    assert result.returncode == 6 and "--role" in result.stderr


def test_tokens_create_refuses_an_admin_token_with_scoping_flags_and_an_empty_project(tmp_path: Path) -> None:
    """--admin --project demo --role editor used to make an admin token silently: the caller meant a narrow one."""
    store = f"sqlite:///{tmp_path / 't.db'}"
    for args in (("--admin", "--project", "demo", "--role", "editor"), ("--admin", "--role", "operator"),
                 ("--project", "", "--role", "viewer")):
        result = jixu("tokens", "create", "--store", store, *args)
        assert result.returncode == 6, (args, result.stderr)
    listed = jixu("tokens", "list", "--store", store, "--json")
    assert listed.returncode != 0 or json.loads(listed.stdout) == [], listed.stdout


def test_the_remote_cli_recovers_an_expired_turn_once_with_the_operators_note(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    from jixu.kernel import ownership
    from jixu.ledger import open_store
    from jixu.scheduling import create_thread_for
    from jixu.threads.log import ThreadLog
    from tests.server.agents import agent

    # The turn's owner ran on a host that was lost: nothing on this machine can look at its process.
    monkeypatch.setattr(ownership, "_IDENTITY",
                        (os.getpid(), {**ownership.process_identity(), "boot_id": "the-lost-host"}))
    store = open_store(served.store)
    try:
        thread_id = create_thread_for(store, agent(), project="demo")
        turn_id, _fence = ThreadLog.load(store, thread_id).start_turn("charge 42", owner="gone-worker", ttl=0.2)
        time.sleep(0.3)  # the lease expires by the store's clock
        request = "ab" * 16
        args = ("threads", "recover-turn", thread_id, turn_id, "--request-id", request, "--expected-epoch", "1",
                "--note", "worker host lost")
        refused = remote(served, "viewer", *args)
        assert refused.returncode == 7 and "forbidden" in refused.stderr
        recovered = remote(served, "editor", *args, "--json")
        assert recovered.returncode == 0, recovered.stderr
        answer = json.loads(recovered.stdout)
        assert answer["recorded"] is True
        assert (answer["receipt"]["epoch"], answer["receipt"]["previous_owner"], answer["receipt"]["note"]) == (
            2, "gone-worker", "worker host lost")
        # The same request again is the same answer (its Idempotency-Key is the request id), recorded once.
        again = remote(served, "editor", *args, "--json")
        assert again.returncode == 0 and json.loads(again.stdout)["receipt"] == answer["receipt"]
        stale = remote(served, "editor", *args[:5], "cd" * 16, "--expected-epoch", "1")
        assert stale.returncode != 0 and "already recovered" in stale.stderr, stale.stdout + stale.stderr
        events = [e for e in store.read(f"thread/{thread_id}") if e.type == "turn.recovered"]
        assert len(events) == 1 and events[0].data["note"] == "worker host lost"
    finally:
        store.close()
