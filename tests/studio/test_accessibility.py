"""Accessibility basics in Chromium: every control on every page has an accessible name (as the browser's
accessibility tree computes it), and the pages work from the keyboard alone."""

from __future__ import annotations

import re
from typing import Any

from playwright.sync_api import expect

from tests.studio.conftest import Shots, Studio, log_in

CONTROLS = "input:not([type=hidden]), select, textarea, button, a[href]"
NAMED = re.compile(r"\S")


def _pages(studio: Studio) -> list[str]:
    f = studio.fixture
    return [f"{studio.studio}/threads", f"{studio.studio}/threads/{f['unknown_thread']}",
            f"{studio.studio}/threads/{f['parked_thread']}", f"{studio.studio}/runs",
            f"{studio.studio}/runs/{f['failed_check_run']}", f"{studio.studio}/runs/{f['publication_run']}"]


def _assert_every_control_is_named(page: Any) -> int:
    # Open every disclosure first: a control in a closed <details> is outside the accessibility tree until then.
    page.evaluate("document.querySelectorAll('details').forEach(d => { d.open = true; })")
    controls = page.locator(CONTROLS)
    count = controls.count()
    for index in range(count):
        control = controls.nth(index)
        expect(control, f"control {index} of {page.url}: {control.evaluate('e => e.outerHTML')[:200]}") \
            .to_have_accessible_name(NAMED)
    # Every form field has a <label> tied to it (not only a placeholder or a title).
    unlabelled = page.evaluate("""() => [...document.querySelectorAll('input:not([type=hidden]), select, textarea')]
        .filter(e => !e.labels || e.labels.length === 0).map(e => e.outerHTML)""")
    assert unlabelled == [], unlabelled
    return int(count)


def test_every_control_has_an_accessible_name(studio: Studio, page: Any, shots: Shots) -> None:
    errors: list[str] = []  # the page's own Content-Security-Policy refused its icon on every load
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.goto(f"{studio.studio}/login")
    assert _assert_every_control_is_named(page) >= 3
    expect(page.get_by_label("Bearer token")).to_be_editable()
    log_in(page, studio, studio.fixture["operator_token"])
    seen = 0
    for url in _pages(studio):
        page.goto(url)
        expect(page.locator("html")).to_have_attribute("lang", "en")
        expect(page.locator("h1")).to_have_count(1)
        seen += _assert_every_control_is_named(page)
    assert seen > 40  # the operator's pages are full of controls: all of them were checked
    assert errors == [], errors
    # The resolution controls are reachable by their labels, as a screen reader announces them.
    page.goto(_pages(studio)[1])
    panel = page.locator("#unresolved")
    for label in ("It occurred", "It did not occur"):
        expect(panel.get_by_label(label)).to_have_attribute("type", "radio")
    expect(panel.get_by_label("Reason for abandoning (required)")).to_have_attribute("required", "")  # 2nd step
    expect(panel.get_by_role("group", name=re.compile("What happened to charge_card"))).to_be_visible()
    expect(panel.get_by_label(re.compile("Note \\(required\\)"))).to_have_attribute("required", "")
    shots(page, "operator-thread")


def _tab_to(page: Any, name: str, limit: int = 200) -> None:
    """Press Tab until the focused element's accessible text is ``name`` (fail after ``limit`` presses)."""
    for _ in range(limit):
        page.keyboard.press("Tab")
        focused = page.evaluate("""() => { const e = document.activeElement;
            return e ? (e.labels && e.labels.length ? e.labels[0].textContent : e.textContent).trim() : ''; }""")
        if focused == name:
            return
    raise AssertionError(f"Tab never reached {name!r}")


def test_the_pages_work_from_the_keyboard(studio: Studio, page: Any, shots: Shots) -> None:
    f = studio.fixture
    page.goto(f"{studio.studio}/login")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    _tab_to(page, "Bearer token")
    page.keyboard.type(f["operator_token"])
    _tab_to(page, "Log in")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r".*/studio/threads$"))

    # Follow a link with Enter, then approve the parked call with Space, never touching the mouse.
    _tab_to(page, f["parked_thread"])
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(f".*/threads/{f['parked_thread']}$"))
    _tab_to(page, "Approval note (optional)")
    page.keyboard.type("Order 1002 was returned; refund approved.")
    _tab_to(page, "Approve refund")
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline != "none", "the focused control must show a focus ring"
    shots(page, "keyboard-focus-approve")
    page.keyboard.press("Space")
    expect(page.get_by_role("status").first).to_contain_text("Approved")
    expect(page.locator("#thread-status")).to_contain_text("idle", timeout=30_000)
    expect(page.locator(".effect-card", has_text="refund").locator(".badge")).to_have_text("completed")
    shots(page, "keyboard-approved")
