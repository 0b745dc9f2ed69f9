"""A real ``jixu serve`` process for the tests that need one (its signals, its worker processes, its sockets)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.helpers import PROC_CHILDREN, ROOT, children_of, process_exited, python_env
from tests.runs.conftest import wait_until
from tests.server.test_cli_remote import free_port, jixu


@dataclass
class Served:
    process: subprocess.Popen[str]
    client: httpx.Client
    """An editor of project ``demo``."""
    token: str
    url: str
    log_path: Path
    store_path: Path

    def output(self) -> str:
        return self.log_path.read_text()

    def children(self) -> list[int]:
        return children_of(self.process.pid) if PROC_CHILDREN else []


@contextmanager
def served(tmp_path: Path, *options: str) -> Iterator[Served]:
    """A real `jixu serve` of the API tests' agent with ``options``, and an editor's client of project demo."""
    store_path = tmp_path / "served.db"
    store = f"sqlite:///{store_path}"
    made = jixu("tokens", "create", "--store", store, "--project", "demo", "--role", "editor", "--json")
    assert made.returncode == 0, made.stderr
    token = json.loads(made.stdout)["secret"]
    port = free_port()
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log:
        process = subprocess.Popen([sys.executable, "-m", "jixu", "serve", "--store", store, "--port", str(port),
                                    "--agent", "tests.server.agents:agent", "--workspace-root", str(tmp_path / "ws"),
                                    *options], cwd=ROOT, env=python_env(), stdout=log, stderr=subprocess.STDOUT,
                                   text=True)
        url = f"http://127.0.0.1:{port}/api/v1"
        client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        server = Served(process, client, token, url, log_path, store_path)
        children: list[int] = []
        try:
            def up() -> bool:
                assert process.poll() is None, server.output()
                try:
                    return httpx.get(f"{url}/health").status_code == 200
                except httpx.TransportError:
                    return False

            wait_until(up, "jixu serve to answer", interval=0.1)
            children = server.children()
            yield server
        finally:
            client.close()
            if process.poll() is None:
                process.kill()
                process.wait(10)
            for child in children:  # a test that failed must not leave workers behind either
                if not process_exited(child):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child, signal.SIGKILL)


__all__ = ["Served", "served"]
