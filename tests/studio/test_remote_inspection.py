"""After a reconciliation without proof, the operator asks the provider from the run page (read-only, the
finding kept in the request): the origin holds the admitted commit, so that evidence settles the request by
itself (the inspection is the probe, decision 0028); no operator's word is needed or offered. Real Chromium."""

from __future__ import annotations

from typing import Any

from playwright.sync_api import expect

from tests.studio.conftest import Shots, Studio, log_in


def test_operator_inspects_the_provider_and_its_evidence_settles_the_publication(studio: Studio, page: Any,
                                                                                 shots: Shots) -> None:
    fixture = studio.fixture
    log_in(page, studio, fixture["operator_token"])
    page.goto(f"{studio.studio}/runs/{fixture['publication_run']}")
    request = page.locator(f"#request-{fixture['publication_request']}")
    expect(request.locator(".badge", has_text="needs_reconciliation")).to_be_visible()
    expect(request.get_by_role("button", name="Record resolution")).to_have_count(0)  # inspect first
    with page.expect_response(lambda r: r.url.endswith("/inspect")) as posted:
        request.get_by_role("button", name="Inspect the provider (read-only)").click()
    assert posted.value.status == 303
    request = page.locator(f"#request-{fixture['publication_request']}")
    shown = request.get_by_label(f"What the provider showed for request {fixture['publication_request']}")
    expect(shown).to_contain_text("remote_commit")  # the branch the lost answer pushed is on the origin
    expect(request.locator(".badge", has_text="succeeded")).to_be_visible()  # settled by the evidence
    expect(request).to_contain_text("probe:")  # by whom: the provider's inspection, not an operator
    expect(request.get_by_role("button", name="Record resolution")).to_have_count(0)
    expect(request.get_by_role("button", name="Inspect the provider (read-only)")).to_have_count(0)
    shots(page, "settled-by-evidence")
