"""The model-based check of the effect kernel (see tests/kernel/model.py), bounded for CI.

Each example is a scenario drawn from a seed: threads alone or sharing
commits, parallel calls of every semantics in one response, another
connection writing to the same streams at random moments, and sometimes a
crash after a random append. ``bench/soak.py`` runs the same check for
minutes. The mutant tests show that the check catches a kernel that breaks
each rule: appends of one stream not serialised, or a receipt dropped when
another writer moved the head.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jixu.kernel import writer as writer_module
from jixu.ledger import MemoryStore, SQLiteStore, Store
from jixu.ledger.postgres import PostgresStore
from tests.conftest import PostgresSchema
from tests.helpers import python_env
from tests.kernel.model import World, draw, recover_scenario, run_scenario

ROOT = Path(__file__).resolve().parents[2]

EXAMPLES = int(os.environ.get("JIXU_MODEL_EXAMPLES", "10"))  # bench/soak.py runs the model for minutes
"""Scenarios per store kind in CI (``bench/soak.py`` runs many more)."""


@pytest.fixture(params=["sqlite", "postgres"])
def durable_opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Callable[[], Store]]]:
    """A ledger another process can open: its URL, and an opener of new connections to it."""
    if request.param == "sqlite":
        path = tmp_path / "killed.db"
        yield f"sqlite:///{path}", lambda: SQLiteStore(path)
        return
    schema = PostgresSchema(request.getfixturevalue("postgres_dsn"))
    try:
        yield schema.url, lambda: PostgresStore(schema.url, max_size=4)
    finally:
        schema.drop()


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Store]]:
    """Opens the test's ledger on a new connection each time (the one MemoryStore for ``memory``)."""
    if request.param == "memory":
        shared = MemoryStore()
        yield lambda: shared
        return
    if request.param == "sqlite":
        path = tmp_path / "model.db"
        yield lambda: SQLiteStore(path)
        return
    schema = PostgresSchema(request.getfixturevalue("postgres_dsn"))
    try:
        yield lambda: PostgresStore(schema.url, max_size=4)
    finally:
        schema.drop()


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(min_value=0, max_value=2**31))
def test_the_kernel_keeps_its_rules_in_random_interleavings(opener: Callable[[], Store], seed: int) -> None:
    asyncio.run(run_scenario(draw(seed), opener))


@pytest.mark.parametrize("seed", [435, 583])
def test_scenarios_that_once_broke_a_rule_keep_it(opener: Callable[[], Store], seed: int) -> None:
    """Seeds the random check found breaking a rule: a receipt of a recorded call committed together with another
    effect's or a later attempt's events met another writer's append, and was dropped with them (the call's
    outcome lost, or the loop stopping with "recorded nothing"). Only a receipt whose own intent or own
    attempt's dispatch marker is in the refused batch waits for the loop's next decision."""
    asyncio.run(run_scenario(draw(seed), opener))


@pytest.mark.parametrize("threads", [1, 3])
def test_scenarios_with_a_crash_after_a_random_append_recover_by_the_rules(
        opener: Callable[[], Store], threads: int) -> None:
    """Crashing scenarios, alone and sharing commits, until 3 reached their crash point (the random test
    draws crashes too). Whether a drawn crash point is reached depends on how the other writer's moves
    (timed in loop ticks) interleave with the turns, so the sample runs on until 3 did, 20 at most."""
    crashed = tried = 0
    durable = opener() is not opener()  # a MemoryStore would not outlive a crash: none is drawn for it
    for seed in range(20 if durable else 6):
        outcome = asyncio.run(run_scenario(draw(seed, threads=threads, crash=True), opener))
        crashed, tried = crashed + outcome.crashed, tried + 1
        if durable and crashed >= 3:
            break
    if durable:
        assert crashed >= 3, f"only {crashed} of {tried} scenarios reached their crash point"


@pytest.mark.crash
def test_scenarios_killed_with_sigkill_at_a_random_append_recover_by_the_rules(
        durable_opener: tuple[str, Callable[[], Store]]) -> None:
    """A sample of scenarios run by a child that SIGKILLs itself right after its crash point's commit; a new
    process (this one, same owner name, new connections) recovers them by the rules."""
    url, opener = durable_opener
    killed = 0
    for seed in range(4):
        for threads in (1, 3):
            child = subprocess.run([sys.executable, "-m", "tests.kernel.model_child", url, str(seed), str(threads)],
                                   capture_output=True, text=True, timeout=120, env=python_env(), cwd=ROOT,
                                   check=False)
            lines = child.stdout.splitlines()
            if child.returncode != -signal.SIGKILL:
                assert child.returncode == 0 and lines[-1] == "DONE", child.stderr
                continue
            killed += 1
            [thread_ids] = [line.split()[1:] for line in lines if line.startswith("T ")]
            world = World()
            for line in lines:
                if line.startswith("X "):
                    _x, effect_id, semantics = line.split()
                    world.invoked[effect_id] += 1
                    world.semantics[effect_id] = semantics
            asyncio.run(recover_scenario(draw(seed, threads=threads, crash=True), opener, thread_ids, world))
    assert killed >= 4, f"only {killed} of 8 children reached their crash point"


# --- mutants: the check must catch a kernel that breaks a rule ---------------------------------------------


def _unserialised(self: writer_module.StreamWriter, events, fence=None, *, user=False):  # type: ignore[no-untyped-def]
    """``append_async`` as it was before issue 21: submitted at once at the record's head, whatever is in flight."""
    from jixu.kernel.commits import Commits
    from jixu.ledger.event import prepare

    async def append() -> list:  # type: ignore[type-arg]
        prepared = [prepare(e, self.store.max_payload_bytes) for e in events]
        if self._staged:
            return self._commit_now(prepared, fence, Commits.of(self.store).append_now)
        stored = await Commits.of(self.store).submit(self.stream, prepared, self.state.seq, fence, user=user)
        self._apply(stored)
        return stored

    return append()


def _dropping(self: writer_module.StreamWriter, batch, fence, conflict, *, offset, expected):  # type: ignore[no-untyped-def]
    """``_after_conflict`` that drops the receipts (as threads did before issue 21): fold, then refuse."""
    self._follow()
    raise conflict


def _first_caught(opener: Callable[[], Store], seeds: range, **fixed: int | bool) -> tuple[int, str] | None:
    """The first seed whose scenario fails (a broken rule, or anything else the run raises), and why."""
    for seed in seeds:
        try:
            asyncio.run(run_scenario(draw(seed, **fixed), opener))  # type: ignore[arg-type]
        except Exception as broken:
            return seed, f"{type(broken).__name__}: {broken}"
    return None


def _assert_caught(monkeypatch: pytest.MonkeyPatch, path: Path, seeds: range, what: str,
                   **fixed: int | bool) -> None:
    """Some scenario fails under the mutant, and the same scenario passes on the real kernel (so it is the
    mutant, not the scenario, that the check caught)."""
    caught = _first_caught(lambda: SQLiteStore(path), seeds, **fixed)
    assert caught is not None, f"no scenario noticed {what}"
    monkeypatch.undo()
    seed, _why = caught
    asyncio.run(run_scenario(draw(seed, **fixed), lambda: SQLiteStore(path.with_name("control.db"))))  # type: ignore[arg-type]


def test_a_kernel_that_does_not_serialise_a_streams_appends_is_caught(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer_module.StreamWriter, "append_async", _unserialised)
    _assert_caught(monkeypatch, tmp_path / "mutant.db", range(40),
                   "appends of one stream submitted at one expected seq", threads=3, crash=False)


def test_a_kernel_that_drops_a_receipt_on_a_conflict_is_caught(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer_module.StreamWriter, "_after_conflict", _dropping)
    _assert_caught(monkeypatch, tmp_path / "mutant.db", range(60),
                   "a receipt dropped when another writer moved the head", crash=False)
