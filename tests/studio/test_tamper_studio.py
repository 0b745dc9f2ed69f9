"""Issue 22's tamper matrix in the Studio, in headless Chromium: corrupt is shown, no control is offered, the
first bad event is marked and linked; a forged checkpoint is reported and never shown as the thread's state.

Threads: the cases of tests/tamper_cases.py (seven kinds x checkpoint none / head / middle, and a checkpoint
edited naively or forged) in one tampered SQLite file, served by a real uvicorn server with the Studio. Runs
and execution requests: each tampered copy of the Studio fixture's store, served likewise. Also issue 22.3: a
parked thread whose history was changed offers no Approve, and posting one anyway (Studio or API) is refused
while the server's worker, woken, runs nothing.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from jixu.ledger import SQLiteStore, Store
from jixu.scheduling import WorkerConfig
from jixu.server import create_app, create_token
from jixu.server.background import BackgroundWorker
from jixu.server.studio import studio_router
from tests.attacker import KINDS, Raw, flip_data_byte
from tests.server.conftest import LiveServer
from tests.studio.conftest import WAIT, Shots, csrf_of, http_login
from tests.tamper_cases import (
    CHECKPOINT_EDITS,
    FORGED_TEXT,
    PLACEMENTS,
    PROJECT,
    TAMPER_SEQ,
    TOOL_CALLS,
    Case,
    RunCase,
    _two_turns,
    agent,
    copy_store,
    run,
    run_cases,
    run_fixture,
    tamper_cases,
)

THREADS = [f"{kind}-{placement}" for placement in PLACEMENTS for kind in KINDS] + [
    f"{edit}-{placement}" for placement in PLACEMENTS if placement != "none" for edit in CHECKPOINT_EDITS]
RUNS = [f"{kind}-{place}" for place in ("none", "head", "middle", "request") for kind in KINDS]
CONTROLS = ("/inputs", "/resolve", "/approve", "/deny")


class Served:
    def __init__(self, store: Store, server: LiveServer, token: str, worker: BackgroundWorker | None = None) -> None:
        self.store, self.server, self.token, self.worker = store, server, token, worker

    @property
    def studio(self) -> str:
        return f"{self.server.url}/studio"

    def stop(self) -> None:
        self.server.stop()
        self.store.close()


def serve(path: Path, token: str | None = None, *, worker: bool = False, **app: Any) -> Served:
    """A real server (API + Studio) over ``path``; an operator token of ``PROJECT`` unless ``token``."""
    store = SQLiteStore(path)
    if token is None:
        _info, token = create_token(store, "op", roles={PROJECT: "operator"}, actor="test")
    background = None
    lifespan = []
    if worker:
        config = WorkerConfig(store_url=store.url or "", agent="tests.tamper_cases:agent", owner="studio-worker",
                              poll_interval=0.02, quiet=True, drain_timeout=2)
        background = BackgroundWorker(store, config, agent=agent())
        lifespan = [background.lifespan]
    server = LiveServer(create_app(store, routers=[studio_router()], lifespan=lifespan, **app))
    server.start()
    return Served(store, server, token, background)


def log_in(page: Any, served: Served) -> None:
    page.goto(f"{served.studio}/login")
    page.get_by_label("Bearer token").fill(served.token)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(re.compile(r".*/studio/threads$"))


def forms(page: Any) -> list[str]:
    return [str(a) for a in page.locator("form").evaluate_all("fs => fs.map(f => f.getAttribute('action'))")]


@pytest.fixture(scope="module")
def threads(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, dict[str, Case]]]:
    base = tmp_path_factory.mktemp("studio-matrix")
    path = base / "matrix.db"
    with SQLiteStore(path) as store:
        cases = {case.name: case for case in tamper_cases(store, path)}
    served = serve(copy_store(path, base / "served.db"), agent=agent())
    try:
        yield served, cases
    finally:
        served.stop()


class OperatorPage:
    """One browser page for all the cases of this module (a new context starts a renderer: ~1 s a case),
    logged in to whichever server a case serves."""

    def __init__(self, page: Any) -> None:
        self.page, self.server = page, ""

    def on(self, served: Served) -> Any:
        if self.server != served.server.url:
            self.page.context.clear_cookies()
            log_in(self.page, served)
            self.server = served.server.url
        return self.page


@pytest.fixture(scope="module")
def operator(browser: Any) -> Iterator[OperatorPage]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(WAIT * 1000)
    try:
        yield OperatorPage(context.new_page())
    finally:
        context.close()


@pytest.mark.parametrize("name", THREADS)
def test_a_tampered_thread_page_shows_corrupt_offers_nothing_and_marks_the_first_bad_event(
        threads: tuple[Served, dict[str, Case]], operator: OperatorPage, shots: Shots, name: str) -> None:
    served, cases = threads
    case = cases[name]
    page = operator.on(served)
    page.goto(f"{served.studio}/threads/{case.thread_id}")
    status = page.locator("#thread-status .badge").first
    actions = forms(page)
    if not case.corrupt:
        assert status.inner_text() == "idle"
        assert "checkpoint forged" in page.locator("#chain").inner_text()
        assert FORGED_TEXT not in page.content()
        assert any(a.endswith("/inputs") for a in actions)
        shots(page, "forged-checkpoint")
        return
    assert status.inner_text() == "corrupt"
    assert page.locator("#corrupt").is_visible()
    assert not [a for a in actions if a.endswith(CONTROLS)], actions
    seqs = [int(s) for s in page.locator("li.event").evaluate_all("ls => ls.map(l => l.id.slice(6))")]
    marked = min(s for s in seqs if s >= (case.expected_seq or 0))
    link = page.locator("#first-bad-link")
    assert link.get_attribute("href") == f"#event-{marked}"
    assert f"#{case.expected_seq}" in link.inner_text()
    assert case.expected_reason in page.locator("#chain").inner_text()
    bad = page.locator("li.event.bad")
    assert bad.count() == 1 and bad.get_attribute("id") == f"event-{marked}"
    assert f"first bad event: {case.expected_reason}" in bad.inner_text()
    forks = page.locator("a.fork-link").count()  # forking is offered on the state at each sound event
    assert forks == len([s for s in seqs if s < (case.sound_before or 0)]), (forks, seqs)
    link.click()
    page.wait_for_url(re.compile(rf".*#event-{marked}$"))
    shots(page, "corrupt")


def test_the_thread_list_says_corrupt_for_every_tampered_thread(threads: tuple[Served, dict[str, Case]],
                                                                page: Any) -> None:
    served, cases = threads
    log_in(page, served)
    page.goto(f"{served.studio}/threads")
    for case in cases.values():
        row = page.locator("tr", has=page.locator(f"a[href$='/threads/{case.thread_id}']"))
        assert row.locator(".badge").first.inner_text() == ("corrupt" if case.corrupt else "idle"), case.name


# --- issue 22.3: a parked thread changed in the store; the server's worker is running ---------------------


@pytest.fixture
def parked(tmp_path: Path) -> Iterator[tuple[Served, str, str]]:
    """A thread waiting for approval of ``charge_card`` and an idle one, both with event #5 changed, served with
    the worker running."""
    path = tmp_path / "parked.db"
    with SQLiteStore(path) as store:
        waiting, _seq = run(lambda: _two_turns(store, Raw(path), "head", last="charge 42"))
        idle, _seq = run(lambda: _two_turns(store, Raw(path), "head"))
    for thread_id in (waiting, idle):
        flip_data_byte(Raw(path), f"thread/{thread_id}", TAMPER_SEQ)
    served = serve(path, worker=True, agent=agent())
    try:
        yield served, waiting, idle
    finally:
        served.stop()


def test_a_tampered_parked_thread_offers_no_approval_and_nothing_runs(parked: tuple[Served, str, str],
                                                                      page: Any, shots: Shots) -> None:
    served, waiting, idle = parked
    calls = len(TOOL_CALLS)
    before = {t: [(e.seq, e.hash) for e in served.store.read(f"thread/{t}")] for t in (waiting, idle)}
    log_in(page, served)
    page.goto(f"{served.studio}/threads/{waiting}")
    assert page.locator("#thread-status .badge").first.inner_text() == "corrupt"
    assert page.get_by_role("button", name=re.compile("Approve|Deny")).count() == 0
    shots(page, "parked-corrupt")
    effect = str(served.store.read(f"thread/{waiting}")[-1].data.get("effect_id"))
    with httpx.Client(base_url=served.server.url, timeout=30, follow_redirects=False) as client:
        http_login(client, served.token)
        html = client.get(f"/studio/threads/{waiting}").text
        refused = client.post(f"/studio/threads/{waiting}/effects/{effect}/approve",
                              data={"csrf_token": csrf_of(html), "note": "go"})
        assert refused.status_code == 303  # Post/Redirect/Get: the 409 is shown on the thread's page
        assert "409: thread_corrupt" in client.get(refused.headers["location"]).text
        sent = client.post(f"/studio/threads/{idle}/inputs", data={"csrf_token": csrf_of(html), "input": "refund 42"})
        assert sent.status_code == 303 and "409: thread_corrupt" in client.get(sent.headers["location"]).text
    api = httpx.Client(base_url=f"{served.server.url}/api/v1", timeout=30,
                       headers={"Authorization": f"Bearer {served.token}"})
    with api:
        answer = api.post(f"/threads/{waiting}/effects/{effect}/approve", json={})
        assert answer.status_code == 409 and answer.json()["first_bad_seq"] == TAMPER_SEQ
        assert api.post(f"/threads/{idle}/inputs", json={"input": "refund 42"}).status_code == 409
    # Wake the worker on both anyway: it opens them, finds them corrupt and runs nothing.
    for thread_id in (waiting, idle):
        served.store.enqueue(f"thread/{thread_id}", PROJECT)
    deadline = time.monotonic() + 30
    while any((item := served.store.get_work(f"thread/{t}")) is None or item.state != "done"
              for t in (waiting, idle)):
        assert time.monotonic() < deadline, "the worker did not take the items"
        time.sleep(0.05)
    assert TOOL_CALLS[calls:] == []
    assert {t: [(e.seq, e.hash) for e in served.store.read(f"thread/{t}")] for t in (waiting, idle)} == before


# --- runs and execution requests ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run_matrix(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunCase]:
    base = tmp_path_factory.mktemp("studio-runs")
    path, fixture = run_fixture(base)
    return {case.name: case for case in run_cases(base, path, fixture)}


@pytest.mark.parametrize("name", RUNS)
def test_a_tampered_run_or_request_page_shows_corrupt_and_offers_nothing(run_matrix: dict[str, RunCase],
                                                                         operator: OperatorPage, shots: Shots,
                                                                         name: str) -> None:
    from jixu.cli.studio import fixture_agent, fixture_providers

    case = run_matrix[name]
    served = serve(case.path, str(case.fixture["operator_token"]), agent=fixture_agent(),
                   providers=fixture_providers(), workspace_root=case.fixture["workspace_root"])
    try:
        page = operator.on(served)
        page.goto(f"{served.studio}/runs/{case.run_id}")
        if case.placement == "request":
            request = page.locator(f"#request-{case.request_id}")
            assert request.locator(".badge").first.inner_text() == "corrupt"
            assert f"first bad event #{case.expected_seq}" in request.inner_text()
            assert request.locator("form").count() == 0
            shots(page, "request-corrupt")
            return
        assert page.locator("#run-status .badge").first.inner_text() == "corrupt"
        assert page.locator("#corrupt").is_visible()
        actions = forms(page)
        assert not [a for a in actions if a.endswith(("/resume", "/handoff", "/retry", "/cancel", "/reconcile",
                                                      "/inspect", "/resolve"))], actions
        seqs = [int(s) for s in page.locator("li.event").evaluate_all("ls => ls.map(l => l.id.slice(6))")]
        marked = min(s for s in seqs if s >= case.expected_seq)
        link = page.locator("#first-bad-link")
        assert link.get_attribute("href") == f"#entry-{marked}" and f"#{case.expected_seq}" in link.inner_text()
        bad = page.locator("li.event.bad")
        assert bad.count() == 1 and bad.get_attribute("id") == f"entry-{marked}"
        assert case.expected_reason in page.locator("#journal-validity").inner_text()
        shots(page, "run-corrupt")
    finally:
        served.stop()


def test_a_threads_changed_project_moves_it_in_no_list(tmp_path: Path) -> None:
    """Seen by an audit: the Studio's list took a thread's project from its first event unverified, so one whose
    ``metadata.project`` was changed from alpha to beta was listed to beta's viewers and hidden from alpha's, while
    the API kept it in alpha. Both now take it from one place (``project_of_stream``)."""
    from jixu import Harness
    from tests.server.agents import agent as api_agent

    path = tmp_path / "moved.db"
    store = SQLiteStore(path)

    async def make() -> str:
        harness = Harness(api_agent(), store, owner="maker")
        thread = await harness.create_thread(metadata={"project": "alpha"})
        await thread.send("hello")
        await thread.wait()
        return thread.thread_id

    thread_id = run(make)
    _, alpha = create_token(store, "alpha-viewer", roles={"alpha": "viewer"}, actor="test")
    _, beta = create_token(store, "beta-viewer", roles={"beta": "viewer"}, actor="test")
    with Raw(path).transaction() as sql:
        sql("UPDATE jixu_events SET data = replace(data, '\"project\":\"alpha\"', '\"project\":\"beta\"'), "
            "meta = replace(meta, '\"project\":\"alpha\"', '\"project\":\"beta\"') WHERE stream = ? AND seq = 1",
            f"thread/{thread_id}")
    server = LiveServer(create_app(store, routers=[studio_router()]))
    server.start()
    try:
        for token, listed in ((alpha, True), (beta, False)):
            with httpx.Client(base_url=server.url, timeout=WAIT) as client:
                http_login(client, token)
                page = client.get("/studio/threads")
                assert page.status_code == 200
                assert (thread_id in page.text) is listed, "the Studio lists a thread to the API's project only"
                api = client.get(f"/api/v1/threads/{thread_id}", headers={"Authorization": f"Bearer {token}"})
                assert (api.status_code == 200) is listed
                if listed:
                    assert api.json()["status"] == "corrupt"
    finally:
        server.stop()
        store.close()
