"""The throwaway PostgreSQL of the test session goes away even when the session is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

HOLDER = '''
import os, time
from pathlib import Path


def test_hold(postgres_dsn):
    import psycopg
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        data = conn.execute("SHOW data_directory").fetchone()[0]
    pid = int(Path(data, "postmaster.pid").read_text().splitlines()[0])
    Path(os.environ["HOLDER_OUT"]).write_text(f"{pid} {data}")
    time.sleep(120)
'''


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_killed_session_leaves_no_throwaway_server_behind(tmp_path: Path) -> None:
    """SIGKILL runs no cleanup in the session: the reaper it started stops the server and deletes its data."""
    (tmp_path / "conftest.py").write_text('pytest_plugins = ("tests.conftest",)\n')
    (tmp_path / "test_holder.py").write_text(HOLDER)
    out = tmp_path / "holder.out"
    env = {key: value for key, value in os.environ.items() if key != "JIXU_TEST_POSTGRES_DSN"}
    env.update(HOLDER_OUT=str(out), PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "src")]))
    session = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                               cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not out.exists() or not out.read_text():
            assert session.poll() is None, "the holding session ended before it started its server"
            assert time.monotonic() < deadline, "the holding session never started its server"
            time.sleep(0.1)
        pid_text, data = out.read_text().split(" ", 1)
        pid = int(pid_text)
        assert _alive(pid) and Path(data).is_dir()
    finally:
        os.killpg(session.pid, signal.SIGKILL)
        session.wait(timeout=30)
    deadline = time.monotonic() + 30
    while _alive(pid) or Path(data).exists():
        assert time.monotonic() < deadline, f"server {pid} alive: {_alive(pid)}; data left: {Path(data).exists()}"
        time.sleep(0.1)
