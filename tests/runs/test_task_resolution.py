"""An operator's outcome resolution of a run task whose outcome stayed unknown (SPEC 4.4 rules, on runs)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from jixu.errors import EffectNotUnknown, InvalidInput, NotFound, ResolutionConflict
from jixu.ledger import Store
from jixu.runs import ImplementContext, ImplementResult, Runs, ScriptedProvider
from tests.runs.run_helpers import fix, make_origin, register, run, task_events

RESOLUTION = "f" * 32


async def interrupted(workspace: Path, context: ImplementContext) -> ImplementResult:
    raise asyncio.CancelledError()  # the worker is stopped mid-call: the receipt says "indeterminate"


def stuck_run(store: Store, tmp_path: Path, *, then: list[object]) -> tuple[Runs, str, str]:
    """A run whose implementation was dispatched three times without a receipt: it needs reconciliation."""
    register(store, make_origin(tmp_path))
    provider = ScriptedProvider("scripted", [interrupted, interrupted, interrupted, *then])  # type: ignore[list-item]
    runs = Runs(store, tmp_path / "ws", {"scripted": provider}, owner="worker")
    run_id: str = run(runs.create_run("calc", "fix add()", provider="scripted"))
    for attempt in range(3):
        if attempt:
            run(runs.resume(run_id, "ops"))
        with pytest.raises(asyncio.CancelledError):
            run(runs.execute(run_id))
    run(runs.resume(run_id, "ops"))
    state = run(runs.state(run_id))
    assert state.status == "needs_reconciliation" and "3 time(s) without a receipt" in state.reason
    [effect_id] = {e["data"]["effect_id"] for e in task_events(run(runs.journal(run_id))[0], "implement",
                                                                   "requested")}
    return runs, run_id, effect_id


def test_not_occurred_lets_the_run_try_the_task_again_under_a_new_effect_id(store: Store, tmp_path: Path) -> None:
    runs, run_id, effect_id = stuck_run(store, tmp_path, then=[fix])
    with pytest.raises(InvalidInput) as refused:
        run(runs.resolve_task_outcome(run_id, effect_id, "occurred", actor="ops"))
    assert refused.value.details["field"] == "resolution"
    state = run(runs.resolve_task_outcome(run_id, effect_id, "not_occurred", resolution_id=RESOLUTION,
                                          note="nothing in the workspace", actor="ops"))
    assert state.status == "queued"
    length = len(run(runs.journal(run_id))[0])
    # The same resolution id and body is an idempotent repeat; a changed body is a conflict. Nothing is written.
    run(runs.resolve_task_outcome(run_id, effect_id, "not_occurred", resolution_id=RESOLUTION,
                                  note="nothing in the workspace", actor="ops"))
    with pytest.raises(ResolutionConflict):
        run(runs.resolve_task_outcome(run_id, effect_id, "abandoned_unknown", resolution_id=RESOLUTION, actor="ops"))
    assert len(run(runs.journal(run_id))[0]) == length
    state = run(runs.execute(run_id))
    assert state.status == "succeeded", state.reason
    entries, valid = run(runs.journal(run_id))
    intents = task_events(entries, "implement", "requested")
    assert valid and len(intents) == 2 and intents[1]["data"]["effect_id"] != effect_id
    assert intents[1]["data"]["attempt"] == 2
    [resolved] = [e for e in entries if e["type"] == "task.outcome_resolved"]
    assert (resolved["data"]["resolution"], resolved["data"]["actor"]) == ("not_occurred", "ops")


def test_abandoned_unknown_finishes_the_run_as_failed(store: Store, tmp_path: Path) -> None:
    runs, run_id, effect_id = stuck_run(store, tmp_path, then=[fix])
    run(runs.resolve_task_outcome(run_id, effect_id, "abandoned_unknown", actor="ops"))
    state = run(runs.execute(run_id))
    assert state.status == "failed" and "abandoned as unknown" in state.reason


def test_only_an_unknown_outcome_of_an_existing_effect_can_be_resolved(store: Store, tmp_path: Path) -> None:
    runs, run_id, effect_id = stuck_run(store, tmp_path, then=[fix])
    prepare = task_events(run(runs.journal(run_id))[0], "prepare", "requested")[0]["data"]["effect_id"]
    length = len(run(runs.journal(run_id))[0])
    with pytest.raises(EffectNotUnknown):
        run(runs.resolve_task_outcome(run_id, prepare, "not_occurred", actor="ops"))
    with pytest.raises(NotFound):
        run(runs.resolve_task_outcome(run_id, "0" * 26, "not_occurred", actor="ops"))
    with pytest.raises(InvalidInput):
        run(runs.resolve_task_outcome(run_id, effect_id, "maybe", actor="ops"))
    assert len(run(runs.journal(run_id))[0]) == length
