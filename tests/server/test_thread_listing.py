"""``GET /threads`` over the store's index of threads by project: what each caller sees, pages, forks, threads made
by the Python API, on SQLite and on PostgreSQL."""

from __future__ import annotations

import httpx

from jixu.scheduling import create_thread_for
from jixu.threads.log import ThreadLog
from tests.server.agents import agent
from tests.server.conftest import Api
from tests.server.test_threads_api import new_thread


def listed(client: httpx.Client, **params: object) -> list[str]:
    answer = client.get("/threads", params=params)
    assert answer.status_code == 200, answer.text
    return [row["thread_id"] for row in answer.json()["threads"]]


def pages(client: httpx.Client, limit: int, **params: object) -> list[list[str]]:
    found: list[list[str]] = []
    after: str | None = None
    while True:
        body = client.get("/threads", params={**params, "limit": limit, **({"after": after} if after else {})}).json()
        found.append([row["thread_id"] for row in body["threads"]])
        after = body["next_after"]
        if after is None:
            return found


def test_each_caller_sees_the_threads_of_its_projects_paged_in_order(any_api: Api) -> None:
    admin = any_api.client("admin")
    alpha = [new_thread(admin, "alpha") for _ in range(5)]
    beta = [new_thread(admin, "beta") for _ in range(3)]
    other = create_thread_for(any_api.store, agent(), project="gamma")
    plain = ThreadLog.create(any_api.store, agent().describe()).thread_id  # no project: "default"
    assert listed(any_api.client("alpha-viewer")) == alpha
    assert listed(any_api.client("beta-operator")) == beta
    assert listed(any_api.client("beta-operator"), project="alpha") == []
    assert listed(admin) == sorted([*alpha, *beta, other, plain])
    assert listed(admin, project="gamma") == [other] and listed(admin, project="default") == [plain]
    assert pages(any_api.client("alpha-viewer"), 2) == [alpha[:2], alpha[2:4], alpha[4:]]
    assert pages(admin, 3, project="alpha") == [alpha[:3], alpha[3:]]
    rows = any_api.client("alpha-viewer").get("/threads").json()["threads"]
    assert {row["project"] for row in rows} == {"alpha"} and all(row["events"] >= 1 for row in rows)


def test_a_fork_is_listed_in_its_parents_project(any_api: Api) -> None:
    editor = any_api.client("alpha-editor")
    parent = new_thread(editor)
    first = editor.get(f"/threads/{parent}/events").json()["events"][0]["id"]
    forked = editor.post(f"/threads/{parent}/fork", json={"at": first})
    assert forked.status_code == 201, forked.text
    child = forked.json()["thread_id"]
    assert set(listed(any_api.client("alpha-viewer"))) == {parent, child}
    assert listed(any_api.client("beta-operator")) == []
