"""The operator's walkthrough in real Chromium: log in, resolve the unknown effect and watch the thread go on,
then open the runs: the failed check, the unresolved publication (reconciling it without proof is a 409,
explained on the page) and resuming the paused run until it succeeds."""

from __future__ import annotations

import re
from typing import Any

from playwright.sync_api import expect

from tests.studio.conftest import Shots, Studio, log_in


def test_operator_resolves_the_unknown_effect_and_the_thread_continues(studio: Studio, page: Any,
                                                                        shots: Shots) -> None:
    fixture = studio.fixture
    page.goto(studio.studio)
    expect(page).to_have_url(re.compile(r".*/studio/login\?next="))
    shots(page, "login")
    log_in(page, studio, fixture["operator_token"])

    # Threads list: status, why each waits, lineage.
    rows = page.locator("tbody tr")
    expect(rows).to_have_count(2)
    unknown_row = rows.filter(has_text=fixture["unknown_thread"])
    expect(unknown_row).to_contain_text("waiting")
    expect(unknown_row).to_contain_text("charge_card")
    expect(unknown_row.locator("td.status-cell .badge")).to_have_text("unknown")  # what it needs, first
    expect(rows.first).to_contain_text(fixture["unknown_thread"])  # an unknown outcome leads the list
    parked_row = rows.filter(has_text=fixture["parked_thread"])
    expect(parked_row.locator("td.status-cell .badge")).to_have_text("parked")
    shots(page, "threads")

    page.get_by_role("link", name=fixture["unknown_thread"]).click()
    expect(page.locator("#chain")).to_contain_text("chain valid")
    expect(page.locator("#thread-status")).to_contain_text("waiting")
    panel = page.locator("#unresolved")
    expect(panel.locator(".badge", has_text="unknown")).to_be_visible()
    expect(page.locator(".timeline li.event")).to_have_count(9)  # every event, in order
    expect(page.locator(".timeline li.event").first).to_contain_text("thread.created")
    shots(page, "thread-waiting")

    # The note is required: the browser refuses to submit without it.
    panel.get_by_label("It did not occur").check()
    panel.get_by_role("button", name="Record resolution").click()
    expect(page.locator("#unresolved")).to_be_visible()
    assert page.evaluate("document.querySelector('#unresolved textarea').validity.valueMissing")

    panel.get_by_label(re.compile("Note \\(required\\)")).fill("Checked the gateway's dashboard: no charge.")
    with page.expect_response(lambda r: r.url.endswith("/resolve")) as posted:
        panel.get_by_role("button", name="Record resolution").click()
    assert posted.value.status == 303
    expect(page.get_by_role("status").first).to_contain_text("Resolution recorded")

    # The in-process worker continues the thread; the page follows by itself (live updates).
    expect(page.locator("#thread-status")).to_contain_text("idle", timeout=30_000)
    expect(page.locator("#last-reply")).to_contain_text("Done: the operator's decision is recorded")
    expect(page.locator("#unresolved")).to_have_count(0)
    card = page.locator(".effect-card", has_text="charge_card")
    expect(card).to_contain_text("Resolved as not_occurred")
    expect(card).to_contain_text("Checked the gateway's dashboard")
    expect(page.locator(".timeline li.event", has_text="tool.outcome_resolved")).to_have_count(1)
    expect(page.locator("#chain")).to_contain_text("chain valid")
    shots(page, "thread-continued")


def test_operator_reconciles_without_proof_and_resumes_the_failed_check_run(studio: Studio, page: Any,
                                                                             shots: Shots) -> None:
    fixture = studio.fixture
    log_in(page, studio, fixture["operator_token"])
    page.get_by_role("link", name="Runs").click()
    expect(page.locator("tbody tr")).to_have_count(2)
    expect(page.locator("tbody tr", has_text=fixture["failed_check_run"])).to_contain_text("paused")
    expect(page.locator("tbody tr", has_text=fixture["publication_run"])).to_contain_text("succeeded")
    shots(page, "runs")

    # The succeeded run's publication lost its answer: needs reconciliation; without proof the server says 409.
    page.get_by_role("link", name=fixture["publication_run"]).click()
    request = page.locator(f"#request-{fixture['publication_request']}")
    expect(request.locator(".badge", has_text="needs_reconciliation")).to_be_visible()
    expect(request).to_contain_text("the origin hung up before confirming the push")
    expect(page.get_by_role("button", name="Resume run")).to_have_count(0)  # a succeeded run is not resumed
    generated = request.get_by_label("Reconciliation id (generated)").input_value()
    assert re.fullmatch(r"[0-9a-f]{32}", generated)
    shots(page, "run-publication")
    with page.expect_response(lambda r: r.url.endswith("/reconcile")) as posted:
        request.get_by_role("button", name="Reconcile from evidence").click()
    assert posted.value.status == 303  # Post/Redirect/Get: the 409 is shown on the run's page, a GET
    page.wait_for_url(re.compile(r".*/studio/runs/\w{26}\?flash=[\w-]+$"))
    alert = page.get_by_role("alert")
    expect(alert).to_contain_text("409: no proof, the request stays unknown")
    expect(alert).to_contain_text("nothing was called, nothing was repeated")
    expect(alert).to_contain_text("journal_receipt")  # what the server checked
    request = page.locator(f"#request-{fixture['publication_request']}")
    expect(request.locator(".finding")).to_contain_text(f"Last reconciliation {generated}: no proof")
    expect(request.locator(".badge", has_text="needs_reconciliation")).to_be_visible()
    shots(page, "run-reconcile-409")

    # The run whose check failed: the evidence, then resume; the worker repairs it and the checks pass.
    page.goto(f"{studio.studio}/runs/{fixture['failed_check_run']}")
    checks = page.locator("#failed-checks")
    expect(checks).to_contain_text("exit status 1")
    expect(checks.locator("pre.output")).to_contain_text("FAIL: FIXED is missing")
    expect(page.locator("#run-status")).to_contain_text("quota")
    expect(page.locator("#journal-validity")).to_contain_text("journal valid")
    expect(page.get_by_role("button", name="Retry as a new run")).to_have_count(0)  # only for failed runs
    shots(page, "run-failed-check")
    with page.expect_response(lambda r: r.url.endswith("/resume")) as posted:
        page.get_by_role("button", name="Resume run").click()
    assert posted.value.status == 303
    expect(page.get_by_role("status").first).to_contain_text("Resumed")
    expect(page.locator("#run-status")).to_contain_text("succeeded", timeout=60_000)
    expect(page.get_by_role("button", name="Resume run")).to_have_count(0)
    expect(page.locator(".timeline li.event", has_text="run.resumed")).to_have_count(1)
    shots(page, "run-resumed-succeeded")
