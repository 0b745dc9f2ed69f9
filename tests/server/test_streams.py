"""Live event streams end when they must: when their token is revoked, and when the server stops (a real
``jixu serve`` process, a real open client, SIGTERM)."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from jixu.ledger import SQLiteStore
from jixu.server import create_token
from tests.server.conftest import Api, start_api
from tests.server.serve_process import served
from tests.server.test_threads_api import new_thread

RECHECK = 0.3


@pytest.fixture
def rechecking(tmp_path: Path) -> Iterator[Api]:
    """A live server whose streams check their caller again every RECHECK seconds."""
    store = SQLiteStore(tmp_path / "streams.db")
    made, server = start_api(store, tmp_path, stream_recheck_interval=RECHECK)
    try:
        yield made
    finally:
        made.close()
        server.stop()
        store.close()


class Reader:
    """An SSE client on a thread of its own: what it received, and when and how its stream ended."""

    def __init__(self, url: str, token: str, timeout: float = 600) -> None:
        self.url, self.token, self.timeout = url, token, timeout
        self.events: list[dict[str, Any]] = []
        self.status: int | None = None
        self.ended_at: float | None = None
        self.error: BaseException | None = None
        self.open = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        assert self.open.wait(20), "the stream did not open"

    def _read(self) -> None:
        current: dict[str, Any] = {}
        try:
            with httpx.stream("GET", self.url, params={"timeout": self.timeout},
                              headers={"Authorization": f"Bearer {self.token}"}, timeout=None) as response:
                self.status = response.status_code
                self.open.set()
                for line in response.iter_lines():
                    if line.startswith("event: "):
                        current["event"] = line[7:]
                    elif line.startswith("data: "):
                        current["data"] = json.loads(line[6:])
                    elif line == "" and current:
                        self.events.append(current)
                        current = {}
        except BaseException as error:  # recorded for the test to assert on
            self.error = error
        finally:
            self.ended_at = time.monotonic()
            self.open.set()

    def wait_ended(self, timeout: float) -> bool:
        self.thread.join(timeout)
        return not self.thread.is_alive()


def test_a_stream_ends_with_a_problem_once_its_token_is_revoked(rechecking: Api) -> None:
    api = rechecking
    info, secret = create_token(api.store, "watcher", roles={"alpha": "viewer"}, actor="test")
    editor = api.client("alpha-editor")
    thread_id = new_thread(editor)
    reader = Reader(f"{api.url}/api/v1/threads/{thread_id}/events/stream", secret)
    assert reader.status == 200
    deadline = time.monotonic() + 10
    while not reader.events and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [e["event"] for e in reader.events] == ["thread.created"]
    revoked_at = time.monotonic()
    assert api.client("admin").post(f"/tokens/{info.token_id}/revoke", json={"reason": "left"}).status_code == 200
    assert reader.wait_ended(RECHECK * 10 + 5), "the revoked token's stream stayed open"
    assert reader.error is None and reader.ended_at is not None
    assert reader.ended_at - revoked_at < RECHECK * 10 + 2
    *_, last = reader.events
    assert last["event"] == "problem" and last["data"]["code"] == "unauthorized" and last["data"]["status"] == 401
    # Nothing the thread recorded after the revocation reached the revoked token.
    editor.post(f"/threads/{thread_id}/inputs", json={"input": "after"})
    time.sleep(RECHECK * 2)
    assert [e["event"] for e in reader.events] == ["thread.created", "problem"]


def test_a_stream_of_a_token_that_stays_valid_stays_open(rechecking: Api) -> None:
    api = rechecking
    thread_id = new_thread(api.client("alpha-editor"))
    reader = Reader(f"{api.url}/api/v1/threads/{thread_id}/events/stream", api.tokens["alpha-viewer"], timeout=3)
    assert not reader.wait_ended(RECHECK * 5)  # several re-checks passed
    assert reader.wait_ended(10) and reader.error is None
    assert [e["event"] for e in reader.events] == ["thread.created"]


def test_sigterm_closes_open_streams_drains_the_worker_and_exits_0(tmp_path: Path) -> None:
    """`jixu serve --help`: "SIGTERM or SIGINT: stop accepting requests, drain the worker, exit 0" — also with
    a client in the middle of a one-hour event stream."""
    with served(tmp_path) as server:
        thread_id = server.client.post("/threads", json={"project": "demo"}).json()["thread_id"]
        reader = Reader(f"{server.url}/threads/{thread_id}/events/stream", server.token, timeout=3600)
        assert reader.status == 200
        time.sleep(0.5)  # the stream is open and polling
        stopped_at = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        try:
            code = server.process.wait(20)
        except subprocess.TimeoutExpired:
            raise AssertionError("jixu serve did not exit within 20 s of SIGTERM with a stream open:\n"
                                 + server.output()) from None
        took = time.monotonic() - stopped_at
        output = server.output()
    assert code == 0, output
    assert took < 10, f"{took:.1f}s to exit\n{output}"
    assert reader.wait_ended(5) and reader.error is None, reader.error  # the stream ended cleanly
    assert [e["event"] for e in reader.events] == ["thread.created"]
    assert "stopped (the server is shutting down)" in output, output  # the worker was drained


def test_the_client_reads_streamed_events_whole_and_raises_the_closing_problem(rechecking: Api) -> None:
    from jixu.server.client import Client, RemoteError

    api = rechecking
    editor = api.client("alpha-editor")
    thread_id = new_thread(editor)
    text = "one\u2028two\u2029three\u0085four \u4f60\u597d"  # line separators to str.splitlines, text to SSE
    assert editor.post(f"/threads/{thread_id}/inputs", json={"input": text}).status_code in (200, 201, 202)
    with Client(api.url, api.tokens["alpha-viewer"]) as client:
        seen = list(client.stream_events(thread_id, timeout=2))
    assert seen and seen[0]["type"] == "thread.created"
    assert [event["seq"] for event in seen] == list(range(1, len(seen) + 1))
    assert any(text in json.dumps(event["data"], ensure_ascii=False) for event in seen), "the input came whole"

    info, secret = create_token(api.store, "leaving", roles={"alpha": "viewer"}, actor="test")
    with Client(api.url, secret) as client:
        events = client.stream_events(thread_id, timeout=60)
        assert next(events)["type"] == "thread.created"
        assert api.client("admin").post(f"/tokens/{info.token_id}/revoke", json={"reason": "left"}).status_code == 200
        with pytest.raises(RemoteError) as raised:
            for _event in events:
                pass
    assert (raised.value.code, raised.value.status) == ("unauthorized", 401)
