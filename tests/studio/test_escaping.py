"""What agents and users wrote is shown as text: markup in a message never becomes markup in the Studio."""

from __future__ import annotations

from typing import Any

import httpx
from playwright.sync_api import expect

from tests.studio.conftest import Shots, Studio, log_in

PAYLOAD = '<img src=x onerror="document.title=\'pwned\'"><script>document.title="pwned"</script>'


def test_markup_in_a_message_is_shown_as_text(studio: Studio, page: Any, shots: Shots) -> None:
    f = studio.fixture
    api = httpx.Client(base_url=f"{studio.url}/api/v1", headers={"Authorization": f"Bearer {f['operator_token']}"},
                       timeout=30)
    with api:
        created = api.post("/threads", json={"project": f["project"]})
        assert created.status_code == 201, created.text
        thread_id = created.json()["thread_id"]
        assert api.post(f"/threads/{thread_id}/inputs", json={"input": PAYLOAD}).status_code == 202
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    log_in(page, studio, f["operator_token"])
    page.goto(f"{studio.studio}/threads/{thread_id}")
    expect(page.locator("#thread-status")).to_contain_text("idle", timeout=30_000)
    expect(page.locator(".message.role-user")).to_contain_text(PAYLOAD)  # the text itself, visible
    expect(page.locator("main img")).to_have_count(0)
    expect(page.locator("main script")).to_have_count(0)
    assert page.title() != "pwned" and dialogs == []
    shots(page, "escaped")
