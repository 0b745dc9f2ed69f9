"""Shared fixtures: real stores in temporary directories, and a ban on silent skips."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from jixu.ledger import MemoryStore, SQLiteStore, Store

settings.register_profile("ci", max_examples=200, deadline=None, print_blob=True)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

STORE_KINDS = ["memory", "sqlite"]


class StoreFactory:
    """Makes stores of one kind; ``url`` is set for kinds other processes can open."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind = kind
        self.tmp_path = tmp_path
        self._made: list[Store] = []
        self._shared: MemoryStore | None = None
        self.url: str | None = f"sqlite:///{tmp_path / 'ledger.db'}" if kind == "sqlite" else None

    def __call__(self) -> Store:
        """A store; calling again opens the *same* ledger (a second connection)."""
        if self.kind == "memory":
            if self._shared is None:
                self._shared = MemoryStore()
            return self._shared
        store = SQLiteStore(self.tmp_path / "ledger.db")
        self._made.append(store)
        return store

    def close(self) -> None:
        for store in self._made:
            store.close()


@pytest.fixture(params=STORE_KINDS)
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """A factory for each store kind the contract suite covers."""
    factory = StoreFactory(request.param, tmp_path)
    yield factory
    factory.close()


@pytest.fixture
def store(store_factory: StoreFactory) -> Store:
    """One store of each kind."""
    return store_factory()


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    """A path for a fresh SQLite ledger file."""
    return tmp_path / "jixu.db"


StoreMaker = Callable[[], Store]


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if any test was skipped (set JIXU_ALLOW_SKIPS=1 to permit locally)."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or os.environ.get("JIXU_ALLOW_SKIPS") == "1":
        return
    skipped = reporter.stats.get("skipped", [])
    if skipped and session.exitstatus == 0:
        reporter.write_line(f"ERROR: {len(skipped)} test(s) were skipped; jixu's suites never skip silently",
                            red=True)
        session.exitstatus = 1
