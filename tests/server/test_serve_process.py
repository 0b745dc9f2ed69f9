"""A real ``jixu serve`` process: with ``--worker-processes N`` the worker runs as N processes of their own
beside it, which execute what is sent over HTTP, drain with the server on SIGTERM, and end with it when it is
SIGKILLed; and its idle keep-alive connections outlive the clients' own reuse of them."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from jixu.ledger import SQLiteStore
from tests.helpers import PROC_CHILDREN, process_exited
from tests.runs.conftest import wait_until
from tests.server.serve_process import served
from tests.server.test_cli_remote import free_port, jixu

linux_proc = pytest.mark.skipif(not PROC_CHILDREN, reason="reads a process's children from Linux's /proc")


def idle_state(client: httpx.Client, thread_id: str) -> dict[str, Any] | None:
    state: dict[str, Any] = client.get(f"/threads/{thread_id}").json()
    owner = state["ownership"]
    return state if state["status"] == "idle" and (not owner or owner["released"]) else None


def claimed_by(client: httpx.Client, thread_id: str) -> set[str]:
    events = client.get(f"/threads/{thread_id}/events", params={"limit": 1000}).json()["events"]
    return {e["data"]["owner"] for e in events if e["type"] == "turn.claimed"}


@linux_proc
def test_the_worker_processes_run_the_inputs_sent_over_http_and_drain_with_the_server(tmp_path: Path) -> None:
    with served(tmp_path, "--worker-processes", "2", "--owner", "srv") as server:
        children = server.children()
        assert len(children) == 2, server.output()
        assert "durability synchronous=FULL" in server.output()  # on the server's start line, and each worker's:
        wait_until(lambda: server.output().count("(durability synchronous=FULL)") == 2, "the workers' start lines")
        threads = []
        for _ in range(8):
            made = server.client.post("/threads", json={"project": "demo"})
            assert made.status_code == 201, made.text
            threads.append(made.json()["thread_id"])
        for i, thread_id in enumerate(threads):
            sent = server.client.post(f"/threads/{thread_id}/inputs", json={"input": f"hello {i}"})
            assert sent.status_code == 202, sent.text
        states: dict[str, dict[str, Any]] = {}

        def all_idle() -> bool:
            for thread_id in threads:
                state = states.get(thread_id) or idle_state(server.client, thread_id)
                if state is None:
                    return False
                states[thread_id] = state
            return True

        wait_until(all_idle, "every turn to finish", interval=0.05)
        assert [states[t]["last_reply"] for t in threads] == [f"echo: hello {i}" for i in range(8)]
        owners = set().union(*(claimed_by(server.client, t) for t in threads))
        assert owners <= {"srv-1", "srv-2"} and owners, owners  # run by the children, not the server's process
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(30) == 0, server.output()
        wait_until(lambda: all(process_exited(child) for child in children), "the worker processes to exit")
        output = server.output()
    assert "srv-1 stopped (SIGTERM received)" in output and "srv-2 stopped (SIGTERM received)" in output, output
    store = SQLiteStore(server.store_path)
    try:
        assert store.list_work(state="claimed") == []
    finally:
        store.close()


@linux_proc
def test_a_worker_process_killed_under_the_server_is_started_again_and_inputs_still_run(tmp_path: Path) -> None:
    """With one worker process, a SIGKILL of it left the server answering 202 to inputs nobody would ever run."""
    with served(tmp_path, "--worker-processes", "1", "--owner", "srv") as server:
        [child] = server.children()
        os.kill(child, signal.SIGKILL)
        wait_until(lambda: process_exited(child), "the killed worker to be gone")
        wait_until(lambda: [pid for pid in server.children() if pid != child], "a new worker process", timeout=30)
        made = server.client.post("/threads", json={"project": "demo"})
        thread_id = made.json()["thread_id"]
        sent = server.client.post(f"/threads/{thread_id}/inputs", json={"input": "after the kill"})
        assert sent.status_code == 202, sent.text
        wait_until(lambda: idle_state(server.client, thread_id) is not None, "the input to be run", timeout=30)
        state = idle_state(server.client, thread_id)
        assert state is not None and state["last_reply"] == "echo: after the kill"
        assert claimed_by(server.client, thread_id) == {"srv-1"}
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(30) == 0, server.output()
        assert "srv-1 died (exit -9); started it again" in server.output(), server.output()


@linux_proc
def test_a_sigkilled_server_takes_its_worker_processes_with_it(tmp_path: Path) -> None:
    with served(tmp_path, "--worker-processes", "2", "--owner", "srv") as server:
        children = server.children()
        assert len(children) == 2, server.output()
        assert "durability synchronous=FULL" in server.output()  # on the server's start line, and each worker's:
        wait_until(lambda: server.output().count("(durability synchronous=FULL)") == 2, "the workers' start lines")
        server.process.kill()
        server.process.wait(10)
        wait_until(lambda: all(process_exited(child) for child in children), "the orphaned worker processes to exit")
        time.sleep(0.2)  # their last lines reach the log
        output = server.output()
    assert output.count("stopped (the pool's parent process is gone)") == 2, output


def test_worker_processes_out_of_range_are_refused_before_anything_starts(tmp_path: Path) -> None:
    result = jixu("serve", "--store", f"sqlite:///{tmp_path / 'x.db'}", "--agent", "tests.server.agents:agent",
                  "--worker-processes", "-1")
    assert result.returncode == 2 and "--worker-processes" in result.stderr, result.stderr
    assert not (tmp_path / "x.db").exists()


def test_worker_processes_over_a_store_in_memory_are_refused_instead_of_never_seeing_the_inputs() -> None:
    """Each process opening memory:// gets its own empty store: the children would never see an input."""
    result = jixu("serve", "--store", "memory://", "--agent", "tests.server.agents:agent", "--worker-processes", "2",
                  "--port", str(free_port()))
    assert result.returncode == 6, (result.stdout, result.stderr)
    assert "a store they can share" in result.stderr, result.stderr


def test_an_address_that_cannot_be_listened_on_is_one_line_exit_6_before_serve_announces_itself(
        tmp_path: Path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        for args in (("--port", str(taken.getsockname()[1])), ("--host", "256.1.1.1")):
            result = jixu("serve", "--store", f"sqlite:///{tmp_path / 'x.db'}", *args)
            assert result.returncode == 6, (args, result.stdout, result.stderr)
            assert "cannot listen on" in result.stderr and "Traceback" not in result.stderr, result.stderr
            assert "jixu serve:" not in result.stdout, result.stdout
    finally:
        taken.close()
    both = jixu("serve", "--store", f"sqlite:///{tmp_path / 'x.db'}", "--no-worker", "--worker-processes", "2",
                "--port", str(free_port()))
    assert both.returncode == 6 and "--no-worker" in both.stderr, both.stderr


def test_an_idle_keep_alive_connection_outlives_the_clients_reuse_of_it(tmp_path: Path) -> None:
    """httpx reuses an idle connection for up to 5 s (its default ``keepalive_expiry``): the server must keep it
    longer, or it closes connections just as clients send on them (a POST then fails unanswered). A request,
    then 6 s idle, then a second request on the same socket is answered."""
    with served(tmp_path, "--no-worker") as server:
        port = httpx.URL(str(server.client.base_url)).port
        assert port is not None
        request = f"GET /api/v1/health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            for pause in (6.0, 0.0):
                sock.sendall(request)
                answer = b""
                while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
                    piece = sock.recv(65536)
                    assert piece, f"the server closed the connection; got {answer!r}"
                    answer += piece
                assert answer.startswith(b"HTTP/1.1 200"), answer
                time.sleep(pause)


def test_a_stopped_server_ends_within_its_drain_timeout_though_a_def_tool_still_blocks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`jixu serve --drain-timeout 1` with its worker in the process: a plain `def` tool blocks its thread for 30 s.
    SIGTERM ends the server within its drain, the call with it (recorded unknown); it waited for the thread
    (a thread cannot be stopped), and the call could still act after its record said unknown."""
    outside, late = tmp_path / "outside.txt", tmp_path / "late.txt"
    monkeypatch.setenv("JIXU_TEST_OUTSIDE", str(outside))
    monkeypatch.setenv("JIXU_TEST_BLOCK_SLEEP", "30")
    monkeypatch.setenv("JIXU_TEST_BLOCK_LATE", str(late))
    with served(tmp_path, "--agent", "tests.runs.agents:blocking_agent", "--drain-timeout", "1") as server:
        made = server.client.post("/threads", json={"project": "demo"})
        assert made.status_code == 201, made.text
        thread_id = made.json()["thread_id"]
        assert server.client.post(f"/threads/{thread_id}/inputs", json={"input": "block 1"}).status_code == 202
        wait_until(lambda: outside.exists() and outside.read_text().strip() != "", "the blocking call")
        stopped_at = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(30) == 0, server.output()
        took = time.monotonic() - stopped_at
        assert took < 8, f"exited {took:.1f}s after SIGTERM with --drain-timeout 1\n{server.output()}"
        assert "cut off by ending the process" in server.output(), server.output()
    assert not late.exists(), "the cut-off call acted after its server stopped"


@linux_proc
@pytest.mark.parametrize("processes", ["0", "2"])
def test_the_servers_worker_claims_within_the_limits_it_is_given(tmp_path: Path, processes: str) -> None:
    """An audit: `jixu serve`'s worker (in process or in worker processes) took no limits, so beside `jixu worker`s
    given `--global-limit` / `--project-limit` it claimed without any. It takes the same options now."""
    with served(tmp_path, "--worker-processes", processes, "--global-limit", "3", "--project-limit", "demo=1") as server:
        threads = []
        for _ in range(4):
            made = server.client.post("/threads", json={"project": "demo"})
            assert made.status_code == 201, made.text
            threads.append(made.json()["thread_id"])
            sent = server.client.post(f"/threads/{threads[-1]}/inputs", json={"input": "transfer"})
            assert sent.status_code == 202, sent.text
        store = SQLiteStore(server.store_path)
        try:
            wait_until(lambda: len(store.list_work(state="claimed")) >= 1, "a transfer to be claimed")
            time.sleep(1.5)  # the workers look again and again meanwhile (each transfer stays in flight)
            claimed, pending = store.list_work(state="claimed"), store.list_work(state="pending")
            assert (len(claimed), len(pending)) == (1, 3), (claimed, pending, server.output())
        finally:
            store.close()


@pytest.mark.parametrize(("options", "says"), [
    (["--agent", "tests.server.agents:agent", "--project-limit", "bad\tname=1"], "project"),
    (["--agent", "tests.server.agents:agent", "--project-limit", "demo"], "PROJECT=N"),
    (["--no-worker", "--global-limit", "2"], "starts none"),
    (["--project-limit", "demo=1"], "starts none"),
])
def test_serve_refuses_limits_it_cannot_apply_before_it_listens(tmp_path: Path, options: list[str],
                                                               says: str) -> None:
    """The review of the options above: a malformed limit printed a traceback (exit 1) once the server was
    listening; limits given to a server that starts no worker were taken without a word and applied by nobody."""
    result = jixu("serve", "--store", f"sqlite:///{tmp_path / 'x.db'}", "--port", str(free_port()), *options)
    assert result.returncode == 6, (result.returncode, result.stdout, result.stderr)
    assert says in result.stderr and "Traceback" not in result.stderr + result.stdout, result.stderr
