"""An HTTP client of the jixu API (httpx), as the CLI's remote mode uses it.

Every mutation carries an ``Idempotency-Key`` (a fresh random one unless the
caller gives its own), so the client can safely repeat a request whose answer
was lost to a connection error: the server answers the repeat with the
original response. Problems come back as :class:`RemoteError`, whose ``code``
is the server's stable error code (the CLI maps it to the same exit status as
a local error).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from types import TracebackType
from typing import Any, NoReturn, Self
from urllib.parse import urlsplit

import httpx

from jixu.errors import InvalidInput, JixuError, StoreError
from jixu.server.problems import code_of_type
from jixu.threads.http import EventStream

API_PREFIX = "/api/v1"
SERVER_ENV = "JIXU_SERVER"
TOKEN_ENV = "JIXU_TOKEN"


class RemoteError(JixuError):
    """A problem answered by the server: ``code`` is its stable error code, ``status`` the HTTP status."""

    def __init__(self, code: str, message: str, status: int, **details: Any) -> None:
        super().__init__(message, status=status, **details)
        self.code = code
        self.status = status


class Client:
    """The jixu HTTP API at ``server`` (e.g. ``http://127.0.0.1:8420``) with bearer ``token``."""

    def __init__(self, server: str, token: str | None, *, timeout: float = 60.0, retries: int = 2,
                 transport: httpx.BaseTransport | None = None) -> None:
        found = urlsplit(server) if isinstance(server, str) else None
        if found is None or found.scheme not in ("http", "https") or not found.hostname:
            raise InvalidInput(f"server {server!r} is not an http:// or https:// URL (e.g. http://127.0.0.1:8420)",
                               field="server")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.server = server.rstrip("/")
        self.retries = retries
        self._http = httpx.Client(base_url=self.server + API_PREFIX, headers=headers, timeout=timeout,
                                  transport=transport)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # --- plumbing --------------------------------------------------------------------------------

    def request(self, method: str, path: str, *, json_body: Any = None, params: dict[str, Any] | None = None,
                request_id: str | None = None) -> Any:
        """Send one request (mutations with an ``Idempotency-Key``, repeated on connection errors); the JSON."""
        headers: dict[str, str] = {}
        if method != "GET":
            headers["Idempotency-Key"] = request_id or secrets.token_hex(16)
        query = {k: v for k, v in (params or {}).items() if v is not None}
        for attempt in range(self.retries + 1):
            try:
                response = self._http.request(method, path, json=json_body, params=query, headers=headers)
                break
            except httpx.TransportError as error:
                # A repeat is safe: GETs change nothing, and mutations carry the same request id.
                if attempt == self.retries:
                    raise StoreError(f"cannot reach the jixu server at {self.server}: {error}",
                                     server=self.server) from error
        return self._answer(response)

    @classmethod
    def _answer(cls, response: httpx.Response) -> Any:
        if response.status_code < 400:
            return response.json()
        try:
            problem = response.json()
        except ValueError:
            problem = {}
        if not isinstance(problem, dict):
            problem = {}
        cls._raise_problem(problem, response.status_code, response.reason_phrase or "request failed")

    @staticmethod
    def _raise_problem(problem: dict[str, Any], status: int, fallback: str) -> NoReturn:
        """Raise the :class:`RemoteError` of a problem document answered with ``status``."""
        code = code_of_type(str(problem.get("type") or problem.get("code") or f"http_{status}"))
        detail = str(problem.get("detail") or fallback)
        extra = {k: v for k, v in problem.items() if k not in ("type", "title", "status", "detail", "code")}
        raise RemoteError(code, detail, status, **extra)

    # --- meta ------------------------------------------------------------------------------------

    def whoami(self) -> Any:
        """The caller's token, kind, roles and actor."""
        return self.request("GET", "/whoami")

    # --- threads ---------------------------------------------------------------------------------

    def create_thread(self, project: str, metadata: dict[str, Any] | None = None, *,
                      request_id: str | None = None) -> Any:
        """Create a thread in ``project``."""
        body: dict[str, Any] = {"project": project}
        if metadata is not None:
            body["metadata"] = metadata
        return self.request("POST", "/threads", json_body=body, request_id=request_id)

    def list_threads(self, project: str | None = None, *, after: str | None = None, limit: int = 100) -> Any:
        """A page of the threads the caller may see."""
        return self.request("GET", "/threads", params={"project": project, "after": after, "limit": limit})

    def send(self, thread_id: str, text: str, *, request_id: str | None = None) -> Any:
        """Queue a turn with input ``text``."""
        return self.request("POST", f"/threads/{thread_id}/inputs", json_body={"input": text},
                            request_id=request_id)

    def thread(self, thread_id: str) -> Any:
        """A thread's state."""
        return self.request("GET", f"/threads/{thread_id}")

    def events(self, thread_id: str, *, after_seq: int = 0, limit: int = 1000) -> Any:
        """A page of a thread's events."""
        return self.request("GET", f"/threads/{thread_id}/events", params={"after_seq": after_seq, "limit": limit})

    def stream_events(self, thread_id: str, *, after_seq: int = 0, timeout: float = 3600) -> Iterator[dict[str, Any]]:
        """A thread's events as they are appended (server-sent events), from ``after_seq``."""
        params = {"after_seq": after_seq, "timeout": timeout}
        with self._http.stream("GET", f"/threads/{thread_id}/events/stream", params=params,
                               timeout=httpx.Timeout(timeout + 30)) as response:
            if response.status_code >= 400:
                response.read()
                self._answer(response)
            events = EventStream()
            for chunk in response.iter_bytes():
                for kind, data in events.feed(chunk):
                    yield self._streamed(kind, data, response.status_code)
            for kind, data in events.end():
                yield self._streamed(kind, data, response.status_code)

    @classmethod
    def _streamed(cls, kind: str, data: str, status: int) -> dict[str, Any]:
        """A streamed event's envelope; a ``problem`` event (the stream's last, when the caller may no longer
        read the thread) raised as the :class:`RemoteError` it names."""
        body = json.loads(data)
        if kind == "problem":
            problem = body if isinstance(body, dict) else {}
            named = problem.get("status")
            cls._raise_problem(problem, named if isinstance(named, int) else status, "the stream ended with a problem")
        if not isinstance(body, dict):
            raise RemoteError("invalid_response", f"a streamed event is not an object: {data[:200]!r}", status)
        return body

    def verify_thread(self, thread_id: str) -> Any:
        """Verify a thread's chain and effects."""
        return self.request("GET", f"/threads/{thread_id}/verify")

    def replay(self, thread_id: str, upto: str | None = None) -> Any:
        """A thread's state rebuilt from its events (up to ``upto``)."""
        return self.request("GET", f"/threads/{thread_id}/replay", params={"upto": upto})

    def fork(self, thread_id: str, at: str, text: str | None = None, *, request_id: str | None = None) -> Any:
        """Fork a thread at event ``at`` (optionally starting the child's first turn)."""
        body: dict[str, Any] = {"at": at}
        if text is not None:
            body["input"] = text
        return self.request("POST", f"/threads/{thread_id}/fork", json_body=body, request_id=request_id)

    def resolve(self, thread_id: str, effect_id: str, resolution: str, note: str, *,
                resolution_id: str | None = None, evidence: dict[str, Any] | None = None,
                request_id: str | None = None) -> Any:
        """Resolve an unknown effect."""
        body: dict[str, Any] = {"resolution": resolution, "note": note}
        if resolution_id is not None:
            body["resolution_id"] = resolution_id
        if evidence is not None:
            body["evidence"] = evidence
        return self.request("POST", f"/threads/{thread_id}/effects/{effect_id}/resolve", json_body=body,
                            request_id=request_id)

    def decide(self, thread_id: str, effect_id: str, decision: str, note: str | None = None, *,
               request_id: str | None = None) -> Any:
        """``approve`` or ``deny`` a parked call."""
        body = {"note": note} if note is not None else {}
        return self.request("POST", f"/threads/{thread_id}/effects/{effect_id}/{decision}", json_body=body,
                            request_id=request_id)

    def recover_turn(self, thread_id: str, turn_id: str, *, request_id: str, expected_epoch: int,
                     legacy_confirmed_stopped: bool = False, note: str | None = None) -> Any:
        """Recover an expired turn (``request_id`` is also the recovery's own id; ``note``: why, recorded)."""
        body: dict[str, Any] = {"request_id": request_id, "expected_epoch": expected_epoch,
                                "legacy_confirmed_stopped": legacy_confirmed_stopped}
        if note is not None:
            body["note"] = note
        return self.request("POST", f"/threads/{thread_id}/turns/{turn_id}/recover", json_body=body,
                            request_id=request_id)

    def resume_thread(self, thread_id: str, note: str | None = None) -> Any:
        """Resume a paused turn."""
        return self.request("POST", f"/threads/{thread_id}/resume", json_body={"note": note} if note else {})

    # --- runs ------------------------------------------------------------------------------------

    def create_run(self, project: str, brief: str, provider: str, *, commit: str | None = None,
                   request_id: str | None = None) -> Any:
        """Create (and queue) a run."""
        body: dict[str, Any] = {"project": project, "brief": brief, "provider": provider}
        if commit is not None:
            body["commit"] = commit
        return self.request("POST", "/runs", json_body=body, request_id=request_id)

    def list_runs(self, project: str | None = None, status: str | None = None) -> Any:
        """Runs the caller may see."""
        return self.request("GET", "/runs", params={"project": project, "status": status})

    def run(self, run_id: str) -> Any:
        """A run's state."""
        return self.request("GET", f"/runs/{run_id}")

    def plan(self, run_id: str) -> Any:
        """A run's plan."""
        return self.request("GET", f"/runs/{run_id}/plan")

    def journal(self, run_id: str) -> Any:
        """A run's journal entries and validity."""
        return self.request("GET", f"/runs/{run_id}/journal")

    def run_operation(self, run_id: str, operation: str, body: dict[str, Any] | None = None, *,
                      request_id: str | None = None) -> Any:
        """``resume``, ``handoff``, ``retry`` or ``cancel`` a run."""
        return self.request("POST", f"/runs/{run_id}/{operation}", json_body=body or {}, request_id=request_id)

    def execution_requests(self, run_id: str) -> Any:
        """A run's execution requests."""
        return self.request("GET", f"/runs/{run_id}/execution-requests")

    def reconcile_execution_request(self, run_id: str, request_id: str, reconciliation_id: str) -> Any:
        """Reconcile an execution request from retained evidence (409 problem without proof)."""
        return self.request("POST", f"/runs/{run_id}/execution-requests/{request_id}/reconcile",
                            json_body={"reconciliation_id": reconciliation_id}, request_id=reconciliation_id)

    def publish(self, run_id: str, *, publisher: str = "git", branch: str | None = None,
                title: str | None = None, request_id: str | None = None) -> Any:
        """Admit a publication of a succeeded run (queued for workers)."""
        body = {"publisher": publisher, **({"branch": branch} if branch else {}), **({"title": title} if title else {})}
        return self.request("POST", f"/runs/{run_id}/publications", json_body=body, request_id=request_id)

    def remote_task(self, run_id: str, kind: str, provider: str, parameters: dict[str, Any],
                    request_id: str | None = None) -> Any:
        """Admit a deploy, rollback or knowledge write of a succeeded run (queued for workers)."""
        return self.request("POST", f"/runs/{run_id}/remote-tasks", request_id=request_id,
                            json_body={"kind": kind, "provider": provider, "parameters": parameters})

    def inspect_remote(self, run_id: str, request_id: str) -> Any:
        """Ask the request's provider, read-only, what it shows; the finding is retained."""
        return self.request("POST", f"/runs/{run_id}/execution-requests/{request_id}/inspect", json_body={})

    def resolve_request(self, run_id: str, request_id: str, resolution: str, note: str,
                        resolution_id: str | None = None) -> Any:
        """An operator's resolution of an unknown request (after an inspection)."""
        body = {"resolution": resolution, "note": note, **({"resolution_id": resolution_id} if resolution_id else {})}
        return self.request("POST", f"/runs/{run_id}/execution-requests/{request_id}/resolve", json_body=body,
                            request_id=resolution_id)

    def resolve_task(self, run_id: str, effect_id: str, resolution: str, note: str,
                     resolution_id: str | None = None) -> Any:
        """An operator's decision about a run task stuck unknown."""
        body = {"resolution": resolution, "note": note, **({"resolution_id": resolution_id} if resolution_id else {})}
        return self.request("POST", f"/runs/{run_id}/tasks/{effect_id}/resolve", json_body=body,
                            request_id=resolution_id)

    # --- projects and tokens ---------------------------------------------------------------------

    def list_projects(self) -> Any:
        """Projects the caller has a role in."""
        return self.request("GET", "/projects")

    def project(self, name: str) -> Any:
        """A registered project."""
        return self.request("GET", f"/projects/{name}")

    def create_token(self, name: str, *, roles: dict[str, str] | None = None, admin: bool = False,
                     expires_in: int | None = None) -> Any:
        """Create a token (admin), expiring after ``expires_in`` seconds if given; the answer holds its secret."""
        return self.request("POST", "/tokens", json_body={"name": name, "roles": roles or {}, "admin": admin,
                                                          "expires_in": expires_in})

    def rotate_token(self, token_id: str, grace_seconds: int = 0) -> Any:
        """Give a token a new secret (admin); the answer holds it."""
        return self.request("POST", f"/tokens/{token_id}/rotate", json_body={"grace_seconds": grace_seconds})

    def list_tokens(self) -> Any:
        """Every token (admin)."""
        return self.request("GET", "/tokens")

    def revoke_token(self, token_id: str, reason: str | None = None) -> Any:
        """Revoke a token (admin)."""
        return self.request("POST", f"/tokens/{token_id}/revoke", json_body={"reason": reason})


__all__ = ["API_PREFIX", "SERVER_ENV", "TOKEN_ENV", "Client", "RemoteError"]
