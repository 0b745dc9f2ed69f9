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
    "scheduling": {"errors", "ledger", "recovery", "kernel", "threads", "runs", "scheduling"},
    "integrations": {"errors", "ledger", "recovery", "kernel", "threads", "runs", "scheduling", "integrations"},
    "server": {"errors", "ledger", "recovery", "kernel", "threads", "runs", "scheduling", "integrations", "server"},
    "cli": {"errors", "ledger", "recovery", "kernel", "threads", "runs", "scheduling", "integrations", "server",
            "cli"},
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
    for layer in ("recovery", "kernel", "threads", "runs", "scheduling", "integrations", "server", "cli"):
        for path in sorted((SRC / layer).rglob("*.py")) if (SRC / layer).exists() else []:
            text = path.read_text(encoding="utf-8")
            if "import sqlite3" in text or "import psycopg" in text or "INSERT INTO" in text:
                offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, offenders


# The append contract is decided in one place (issue 21): each piece of it may be used only where this says,
# so no store sequences the checks itself. Keys are the pieces; values the functions (file:qualified name)
# that use them, every one of which must still use it.
APPEND_CONTRACT_USES = {
    "existing_batch": {"ledger/store.py:judge_append"},
    "fence_problem": {"ledger/store.py:judge_append", "ledger/store.py:renewed_lease"},
    "head_moved": {"ledger/store.py:judge_append"},
    "judge_append": {"ledger/store.py:decide_append",
                     "ledger/postgres.py:_appended"},  # words the PL/pgSQL function's refusals
    "seal_batch": {"ledger/store.py:decide_append"},
    "decide_append": {"ledger/memory.py:MemoryStore._append", "ledger/sqlite.py:SQLiteStore._append_in",
                      "ledger/sqlite.py:SQLiteStore._append_batched",
                      "ledger/postgres.py:PostgresStore._append_in"}  # the slow path and append_and_enqueue,
}
# The errors of the contract are made only by its pieces (a store may not word a refusal of its own).
APPEND_CONTRACT_ERRORS = {"IdempotencyConflict", "FencingError", "ConcurrencyError"}
APPEND_CONTRACT_ERROR_MAKERS = {"ledger/store.py", "ledger/postgres.py:PostgresStore._translate"}


def _uses(tree: ast.AST, names: set[str], made: set[str]) -> list[tuple[str, str]]:
    """``(name, qualified name of the enclosing function or class)`` for each load of one of ``names`` and
    each call of one of ``made`` (an error being made, not caught or tested for)."""
    found: list[tuple[str, str]] = []

    def visit(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                visit(child, [*scope, child.name])
                continue
            name = (child.id if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Load)
                    else child.attr if isinstance(child, ast.Attribute) else None)
            if name in names:
                found.append((name, ".".join(scope)))
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Name | ast.Attribute):
                called = child.func.id if isinstance(child.func, ast.Name) else child.func.attr
                if called in made:
                    found.append((called, ".".join(scope)))
            visit(child, scope)

    visit(tree, [])
    return found


def test_the_append_contract_is_decided_only_by_decide_append() -> None:
    seen: dict[str, set[str]] = {name: set() for name in APPEND_CONTRACT_USES}
    misplaced = []
    for path in sorted(SRC.rglob("*.py")):
        where = path.relative_to(SRC).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for name, scope in _uses(tree, set(APPEND_CONTRACT_USES), APPEND_CONTRACT_ERRORS):
            user = f"{where}:{scope}"
            if name in APPEND_CONTRACT_ERRORS:
                if where.startswith("ledger/") and where not in APPEND_CONTRACT_ERROR_MAKERS and (
                        user not in APPEND_CONTRACT_ERROR_MAKERS):
                    misplaced.append(f"{user} makes a {name}")
            elif user in APPEND_CONTRACT_USES[name]:
                seen[name].add(user)
            else:
                misplaced.append(f"{user} uses {name}")
    assert not misplaced, f"only the append decision may use its pieces: {misplaced}"
    missing = {name: sorted(users - seen[name]) for name, users in APPEND_CONTRACT_USES.items() if users - seen[name]}
    assert not missing, f"these no longer use their piece of the append decision (update the table): {missing}"


# Issue 21: the RecoveryResolver states each lifecycle rule once. The event fields that carry the rules (an
# attempt, a failure's determinacy, an approval requirement, a receipt's error or result artifact, the args
# an intent hashes) are read only by the rule helpers in resolver.py, which only the one walk calls; the
# other recovery modules take the resolver's answers and never read an event themselves.
RESOLVER = SRC / "recovery" / "resolver.py"
RULE_FIELDS = {"attempt", "indeterminate", "requires_approval", "error", "result_artifact", "args"}
RULE_HELPERS = {"_intent_claims", "_args_hash_ok", "_later_claims", "_mismatch"}
WALK = {"_walk", "_walk_all"}


def _functions(tree: ast.AST) -> dict[str, ast.FunctionDef]:
    return {node.name: node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


def _constants(node: ast.AST) -> set[object]:
    return {child.value for child in ast.walk(node) if isinstance(child, ast.Constant)}


def test_only_the_resolvers_rule_helpers_read_the_fields_its_rules_are_about() -> None:
    tree = ast.parse(RESOLVER.read_text(encoding="utf-8"))
    functions = _functions(tree)
    assert set(functions) >= RULE_HELPERS, "the rule helpers were renamed: update this test with them"
    offenders = sorted(f"resolver.py {name}() reads {sorted(RULE_FIELDS & _constants(function))}"
                       for name, function in functions.items()
                       if name not in RULE_HELPERS and RULE_FIELDS & _constants(function))
    offenders += [f"{path.relative_to(ROOT)} names {sorted(RULE_FIELDS & _constants(ast.parse(path.read_text())))}"
                  for path in sorted((SRC / "recovery").glob("*.py"))
                  if path != RESOLVER and RULE_FIELDS & _constants(ast.parse(path.read_text(encoding="utf-8")))]
    assert not offenders, offenders


def test_only_the_one_walk_asks_the_rule_helpers() -> None:
    """A fast path beside the walk would have to call the rule helpers (or restate them: the test above)."""
    functions = _functions(ast.parse(RESOLVER.read_text(encoding="utf-8")))
    callers = {name for name, function in functions.items() for node in ast.walk(function)
               if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in RULE_HELPERS
               and node.func.id != name}
    assert callers == WALK, sorted(callers)


def test_the_other_recovery_modules_read_no_event() -> None:
    """decision_text writes a decision's text from the resolver's verdict; none of them reads an Event's fields
    or imports the resolver's rule helpers."""
    from dataclasses import fields

    from jixu.ledger.event import Event

    event_fields = {field.name for field in fields(Event)}
    offenders = []
    for path in sorted((SRC / "recovery").glob("*.py")):
        if path == RESOLVER:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        offenders += [f"{path.name}:{node.lineno} reads .{node.attr}" for node in ast.walk(tree)
                      if isinstance(node, ast.Attribute) and node.attr in event_fields]
        offenders += [f"{path.name}:{node.lineno} imports {alias.name}" for node in ast.walk(tree)
                      if isinstance(node, ast.ImportFrom) and node.module == "jixu.recovery.resolver"
                      for alias in node.names if alias.name in RULE_HELPERS]
    assert not offenders, offenders


# Issue 21: one effect kernel. Above it, nothing takes, renews or gives back a lease, commits appends itself, or
# makes a receipt: claims and heartbeats are jixu.kernel.ownership's, appends go through a stream's
# StreamWriter (effect streams) or kernel.record (events of no effect, which refuses receipts), and receipts
# are made by kernel.effects.Outcome.receipt.
KERNEL_ONLY_METHODS = {"acquire_lease", "take_over_lease", "renew_lease", "release_lease", "append_many"}
RECEIPT_SUFFIXES = (".completed", ".failed")
ABOVE_THE_KERNEL = ("threads", "runs", "scheduling", "server", "cli")


def _kernel_violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        where = f"{path.relative_to(ROOT)}:{node.lineno}"
        if isinstance(func, ast.Attribute) and func.attr in KERNEL_ONLY_METHODS:
            found.append(f"{where} calls .{func.attr}()")
        if isinstance(func, ast.Attribute) and func.attr == "append" and (
                (isinstance(func.value, ast.Name) and func.value.id == "store")
                or (isinstance(func.value, ast.Attribute) and func.value.attr == "store")):
            found.append(f"{where} appends to a store directly")
        if isinstance(func, ast.Name) and func.id == "NewEvent" and node.args:
            kind = node.args[0]
            text = kind.value if isinstance(kind, ast.Constant) and isinstance(kind.value, str) else (
                kind.values[-1].value if isinstance(kind, ast.JoinedStr) and kind.values
                and isinstance(kind.values[-1], ast.Constant) else None)
            if isinstance(text, str) and text.endswith(RECEIPT_SUFFIXES):
                found.append(f"{where} makes a {text!r} receipt itself")
    return found


def test_nothing_above_the_kernel_claims_heartbeats_appends_or_makes_receipts() -> None:
    offenders = [offence for layer in ABOVE_THE_KERNEL for path in sorted((SRC / layer).rglob("*.py"))
                 for offence in _kernel_violations(path)]
    assert not offenders, offenders


def test_the_kernel_check_catches_what_it_forbids(tmp_path: Path) -> None:
    """The check above fails on each thing it forbids (a check that cannot fail proves nothing)."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def f(self, store, kind):\n"
        "    store.append('s', [], 0)\n"
        "    self.log.store.append('s', [], 0)\n"
        "    store.renew_lease(fence, 3)\n"
        "    self.store.take_over_lease('k', 'o', 3, expected_epoch=0, require_expired=False)\n"
        "    NewEvent('tool.completed', {})\n"
        "    NewEvent(f'{kind}.failed', {})\n"
        "    items.append(1)\n", encoding="utf-8")
    original = globals()["ROOT"]
    try:
        globals()["ROOT"] = tmp_path
        found = _kernel_violations(sample)
    finally:
        globals()["ROOT"] = original
    assert len(found) == 6, found


# Issue 24: the work queue's policy (projects, their limits, fairness) is the scheduling layer's. The ledger keeps
# the queue as storage: items in groups, and an atomic claim that takes the order of groups from its caller. So no
# name in the ledger speaks of projects, limits of claims or fairness (its SQL keeps the column names of schema 2:
# strings, not names), and outside the ledger only the scheduling layer claims work.
POLICY_WORDS = {"project", "projects", "fair", "fairness", "quota", "quotas"}
POLICY_NAMES = {"global_limit", "limit_of", "claim_order", "check_limits"}
PROJECTION_VERB = {"ledger/projection.py", "ledger/__init__.py"}
"""Where ``project`` is the ledger's verb (:func:`jixu.ledger.project` folds a stream into its projection)."""


def _words(identifier: str) -> set[str]:
    spaced = "".join(f"_{c.lower()}" if c.isupper() else c for c in identifier)
    return {word for word in spaced.split("_") if word}


def _identifiers(tree: ast.AST) -> list[tuple[str, int, bool]]:
    """``(identifier, line, bare)`` for every name the code gives or uses; ``bare``: a plain name, a function's
    or an import's (what the projection verb may be), not an attribute, argument or keyword."""
    found: list[tuple[str, int, bool]] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Name):
            found.append((node.id, line, True))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.append((node.name, line, True))
        elif isinstance(node, ast.alias):
            found.append((node.asname or node.name.split(".")[-1], line, True))
        elif isinstance(node, ast.Attribute):
            found.append((node.attr, line, False))
        elif isinstance(node, ast.arg | ast.keyword) and node.arg:
            found.append((node.arg, line, False))
    return found


def _policy_names(path: Path, where: str) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [f"{where}:{line} names {name!r}" for name, line, bare in _identifiers(tree)
            if (name in POLICY_NAMES or _words(name) & POLICY_WORDS)
            and not (name == "project" and bare and where in PROJECTION_VERB)]


def test_the_ledger_knows_no_project_limit_or_fairness_of_the_queue() -> None:
    offenders = [offence for path in sorted((SRC / "ledger").rglob("*.py"))
                 for offence in _policy_names(path, path.relative_to(SRC).as_posix())]
    assert not offenders, offenders


def test_the_policy_check_catches_what_it_forbids(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from jixu.ledger.projection import project\n"
        "def claim(self, owner, project_limits, *, limits):\n"
        "    row.project\n"
        "    limits.limit_of('p')\n"
        "    return claim_order(live, oldest, served, limits, fair=True)\n"
        "class WorkProject: ...\n", encoding="utf-8")
    found = _policy_names(sample, "ledger/store.py")
    assert len(found) == 7, found  # project (not the verb here), project_limits, .project, limit_of, claim_order,
    #                                fair, WorkProject
    assert [f for f in _policy_names(sample, "ledger/projection.py") if "'project'" in f] == [
        "ledger/projection.py:3 names 'project'"], "only the verb, by its bare name, is the projection's"


def test_only_the_scheduling_layer_claims_work() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        where = path.relative_to(SRC).as_posix()
        if where.startswith(("ledger/", "scheduling/")):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        offenders += [f"{where}:{node.lineno}" for node in ast.walk(tree)
                      if isinstance(node, ast.Attribute) and node.attr == "claim_work"]
    assert not offenders, f"claims of work are the scheduling layer's (jixu.scheduling.queue.claim): {offenders}"
