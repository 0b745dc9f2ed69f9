"""The core installs without the server and PostgreSQL packages; a feature that needs an extra says which.

The missing packages are simulated in a child process by an import hook that refuses them, exactly as a
machine without them would (``ModuleNotFoundError``), while the rest of the environment stays real.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.helpers import ROOT, python_env

BLOCK = """
import importlib.abc, sys
BLOCKED = set({blocked!r})
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Refuse())
"""


def run_without(blocked: set[str], code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a child process in which the packages ``blocked`` cannot be imported."""
    return subprocess.run([sys.executable, "-c", BLOCK.format(blocked=sorted(blocked)) + code], cwd=cwd,
                          env=python_env(), capture_output=True, text=True, timeout=120, check=False)


def cli(*args: str) -> str:
    return f"import sys; sys.argv = ['jixu', *{list(args)!r}]\nfrom jixu.cli.main import main\nmain()\n"


SERVER = {"fastapi", "starlette", "uvicorn", "jinja2"}
POSTGRES = {"psycopg", "psycopg_pool"}


def test_the_core_dependencies_hold_no_server_and_no_postgresql_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    core = {dependency.split(">")[0].split("[")[0].strip().lower() for dependency in project["dependencies"]}
    assert not core & {"fastapi", "uvicorn", "jinja2", "psycopg", "psycopg-pool", "starlette"}, core
    extras = project["optional-dependencies"]
    assert any(d.startswith("fastapi") for d in extras["server"]) and any(d.startswith("uvicorn")
                                                                            for d in extras["server"])
    assert any(d.startswith("psycopg") for d in extras["postgres"])


def test_threads_agents_and_the_sqlite_cli_work_without_the_extras(tmp_path: Path) -> None:
    code = """
import asyncio, sys
from jixu import Agent, Harness, ScriptedModel, SQLiteStore, ToolCall, tool
@tool(semantics="unsafe")
def ping(n: int) -> str:
    \"\"\"Ping.\"\"\"
    return f"pong {n}"
agent = Agent("core", ScriptedModel([ToolCall("ping", {"n": 1}), "done"]), tools=[ping])
async def main() -> None:
    with SQLiteStore("core.db") as store:
        thread = await Harness(agent, store).create_thread()
        await thread.send("go")
        print((await thread.wait()).last_reply)
asyncio.run(main())
assert not {m.split(".")[0] for m in sys.modules} & BLOCKED, sorted(BLOCKED & set(sys.modules))
""" + cli("threads", "list", "core.db")
    result = run_without(SERVER | POSTGRES, code, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "done" and "threads in core.db" in result.stdout


@pytest.mark.parametrize(("blocked", "args", "extra", "feature"), [
    (SERVER, ("serve", "--store", "x.db"), "server", "jixu serve"),
    (POSTGRES, ("threads", "list", "postgresql://nobody@127.0.0.1:1/none"), "postgres", "a PostgreSQL store"),
    (POSTGRES, ("worker", "--store", "postgresql://nobody@127.0.0.1:1/none", "--agent", "tests.runs.agents:counter_agent"), "postgres",
     "a PostgreSQL store"),
], ids=["serve", "postgres-cli", "postgres-worker"])
def test_a_feature_without_its_extra_names_the_pip_install_and_exits_2(
        tmp_path: Path, blocked: set[str], args: tuple[str, ...], extra: str, feature: str) -> None:
    result = run_without(blocked, cli(*args), tmp_path)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert f'{feature} needs the {extra!r} extra' in result.stderr
    assert f'pip install "jixu[{extra}]"' in result.stderr
    assert "Traceback" not in result.stderr
    assert not list(tmp_path.iterdir()), "nothing is created"


def test_the_library_raises_missing_extra_which_is_also_an_import_error(tmp_path: Path) -> None:
    code = """
import jixu
from jixu.errors import MissingExtra
try:
    jixu.PostgresStore
except ImportError as error:
    assert isinstance(error, MissingExtra), type(error)
    print(error.to_dict()["code"], error.details["extra"])
"""
    result = run_without(POSTGRES, code, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["missing_extra", "postgres"]


@pytest.mark.parametrize(("module", "blocked", "extra"), [
    ("jixu.integrations.otel", {"opentelemetry"}, "otel"),
    ("jixu.integrations.mcp", {"mcp"}, "mcp"),
    ("jixu.integrations.pydantic_ai", {"pydantic_ai"}, "pydantic-ai"),
    ("jixu.integrations.openai_agents", {"agents"}, "openai-agents"),
])
def test_an_integration_without_its_extra_raises_missing_extra(tmp_path: Path, module: str, blocked: set[str],
                                                               extra: str) -> None:
    code = f"""
from jixu.errors import MissingExtra
try:
    import {module}
except MissingExtra as error:
    print(error.details["extra"])
    print(error.message)
"""
    result = run_without(blocked, code, tmp_path)
    assert result.returncode == 0, result.stderr
    named, message = result.stdout.splitlines()
    assert named == extra and f'pip install "jixu[{extra}]"' in message, message
