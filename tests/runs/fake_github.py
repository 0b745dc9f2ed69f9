"""A local fake of the GitHub REST API's repository and pull-request endpoints, and a push-counting origin.

The fake speaks the real shapes (``GET /repos/{owner}/{repo}``, ``POST /repos/{owner}/{repo}/pulls`` -> 201 with
``number``/``html_url``/``head``/``base``, ``GET .../pulls?head=owner:branch&state=all``, 401 ``Bad
credentials``, 422 ``Validation Failed`` when the head branch is not on the origin). It runs in a thread of
the test process on 127.0.0.1 and counts every pull-request creation it was asked for.
"""

from __future__ import annotations

import json
import stat
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

TOKEN = "ghp_test_token"
HOOK = """#!/bin/sh
# Count every push the origin receives (one line per ref update), before accepting it.
while read old new ref; do echo "$ref $new" >> "{log}"; done
exit 0
"""


def count_pushes(origin: Path) -> Path:
    """Install a pre-receive hook logging each ref update pushed to the bare ``origin``; the log's path."""
    log = origin / "pushes.log"
    hook = origin / "hooks" / "pre-receive"
    hook.write_text(HOOK.format(log=log))
    hook.chmod(hook.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return log


def pushes(log: Path) -> list[str]:
    """The ref updates the origin received so far."""
    return log.read_text().splitlines() if log.exists() else []


class FakeGitHub:
    """``repository`` (owner/name) backed by the bare ``origin``; start with :meth:`start`, stop with :meth:`stop`."""

    def __init__(self, repository: str, origin: Path, *, can_push: bool = True) -> None:
        self.repository = repository
        self.origin = origin
        self.can_push = can_push
        self.fail_creations = False
        """When set, POST .../pulls answers 500 after counting the request (a failure after dispatch)."""
        self.pulls: list[dict[str, Any]] = []
        self.creation_requests = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeGitHub:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self._send(401, {"message": "Bad credentials",
                                     "documentation_url": "https://docs.github.com/rest"})
                    return False
                return True

            def do_GET(self) -> None:
                if not self._authorized():
                    return
                url = urlparse(self.path)
                if url.path == f"/repos/{fake.repository}":
                    self._send(200, {"id": 1, "full_name": fake.repository, "default_branch": "main",
                                     "permissions": {"admin": False, "push": fake.can_push, "pull": True}})
                elif url.path == f"/repos/{fake.repository}/pulls":
                    head = parse_qs(url.query).get("head", [""])[0]
                    with fake._lock:
                        found = [p for p in fake.pulls if not head or f"{fake.owner}:{p['head']['ref']}" == head]
                    self._send(200, found)
                else:
                    self._send(404, {"message": "Not Found"})

            def do_POST(self) -> None:
                if not self._authorized():
                    return
                if urlparse(self.path).path != f"/repos/{fake.repository}/pulls":
                    self._send(404, {"message": "Not Found"})
                    return
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                with fake._lock:
                    fake.creation_requests += 1
                    if fake.fail_creations:
                        self._send(500, {"message": "Server Error"})
                        return
                    head, base = body.get("head"), body.get("base")
                    sha = fake.branch(str(head))
                    if not body.get("title") or sha is None or not base:
                        self._send(422, {"message": "Validation Failed",
                                         "errors": [{"resource": "PullRequest", "field": "head",
                                                     "code": "invalid"}]})
                        return
                    number = len(fake.pulls) + 1
                    pull = {"number": number, "state": "open", "title": body["title"], "body": body.get("body"),
                            "html_url": f"https://github.example/{fake.repository}/pull/{number}",
                            "url": f"{fake.url}/repos/{fake.repository}/pulls/{number}",
                            "head": {"ref": head, "sha": sha}, "base": {"ref": base}}
                    fake.pulls.append(pull)
                self._send(201, pull)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    @property
    def owner(self) -> str:
        return self.repository.split("/")[0]

    def branch(self, name: str) -> str | None:
        """The commit ``name`` names on the origin, read with git."""
        listing = subprocess.run(["git", "ls-remote", "--heads", str(self.origin), f"refs/heads/{name}"],
                                 capture_output=True, text=True, check=True).stdout
        return listing.split()[0] if listing.strip() else None

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
