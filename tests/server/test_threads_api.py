"""The threads endpoints over a real server: lifecycle, events (paged and live), decisions, actors, on both stores."""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from jixu.ledger import SQLiteStore, Store
from jixu.server.studio import studio_router
from jixu.threads.log import ThreadLog
from tests.conftest import PostgresSchema
from tests.server.agents import TRANSFER_GATE
from tests.server.conftest import Api, start_api, wait_for
from tests.studio.conftest import csrf_of, http_login


def new_thread(client: httpx.Client, project: str = "alpha") -> str:
    response = client.post("/threads", json={"project": project})
    assert response.status_code == 201, response.text
    thread_id: str = response.json()["thread_id"]
    return thread_id


def settled(client: httpx.Client, thread_id: str, status: str) -> dict[str, Any]:
    """The thread's state once it reached ``status`` (the in-process worker runs it)."""
    def check() -> dict[str, Any] | None:
        state: dict[str, Any] = client.get(f"/threads/{thread_id}").json()
        owner = state["ownership"]
        return state if state["status"] == status and (not owner or owner["released"]) else None

    found: dict[str, Any] = wait_for(check, f"thread {thread_id} to be {status}")
    return found


def test_a_thread_created_and_sent_input_over_http_runs_and_records_the_token_as_actor(any_api: Api) -> None:
    client = any_api.client("alpha-editor")
    thread_id = new_thread(client)
    sent = client.post(f"/threads/{thread_id}/inputs", json={"input": "hello there"})
    assert sent.status_code == 202 and sent.json()["queued"] is True
    state = settled(client, thread_id, "idle")
    assert state["last_reply"] == "echo: hello there" and state["project"] == "alpha"
    events = client.get(f"/threads/{thread_id}/events", params={"limit": 1000}).json()["events"]
    actor = f"token:{any_api.token_ids['alpha-editor']}"
    by_type = {e["type"]: e for e in events}
    assert by_type["thread.created"]["meta"]["actor"] == actor
    assert by_type["turn.started"]["meta"]["actor"] == actor
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    verify = client.get(f"/threads/{thread_id}/verify").json()
    assert verify["valid"] is True and verify["chain"]["count"] == len(events)
    listed = client.get("/threads").json()["threads"]
    assert [t["thread_id"] for t in listed] == [thread_id]


def test_events_are_paged_by_seq(api: Api) -> None:
    client = api.client("alpha-editor")
    thread_id = new_thread(client)
    client.post(f"/threads/{thread_id}/inputs", json={"input": "one"})
    settled(client, thread_id, "idle")
    whole = client.get(f"/threads/{thread_id}/events").json()
    seen: list[int] = []
    after = 0
    while True:
        page = client.get(f"/threads/{thread_id}/events", params={"after_seq": after, "limit": 2}).json()
        if not page["events"]:
            break
        assert len(page["events"]) <= 2
        seen.extend(e["seq"] for e in page["events"])
        after = page["next_after_seq"]
    assert seen == [e["seq"] for e in whole["events"]] == list(range(1, whole["head_seq"] + 1))


def read_sse(client: httpx.Client, path: str, count: int, headers: dict[str, str] | None = None,
             ) -> list[dict[str, Any]]:
    """The first ``count`` events of a server-sent event stream (with their ``id`` and ``event`` fields)."""
    found: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    with client.stream("GET", path, params={"timeout": 10}, headers=headers) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("id: "):
                current["id"] = int(line[4:])
            elif line.startswith("event: "):
                current["event"] = line[7:]
            elif line.startswith("data: "):
                current["data"] = json.loads(line[6:])
            elif line == "" and current:
                found.append(current)
                current = {}
                if len(found) == count:
                    break
    return found


def test_the_live_stream_sends_new_events_and_resumes_after_last_event_id(any_api: Api) -> None:
    client = any_api.client("alpha-viewer")
    editor = any_api.client("alpha-editor")
    thread_id = new_thread(editor)
    first = read_sse(client, f"/threads/{thread_id}/events/stream", 1)
    assert first[0]["id"] == 1 and first[0]["event"] == "thread.created"
    editor.post(f"/threads/{thread_id}/inputs", json={"input": "stream me"})
    # Resume after seq 1: the turn's events arrive, none repeated.
    later = read_sse(client, f"/threads/{thread_id}/events/stream", 2, headers={"Last-Event-ID": "1"})
    assert [e["id"] for e in later] == [2, 3] and later[0]["event"] == "turn.started"
    assert later[0]["data"]["seq"] == 2


def test_an_unknown_effect_is_resolved_only_by_an_operator(api: Api) -> None:
    editor, operator, viewer = api.client("alpha-editor"), api.client("alpha-operator"), api.client("alpha-viewer")
    thread_id = new_thread(editor)
    editor.post(f"/threads/{thread_id}/inputs", json={"input": "charge the card"})
    state = settled(editor, thread_id, "waiting")
    [waiting] = state["waiting_on"]
    assert waiting["state"] == "unknown" and waiting["name"] == "charge"
    path = f"/threads/{thread_id}/effects/{waiting['effect_id']}/resolve"
    body = {"resolution": "not_occurred", "note": "the gateway shows no charge"}
    for who in (editor, viewer):
        refused = who.post(path, json=body)
        assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
    assert api.client("beta-operator").post(path, json=body).status_code == 404
    done = operator.post(path, json=body)
    assert done.status_code == 200, done.text
    assert done.json()["effect"]["resolution"]["resolution"] == "not_occurred"
    events = operator.get(f"/threads/{thread_id}/events", params={"limit": 1000}).json()["events"]
    [resolved] = [e for e in events if e["type"] == "tool.outcome_resolved"]
    assert resolved["meta"]["actor"] == f"token:{api.token_ids['alpha-operator']}"
    again = operator.post(path, json={**body, "note": "changed my mind"})
    assert again.status_code == 409 and again.json()["code"] == "resolution_conflict"


def test_a_parked_call_is_approved_or_denied_by_an_operator(api: Api) -> None:
    editor, operator = api.client("alpha-editor"), api.client("alpha-operator")
    for decision in ("approve", "deny"):
        thread_id = new_thread(editor)
        editor.post(f"/threads/{thread_id}/inputs", json={"input": "please approve a refund"})
        [parked] = settled(editor, thread_id, "waiting")["waiting_on"]
        assert parked["state"] == "parked"
        path = f"/threads/{thread_id}/effects/{parked['effect_id']}/{decision}"
        assert editor.post(path, json={"note": "x"}).status_code == 403
        answer = operator.post(path, json={"note": "checked the order"})
        assert answer.status_code == 200, answer.text
        state = settled(editor, thread_id, "idle")
        assert state["effects"][parked["effect_id"]]["state"] == "completed"
        again = operator.post(path, json={})
        assert again.status_code == 409 and again.json()["code"] == "effect_not_parked"


def test_replay_and_fork(api: Api) -> None:
    editor, viewer = api.client("alpha-editor"), api.client("alpha-viewer")
    thread_id = new_thread(editor)
    editor.post(f"/threads/{thread_id}/inputs", json={"input": "first"})
    settled(editor, thread_id, "idle")
    events = editor.get(f"/threads/{thread_id}/events").json()["events"]
    replayed = viewer.get(f"/threads/{thread_id}/replay").json()
    assert replayed["last_reply"] == "echo: first" and replayed["seq"] == len(events)
    early = viewer.get(f"/threads/{thread_id}/replay", params={"upto": "1"}).json()
    assert early["seq"] == 1 and early["last_reply"] is None
    assert viewer.post(f"/threads/{thread_id}/fork", json={"at": events[-1]["id"]}).status_code == 403
    forked = editor.post(f"/threads/{thread_id}/fork", json={"at": events[-1]["id"], "input": "second"})
    assert forked.status_code == 201, forked.text
    child = forked.json()
    assert child["parent"]["thread_id"] == thread_id and child["project"] == "alpha" and child["turn_id"]
    state = settled(editor, child["thread_id"], "idle")
    assert state["last_reply"] == "echo: second"
    assert editor.get(f"/threads/{thread_id}/events").json()["head_seq"] == len(events)  # the parent is unchanged
    unknown = editor.post(f"/threads/{thread_id}/fork", json={"at": "01" + "0" * 24})
    assert unknown.status_code == 404


def test_an_expired_turn_is_recovered_by_an_editor_with_its_epoch(api: Api) -> None:
    editor, viewer = api.client("alpha-editor"), api.client("alpha-viewer")
    thread_id = new_thread(editor)
    # A process outside the server started a turn and died: its lease expires.
    log = ThreadLog.load(api.store, thread_id)
    turn_id, _fence = log.start_turn("lost work", owner="crashed-process", ttl=0.05)
    ownership = wait_for(lambda: (o := viewer.get(f"/threads/{thread_id}").json()["ownership"]) and o["expired"]
                         and o, "the lease to expire")
    body = {"request_id": secrets.token_hex(16), "expected_epoch": ownership["epoch"], "note": "its host is gone"}
    path = f"/threads/{thread_id}/turns/{turn_id}/recover"
    assert viewer.post(path, json=body).status_code == 403
    recovered = editor.post(path, json=body)
    assert recovered.status_code == 200, recovered.text
    receipt = recovered.json()["receipt"]
    assert receipt["previous_owner"] == "crashed-process" and receipt["epoch"] == ownership["epoch"] + 1
    assert receipt["actor"] == f"token:{api.token_ids['alpha-editor']}"
    assert receipt["note"] == "its host is gone"  # the reason is in the receipt (the turn.recovered event)
    stale = editor.post(path, json={**body, "request_id": secrets.token_hex(16)})
    assert stale.status_code == 409


def test_sending_input_to_a_waiting_thread_is_refused_and_writes_nothing(api: Api) -> None:
    editor = api.client("alpha-editor")
    thread_id = new_thread(editor)
    editor.post(f"/threads/{thread_id}/inputs", json={"input": "charge it"})
    settled(editor, thread_id, "waiting")
    head = editor.get(f"/threads/{thread_id}/events").json()["head_seq"]
    refused = editor.post(f"/threads/{thread_id}/inputs", json={"input": "anything"})
    assert refused.status_code == 409 and refused.json()["code"] == "thread_busy"
    assert editor.get(f"/threads/{thread_id}/events").json()["head_seq"] == head


def test_listing_threads_reads_only_the_threads_of_the_callers_projects_and_no_events(tmp_path: Any) -> None:
    from jixu.ledger import SQLiteStore
    from jixu.server import create_app, create_token
    from jixu.threads.log import THREAD_PREFIX
    from tests.server.agents import agent
    from tests.server.conftest import LiveServer

    class Counting(SQLiteStore):
        reads = 0
        listed = 0

        def read(self, stream: str, from_seq: int = 1, to_seq: int | None = None) -> Any:
            if stream.startswith(THREAD_PREFIX):
                Counting.reads += 1
            return super().read(stream, from_seq, to_seq)

        def list_streams(self, prefix: str = "", **options: Any) -> Any:
            found = super().list_streams(prefix, **options)
            Counting.listed += len(found) if prefix == THREAD_PREFIX else 0
            return found

    store = Counting(tmp_path / "count.db")
    _, editor_secret = create_token(store, "ed", roles={"alpha": "editor"})
    _, outsider_secret = create_token(store, "out", roles={"beta": "viewer"})
    server = LiveServer(create_app(store, agent=agent()))
    server.start()
    try:
        def client(secret: str) -> httpx.Client:
            return httpx.Client(base_url=f"{server.url}/api/v1", headers={"Authorization": f"Bearer {secret}"})

        with client(editor_secret) as editor, client(outsider_secret) as outsider:
            made = [new_thread(editor) for _ in range(30)]
            Counting.reads = Counting.listed = 0
            for _ in range(3):
                assert outsider.get("/threads").json()["threads"] == []
            assert Counting.listed == 0  # the index has no beta thread: not one alpha thread is read
            assert [t["thread_id"] for t in editor.get("/threads").json()["threads"]] == made
            assert Counting.listed == 30
            assert outsider.get("/threads", params={"project": "alpha"}).json()["threads"] == []
            assert Counting.listed == 30 and Counting.reads == 0  # no thread's events are read to list threads
    finally:
        server.stop()
        store.close()


def test_input_sent_over_http_is_claimed_at_once_not_at_the_workers_next_poll(tmp_path: Any) -> None:
    """The in-process worker polls the queue every 30 s here; the answered POST nudges it, so the turn runs
    within a few seconds (without the nudge it would wait for the poll)."""
    from jixu.ledger import SQLiteStore
    from tests.server.conftest import start_api

    store = SQLiteStore(tmp_path / "api.db")
    made, server = start_api(store, tmp_path, poll_interval=30.0)
    try:
        client = made.client("alpha-editor")
        thread_id = new_thread(client)
        time.sleep(0.5)  # the worker has looked at the empty queue and waits for its next poll
        for text in ("first", "second"):  # the second nudge comes after the first was cleared
            sent_at = time.monotonic()
            assert client.post(f"/threads/{thread_id}/inputs", json={"input": text}).status_code == 202
            def replied(text: str = text) -> dict[str, Any] | None:
                state: dict[str, Any] = client.get(f"/threads/{thread_id}").json()
                return state if state["status"] == "idle" and state["last_reply"] == f"echo: {text}" else None

            state = wait_for(replied, f"the {text} turn", timeout=10)
            took = time.monotonic() - sent_at
            assert took < 5, f"{took:.1f}s from the POST to the reply: the worker waited for its poll"
            assert state["last_reply"] == f"echo: {text}"
    finally:
        made.close()
        server.stop()
        store.close()


def test_a_thread_whose_first_event_was_deleted_is_corrupt_to_an_admin_not_missing(api: Api) -> None:
    """Deleting a thread's first event (triggers dropped) hid the thread from everyone, admin included: its
    project is read from that event, so every route answered 404 while the list still named it. It is the
    stream's thread all the same: an admin sees it ``corrupt`` (gap at seq 1) and every mutation is refused with
    409 naming that. Its project is the one the store indexed it under when it was created (whose listing names
    it): that project's tokens see it corrupt too, another project's get 404."""
    from jixu.scheduling import create_thread_for
    from tests.attacker import Raw, delete_event
    from tests.server.agents import agent

    admin = api.client("admin")
    thread_id = create_thread_for(api.store, agent(), project="alpha")  # the server has not seen it yet
    path = api.store.url.removeprefix("sqlite:///")  # type: ignore[union-attr]
    delete_event(Raw(Path(path)), f"thread/{thread_id}", 1)
    state = admin.get(f"/threads/{thread_id}")
    assert state.status_code == 200, state.text
    assert (state.json()["thread_id"], state.json()["status"]) == (thread_id, "corrupt")
    assert state.json()["corruption"]["stream"] == f"thread/{thread_id}"
    assert (state.json()["corruption"]["first_bad_seq"], state.json()["corruption"]["reason"]) == (1, "gap")
    for path_tail, body in (("/inputs", {"input": "again"}), ("/resume", {})):
        refused = admin.post(f"/threads/{thread_id}{path_tail}", json=body)
        assert refused.status_code == 409 and refused.json()["code"] == "thread_corrupt", refused.text
        assert refused.json()["first_bad_seq"] == 1
    member = api.client("alpha-operator").get(f"/threads/{thread_id}")
    assert (member.status_code, member.json()["status"]) == (200, "corrupt"), member.text
    assert thread_id in [t["thread_id"] for t in api.client("alpha-operator").get("/threads").json()["threads"]]
    assert api.client("beta-operator").get(f"/threads/{thread_id}").status_code == 404


def test_a_changed_project_in_a_threads_first_event_never_moves_it_to_another_project(api: Api) -> None:
    """``thread.created``'s ``metadata.project`` edited from alpha to beta (hash left stale): the first event no
    longer holds, so it says nothing. The thread stays alpha's (listed and shown to alpha, as ``corrupt``);
    beta's tokens get the 404 of a thread they cannot see and do not list it."""
    from jixu.scheduling import create_thread_for
    from tests.attacker import Raw
    from tests.server.agents import agent

    thread_id = create_thread_for(api.store, agent(), project="alpha")
    stream = f"thread/{thread_id}"
    with Raw(Path(api.store.url.removeprefix("sqlite:///"))).transaction() as sql:  # type: ignore[union-attr]
        [(data,)] = sql("SELECT data FROM jixu_events WHERE stream = ? AND seq = 1", stream)
        assert '"project":"alpha"' in data
        sql("UPDATE jixu_events SET data = ? WHERE stream = ? AND seq = 1",
            data.replace('"project":"alpha"', '"project":"beta"'), stream)
    alpha, beta = api.client("alpha-operator"), api.client("beta-operator")
    state = alpha.get(f"/threads/{thread_id}")
    assert (state.status_code, state.json()["status"]) == (200, "corrupt"), state.text
    assert state.json()["corruption"]["first_bad_seq"] == 1
    # The break found is recorded: the raw events page says so too, as every later reader.
    page = alpha.get(f"/threads/{thread_id}/events").json()
    assert (page["corruption"]["first_bad_seq"], page["corruption"]["reason"]) == (1, "payload_changed")
    assert thread_id in [t["thread_id"] for t in alpha.get("/threads").json()["threads"]]
    sound = create_thread_for(api.store, agent(), project="alpha")
    assert alpha.get(f"/threads/{sound}/events").json()["corruption"] is None
    assert beta.get(f"/threads/{thread_id}").status_code == 404
    assert thread_id not in [t["thread_id"] for t in beta.get("/threads").json()["threads"]]
    refused = alpha.post(f"/threads/{thread_id}/inputs", json={"input": "again"})
    assert refused.status_code == 409 and refused.json()["code"] == "thread_corrupt", refused.text


def test_a_call_in_flight_in_the_worker_is_running_everywhere_and_no_surface_offers_to_resolve_it(
        tmp_path: Path) -> None:
    """The call has no receipt yet, so the resolver says ``unknown``; but the worker holds the turn's live claim
    and the server refuses a resolution until it ends. So the thread is ``running`` on every surface, nothing is
    listed as waiting for an operator, and the Studio offers no Resolve form (it offered one, then refused it)."""
    store = SQLiteStore(tmp_path / "api.db")
    api, server = start_api(store, tmp_path, routers=[studio_router()])
    try:
        _in_flight_everywhere(api)
        _in_flight_beside_a_parked_call(api)
    finally:
        api.close()
        server.stop()
        store.close()


def _in_flight_beside_a_parked_call(api: Api) -> None:
    """One call in flight in the worker and one parked: the thread waits for the approval only; the Studio offers
    Approve, never Resolve (it offered Resolve, which the server refused)."""
    operator = api.client("alpha-operator")
    thread_id = new_thread(operator)
    TRANSFER_GATE.clear()
    try:
        operator.post(f"/threads/{thread_id}/inputs", json={"input": "transfer and refund"})

        def both() -> dict[str, Any] | None:
            state: dict[str, Any] = operator.get(f"/threads/{thread_id}").json()
            found = {e["name"]: e["state"] for e in state["effects"].values() if e["kind"] == "tool"}
            return state if found == {"transfer": "unknown", "refund": "parked"} else None

        state = wait_for(both, "the transfer in flight beside the parked refund")
        assert state["status"] == "waiting" and "in progress in api-worker" in state["reason"], state["reason"]
        assert [(w["name"], w["state"]) for w in state["waiting_on"]] == [("refund", "parked")]
        with httpx.Client(base_url=api.url, timeout=20) as browser:
            http_login(browser, api.tokens["alpha-operator"])
            page = browser.get(f"/studio/threads/{thread_id}").text
        assert "/resolve" not in page and "/approve" in page
    finally:
        TRANSFER_GATE.set()


def _in_flight_everywhere(api: Api) -> None:
    operator = api.client("alpha-operator")
    thread_id = new_thread(operator)
    TRANSFER_GATE.clear()
    try:
        operator.post(f"/threads/{thread_id}/inputs", json={"input": "transfer the money"})

        def in_flight() -> dict[str, Any] | None:
            state: dict[str, Any] = operator.get(f"/threads/{thread_id}").json()
            found = [e for e in state["effects"].values() if e["name"] == "transfer" and e["state"] == "unknown"]
            return state if found else None

        state = wait_for(in_flight, "the transfer to be dispatched")
        [effect] = [e for e in state["effects"].values() if e["name"] == "transfer"]
        assert state["status"] == "running" and "in progress in api-worker" in state["reason"], state["reason"]
        assert state["waiting_on"] == [] and state["ownership"]["owner"] == "api-worker"
        with httpx.Client(base_url=api.url, timeout=20) as browser:
            http_login(browser, api.tokens["alpha-operator"])
            page = browser.get(f"/studio/threads/{thread_id}").text
        assert f"/effects/{effect['effect_id']}/resolve" not in page and 'id="unresolved"' not in page
        refused = operator.post(f"/threads/{thread_id}/effects/{effect['effect_id']}/resolve",
                                json={"resolution": "not_occurred", "note": "looked in the ledger"})
        assert refused.status_code == 409 and refused.json()["code"] == "turn_owned", refused.text
    finally:
        TRANSFER_GATE.set()
    done = settled(operator, thread_id, "idle")
    assert [t["status"] for t in done["turns"]] == ["completed"]


def assert_problem(response: httpx.Response, status: int, code: str) -> None:
    assert (response.status_code, response.json().get("code")) == (status, code), response.text


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_an_editor_interrupts_a_turn_the_servers_worker_runs_and_it_ends_at_its_next_step(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """No surface could stop a turn another process ran (``interrupt`` was the owning program's, and ``TurnOwned``
    elsewhere). The interrupt is recorded (here from the Studio, which offers it to editors only); the worker ends
    the turn once its call in flight returned, records that call's receipt, and asks the model nothing more
    (decision 0071)."""
    schema: PostgresSchema | None = None
    if kind == "postgres":
        from jixu.ledger import PostgresStore

        schema = PostgresSchema(request.getfixturevalue("postgres_dsn"))
        store: Store = PostgresStore(schema.url, max_size=8)
    else:
        store = SQLiteStore(tmp_path / "api.db")
    any_api, server = start_api(store, tmp_path, routers=[studio_router()])
    try:
        _interrupted_from_the_studio(any_api)
    finally:
        any_api.close()
        server.stop()
        store.close()
        if schema is not None:
            schema.drop()


def _interrupted_from_the_studio(any_api: Api) -> None:
    editor, viewer = any_api.client("alpha-editor"), any_api.client("alpha-viewer")
    thread_id = new_thread(editor)
    assert_problem(editor.post(f"/threads/{thread_id}/interrupt", json={}), 409, "no_active_turn")
    TRANSFER_GATE.clear()
    try:
        editor.post(f"/threads/{thread_id}/inputs", json={"input": "transfer the money"})

        def in_flight() -> bool:
            state = editor.get(f"/threads/{thread_id}").json()
            return any(e["name"] == "transfer" and e["state"] == "unknown" for e in state["effects"].values())

        wait_for(in_flight, "the transfer to be dispatched")
        assert_problem(viewer.post(f"/threads/{thread_id}/interrupt", json={}), 403, "forbidden")
        with httpx.Client(base_url=any_api.url, timeout=20) as browser:  # the Studio offers it to an editor only
            http_login(browser, any_api.tokens["alpha-viewer"])
            assert "/interrupt" not in browser.get(f"/studio/threads/{thread_id}").text
        with httpx.Client(base_url=any_api.url, timeout=20) as browser:
            http_login(browser, any_api.tokens["alpha-editor"])
            page = browser.get(f"/studio/threads/{thread_id}").text
            assert f'action="/studio/threads/{thread_id}/interrupt"' in page
            asked = browser.post(f"/studio/threads/{thread_id}/interrupt",
                                 data={"csrf_token": csrf_of(page), "reason": "wrong account"})
            assert asked.status_code == 303 and asked.headers["location"].endswith("done=interrupt_requested"), (
                asked.status_code, asked.text[:300])
        shown = editor.get(f"/threads/{thread_id}").json()
        assert shown["status"] == "running" and "asked to interrupt it" in shown["reason"], shown["reason"]
    finally:
        TRANSFER_GATE.set()
    state = wait_for(lambda: (s := editor.get(f"/threads/{thread_id}").json())["status"] != "running" and s,
                     "the turn to end")
    assert state["status"] == "idle", state["reason"]
    events = editor.get(f"/threads/{thread_id}/events", params={"limit": 100}).json()["events"]
    types = [e["type"] for e in events]
    assert types[-3:] == ["turn.interrupt_requested", "tool.completed", "turn.ended"], types
    assert types.count("model.requested") == 1, "the model was asked nothing after the interrupt"
    ended = events[-1]["data"]
    token = any_api.token_ids["alpha-editor"]
    assert ended["outcome"] == "interrupted" and ended["requested_by"] == f"token:{token}", ended
    assert ended["reason"] == f"interrupted by token:{token}: wrong account"
    assert_problem(editor.post(f"/threads/{thread_id}/interrupt", json={}), 409, "no_active_turn")
    with httpx.Client(base_url=any_api.url, timeout=20) as browser:  # nothing to interrupt: nothing offered
        http_login(browser, any_api.tokens["alpha-editor"])
        assert "/interrupt" not in browser.get(f"/studio/threads/{thread_id}").text
