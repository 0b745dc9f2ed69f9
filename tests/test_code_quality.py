"""The code-quality gates run as tests, so the README's one test command checks them too."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "jixu"

# Which top-level layers each layer may import (SPEC section 1: dependencies point downwards).
ALLOWED_IMPORTS = {
    "errors": set(),
    "ledger": {"errors", "ledger"},
    "recovery": {"errors", "ledger", "recovery"},
    "kernel": {"errors", "ledger", "recovery", "kernel"},
    "threads": {"errors", "ledger", "recovery", "kernel", "threads"},
    "runs": {"errors", "ledger", "recovery", "kernel", "threads", "runs"},
    "server": {"errors", "ledger", "recovery", "kernel", "threads", "runs", "server"},
    "cli": {"errors", "ledger", "recovery", "kernel", "threads", "runs", "server", "cli"},
}


def test_ruff_finds_nothing() -> None:
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "src", "tests", "bench"], cwd=ROOT,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_passes_on_src() -> None:
    result = subprocess.run([sys.executable, "-m", "mypy", "--strict", "src/jixu"], cwd=ROOT,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def _jixu_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    layers: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "jixu" and len(parts) > 1:
                layers.add(parts[1])
    return layers


def test_layers_depend_only_downwards() -> None:
    violations = []
    for layer, allowed in ALLOWED_IMPORTS.items():
        files = [SRC / f"{layer}.py"] if (SRC / f"{layer}.py").exists() else sorted((SRC / layer).rglob("*.py"))
        for path in files:
            bad = {imp for imp in _jixu_imports(path) if imp in ALLOWED_IMPORTS and imp not in allowed}
            if bad:
                violations.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    assert not violations, violations


def test_no_sql_above_the_ledger() -> None:
    offenders = []
    for layer in ("recovery", "kernel", "threads", "runs", "server", "cli"):
        for path in sorted((SRC / layer).rglob("*.py")) if (SRC / layer).exists() else []:
            text = path.read_text(encoding="utf-8")
            if "import sqlite3" in text or "import psycopg" in text or "INSERT INTO" in text:
                offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, offenders
