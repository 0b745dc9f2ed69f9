"""Shared fixtures: real stores (in temporary directories, or a throwaway PostgreSQL), and a ban on silent skips.

PostgreSQL: ``JIXU_TEST_POSTGRES_DSN`` (a ``postgresql://`` URL whose role may
create schemas and databases) when set, else a throwaway server from the ``pgserver`` wheel,
started once per session. Each test gets a fresh schema of its own.
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import settings

from jixu.ledger import MemoryStore, SQLiteStore, Store

# One bounded profile wherever the suite runs (CI included: it must stay under 15 minutes); "deep" is for
# long runs by hand (HYPOTHESIS_PROFILE=deep), bench/properties.py scales the heaviest tests further.
settings.register_profile("suite", max_examples=60, deadline=None, print_blob=True)
settings.register_profile("deep", max_examples=1000, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "suite"))

STORE_KINDS = ["memory", "sqlite", "postgres"]

# Checkpoints are sealed with a key held outside the store (decision 0025): the tests (and the processes they
# start, which inherit the environment) use a key file of their own, never the user's.
_KEY_DIR = tempfile.mkdtemp(prefix="jixu-test-keys-")
os.environ["JIXU_KEY_FILE"] = os.path.join(_KEY_DIR, "checkpoint-keys")
atexit.register(shutil.rmtree, _KEY_DIR, True)

_SCHEMA_NUMBERS = itertools.count(1)

_REAPER = r"""
import os, shutil, signal, sys, time
sys.stdin.buffer.read()  # end of file: the test session ended, or was killed
data = sys.argv[1]
try:
    with open(os.path.join(data, "postmaster.pid")) as pid_file:
        pid = int(pid_file.readline())
    os.kill(pid, signal.SIGQUIT)  # immediate shutdown: the data is thrown away anyway
    for _ in range(200):
        os.kill(pid, 0)  # raises once the server is gone
        time.sleep(0.05)
except (OSError, ValueError):
    pass
shutil.rmtree(data, ignore_errors=True)
"""


def start_reaper(data_dir: str) -> subprocess.Popen[bytes]:
    """A process that stops the throwaway server in ``data_dir`` and deletes it once its stdin closes.

    Only this process holds the pipe's other end, so it closes when the session
    ends or dies (SIGKILL included, where no cleanup of ours runs). The reaper
    runs in a session of its own, so a signal to the test's process group
    does not reach it.
    """
    return subprocess.Popen([sys.executable, "-c", _REAPER, data_dir], stdin=subprocess.PIPE,
                            start_new_session=True)


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """An admin ``postgresql://`` URL: ``JIXU_TEST_POSTGRES_DSN``, or a throwaway pgserver for the session.

    Fails (never skips) when no server can be had.
    """
    given = os.environ.get("JIXU_TEST_POSTGRES_DSN")
    if given:
        if not given.startswith(("postgresql://", "postgres://")):
            pytest.fail("JIXU_TEST_POSTGRES_DSN must be a postgresql:// URL", pytrace=False)
        yield given
        return
    data_dir = tempfile.mkdtemp(prefix="jixu-pg-")
    try:
        with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset (e.g. as root)
            warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
            import pgserver

            server = pgserver.get_server(data_dir, cleanup_mode="stop")
        dsn = str(server.get_uri())
    except Exception as exc:
        shutil.rmtree(data_dir, ignore_errors=True)
        pytest.fail(f"could not start a throwaway PostgreSQL with pgserver ({type(exc).__name__}: {exc}); "
                    "install pgserver or set JIXU_TEST_POSTGRES_DSN to an existing server", pytrace=False)
    reaper = start_reaper(data_dir)
    try:
        yield dsn
    finally:
        server.cleanup()
        shutil.rmtree(data_dir, ignore_errors=True)
        assert reaper.stdin is not None
        reaper.stdin.close()
        reaper.wait(timeout=30)


def postgres_url_with_schema(dsn: str, schema: str) -> str:
    """``dsn`` with ``search_path`` set to ``schema`` (libpq ``options``), still a URL."""
    return f"{dsn}{'&' if '?' in dsn else '?'}options={quote(f'-csearch_path={schema}', safe='')}"


class PostgresSchema:
    """A fresh, empty schema in the test server; ``url`` opens stores in it. Dropped by ``drop``."""

    def __init__(self, admin_dsn: str) -> None:
        import psycopg

        self.admin_dsn = admin_dsn
        self.name = f"jixu_test_{os.getpid()}_{next(_SCHEMA_NUMBERS)}"
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {self.name} CASCADE")
            conn.execute(f"CREATE SCHEMA {self.name}")
        self.url = postgres_url_with_schema(admin_dsn, self.name)

    def drop(self) -> None:
        import psycopg

        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {self.name} CASCADE")


class StoreFactory:
    """Makes stores of one kind; ``url`` is set for kinds other processes can open."""

    def __init__(self, kind: str, tmp_path: Path, postgres_dsn: str | None = None) -> None:
        self.kind = kind
        self.tmp_path = tmp_path
        self._made: list[Store] = []
        self._shared: MemoryStore | None = None
        self._schema: PostgresSchema | None = None
        self.url: str | None = f"sqlite:///{tmp_path / 'ledger.db'}" if kind == "sqlite" else None
        if kind == "postgres":
            assert postgres_dsn is not None
            self._schema = PostgresSchema(postgres_dsn)
            self.url = self._schema.url

    def __call__(self) -> Store:
        """A store; calling again opens the *same* ledger (a second connection)."""
        if self.kind == "memory":
            if self._shared is None:
                self._shared = MemoryStore()
            return self._shared
        if self.kind == "postgres":
            from jixu.ledger import PostgresStore

            assert self.url is not None
            store: Store = PostgresStore(self.url, max_size=4)
        else:
            store = SQLiteStore(self.tmp_path / "ledger.db")
        self._made.append(store)
        return store

    def close(self) -> None:
        for store in self._made:
            store.close()
        if self._schema is not None:
            self._schema.drop()


@pytest.fixture(params=STORE_KINDS)
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """A factory for each store kind the contract suite covers (PostgreSQL: a fresh schema per test)."""
    dsn = request.getfixturevalue("postgres_dsn") if request.param == "postgres" else None
    factory = StoreFactory(request.param, tmp_path, dsn)
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


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one test process more than the cores this process may use.

    The suite waits on child processes, servers and a browser for about a third of its time (on 2 cores, 2
    workers kept 1.35 cores busy on average: 1,098 s of CPU in 813 s), so a third worker keeps the cores busy:
    725 s -> 596 s here. Timings are never asserted in tests (they live in bench/), so the extra load changes
    no outcome.
    """
    return len(os.sched_getaffinity(0)) + 1 if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1) + 1


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
