"""Input a careless or hostile caller sends: every answer is a problem the caller can act on, never a 500, and
nothing is written. Against a real server over SQLite (whose integers stop at 2**63 - 1)."""

from __future__ import annotations

import json

import httpx
import pytest

from jixu.ledger.encoding import VALUE_NESTING
from tests.server.conftest import Api
from tests.server.test_auth_and_problems import assert_problem
from tests.server.test_threads_api import new_thread, settled

BEYOND_SQLITE = 2**63 - 1
MAX_SEQ = 2**53 - 1  # the largest seq the API takes (documented in the OpenAPI document)


def deep(levels: int) -> str:
    """A JSON array nested ``levels`` deep (the outermost counts)."""
    return "[" * levels + "1" + "]" * levels


def raw(header: str) -> bytes:
    """A header's bytes as a client sends them: Latin-1 when it can (``\xb2``), else UTF-8."""
    return header.encode("latin-1") if max(map(ord, header)) < 256 else header.encode("utf-8")


def post_text(client: httpx.Client, path: str, text: str) -> httpx.Response:
    return client.post(path, content=text, headers={"Content-Type": "application/json"})


@pytest.mark.parametrize("after_seq", [BEYOND_SQLITE, BEYOND_SQLITE - 1, 10**25, MAX_SEQ + 1])
def test_a_seq_beyond_what_a_store_holds_is_422_on_the_page_and_on_the_stream(api: Api, after_seq: int) -> None:
    client = api.client("alpha-viewer")
    thread_id = new_thread(api.client("alpha-editor"))
    for path in (f"/threads/{thread_id}/events", f"/threads/{thread_id}/events/stream"):
        problem = assert_problem(client.get(path, params={"after_seq": after_seq, "timeout": 1}), 422,
                                 "invalid_input")
        assert problem["field"] == "after_seq"
    # The largest accepted seq is simply past the end: an empty page, not an error.
    page = client.get(f"/threads/{thread_id}/events", params={"after_seq": MAX_SEQ, "limit": 1000})
    assert page.status_code == 200 and page.json()["events"] == []


@pytest.mark.parametrize("header", [str(10**25), str(BEYOND_SQLITE), "\u00b2", "\u0663", "1\u00b2", "-1", "0x10"])
def test_a_bad_last_event_id_is_refused_before_the_stream_starts(api: Api, header: str) -> None:
    client = api.client("alpha-viewer")
    thread_id = new_thread(api.client("alpha-editor"))
    with client.stream("GET", f"/threads/{thread_id}/events/stream", params={"timeout": 2},
                       headers={"Last-Event-ID": raw(header)}) as response:
        assert response.status_code == 422  # not a 200 whose stream then breaks
        response.read()
        problem = assert_problem(response, 422, "invalid_input")
    assert problem["field"] == "Last-Event-ID"


def test_non_ascii_digits_are_422_wherever_a_seq_is_read(api: Api) -> None:
    client = api.client("alpha-viewer")
    thread_id = new_thread(api.client("alpha-editor"))
    for upto in ("\u00b2", "\u0663", "\uff11", str(10**30)):  # superscript two, Arabic-Indic three, fullwidth one
        problem = assert_problem(client.get(f"/threads/{thread_id}/replay", params={"upto": upto}), 422,
                                 "invalid_input")
        assert problem["field"] == "upto"
    for after_seq in ("\u00b2", "\u0663"):
        assert_problem(client.get(f"/threads/{thread_id}/events", params={"after_seq": after_seq}), 422,
                       "invalid_input")
    assert client.get(f"/threads/{thread_id}/replay", params={"upto": "1"}).status_code == 200


def refused(response: httpx.Response, field: str) -> None:
    """A 422 naming ``field`` as nested too deeply, or (a body so deep the JSON parser gives up) naming the body."""
    problem = assert_problem(response, 422, "invalid_input")
    assert problem["field"] in (field, "body"), problem
    if problem["field"] == field:
        assert "nested too deeply" in problem["detail"] and f"{field}" in problem["detail"]


@pytest.mark.parametrize("levels", [VALUE_NESTING + 1, 256, 300, 500, 990])
def test_free_form_values_nested_deeper_than_the_ledger_rule_are_422_and_write_nothing(api: Api,
                                                                                       levels: int) -> None:
    """One rule (``VALUE_NESTING``) for every free-form field, checked before anything serialises the body."""
    editor, operator, admin = api.client("alpha-editor"), api.client("alpha-operator"), api.client("admin")
    threads_before = len(editor.get("/threads").json()["threads"])
    value = deep(levels - 1)  # inside the field's own object: the field holds ``levels`` levels
    refused(post_text(editor, "/threads", '{"project": "alpha", "metadata": {"x": ' + value + "}}"), "metadata")
    assert len(editor.get("/threads").json()["threads"]) == threads_before
    thread_id = new_thread(editor)
    editor.post(f"/threads/{thread_id}/inputs", json={"input": "charge it"})
    [waiting] = settled(editor, thread_id, "waiting")["waiting_on"]
    head = editor.get(f"/threads/{thread_id}/events").json()["head_seq"]
    resolve = f"/threads/{thread_id}/effects/{waiting['effect_id']}/resolve"
    for field, body in (("evidence", '{"x": ' + value + "}"), ("result", deep(levels))):
        text = '{"resolution": "occurred", "note": "seen", "' + field + '": ' + body + "}"
        refused(post_text(operator, resolve, text), field)
    assert editor.get(f"/threads/{thread_id}/events").json()["head_seq"] == head
    policy = '{"name": "deep", "origin": "/nowhere", "policy": {"x": ' + value + "}}"
    refused(post_text(admin, "/projects", policy), "policy")


def test_a_free_form_value_at_the_ledger_rule_is_stored(api: Api) -> None:
    editor = api.client("alpha-editor")
    body = '{"project": "alpha", "metadata": {"x": ' + deep(VALUE_NESTING - 1) + "}}"
    made = post_text(editor, "/threads", body)
    assert made.status_code == 201, made.text
    [created] = editor.get(f"/threads/{made.json()['thread_id']}/events").json()["events"]
    assert created["data"]["metadata"]["x"] == json.loads(deep(VALUE_NESTING - 1))
