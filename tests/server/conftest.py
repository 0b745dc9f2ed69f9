"""A real uvicorn server on 127.0.0.1 (random port, background thread) over a real store, and its tokens.

``api`` serves a SQLite ledger file; ``any_api`` runs the test once on SQLite
and once on PostgreSQL. Both run the in-process worker with the test agent
(:mod:`tests.server.agents`), so inputs sent over HTTP are executed.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from jixu.ledger import SQLiteStore, Store
from jixu.scheduling import WorkerConfig
from jixu.server import create_app, create_token
from jixu.server.background import BackgroundWorker
from tests.conftest import PostgresSchema
from tests.server.agents import agent

WAIT = 20.0


class LiveServer:
    """uvicorn serving ``app`` on a random port of 127.0.0.1 in a daemon thread."""

    def __init__(self, app: Any) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2, lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + WAIT
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise AssertionError("the test server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(WAIT)
        self.sock.close()


@dataclass
class Api:
    """A live server and bearer tokens: ``admin``, and per project ``alpha`` / ``beta`` one per role."""

    url: str
    store: Store
    tokens: dict[str, str] = field(default_factory=dict)
    token_ids: dict[str, str] = field(default_factory=dict)
    _clients: list[httpx.Client] = field(default_factory=list)

    def client(self, who: str | None = "alpha-operator") -> httpx.Client:
        """An httpx client with ``who``'s token (None: no Authorization header)."""
        headers = {"Authorization": f"Bearer {self.tokens[who]}"} if who else {}
        made = httpx.Client(base_url=f"{self.url}/api/v1", headers=headers, timeout=WAIT)
        self._clients.append(made)
        return made

    def close(self) -> None:
        for made in self._clients:
            made.close()


ROLE_TOKENS = {
    "alpha-viewer": {"alpha": "viewer"},
    "alpha-editor": {"alpha": "editor"},
    "alpha-operator": {"alpha": "operator"},
    "beta-operator": {"beta": "operator"},
}


def start_api(store: Store, tmp_path: Path, providers: dict[str, Any] | None = None, *, poll_interval: float = 0.02,
              **options: Any) -> tuple[Api, LiveServer]:
    """Tokens in ``store``, then a live server over it with the in-process worker (runs too, given providers),
    which looks at the queue every ``poll_interval`` seconds when it is not nudged."""
    api = Api("", store)
    info, secret = create_token(store, "root", admin=True, actor="test")
    api.tokens["admin"], api.token_ids["admin"] = secret, info.token_id
    for name, roles in ROLE_TOKENS.items():
        info, secret = create_token(store, name, roles=roles, actor="test")
        api.tokens[name], api.token_ids[name] = secret, info.token_id
    workspaces = tmp_path / "workspaces"
    config = WorkerConfig(store_url=store.url or "memory://", agent="tests.server.agents:agent", owner="api-worker",
                          poll_interval=poll_interval, quiet=True, drain_timeout=2,
                          providers="test-providers" if providers is not None else None, workspace_root=str(workspaces))
    worker = BackgroundWorker(store, config, agent=agent(), providers=providers)
    app = create_app(store, agent=agent(), providers=providers, workspace_root=workspaces, stream_poll_interval=0.02,
                     lifespan=[worker.lifespan], **options)
    server = LiveServer(app)
    server.start()
    api.url = server.url
    return api, server


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    """A live server over a fresh SQLite ledger file."""
    store = SQLiteStore(tmp_path / "api.db")
    made, server = start_api(store, tmp_path)
    try:
        yield made
    finally:
        made.close()
        server.stop()
        store.close()


@pytest.fixture(params=["sqlite", "postgres"])
def any_api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Api]:
    """A live server over SQLite, then over PostgreSQL (a fresh schema)."""
    schema: PostgresSchema | None = None
    if request.param == "postgres":
        from jixu.ledger import PostgresStore

        schema = PostgresSchema(request.getfixturevalue("postgres_dsn"))
        store: Store = PostgresStore(schema.url, max_size=8)
    else:
        store = SQLiteStore(tmp_path / "api.db")
    made, server = start_api(store, tmp_path)
    try:
        yield made
    finally:
        made.close()
        server.stop()
        store.close()
        if schema is not None:
            schema.drop()


def wait_for(check: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
