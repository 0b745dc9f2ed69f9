"""Tokens and roles, problem+json, request limits and request ids, against a real server."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import httpx
import pytest

from jixu.ledger import NewEvent, SQLiteStore
from jixu.server import create_app, create_token
from jixu.server.idempotency import request_stream
from tests.server.conftest import Api, LiveServer, start_api
from tests.server.test_threads_api import new_thread, settled

PROBLEM_KEYS = {"type", "title", "status", "detail", "code"}


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert set(body) >= PROBLEM_KEYS and body["status"] == status and body["code"] == code
    assert body["type"] == f"urn:jixu:problem:{code}" and body["detail"]
    return body


def test_missing_malformed_unknown_and_revoked_tokens_are_401(api: Api) -> None:
    assert_problem(api.client(None).get("/threads"), 401, "unauthorized")
    for header in ("Basic abc", "Bearer nope", f"Bearer jixu_{'01' + '0' * 24}_{'a' * 43}"):
        response = httpx.get(f"{api.url}/api/v1/threads", headers={"Authorization": header})
        assert_problem(response, 401, "unauthorized")
    forged = api.tokens["alpha-viewer"][:-4] + "AAAA"
    assert_problem(httpx.get(f"{api.url}/api/v1/threads", headers={"Authorization": f"Bearer {forged}"}), 401,
                   "unauthorized")
    admin = api.client("admin")
    assert admin.post(f"/tokens/{api.token_ids['alpha-viewer']}/revoke", json={"reason": "left"}).status_code == 200
    assert_problem(api.client("alpha-viewer").get("/threads"), 401, "unauthorized")
    assert api.client(None).get("/health").json()["status"] == "ok"


def test_a_viewer_reads_but_cannot_mutate(api: Api) -> None:
    thread_id = new_thread(api.client("alpha-editor"))
    viewer = api.client("alpha-viewer")
    assert viewer.get(f"/threads/{thread_id}").status_code == 200
    assert viewer.get(f"/threads/{thread_id}/verify").json()["valid"] is True
    for path, body in ((f"/threads/{thread_id}/inputs", {"input": "hi"}), ("/threads", {"project": "alpha"}),
                       (f"/threads/{thread_id}/resume", {})):
        problem = assert_problem(viewer.post(path, json=body), 403, "forbidden")
        assert problem["role_needed"] == "editor" and problem["role"] == "viewer"
    assert viewer.get(f"/threads/{thread_id}/events").json()["head_seq"] == 1  # nothing was written


def test_other_projects_ids_are_404_on_every_thread_endpoint(api: Api) -> None:
    editor = api.client("alpha-editor")
    thread_id = new_thread(editor)
    [event] = editor.get(f"/threads/{thread_id}/events").json()["events"]
    outsider = api.client("beta-operator")
    effect = "01" + "1" * 24
    gets = ["", "/events", "/verify", "/replay", "/events/stream"]
    for suffix in gets:
        assert_problem(outsider.get(f"/threads/{thread_id}{suffix}"), 404, "thread_not_found")
    posts = {"/inputs": {"input": "x"}, "/fork": {"at": event["id"]}, "/resume": {},
             f"/effects/{effect}/resolve": {"resolution": "occurred", "note": "n"},
             f"/effects/{effect}/approve": {}, f"/effects/{effect}/deny": {},
             f"/turns/{effect}/recover": {"request_id": "a" * 32, "expected_epoch": 0}}
    for suffix, body in posts.items():
        assert_problem(outsider.post(f"/threads/{thread_id}{suffix}", json=body), 404, "thread_not_found")
    assert outsider.get("/threads").json()["threads"] == []
    assert_problem(outsider.post("/threads", json={"project": "alpha"}), 404, "project_not_found")
    # A thread that does not exist at all looks exactly the same.
    missing = assert_problem(outsider.get(f"/threads/{'01' + '3' * 24}"), 404, "thread_not_found")
    assert set(missing) == set(assert_problem(outsider.get(f"/threads/{thread_id}"), 404, "thread_not_found"))
    assert api.client("admin").get(f"/threads/{thread_id}").status_code == 200


def test_validation_problems_name_the_bad_field(api: Api) -> None:
    editor = api.client("alpha-editor")
    thread_id = new_thread(editor)
    cases = [
        ("/threads", {"project": "no spaces allowed"}, "project"),
        ("/threads", {"project": "alpha", "metadata": [1]}, "metadata"),
        ("/threads", {"project": "alpha", "colour": "red"}, "colour"),
        (f"/threads/{thread_id}/inputs", {"input": ""}, "input"),
        (f"/threads/{thread_id}/inputs", {"input": 5}, "input"),
        (f"/threads/{thread_id}/inputs", {}, "input"),
        (f"/threads/{thread_id}/fork", {"at": "not-an-id"}, "at"),
        (f"/threads/{thread_id}/turns/{'01' + '1' * 24}/recover", {"request_id": "XYZ", "expected_epoch": 0},
         "request_id"),
    ]
    for path, body, field in cases:
        problem = assert_problem(editor.post(path, json=body), 422, "invalid_input")
        assert problem["field"] == field, (path, body, problem)
        assert field in problem["detail"]
    malformed = editor.post("/threads", content=b"{not json", headers={"Content-Type": "application/json"})
    assert_problem(malformed, 422, "invalid_input")
    bad_id = assert_problem(editor.get("/threads/not-a-ulid"), 422, "invalid_input")
    assert bad_id["field"] == "thread_id"
    bad_query = assert_problem(editor.get(f"/threads/{thread_id}/events", params={"limit": 0}), 422,
                               "invalid_input")
    assert bad_query["field"] == "limit"
    assert editor.get(f"/threads/{thread_id}/events").json()["head_seq"] == 1  # nothing was written


def test_an_oversized_body_is_413_before_anything_is_read(api: Api) -> None:
    editor = api.client("alpha-editor")
    thread_id = new_thread(editor)
    huge = {"input": "x" * (1024 * 1024 + 10)}
    assert_problem(editor.post(f"/threads/{thread_id}/inputs", json=huge), 413, "request_too_large")

    def chunks() -> Any:  # no Content-Length: counted as it streams
        for _ in range(20):
            yield b"x" * 65536

    streamed = editor.post(f"/threads/{thread_id}/inputs", content=chunks(),
                           headers={"Content-Type": "application/json"})
    assert_problem(streamed, 413, "request_too_large")
    assert editor.get(f"/threads/{thread_id}/events").json()["head_seq"] == 1


def test_a_replayed_request_id_returns_the_original_response_and_runs_once(any_api: Api) -> None:
    editor = any_api.client("alpha-editor")
    key = {"Idempotency-Key": secrets.token_hex(16)}
    first = editor.post("/threads", json={"project": "alpha"}, headers=key)
    again = editor.post("/threads", json={"project": "alpha"}, headers=key)
    assert first.status_code == again.status_code == 201
    assert first.json() == again.json() and again.headers["idempotent-replayed"] == "true"
    assert len(editor.get("/threads").json()["threads"]) == 1
    thread_id = first.json()["thread_id"]
    send_key = {"Idempotency-Key": "send-1"}
    sent = editor.post(f"/threads/{thread_id}/inputs", json={"input": "once"}, headers=send_key)
    settled(editor, thread_id, "idle")
    repeat = editor.post(f"/threads/{thread_id}/inputs", json={"input": "once"}, headers=send_key)
    assert repeat.status_code == 202 and repeat.json() == sent.json()
    turns = editor.get(f"/threads/{thread_id}").json()["turns"]
    assert len(turns) == 1
    changed = assert_problem(editor.post(f"/threads/{thread_id}/inputs", json={"input": "twice"}, headers=send_key),
                             422, "request_id_reused")
    assert changed["field"] == "Idempotency-Key"
    # The ids are the caller's own: another token may use the same id for its own request.
    other = any_api.client("alpha-operator").post("/threads", json={"project": "alpha"}, headers=key)
    assert other.status_code == 201 and other.json()["thread_id"] != thread_id


def test_a_request_id_whose_request_failed_may_be_used_again(api: Api) -> None:
    editor = api.client("alpha-editor")
    thread_id = new_thread(editor)
    editor.post(f"/threads/{thread_id}/inputs", json={"input": "charge it"})
    settled(editor, thread_id, "waiting")
    key = {"Idempotency-Key": "retry-me"}
    assert editor.post(f"/threads/{thread_id}/inputs", json={"input": "more"}, headers=key).status_code == 409
    [waiting] = editor.get(f"/threads/{thread_id}").json()["waiting_on"]
    api.client("alpha-operator").post(f"/threads/{thread_id}/effects/{waiting['effect_id']}/resolve",
                                      json={"resolution": "occurred", "note": "the bank shows it"})
    settled(editor, thread_id, "idle")
    assert editor.post(f"/threads/{thread_id}/inputs", json={"input": "more"}, headers=key).status_code == 202


def test_a_request_without_a_recorded_outcome_is_not_repeated(api: Api) -> None:
    editor = api.client("alpha-editor")
    thread_id = new_thread(editor)
    # A server stopped between recording the start of a request and its outcome.
    path = f"/api/v1/threads/{thread_id}/inputs"
    from jixu.server.idempotency import fingerprint

    api.store.append(request_stream(api.token_ids["alpha-editor"], "lost"), [NewEvent("idempotency.started", {
        "request_id": "lost", "method": "POST", "path": path, "body_hash": fingerprint("POST", path, {"input": "x"}),
        "actor": "t"})], 0)
    problem = assert_problem(editor.post(f"/threads/{thread_id}/inputs", json={"input": "x"},
                                         headers={"Idempotency-Key": "lost"}), 409, "request_in_progress")
    assert "new request id" in problem["detail"]
    assert editor.get(f"/threads/{thread_id}/events").json()["head_seq"] == 1


def test_request_ids_survive_a_server_restart(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "restart.db")
    api, server = start_api(store, tmp_path)
    try:
        key = {"Idempotency-Key": "durable"}
        first = api.client("alpha-editor").post("/threads", json={"project": "alpha"}, headers=key)
    finally:
        api.close()
        server.stop()
    restarted = LiveServer(create_app(store))
    restarted.start()
    try:
        with httpx.Client(base_url=f"{restarted.url}/api/v1",
                          headers={"Authorization": f"Bearer {api.tokens['alpha-editor']}"}) as client:
            again = client.post("/threads", json={"project": "alpha"}, headers=key)
            assert again.status_code == 201 and again.json() == first.json()
            # This server has no agent: a new thread is refused, with a problem that says why.
            assert_problem(client.post("/threads", json={"project": "alpha"}), 409, "agent_not_configured")
    finally:
        restarted.stop()
        store.close()


def test_admin_manages_tokens_and_project_tokens_cannot(api: Api) -> None:
    admin, operator = api.client("admin"), api.client("alpha-operator")
    made = admin.post("/tokens", json={"name": "ci", "roles": {"alpha": "viewer", "beta": "editor"}},
                      headers={"Idempotency-Key": "tok-1"})
    assert made.status_code == 201, made.text
    secret = made.json()["secret"]
    assert secret.startswith("jixu_")
    replay = admin.post("/tokens", json={"name": "ci", "roles": {"alpha": "viewer", "beta": "editor"}},
                        headers={"Idempotency-Key": "tok-1"})
    assert replay.status_code == 201 and replay.json()["secret"] is None  # the secret is never stored
    assert replay.json()["token"] == made.json()["token"]
    whoami = httpx.get(f"{api.url}/api/v1/whoami", headers={"Authorization": f"Bearer {secret}"}).json()
    assert whoami["roles"] == {"alpha": "viewer", "beta": "editor"} and whoami["kind"] == "project"
    listed = admin.get("/tokens").json()["tokens"]
    assert made.json()["token"]["token_id"] in {t["token_id"] for t in listed}
    assert all("secret" not in json_text for json_text in map(str, listed))
    assert_problem(operator.post("/tokens", json={"name": "sneaky", "admin": True}), 403, "forbidden")
    assert_problem(operator.get("/tokens"), 403, "forbidden")
    bad = assert_problem(admin.post("/tokens", json={"name": "x", "roles": {"alpha": "owner"}}), 422,
                         "invalid_input")
    assert bad["field"].startswith("roles")
    assert_problem(admin.post("/tokens", json={"name": "nothing"}), 422, "invalid_input")
    events = api.store.read(f"auth/token/{made.json()['token']['token_id']}")
    assert events[0].meta["actor"] == f"token:{api.token_ids['admin']}"
    raw_secret = secret[len("jixu_") + 26 + 1:]  # the secret itself may contain "_" (url-safe base64)
    assert len(raw_secret) == 43 and raw_secret not in str(events[0].data)


@pytest.mark.parametrize("role", ["viewer", "editor", "operator"])
def test_tokens_made_in_the_store_authenticate(tmp_path: Path, role: str) -> None:
    store = SQLiteStore(tmp_path / "tokens.db")
    info, secret = create_token(store, f"t-{role}", roles={"alpha": role})
    server = LiveServer(create_app(store))
    server.start()
    try:
        answer = httpx.get(f"{server.url}/api/v1/whoami", headers={"Authorization": f"Bearer {secret}"})
        assert answer.json() == {"token_id": info.token_id, "name": f"t-{role}", "kind": "project",
                                 "roles": {"alpha": role}, "actor": f"token:{info.token_id}",
                                 "expires_at": None}
    finally:
        server.stop()
        store.close()


def test_values_nested_too_deeply_are_refused_with_their_path_and_write_nothing(api: Api) -> None:
    """Free-form fields (thread metadata, a resolution's evidence) nest at most ``VALUE_NESTING`` levels, the
    ledger's rule for free-form values: 422 naming the field and the path, nothing written; bodies too deep to
    parse at all are 422 too."""
    from jixu.ledger.encoding import VALUE_NESTING

    editor = api.client("alpha-editor")

    def deep(levels: int) -> str:
        return "[" * levels + "1" + "]" * levels

    before = len(editor.get("/threads", params={"project": "alpha"}).json()["threads"])
    body = '{"project": "alpha", "metadata": {"note": ' + deep(VALUE_NESTING) + "}}"
    problem = assert_problem(editor.post("/threads", content=body, headers={"Content-Type": "application/json"}),
                             422, "invalid_input")
    assert problem["field"] == "metadata" and "nested too deeply" in problem["detail"]
    assert "metadata.note[0]" in problem["detail"]
    unparsable = '{"project": "alpha", "metadata": {"note": ' + deep(100_000) + "}}"
    assert_problem(editor.post("/threads", content=unparsable, headers={"Content-Type": "application/json"}),
                   422, "invalid_input")
    assert len(editor.get("/threads", params={"project": "alpha"}).json()["threads"]) == before
    fine = '{"project": "alpha", "metadata": {"note": ' + deep(VALUE_NESTING - 1) + "}}"
    assert editor.post("/threads", content=fine, headers={"Content-Type": "application/json"}).status_code == 201


def test_an_unauthenticated_caller_gets_401_whatever_its_body(api: Api) -> None:
    """Authentication comes first: a caller without a token learns nothing of a route's validation."""
    thread_id = new_thread(api.client("alpha-editor"))
    anonymous = api.client(None)
    for body in (b"{not json", b"[" * 5000, b"\xff\xfe", b'{"project": 5}', b'{"input": ""}'):
        for path in ("/threads", f"/threads/{thread_id}/inputs", "/tokens", "/runs", "/projects"):
            response = anonymous.post(path, content=body, headers={"Content-Type": "application/json"})
            assert_problem(response, 401, "unauthorized")
            assert response.headers["www-authenticate"].startswith("Bearer")
    assert_problem(anonymous.get("/threads/not-an-id"), 401, "unauthorized")
    assert_problem(anonymous.get(f"/threads/{thread_id}/events", params={"after_seq": -1}), 401, "unauthorized")


def test_two_authorization_headers_are_refused_not_resolved_by_order(api: Api) -> None:
    admin, viewer = api.tokens["admin"], api.tokens["alpha-viewer"]
    for first, second in ((admin, viewer), (viewer, admin), (admin, admin), (admin, "nonsense")):
        headers = [("Authorization", f"Bearer {first}"), ("Authorization", f"Bearer {second}")]
        assert_problem(httpx.get(f"{api.url}/api/v1/whoami", headers=headers), 401, "unauthorized")
        made = httpx.post(f"{api.url}/api/v1/threads", json={"project": "alpha"}, headers=headers)
        assert_problem(made, 401, "unauthorized")
    assert api.client("admin").get("/threads").json()["threads"] == []  # nothing was created


def test_a_method_a_path_does_not_serve_is_405_listing_the_ones_it_does(api: Api) -> None:
    thread_id = new_thread(api.client("alpha-editor"))
    client = api.client("admin")
    for method, path, allowed in (("DELETE", "/threads", "GET, POST"), ("PUT", "/health", "GET"),
                                  ("GET", f"/threads/{thread_id}/inputs", "POST"),
                                  ("PATCH", f"/threads/{thread_id}", "GET"),
                                  ("DELETE", "/projects/alpha/policy", "PUT")):
        response = client.request(method, path)
        assert_problem(response, 405, "method_not_allowed")
        assert response.headers["allow"] == allowed, (method, path)


def test_the_published_document_constrains_ids_and_documents_request_ids(api: Api) -> None:
    document = httpx.get(f"{api.url}/openapi.json").json()
    ulid = r"^[0-7][0-9A-HJKMNP-TV-Z]{25}$"
    mutations = 0
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            parameters = {p["name"]: p for p in operation.get("parameters", [])}
            for name, parameter in parameters.items():
                if parameter["in"] == "path":
                    assert parameter["schema"].get("pattern"), (method, path, name)
                    if name.endswith("_id"):
                        assert parameter["schema"]["pattern"] == ulid, (method, path, name)
            if method in ("post", "put", "patch", "delete"):
                mutations += 1
                key = parameters.get("Idempotency-Key")
                assert key is not None and key["in"] == "header", (method, path)
                assert key["schema"]["anyOf"][0]["pattern"], (method, path)
            if path.startswith("/api/v1/") and not path.endswith("/health"):
                # Any authenticated route answers 429 after too many failed logins from the caller's address.
                assert "429" in operation["responses"], (method, path)
    assert mutations >= 20
    request = document["paths"]["/api/v1/runs/{run_id}/execution-requests/{request_id}"]["get"]
    assert "409" in request["responses"], "a corrupt run's request is answered run_corrupt"


def test_an_edited_request_id_record_is_neither_replayed_nor_run_again(api: Api) -> None:
    """The stored answer of a request id changed in the database (201 made 299, triggers dropped): replaying it
    would serve the edit as the original answer, running the request again could repeat it. Refused with 409
    naming the first bad event; nothing is created."""
    from tests.attacker import Raw

    editor = api.client("alpha-editor")
    key = {"Idempotency-Key": "edited"}
    first = editor.post("/threads", json={"project": "alpha"}, headers=key)
    assert first.status_code == 201
    stream = request_stream(api.token_ids["alpha-editor"], "edited")
    with Raw(Path(api.store.url.removeprefix("sqlite:///"))).transaction() as sql:  # type: ignore[union-attr]
        [(data,)] = sql("SELECT data FROM jixu_events WHERE stream = ? AND seq = 2", stream)
        sql("UPDATE jixu_events SET data = ? WHERE stream = ? AND seq = 2", data.replace('"status":201',
                                                                                          '"status":299'), stream)
    again = assert_problem(editor.post("/threads", json={"project": "alpha"}, headers=key), 409, "stream_corrupt")
    assert (again["first_bad_seq"], again["reason"]) == (2, "payload_changed")
    assert [t["thread_id"] for t in editor.get("/threads").json()["threads"]] == [first.json()["thread_id"]]


def test_two_request_id_headers_are_refused(api: Api) -> None:
    """Which of two ``Idempotency-Key`` headers a proxy or a server reads differs: refused, as two
    ``Authorization`` headers are, and nothing is created."""
    editor = api.client("alpha-editor")
    for headers in ([("Idempotency-Key", "k1"), ("Idempotency-Key", "k2")],
                    [("Idempotency-Key", "k1"), ("Idempotency-Key", "bad key!")]):
        refused = assert_problem(editor.post("/threads", json={"project": "alpha"}, headers=httpx.Headers(headers)),
                                 422, "invalid_input")
        assert refused["field"] == "Idempotency-Key"
    assert editor.get("/threads").json()["threads"] == []
