"""A thread page's seq is the seq its status was decided at.

The page's live updates fetch it again when the thread's head moves past its seq. Seen in the suite: the page
loaded the thread (status ``running``), another writer appended the turn's last events, then the page read the
stored head (the later seq) and showed it beside the old status, so no update ever came and the page stayed
``running`` on an idle thread. Here another writer approves the parked call right after the page (and the
``/head`` the page polls) loaded the thread.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from jixu.ledger import SQLiteStore
from jixu.server.studio import views
from jixu.threads.log import ThreadLog
from tests.attacker import Raw
from tests.studio.conftest import http_login
from tests.studio.test_tamper_studio import Served, serve
from tests.tamper_cases import _two_turns, agent, run


@pytest.fixture
def parked(tmp_path: Path) -> Iterator[tuple[Served, str, str]]:
    path = tmp_path / "parked.db"
    with SQLiteStore(path) as store:
        thread_id, _seq = run(lambda: _two_turns(store, Raw(path), "head", last="charge 42"))
        log = ThreadLog.load(store, thread_id)
        assert log.status() == "waiting"
        effect_id = str(store.read(log.stream)[-1].data["effect_id"])
    served = serve(path, agent=agent())
    try:
        yield served, thread_id, effect_id
    finally:
        served.stop()


def page_seq(client: httpx.Client, thread_id: str) -> tuple[int, str]:
    html = client.get(f"/studio/threads/{thread_id}").text
    main = re.search(r'<main[^>]*id="main"[^>]*>', html)
    assert main is not None, html[:500]
    seq, status = re.search(r'data-seq="(\d+)"', main.group(0)), re.search(r'data-status="(\w+)"', main.group(0))
    assert seq is not None and status is not None, main.group(0)
    return int(seq.group(1)), status.group(1)


def head_seq(client: httpx.Client, thread_id: str) -> tuple[int, str]:
    head = client.get(f"/studio/threads/{thread_id}/head").json()
    return int(head["seq"]), str(head["status"])


@pytest.mark.parametrize("read", [page_seq, head_seq], ids=["page", "head"])
def test_the_page_and_its_head_carry_the_seq_of_the_status_they_show(parked: tuple[Served, str, str],
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     read: Any) -> None:
    served, thread_id, effect_id = parked
    info = served.store.stream_info(f"thread/{thread_id}")
    assert info is not None
    waiting_seq = info.head_seq
    real_load = ThreadLog.load
    approvals: list[int] = []

    def load_then_another_writer_approves(*args: Any, **kwargs: Any) -> ThreadLog:
        loaded = real_load(*args, **kwargs)
        if not approvals:  # once: the view's load and another operator's approval race
            other = real_load(served.store, thread_id)
            other.decide_parked(effect_id, "approved", actor="another-operator")
            approvals.append(other.state.seq)
        return loaded

    monkeypatch.setattr(views.ThreadLog, "load", load_then_another_writer_approves)
    with httpx.Client(base_url=served.server.url, timeout=30) as client:
        http_login(client, served.token)
        # Decided before the approval landed, so at that seq: the stream's next head makes the page fetch again.
        assert read(client, thread_id) == (waiting_seq, "waiting")
        assert approvals == [waiting_seq + 1]
        assert read(client, thread_id) == (waiting_seq + 1, "running")  # no worker here: it stays to be run


def test_an_open_page_shows_corrupt_and_drops_its_controls_when_its_history_is_changed_under_it(
        tmp_path: Path, browser: Any) -> None:
    """An event in the middle of a parked thread is changed in the store while its page is open: the head does
    not move, so nothing the page followed changed. Its live updates verify the history every few seconds:
    the page shows ``corrupt`` without Approve or Deny, as a new load of it does."""
    from playwright.sync_api import expect

    from tests.attacker import flip_data_byte
    from tests.studio.test_tamper_studio import log_in, serve

    path = tmp_path / "parked.db"
    with SQLiteStore(path) as store:
        thread_id, _seq = run(lambda: _two_turns(store, Raw(path), "head", last="charge 42"))
    served = serve(path, agent=agent(), stream_recheck_interval=0.3)
    page = browser.new_page()
    try:
        log_in(page, served)
        page.goto(f"{served.studio}/threads/{thread_id}")
        expect(page.locator("#thread-status")).to_contain_text("waiting")
        expect(page.get_by_role("button", name="Approve")).to_have_count(1)
        flip_data_byte(Raw(path), f"thread/{thread_id}", 3)
        expect(page.locator("#thread-status")).to_contain_text("corrupt", timeout=15_000)
        expect(page.get_by_role("button", name="Approve")).to_have_count(0)
        expect(page.get_by_role("button", name="Deny")).to_have_count(0)
    finally:
        page.close()
        served.stop()


def test_the_previous_and_next_links_of_a_state_skip_a_deleted_event(parked: tuple[Served, str, str]) -> None:
    """Event #5 deleted from the store (triggers dropped): the state after #4 links on to #6 and the state after
    #6 back to #4, never to the missing #5 (a 404)."""
    from tests.attacker import delete_event

    served, thread_id, _effect_id = parked
    delete_event(Raw(Path(served.store.url.removeprefix("sqlite:///"))), f"thread/{thread_id}", 5)  # type: ignore[union-attr]
    with httpx.Client(base_url=served.server.url, timeout=30) as client:
        http_login(client, served.token)
        after_4 = client.get(f"/studio/threads/{thread_id}/at/4")
        after_6 = client.get(f"/studio/threads/{thread_id}/at/6")
        assert after_4.status_code == after_6.status_code == 200
        assert re.search(r'href="[^"]*/at/6" rel="next"', after_4.text), after_4.text[:2000]
        assert re.search(r'href="[^"]*/at/4" rel="prev"', after_6.text), after_6.text[:2000]
        assert client.get(f"/studio/threads/{thread_id}/at/5").status_code == 404


def test_an_open_run_page_drops_the_controls_of_a_request_changed_under_it(tmp_path: Path, browser: Any) -> None:
    """The publication request of an open run page is changed in the store: the run's own journal does not
    move, so its status and seq stay. The page's live updates compare its requests' statuses too: it reloads,
    and the request shows corrupt with no Reconcile or Inspect."""
    from playwright.sync_api import expect

    from jixu.cli.studio import fixture_agent, fixture_providers
    from tests.attacker import flip_data_byte
    from tests.studio.test_tamper_studio import log_in, serve
    from tests.tamper_cases import REQUEST_TAMPER_SEQ, run_fixture

    path, fixture = run_fixture(tmp_path)
    served = serve(path, str(fixture["operator_token"]), agent=fixture_agent(), providers=fixture_providers(),
                   workspace_root=fixture["workspace_root"])
    page = browser.new_page()
    try:
        log_in(page, served)
        page.goto(f"{served.studio}/runs/{fixture['publication_run']}")
        request = page.locator(f"#request-{fixture['publication_request']}")
        expect(request.locator("form")).not_to_have_count(0)
        flip_data_byte(Raw(path), f"request/{fixture['publication_request']}", REQUEST_TAMPER_SEQ)
        expect(request.locator(".badge").first).to_have_text("corrupt", timeout=15_000)
        expect(request.locator("form")).to_have_count(0)
    finally:
        page.close()
        served.stop()
