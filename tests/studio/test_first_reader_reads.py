"""The read-only surfaces that answered from the recorded break alone agree with the verdict as first readers.

Seen by an audit: a parked thread with its checkpoint at the head, one byte of event #5 changed, a fresh
server: ``GET /api/v1/threads/{id}/events`` answered ``"corruption": null`` and the Studio's
``/studio/threads/{id}/head`` (what the page polls for live updates) ``status: waiting``, while
``GET /api/v1/threads/{id}`` said ``corrupt`` (first bad seq 5). Both agreed only once another surface had
recorded the break, and went back to the wrong answer once that row was deleted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from jixu.ledger import SQLiteStore
from tests.attacker import Raw, flip_data_byte
from tests.studio.conftest import http_login
from tests.studio.test_tamper_studio import Served, serve
from tests.tamper_cases import _two_turns, agent, run


@pytest.fixture
def tampered(tmp_path: Path) -> Iterator[tuple[Served, str]]:
    path = tmp_path / "parked.db"
    with SQLiteStore(path) as store:
        thread_id, checkpoint_seq = run(lambda: _two_turns(store, Raw(path), "head", last="charge 42"))
    assert checkpoint_seq is not None and checkpoint_seq > 5
    flip_data_byte(Raw(path), f"thread/{thread_id}", 5)
    served = serve(path, agent=agent())
    try:
        yield served, thread_id
    finally:
        served.stop()


def _reads(served: Served, thread_id: str) -> tuple[object, object]:
    api = httpx.Client(base_url=f"{served.server.url}/api/v1", headers={"Authorization": f"Bearer {served.token}"})
    web = httpx.Client(base_url=served.server.url, headers={"Origin": served.server.url})
    http_login(web, served.token)
    events = api.get(f"/threads/{thread_id}/events", params={"limit": 1}).json()["corruption"]
    head = web.get(f"/studio/threads/{thread_id}/head").json()["status"]
    return events, head


def test_events_and_the_studio_head_say_corrupt_as_first_readers(tampered: tuple[Served, str]) -> None:
    served, thread_id = tampered
    corruption, status = _reads(served, thread_id)
    assert isinstance(corruption, dict) and (corruption["first_bad_seq"], corruption["reason"]) == (
        5, "payload_changed")
    assert status == "corrupt"


def test_they_still_say_corrupt_once_the_recorded_break_is_deleted(tampered: tuple[Served, str]) -> None:
    served, thread_id = tampered
    _reads(served, thread_id)  # the break is recorded now
    with Raw(served.store.path).transaction() as sql:
        sql("DELETE FROM jixu_checkpoints WHERE stream = ? AND name = 'jixu/verdict'", f"thread/{thread_id}")
    corruption, status = _reads(served, thread_id)
    assert isinstance(corruption, dict) and corruption["first_bad_seq"] == 5
    assert status == "corrupt"
