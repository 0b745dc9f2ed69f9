"""Who may do what: a viewer sees no mutation control and its hand-crafted posts are refused (403); posts
without this session's CSRF token, or from another site, are refused; the session cookie is HttpOnly and
SameSite=Strict. Each refusal leaves the ledger as it was."""

from __future__ import annotations

import re
from typing import Any

import httpx
from playwright.sync_api import expect

from tests.studio.conftest import Shots, Studio, csrf_of, http_login, log_in

MUTATIONS = ("Record resolution", "Approve", "Deny", "Fork at", "Send", "Resume run", "Hand off run",
             "Retry as a new run", "Cancel run", "Reconcile from evidence")


def _pages(studio: Studio) -> list[str]:
    f = studio.fixture
    return [f"{studio.studio}/threads", f"{studio.studio}/threads/{f['unknown_thread']}",
            f"{studio.studio}/threads/{f['parked_thread']}", f"{studio.studio}/runs",
            f"{studio.studio}/runs/{f['failed_check_run']}", f"{studio.studio}/runs/{f['publication_run']}"]


def test_a_viewer_sees_every_page_but_no_mutation_control(studio: Studio, page: Any, shots: Shots) -> None:
    log_in(page, studio, studio.fixture["viewer_token"])
    for number, url in enumerate(_pages(studio)):
        page.goto(url)
        expect(page.locator("h1")).to_be_visible()
        # The only form a viewer may post is "Log out" in the header; the page itself has none (the threads
        # list's filters are a GET form: they change nothing).
        expect(page.locator("main form[method=post]")).to_have_count(0)
        expect(page.locator("main form:not([method=get]) :is(button, textarea, select, input)")).to_have_count(0)
        for name in MUTATIONS:
            expect(page.get_by_role("button", name=re.compile(name))).to_have_count(0)
        shots(page, f"viewer-{number}")
    # The viewer is told who can act instead.
    page.goto(_pages(studio)[1])
    expect(page.locator("#unresolved")).to_contain_text("An operator of studio-demo must resolve this")
    expect(page.locator("#unresolved .badge", has_text="unknown")).to_be_visible()
    page.goto(_pages(studio)[5])
    expect(page.locator("#requests")).to_contain_text("An operator of studio-demo must reconcile this")


def _followed(client: httpx.Client, response: httpx.Response) -> str:
    """The page a refused post's 303 leads to (Post/Redirect/Get: refusals are shown on a GET page)."""
    assert response.status_code == 303, (response.status_code, response.text[:300])
    return client.get(response.headers["location"]).text


def _status(client: httpx.Client, studio: Studio) -> tuple[str, str]:
    f = studio.fixture
    thread = client.get(f"/studio/threads/{f['unknown_thread']}/head").json()
    run = client.get(f"/studio/runs/{f['failed_check_run']}/head").json()
    return thread["status"], run["status"]


def test_hand_crafted_posts_from_a_viewer_are_refused(studio: Studio) -> None:
    f = studio.fixture
    with studio.http() as client:
        http_login(client, f["viewer_token"])
        page = client.get(f"/studio/threads/{f['unknown_thread']}")
        assert page.status_code == 200
        csrf = csrf_of(page.text)  # the viewer's own, valid CSRF token: the role alone must refuse
        before = _status(client, studio)
        thread = f"/studio/threads/{f['unknown_thread']}"
        effect = client.get(f"/api/v1/threads/{f['unknown_thread']}",
                            headers={"Authorization": f"Bearer {f['operator_token']}"}).json()["waiting_on"][0]
        posts = {
            f"{thread}/effects/{effect['effect_id']}/resolve": {"resolution": "not_occurred", "note": "forged",
                                                                "resolution_id": "a" * 32},
            f"/studio/threads/{f['parked_thread']}/effects/x/approve": {"note": "forged"},
            f"{thread}/fork": {"at": "01M8N81D1HCQS9P2AD6DDMB3BQ"},
            f"/studio/runs/{f['failed_check_run']}/resume": {},
            f"/studio/runs/{f['failed_check_run']}/cancel": {"reason": "forged"},
            f"/studio/runs/{f['failed_check_run']}/handoff": {"agent": "fixture-agent"},
            f"/studio/runs/{f['publication_run']}/requests/{f['publication_request']}/reconcile":
                {"reconciliation_id": "b" * 32},
        }
        for path, form in posts.items():
            redirected = client.post(path, data={**form, "csrf_token": csrf})
            assert redirected.status_code == 303, (path, redirected.status_code, redirected.text[:300])
            refused = client.get(redirected.headers["location"])  # Post/Redirect/Get: the refusal on a page
            assert "403: forbidden" in refused.text, (path, refused.text[:300])
            assert "Refused (403): nothing was changed." in refused.text
            assert "needs the" in refused.text  # the API's own explanation: which role it needs
        assert _status(client, studio) == before == ("waiting", "paused")


def test_posts_without_the_csrf_token_or_from_another_site_are_refused(studio: Studio) -> None:
    f = studio.fixture
    resume = f"/studio/runs/{f['failed_check_run']}/resume"
    with studio.http() as client:
        login = client.post("/studio/login", data={"token": f["operator_token"], "next": "/studio/runs"})
        cookie = login.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/studio" in cookie
        csrf = csrf_of(client.get(f"/studio/runs/{f['failed_check_run']}").text)
        before = _status(client, studio)
        for form in ({}, {"csrf_token": ""}, {"csrf_token": "0" * 64}, {"csrf_token": csrf[:-1] + ("1" if csrf.endswith("0") else "0")}):
            refused = _followed(client, client.post(resume, data=form))
            assert "403: forbidden" in refused, form
            assert "no valid CSRF token" in refused
        elsewhere = client.post(resume, data={"csrf_token": csrf}, headers={"Origin": "https://evil.example"})
        assert "403: forbidden" in _followed(client, elsewhere) and "posted from another site" in _followed(client, elsewhere)
        # Another session's token is not this session's.
        with studio.http() as other:
            http_login(other, f["viewer_token"])
            theirs = csrf_of(other.get("/studio/threads").text)
        assert theirs != csrf
        assert "403: forbidden" in _followed(client, client.post(resume, data={"csrf_token": theirs}))
        assert _status(client, studio) == before == ("waiting", "paused")
    with studio.http() as anonymous:
        gone = anonymous.post(resume, data={"csrf_token": csrf})
        assert gone.status_code == 303 and gone.headers["location"].startswith("/studio/login?next=")
        redirected = anonymous.get(f"/studio/runs/{f['failed_check_run']}")
        assert redirected.status_code == 303 and redirected.headers["location"].startswith("/studio/login?next=")
        assert anonymous.get(f"/studio/runs/{f['failed_check_run']}/head").status_code == 401
        bad = anonymous.post("/studio/login", data={"token": "jixu_not-a-token"})
        assert bad.status_code == 303 and "set-cookie" not in bad.headers
        assert 'role="alert" id="login-error"' in anonymous.get(bad.headers["location"]).text


def test_pages_send_a_strict_content_security_policy(studio: Studio) -> None:
    with studio.http() as client:
        http_login(client, studio.fixture["operator_token"])
        page = client.get("/studio/threads")
        policy = page.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy and "form-action 'self'" in policy
        assert "<script>" not in page.text  # no inline script: only /studio/static/studio.js
        assert client.get("/studio/static/studio.js").headers["content-type"].startswith("text/javascript")
        assert client.get("/studio/static/../app.py").status_code == 404


def test_the_server_refuses_a_resolution_without_a_note(studio: Studio) -> None:
    f = studio.fixture
    with studio.http() as client:
        http_login(client, f["operator_token"])
        page = client.get(f"/studio/threads/{f['unknown_thread']}")
        effect = re.search(r'/effects/(\w{26})/resolve"', page.text)
        assert effect is not None
        for note in ("", "   "):
            refused = client.post(f"/studio/threads/{f['unknown_thread']}/effects/{effect.group(1)}/resolve",
                                  data={"csrf_token": csrf_of(page.text), "resolution": "not_occurred", "note": note})
            shown = _followed(client, refused)
            assert "422: invalid_input" in shown and "Note: this field is required" in shown
        assert _status(client, studio)[0] == "waiting"
