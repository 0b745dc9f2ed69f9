"""Real SIGKILLs of a user's own loop, made durable with ``jixu.durable``, inside its unsafe ``charge`` step, on
SQLite and PostgreSQL.

The child (``tests/threads/steps_child.py``) runs reserve -> charge -> ship and dies inside ``charge``, after the
bank's line is durable (or before it is written). This process then runs the same loop again with the thread
id: the completed step returns its recorded result without running again, the charge is found unknown and never
repeated, the probe (or an operator) settles it, and the loop finishes. Every side effect is a line in a file,
so the counts are what really ran.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from jixu import RecoveryResolver, StepOutcomeUnknown
from jixu.ledger import Store, open_store
from jixu.threads.log import ThreadLog
from tests.conftest import PostgresSchema
from tests.helpers import ROOT, python_env
from tests.threads.steps_child import RUN, RUN_KEY, lines, order_loop

pytestmark = pytest.mark.crash

CHILD_TIMEOUT = 60.0


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'jixu.db'}"
        return
    schema = PostgresSchema(request.getfixturevalue("postgres_dsn"))
    try:
        yield schema.url
    finally:
        schema.drop()


def _crash(mode: str, url: str, directory: Path) -> str:
    """Run the child until it SIGKILLs itself inside ``charge``; the thread id it reported."""
    proc = subprocess.run([sys.executable, "-m", "tests.threads.steps_child", mode, url, str(directory)],
                          env=python_env(), cwd=ROOT, text=True, capture_output=True, timeout=CHILD_TIMEOUT,
                          check=False)
    assert proc.returncode == -signal.SIGKILL, f"the child exited {proc.returncode}: {proc.stderr[-3000:]}"
    found = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("T ")]
    assert found, proc.stdout
    return found[0]


def _log(url: str, thread_id: str) -> tuple[ThreadLog, Store]:
    store = open_store(url)
    return ThreadLog.load(store, thread_id, verify=True), store


def _charge_effect(log: ThreadLog) -> str:
    [charge] = [e for e in log.events() if e.type == "tool.requested" and e.data.get("step") == "charge#1"]
    return str(charge.data["effect_id"])


def _after_the_kill(url: str, thread_id: str) -> str:
    """The record the dead child left: reserve completed, charge dispatched without a receipt (unknown)."""
    log, store = _log(url, thread_id)
    try:
        events = log.events()
        analysis = RecoveryResolver.analyze(events)
        charge = _charge_effect(log)
        assert analysis.decisions[charge].state == "unknown", analysis.decisions[charge]
        assert analysis.decisions[charge].reason == "dispatched_without_receipt"
        assert charge in analysis.requires_resolution
        [reserve] = [d for d in analysis.decisions.values() if d.name == "reserve"]
        assert reserve.state == "completed"
        assert not [e for e in events if e.type == "turn.ended"], "the run is unfinished"
        state = log.snapshot()
        assert state.status == "waiting" and charge in state.reason, state.reason
        assert [t["steps"] for t in state.turns] == [True]
        return charge
    finally:
        store.close()


def test_a_killed_unsafe_step_is_unknown_the_probe_settles_it_and_the_loop_finishes_without_repeating_it(
        url: str, tmp_path: Path) -> None:
    thread_id = _crash("after", url, tmp_path)
    assert len(lines(tmp_path / "bank.log")) == 1 and len(lines(tmp_path / "reserve.log")) == 1
    charge = _after_the_kill(url, thread_id)

    reply = asyncio.run(order_loop(url, tmp_path, thread_id))

    assert reply == "reserved, {'charged': 7, 'line': 1}, shipped", reply
    assert len(lines(tmp_path / "reserve.log")) == 1, "the completed step returned its recorded result"
    assert len(lines(tmp_path / "bank.log")) == 1, "the unsafe step was not repeated"
    assert len(lines(tmp_path / "ship.log")) == 1
    log, store = _log(url, thread_id)
    try:
        events = log.events()
        dispatched = [e for e in events if e.type == "tool.dispatched" and e.data["effect_id"] == charge]
        assert [e.data["attempt"] for e in dispatched] == [1]
        [resolved] = [e for e in events if e.type == "tool.outcome_resolved"]
        assert resolved.data["effect_id"] == charge and resolved.data["resolution"] == "occurred"
        assert resolved.data["actor"] == "probe:charge"
        [asked] = [e for e in events if e.type == "probe.requested"]
        assert resolved.data["resolution_id"] == asked.data["effect_id"]
        assert [e.data["reason"] for e in events if e.type == "turn.claimed"] == ["took_over_dead_owner"]
        [ended] = [e for e in events if e.type == "turn.ended"]
        assert ended.data["outcome"] == "completed"
        state = log.snapshot()
        assert state.status == "idle" and state.analysis.safe_to_continue
        assert state.effects[charge].resolution is not None
        assert RecoveryResolver.analyze(events).decisions == state.effects, "online == replayed"
        assert log.replay().effects == state.effects
    finally:
        store.close()


def test_without_a_probe_the_killed_step_stops_the_loop_until_an_operator_resolves_it(
        url: str, tmp_path: Path) -> None:
    thread_id = _crash("after", url, tmp_path)
    charge = _after_the_kill(url, thread_id)

    with pytest.raises(StepOutcomeUnknown) as raised:
        asyncio.run(order_loop(url, tmp_path, thread_id, probe=False))
    error = raised.value
    assert error.details["effect_id"] == charge and error.details["step"] == "charge#1"
    assert f"jixu threads resolve STORE {thread_id} {charge}" in error.message
    assert len(lines(tmp_path / "bank.log")) == 1 and len(lines(tmp_path / "reserve.log")) == 1
    assert not lines(tmp_path / "ship.log"), "nothing after the unknown step ran"

    log, store = _log(url, thread_id)
    try:
        assert log.snapshot().status == "waiting"
        # The operator checked the bank: the charge happened (the run gave its lease back, so this is admitted).
        log.resolve(charge, "occurred", note="the bank shows the charge", result={"charged": 7, "line": 1},
                    actor="ops")
    finally:
        store.close()

    reply = asyncio.run(order_loop(url, tmp_path, thread_id, probe=False))

    assert reply == "reserved, {'charged': 7, 'line': 1}, shipped"
    assert [len(lines(tmp_path / f)) for f in ("reserve.log", "bank.log", "ship.log")] == [1, 1, 1]
    log, store = _log(url, thread_id)
    try:
        assert log.snapshot().status == "idle"
        assert [t["input"] for t in log.snapshot().turns] == [RUN]
    finally:
        store.close()


def test_a_step_killed_before_its_side_effect_is_found_not_to_have_happened_and_runs_once_under_a_new_effect(
        url: str, tmp_path: Path) -> None:
    thread_id = _crash("before", url, tmp_path)
    assert lines(tmp_path / "bank.log") == []
    charge = _after_the_kill(url, thread_id)

    asyncio.run(order_loop(url, tmp_path, thread_id))

    assert [len(lines(tmp_path / f)) for f in ("reserve.log", "bank.log", "ship.log")] == [1, 1, 1]
    log, store = _log(url, thread_id)
    try:
        intents = [e for e in log.events() if e.type == "tool.requested" and e.data.get("step") == "charge#1"]
        assert len(intents) == 2 and intents[0].data["effect_id"] == charge
        assert intents[1].data["idempotency_key"] in lines(tmp_path / "bank.log")[0]
        assert log.snapshot().effects[charge].resolution["resolution"] == "not_occurred"  # type: ignore[index]
    finally:
        store.close()


def test_a_keyed_run_killed_after_it_ended_is_replayed_by_its_rerun_and_nothing_runs_twice(
        url: str, tmp_path: Path) -> None:
    """The SIGKILL lands after ``turn.ended`` is durable, before the code learns of it: the code runs again with
    its thread id and run key, and gets what the run recorded (decision 0051)."""
    thread_id = _crash("ended", url, tmp_path)
    assert [len(lines(tmp_path / f"{name}.log")) for name in ("reserve", "bank", "ship")] == [1, 1, 1]
    log, store = _log(url, thread_id)
    try:
        recorded = [(e.type, e.seq) for e in log.events()]
        [ended] = [e for e in log.events() if e.type == "turn.ended"]
        assert ended.data["outcome"] == "completed"
    finally:
        store.close()

    reply = asyncio.run(order_loop(url, tmp_path, thread_id, run_key=RUN_KEY))

    assert reply == ended.data["reply"] == "reserved, {'charged': 7, 'line': 1}, shipped"
    assert [len(lines(tmp_path / f"{name}.log")) for name in ("reserve", "bank", "ship")] == [1, 1, 1]
    log, store = _log(url, thread_id)
    try:
        assert [(e.type, e.seq) for e in log.events()] == recorded, "the replay appended nothing"
        assert log.snapshot().status == "idle"
    finally:
        store.close()


def test_two_unsafe_steps_in_flight_at_once_when_killed_are_both_unknown_and_settled_by_probe_never_run_twice(
        url: str, tmp_path: Path) -> None:
    """Steps of one run run at once (an SDK's parallel tool calls): before, a second step waited for the first to
    end, so a step that waited on another never finished. Killed with both in flight, both are unknown; the
    rerun's probes find both charges and nothing is charged again."""
    thread_id = _crash("parallel", url, tmp_path)
    assert len(lines(tmp_path / "bank.log")) == 2
    log, store = _log(url, thread_id)
    try:
        analysis = RecoveryResolver.analyze(log.events())
        charges = {e.data["step"]: e.data["effect_id"] for e in log.events() if e.type == "tool.requested"}
        assert set(charges) == {"charge-7", "charge-8"}
        assert {analysis.decisions[e].state for e in charges.values()} == {"unknown"}
    finally:
        store.close()

    reply = asyncio.run(order_loop(url, tmp_path, thread_id, parallel=True))

    assert reply == "charged [7, 8]"
    assert len(lines(tmp_path / "bank.log")) == 2, "each order charged once"
    log, store = _log(url, thread_id)
    try:
        resolved = {e.data["effect_id"]: e.data["resolution"] for e in log.events()
                    if e.type == "tool.outcome_resolved"}
        assert resolved == dict.fromkeys(charges.values(), "occurred")
    finally:
        store.close()
