"""Publication providers: push a run's verified source to its authorized origin, open a pull request.

A publisher does I/O and decides nothing about durability: the execution
request machinery (:mod:`jixu.runs.requests`) records the publication intent
and its dispatch marker before :meth:`Publisher.publish`, and the evidence it
returns as the receipt after. Three calls, three different promises:

* :meth:`Publisher.preflight` changes nothing. Raising
  :class:`PublicationRejected` there is a *rejection retained before dispatch*:
  the request is settled as failed and may be retried explicitly.
* :meth:`Publisher.publish` is the effect. Whatever it raises, the outcome is
  unknown (a push or a pull request may exist although an error came back).
* :meth:`Publisher.inspect` is read-only: what the provider shows now for the
  recorded branch and pull request. Operators use it to find evidence; it never
  settles anything by itself (the remote branch is mutable state).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from jixu.errors import GitError, InvalidInput, JixuError
from jixu.ledger.encoding import JSONObject
from jixu.runs.workspace import push, remote_branch

HTTP_TIMEOUT_S = 30.0


class RemoteRejected(JixuError):
    """A remote provider refused in its preflight, before anything was sent (the request fails; nothing
    happened remotely)."""

    code = "remote_rejected"


class PublicationRejected(RemoteRejected):
    """A publisher refused before anything was sent (the request fails; nothing happened remotely)."""

    code = "publication_rejected"


@dataclass(frozen=True, slots=True)
class PublicationContext:
    """What a publication is about, as recorded in its intent."""

    run_id: str
    request_id: str
    workspace: Path
    origin: str
    branch: str
    base_branch: str
    commit: str
    """The commit to publish: the verified tree on the source commit (see :func:`~jixu.runs.workspace.commit_tree`)."""
    tree: str
    title: str
    body: str


class Publisher(Protocol):
    """The interface of every publication provider."""

    @property
    def name(self) -> str:
        """The configured publisher's name (``git``, ``github``, …)."""
        ...

    @property
    def kind(self) -> str:
        """``git`` or ``pull_request``."""
        ...

    def settings(self) -> JSONObject:
        """The configuration without secrets (recorded in the request)."""
        ...

    async def preflight(self, context: PublicationContext) -> None:
        """Check that publishing can be attempted; :class:`PublicationRejected` if not. Changes nothing."""
        ...

    async def publish(self, context: PublicationContext) -> JSONObject:
        """Publish; the evidence observed (``branch``, ``pushed_commit``, ``tree``, and ``pr_number``/``pr_url``)."""
        ...

    async def inspect(self, context: PublicationContext) -> JSONObject:
        """What the provider shows now for the recorded branch (and pull request); read-only."""
        ...


def _git_preflight(context: PublicationContext) -> None:
    try:
        current = remote_branch(context.origin, context.branch)
    except GitError as error:
        raise PublicationRejected(f"the origin {context.origin} cannot be read: {error.message}",
                                  origin=context.origin) from error
    if current is not None and current != context.commit:
        raise PublicationRejected(f"branch {context.branch} already exists on the origin at {current[:12]}, not at "
                                  f"the commit to publish {context.commit[:12]}; refusing to overwrite it",
                                  branch=context.branch, remote_commit=current)


def _git_publish(context: PublicationContext) -> JSONObject:
    push(context.workspace, context.origin, context.commit, context.branch)
    return {"branch": context.branch, "pushed_commit": remote_branch(context.origin, context.branch),
            "commit": context.commit, "tree": context.tree}


def _git_inspect(context: PublicationContext) -> JSONObject:
    try:
        return {"branch": context.branch, "remote_commit": remote_branch(context.origin, context.branch),
                "reachable": True}
    except GitError as error:
        return {"branch": context.branch, "remote_commit": None, "reachable": False, "error": error.message}


class GitPublisher:
    """Push the run's commit to ``refs/heads/<branch>`` on its authorized origin (never forced)."""

    kind = "git"

    def __init__(self, name: str = "git") -> None:
        self._name = name

    @property
    def name(self) -> str:
        """The configured name."""
        return self._name

    def settings(self) -> JSONObject:
        """No settings: the origin is the project's authorized one."""
        return {}

    async def preflight(self, context: PublicationContext) -> None:
        """The origin is readable and the branch is absent or already at our commit."""
        await asyncio.to_thread(_git_preflight, context)

    async def publish(self, context: PublicationContext) -> JSONObject:
        """``git push ORIGIN COMMIT:refs/heads/BRANCH``; the branch as the origin reports it afterwards."""
        return await asyncio.to_thread(_git_publish, context)

    async def inspect(self, context: PublicationContext) -> JSONObject:
        """The branch's commit on the origin now."""
        return await asyncio.to_thread(_git_inspect, context)


class PullRequestPublisher:
    """Push the branch, then open a pull request through a GitHub-compatible REST API (``httpx``).

    ``api_url`` is the API root (``https://api.github.com`` or a GitHub
    Enterprise / compatible server), ``repository`` is ``owner/name``. The
    token is a secret: it is sent as a bearer token and never recorded.
    """

    kind = "pull_request"

    def __init__(self, api_url: str, repository: str, token: str | None = None, *, name: str = "pull_request",
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        owner, slash, repo = repository.partition("/")
        if not (owner and slash and repo) or "/" in repo:
            raise InvalidInput(f"repository {repository!r} must be owner/name", field="repository")
        self._name = name
        self.api_url = api_url.rstrip("/")
        self.repository = repository
        self.owner = owner
        self._token = token
        self._transport = transport

    @property
    def name(self) -> str:
        """The configured name."""
        return self._name

    def settings(self) -> JSONObject:
        """API root and repository (the token is never recorded)."""
        return {"api_url": self.api_url, "repository": self.repository}

    def _client(self) -> httpx.AsyncClient:
        headers = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28",
                   "User-Agent": "jixu"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        return httpx.AsyncClient(base_url=self.api_url, headers=headers, timeout=HTTP_TIMEOUT_S,
                                 transport=self._transport)

    async def preflight(self, context: PublicationContext) -> None:
        """The repository exists, the token may push to it, and the git preflight holds."""
        async with self._client() as client:
            try:
                response = await client.get(f"/repos/{self.repository}")
            except httpx.HTTPError as error:
                raise PublicationRejected(f"the pull-request API {self.api_url} cannot be reached: {error}") from error
        if response.status_code != 200:
            raise PublicationRejected(f"GET /repos/{self.repository} answered {response.status_code}: "
                                      f"{response.text[:300]}", status=response.status_code)
        permissions = _json(response).get("permissions")
        if isinstance(permissions, dict) and permissions.get("push") is False:
            raise PublicationRejected(f"the token may not push to {self.repository}")
        await asyncio.to_thread(_git_preflight, context)

    async def publish(self, context: PublicationContext) -> JSONObject:
        """Push the branch, then ``POST /repos/{repository}/pulls``; number and URL of the pull request."""
        evidence = await asyncio.to_thread(_git_publish, context)
        async with self._client() as client:
            response = await client.post(f"/repos/{self.repository}/pulls", json={
                "title": context.title, "head": context.branch, "base": context.base_branch, "body": context.body})
        if response.status_code != 201:
            raise JixuError(f"POST /repos/{self.repository}/pulls answered {response.status_code}: "
                            f"{response.text[:300]}", status=response.status_code)
        created = _json(response)
        return {**evidence, "pr_number": created.get("number"), "pr_url": created.get("html_url")}

    async def inspect(self, context: PublicationContext) -> JSONObject:
        """The branch on the origin and the pull requests whose head is the branch (any state)."""
        found = await asyncio.to_thread(_git_inspect, context)
        async with self._client() as client:
            try:
                response = await client.get(f"/repos/{self.repository}/pulls",
                                            params={"head": f"{self.owner}:{context.branch}", "state": "all"})
            except httpx.HTTPError as error:
                return {**found, "pull_requests": None, "api_error": str(error)}
        if response.status_code != 200:
            return {**found, "pull_requests": None, "api_error": f"status {response.status_code}"}
        listing = response.json()
        pulls = [{"number": p.get("number"), "url": p.get("html_url"), "state": p.get("state"),
                  "head_sha": (p.get("head") or {}).get("sha"), "head_ref": (p.get("head") or {}).get("ref")}
                 for p in listing if isinstance(p, dict)] if isinstance(listing, list) else []
        return {**found, "pull_requests": pulls}


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        value = response.json()
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


__all__ = ["GitPublisher", "PublicationContext", "PublicationRejected", "Publisher", "PullRequestPublisher",
           "RemoteRejected"]
