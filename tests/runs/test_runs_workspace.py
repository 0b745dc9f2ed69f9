"""The workspace observations the journal's evidence rests on: trees, inspection, source resolution."""

from __future__ import annotations

import os
import time
from pathlib import Path

from jixu.runs.workspace import changes, clone, inspect, resolve_source, tree_of
from tests.runs.run_helpers import BUGGY, git, make_origin


def test_a_file_rewritten_in_the_same_second_as_the_checkout_still_changes_the_tree(tmp_path: Path) -> None:
    """Regression: a same-size edit within the index's second must not be trusted from the stat cache."""
    origin = make_origin(tmp_path)
    commit = git("rev-parse", "HEAD", cwd=origin)
    workspace = tmp_path / "ws"
    while time.time() % 1 > 0.5:  # start early in a second: checkout and edit share it
        time.sleep(0.05)
    clone(str(origin), commit, workspace)
    (workspace / "calc.py").write_text(BUGGY.replace("-", "+"))  # same size, same inode
    time.sleep(1.05 - time.time() % 1)  # observe in a later second
    tree = tree_of(workspace)
    assert tree != git("rev-parse", f"{commit}^{{tree}}", cwd=origin)
    assert changes(workspace, commit, tree)["changed_paths"] == ["calc.py"]

def test_inspect_reports_missing_and_broken_workspaces_as_evidence(tmp_path: Path) -> None:
    assert inspect(tmp_path / "nothing") == {"exists": False, "git_root": None, "origin": None, "head": None,
                                             "tree": None, "dirty": None}
    (tmp_path / "plain").mkdir()
    plain = inspect(tmp_path / "plain")
    assert plain["exists"] and plain["git_root"] is None  # never mistaken for an enclosing repository
    origin = make_origin(tmp_path)
    commit = git("rev-parse", "HEAD", cwd=origin)
    workspace = tmp_path / "ws"
    clone(str(origin), commit, workspace)
    seen = inspect(workspace)
    assert (seen["git_root"], seen["origin"], seen["head"], seen["dirty"]) == (
        os.path.realpath(workspace), str(origin), commit, False)
    assert seen["tree"] == git("rev-parse", f"{commit}^{{tree}}", cwd=origin)
    (workspace / "new.txt").write_text("x")
    assert inspect(workspace)["dirty"] is True and inspect(workspace)["tree"] != seen["tree"]


def test_sources_resolve_on_the_origin(tmp_path: Path) -> None:
    origin = make_origin(tmp_path)
    commit = git("rev-parse", "HEAD", cwd=origin)
    git("tag", "v1", cwd=tmp_path / "origin-src")
    git("push", "-q", str(origin), "v1", cwd=tmp_path / "origin-src")
    assert resolve_source(str(origin), None, "main") == {"origin": str(origin), "commit": commit,
                                                         "ref": "refs/heads/main"}
    assert resolve_source(str(origin), "v1", "main")["commit"] == commit
    assert resolve_source(str(origin), commit[:8], "main") == {"origin": str(origin), "commit": commit, "ref": None}
