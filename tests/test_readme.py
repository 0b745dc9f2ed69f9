"""The README's examples work when pasted: every ```python block runs as a script, and its commands exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import python_env

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL)


def test_the_first_lines_give_the_two_fresh_machine_commands() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    head = "\n".join(lines[:5])
    assert "pip install ." in head and "jixu demo" in head
    assert 'pip install -e ".[test]"' in head and "pytest" in head
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    test_command = re.search(r"Install and run the tests: `(.*)`", head)
    assert test_command is not None and test_command.group(1) in ci, "'.ci/run' must run the README's command"


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_python_blocks_run_as_pasted(index: int, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(BLOCKS[index], encoding="utf-8")
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=python_env(), capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip(), "every example prints what it did"
