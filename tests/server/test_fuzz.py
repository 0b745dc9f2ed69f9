"""Property-based fuzzing of every documented operation with schemathesis, against a real server.

Requests are generated from the published ``/openapi.json``; every answer must
be no 5xx, have a documented status and content type, and match its schema.
Bounded: a few examples per operation (about 20 s in all). The live event
stream is excluded (it is endless by design) and tested in test_threads_api.
Random ids mostly meet 404s, so the bodies of real resources (a thread that
ran a turn, its fork, tokens, projects) are checked as well, with the same
checks, in ``test_real_resources_answer_within_their_schemas``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from jixu.ledger import MemoryStore, SQLiteStore
from jixu.server import create_app
from tests.server.conftest import Api, start_api

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    tmp_path: Path = tmp_path_factory.mktemp("fuzz")
    store = SQLiteStore(tmp_path / "fuzz.db")
    api, server = start_api(store, tmp_path)
    editor = api.client("admin")
    thread_id = editor.post("/threads", json={"project": "alpha"}).json()["thread_id"]
    editor.post(f"/threads/{thread_id}/inputs", json={"input": "hello"})
    api.token_ids["thread"] = thread_id
    try:
        yield api
    finally:
        api.close()
        server.stop()
        store.close()


# The document the app publishes, built at collection time (parametrizing needs it before any server runs);
# test_the_fuzzed_document_is_the_published_one proves the live server serves exactly this.
DOCUMENT = create_app(MemoryStore()).openapi()
schema = schemathesis.openapi.from_dict(DOCUMENT).exclude(path_regex=r"/events/stream$")


def test_the_fuzzed_document_is_the_published_one(fuzzed: Api) -> None:
    published = httpx.get(f"{fuzzed.url}/openapi.json").json()
    assert published == DOCUMENT
    assert len(published["paths"]) >= 20


@schema.parametrize()
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_operation_answers_5xx_or_off_schema(case: Any, fuzzed: Api) -> None:
    case.call_and_validate(base_url=fuzzed.url, headers={"Authorization": f"Bearer {fuzzed.tokens['admin']}"},
                           checks=CHECKS)


def test_real_resources_answer_within_their_schemas(fuzzed: Api) -> None:
    admin = httpx.Client(base_url=f"{fuzzed.url}/api/v1", headers={"Authorization": f"Bearer {fuzzed.tokens['admin']}"})
    thread_id = fuzzed.token_ids["thread"]
    deadline = time.monotonic() + 20
    while admin.get(f"/threads/{thread_id}").json()["status"] not in ("idle", "waiting"):
        assert time.monotonic() < deadline, "the thread's turn did not finish"
        time.sleep(0.05)
    first = admin.get(f"/threads/{thread_id}/events").json()["events"][0]["id"]
    viewer_id = fuzzed.token_ids["alpha-viewer"]
    cases = [
        ("/whoami", "GET", {}, {}, None), ("/health", "GET", {}, {}, None), ("/threads", "GET", {}, {}, None),
        ("/threads", "GET", {}, {"project": "alpha", "limit": 1}, None),
        ("/threads/{thread_id}", "GET", {"thread_id": thread_id}, {}, None),
        ("/threads/{thread_id}/events", "GET", {"thread_id": thread_id}, {"limit": 3}, None),
        ("/threads/{thread_id}/verify", "GET", {"thread_id": thread_id}, {}, None),
        ("/threads/{thread_id}/replay", "GET", {"thread_id": thread_id}, {"upto": "2"}, None),
        ("/threads/{thread_id}/fork", "POST", {"thread_id": thread_id}, {}, {"at": first}),
        ("/threads", "POST", {}, {}, {"project": "beta", "metadata": {"k": [1, {"n": None}]}}),
        ("/tokens", "GET", {}, {}, None), ("/tokens/{token_id}", "GET", {"token_id": viewer_id}, {}, None),
        ("/tokens", "POST", {}, {}, {"name": "made", "roles": {"alpha": "viewer"}, "expires_in": 3600}),
        ("/tokens/{token_id}/rotate", "POST", {"token_id": viewer_id}, {}, {"grace_seconds": 60}),
        ("/projects", "GET", {}, {}, None), ("/runs", "GET", {}, {}, None),
    ]
    for path, method, params, query, body in cases:
        operation = schema[f"/api/v1{path}"][method]
        case = operation.Case(path_parameters=params, query=query, **({"body": body} if body is not None else {}))
        response = case.call_and_validate(base_url=fuzzed.url,
                                          headers={"Authorization": f"Bearer {fuzzed.tokens['admin']}"},
                                          checks=CHECKS)
        assert response.status_code < 300, (path, method, response.text)
    admin.close()


def test_values_the_document_declares_are_accepted(fuzzed: Api) -> None:
    """An audit's schemathesis run found requests valid by the document refused with 422: a run status filter
    declared as any text, ``Last-Event-ID`` as any text, ``upto`` as any 40 characters (39 zeros were refused). The
    document now declares what the server takes, and the extremes it declares are accepted."""
    parameters = {(path, p["name"]): p["schema"] for path, item in DOCUMENT["paths"].items()
                  for operation in item.values() for p in operation.get("parameters", [])}
    statuses = parameters[("/api/v1/runs", "status")]["enum"]
    upto = re.compile(parameters[("/api/v1/threads/{thread_id}/replay", "upto")]["pattern"])
    resume = re.compile(parameters[("/api/v1/threads/{thread_id}/events/stream", "last-event-id")]["pattern"])
    assert upto.match("1") and not upto.match("0" * 39) and resume.match("9" * 15)
    admin = httpx.Client(base_url=f"{fuzzed.url}/api/v1", headers={"Authorization": f"Bearer {fuzzed.tokens['admin']}"})
    try:
        for status in statuses:
            assert admin.get("/runs", params={"status": status}).status_code == 200, status
        thread_id = fuzzed.token_ids["thread"]
        assert admin.get(f"/threads/{thread_id}/replay", params={"upto": "1"}).status_code == 200
        with admin.stream("GET", f"/threads/{thread_id}/events/stream",
                          headers={"Last-Event-ID": "9" * 15}) as streamed:
            assert streamed.status_code == 200
    finally:
        admin.close()
