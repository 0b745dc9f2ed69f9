"""Forms no Studio page sends are refused as such, never answered 500 (seen by an audit's fuzzing): a CSRF token
with a character beyond ASCII (``hmac.compare_digest`` raised TypeError) and a form of more than 100 fields
(``parse_qs`` raised ValueError, on the login form too, without a session). The same audit: the OpenAPI
document allowed a run brief of 200,000 characters the server refused past 100,000, and a 405 was titled
"Error"."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from jixu.ledger import SQLiteStore
from jixu.runs.model import MAX_BRIEF_CHARS
from tests.attacker import Raw
from tests.studio.conftest import http_login
from tests.studio.test_tamper_studio import Served, serve
from tests.tamper_cases import _two_turns, agent, run


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Served, str]]:
    path = tmp_path / "forms.db"
    with SQLiteStore(path) as store:
        thread_id, _seq = run(lambda: _two_turns(store, Raw(path), "none"))
    served = serve(path, agent=agent())
    try:
        yield served, thread_id
    finally:
        served.stop()


def _client(served: Served) -> httpx.Client:
    return httpx.Client(base_url=served.server.url, headers={"Origin": served.server.url})


def test_a_csrf_token_beyond_ascii_is_refused_not_a_500(served: tuple[Served, str]) -> None:
    server, thread_id = served
    head = server.store.stream_info(f"thread/{thread_id}")
    with _client(server) as client:
        http_login(client, server.token)
        for path, form in ((f"/studio/threads/{thread_id}/inputs", {"input": "refund 7", "csrf_token": "é"}),
                           ("/studio/logout", {"csrf_token": "jeton-é"})):
            answer = client.post(path, data=form)
            assert answer.status_code == 303, (path, answer.status_code, answer.text[:300])
            assert "flash=" in answer.headers["location"], answer.headers["location"]
        assert client.get("/studio/threads").status_code == 200  # still logged in: the logout was refused
    assert server.store.stream_info(f"thread/{thread_id}") == head  # nothing was sent


@pytest.mark.parametrize("path", ["/studio/login", "/studio/logout", "/studio/threads/{thread_id}/inputs"])
def test_a_form_of_more_than_100_fields_is_refused_not_a_500(served: tuple[Served, str], path: str) -> None:
    server, thread_id = served
    with _client(server) as client:
        if path != "/studio/login":
            http_login(client, server.token)
        answer = client.post(path.format(thread_id=thread_id), content="&".join(f"f{i}=1" for i in range(101)),
                             headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert answer.status_code == 422, answer.text[:300]
    assert answer.json()["code"] == "invalid_input" and "100 fields" in answer.json()["detail"]


def test_the_openapi_brief_limit_is_the_servers_and_a_405_has_its_title(served: tuple[Served, str]) -> None:
    server, _thread_id = served
    with httpx.Client(base_url=f"{server.server.url}/api/v1",
                      headers={"Authorization": f"Bearer {server.token}"}) as api:
        schema = httpx.get(f"{server.server.url}/openapi.json").json()
        assert schema["components"]["schemas"]["CreateRun"]["properties"]["brief"]["maxLength"] == MAX_BRIEF_CHARS
        refused = api.delete("/threads")
    assert refused.status_code == 405 and refused.json()["title"] == "Method not allowed", refused.text
