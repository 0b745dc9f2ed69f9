"""A run's retained workspace: real ``git``, inspected rather than trusted.

Everything here is synchronous I/O on one directory (the engine calls it from
a thread): resolving a project's source on its origin, cloning it into the
run's workspace, and observing what is there now (:func:`inspect`). What the
journal *expects* to find and the comparison of the two are pure
(:func:`jixu.runs.projection.expected_workspace`, :func:`compare`).

Conventions:

* git runs with ``GIT_TERMINAL_PROMPT=0`` (never asks for credentials) and,
  inside a workspace, ``GIT_CEILING_DIRECTORIES`` set to its parent, so a
  workspace whose ``.git`` vanished is reported as having no git root instead
  of being mistaken for an enclosing repository.
* A clone is made in a hidden sibling directory and renamed into place, so a
  workspace either exists completely or not at all, whenever the process stops.
* The *tree* of a workspace is the git tree object of everything in it that git
  would track (``git add -A`` into a temporary index, ``git write-tree``):
  committed, staged, modified and untracked files alike, ignored files not.
  The real index is never touched.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from jixu.errors import GitError, InvalidInput, SourceUnavailable
from jixu.ledger.encoding import JSONObject

GIT_TIMEOUT_S = 300.0
"""The longest one git command may take (a clone of a large origin included)."""
_SHA = re.compile(r"^[0-9a-f]{40}$")
_HEX = re.compile(r"^[0-9a-f]{4,40}$")


def _env(ceiling: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["GIT_TERMINAL_PROMPT"] = "0"
    env.pop("GIT_DIR", None)
    env.pop("GIT_WORK_TREE", None)
    env.pop("GIT_INDEX_FILE", None)
    if ceiling is not None:
        env["GIT_CEILING_DIRECTORIES"] = str(ceiling)
    return env


def git(args: list[str], cwd: Path | None = None, *, check: bool = True, extra_env: dict[str, str] | None = None,
        timeout: float = GIT_TIMEOUT_S, text: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``git args`` (in ``cwd``); :class:`~jixu.errors.GitError` with git's message when it fails and ``check``."""
    env = _env(cwd.parent if cwd is not None else None)
    if extra_env:
        env.update(extra_env)
    try:
        result = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=text,
                                timeout=timeout, check=False, stdin=subprocess.DEVNULL)
    except FileNotFoundError as error:
        raise GitError("git is not installed (no `git` on PATH)", args=args) from error
    except subprocess.TimeoutExpired as error:
        raise GitError(f"git {' '.join(args[:2])} took longer than {timeout:.0f}s", args=args) from error
    if check and result.returncode != 0:
        raise GitError(f"git {' '.join(args)} failed (exit {result.returncode}): {result.stderr.strip()[:500]}",
                       args=args, exit_status=result.returncode)
    return result


def _git_bytes(args: list[str], cwd: Path, extra_env: dict[str, str] | None = None) -> bytes:
    env = _env(cwd.parent)
    if extra_env:
        env.update(extra_env)
    result = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, timeout=GIT_TIMEOUT_S,
                            check=False, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise GitError(f"git {' '.join(args)} failed (exit {result.returncode}): "
                       f"{result.stderr.decode('utf-8', 'replace').strip()[:500]}", args=args)
    return result.stdout


# --- the origin ------------------------------------------------------------------------------


def check_origin(origin: object) -> str:
    """The origin to record: an existing local path made absolute, or a URL as given (typed error if unusable)."""
    if not isinstance(origin, str) or not origin.strip() or len(origin) > 2000 or not origin.isprintable():
        raise InvalidInput(f"origin {origin!r} must be a git URL or a path (1-2000 printable characters)",
                           field="origin")
    if origin.startswith("-"):
        raise InvalidInput(f"origin {origin!r} must not start with '-'", field="origin")
    if "://" not in origin and not re.match(r"^[\w.-]+@[\w.-]+:", origin):
        path = Path(origin).expanduser()
        if path.exists():
            return str(path.resolve())
    return origin


def _is_local(origin: str) -> bool:
    return "://" not in origin and Path(origin).exists()


def default_branch(origin: str) -> str:
    """The branch the origin's HEAD names (``git ls-remote --symref ORIGIN HEAD``)."""
    try:
        result = git(["ls-remote", "--symref", origin, "HEAD"], timeout=60)
    except GitError as error:
        raise SourceUnavailable(f"cannot read the origin {origin!r}: {error.message}", origin=origin) from error
    for line in result.stdout.splitlines():
        if line.startswith("ref: refs/heads/") and line.endswith("\tHEAD"):
            return line[len("ref: refs/heads/"):-len("\tHEAD")]
    raise SourceUnavailable(f"the origin {origin!r} has no HEAD branch (is it empty?); name a default branch",
                            origin=origin)


def origin_refs(origin: str) -> dict[str, str]:
    """Every ref the origin shows now (``git ls-remote``: name -> commit id);
    :class:`~jixu.errors.SourceUnavailable` when the origin cannot be read."""
    try:
        listing = git(["ls-remote", origin], timeout=60).stdout
    except GitError as error:
        raise SourceUnavailable(f"cannot read the origin {origin!r}: {error.message}", origin=origin) from error
    refs: dict[str, str] = {}
    for line in listing.splitlines():
        sha, _tab, name = line.partition("\t")
        if _SHA.match(sha) and name:
            refs[name] = sha
    return refs


def resolve_source(origin: str, commit: str | None, branch: str) -> JSONObject:
    """``{origin, commit, ref}``: the exact commit a run starts from, resolved on the origin.

    ``commit`` ``None`` means the tip of ``branch``; a ref name (``main``,
    ``v1.2``, ``refs/heads/x``) is resolved with ``git ls-remote``; a hex
    commit id is checked with ``git rev-parse`` on a local origin (a full id on
    a remote origin is accepted as is and checked when the workspace is
    prepared). :class:`~jixu.errors.SourceUnavailable` when nothing matches.
    """
    if commit is not None and (not isinstance(commit, str) or not commit or commit.startswith("-")
                               or len(commit) > 250 or not commit.isprintable() or " " in commit):
        raise InvalidInput(f"commit {commit!r} must be a commit id or a ref name", field="commit")
    wanted = commit if commit is not None else f"refs/heads/{branch}"
    refs = origin_refs(origin)
    for candidate in (wanted, f"refs/heads/{wanted}", f"refs/tags/{wanted}"):
        peeled = refs.get(f"{candidate}^{{}}")
        if peeled is not None:
            return {"origin": origin, "commit": peeled, "ref": candidate}
        if candidate in refs:
            return {"origin": origin, "commit": refs[candidate], "ref": candidate}
    if commit is not None and _HEX.match(commit):
        if _is_local(origin):
            found = git(["rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"], cwd=Path(origin), check=False)
            if found.returncode == 0 and _SHA.match(found.stdout.strip()):
                return {"origin": origin, "commit": found.stdout.strip(), "ref": None}
        elif _SHA.match(commit):
            return {"origin": origin, "commit": commit, "ref": None}
    raise SourceUnavailable(f"{wanted!r} is not a branch, tag or commit of the origin {origin!r}", origin=origin,
                            commit=commit)


# --- the workspace ---------------------------------------------------------------------------


def _partials(workspace: Path) -> list[Path]:
    return sorted(workspace.parent.glob(f".{workspace.name}.partial-*"))


def clone(origin: str, commit: str, workspace: Path) -> None:
    """Clone ``origin`` and check out ``commit`` (detached) into ``workspace``, which must not exist yet.

    The clone is made in a hidden sibling and renamed into place; leftovers
    of an earlier, interrupted clone of the same workspace are removed first
    (they were never the workspace).
    """
    if workspace.exists():
        raise GitError(f"workspace {workspace} already exists; refusing to clone over it", workspace=str(workspace))
    workspace.parent.mkdir(parents=True, exist_ok=True)
    for stale in _partials(workspace):
        shutil.rmtree(stale, ignore_errors=True)
    partial = workspace.parent / f".{workspace.name}.partial-{os.getpid()}-{time.time_ns()}"
    try:
        git(["clone", "--quiet", "--no-checkout", "--", origin, str(partial)])
        if git(["cat-file", "-e", f"{commit}^{{commit}}"], cwd=partial, check=False).returncode != 0:
            git(["fetch", "--quiet", "origin", commit], cwd=partial)
        git(["checkout", "--quiet", "--detach", commit], cwd=partial)
        head = git(["rev-parse", "--verify", "HEAD"], cwd=partial).stdout.strip()
        if head != commit:
            raise GitError(f"checked out {head}, expected {commit}", commit=commit)
        os.rename(partial, workspace)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def _out(args: list[str], cwd: Path) -> str | None:
    result = git(args, cwd=cwd, check=False, timeout=60)
    return result.stdout.strip() if result.returncode == 0 else None


def tree_of(workspace: Path) -> str:
    """The git tree of everything git would track in ``workspace`` now (see the module docstring)."""
    git_dir = git(["rev-parse", "--absolute-git-dir"], cwd=workspace).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="jixu-index-") as scratch:
        index = Path(scratch) / "index"
        real = Path(git_dir) / "index"
        if real.exists():
            # The stat cache saves rehashing unchanged files. copy2 keeps the index's mtime, which git's
            # racy-git check needs: a file changed in the same second as the index was written (same size,
            # same inode) is then hashed again instead of being trusted as unchanged.
            shutil.copy2(real, index)
        env = {"GIT_INDEX_FILE": str(index)}
        git(["add", "-A", "--", "."], cwd=workspace, extra_env=env)
        return git(["write-tree"], cwd=workspace, extra_env=env).stdout.strip()


def inspect(workspace: Path) -> JSONObject:
    """What is in ``workspace`` now: ``{exists, git_root, origin, head, tree, dirty}`` (``None`` where unknown).

    Never raises for a missing or broken workspace: that is evidence too.
    """
    evidence: JSONObject = {"exists": workspace.is_dir(), "git_root": None, "origin": None, "head": None,
                            "tree": None, "dirty": None}
    if not evidence["exists"]:
        return evidence
    root = _out(["rev-parse", "--show-toplevel"], workspace)
    evidence["git_root"] = os.path.realpath(root) if root else None
    if root is None:
        return evidence
    evidence["origin"] = _out(["remote", "get-url", "origin"], workspace)
    evidence["head"] = _out(["rev-parse", "--verify", "--quiet", "HEAD"], workspace)
    if evidence["git_root"] == os.path.realpath(workspace):
        try:
            evidence["tree"] = tree_of(workspace)
        except GitError:
            evidence["tree"] = None
        status = _out(["--no-optional-locks", "status", "--porcelain", "--untracked-files=all"], workspace)
        evidence["dirty"] = None if status is None else bool(status)
    return evidence


def changes(workspace: Path, base_commit: str, tree: str) -> JSONObject:
    """What differs between ``base_commit`` and ``tree``: ``{changed_paths, diff_digest}``.

    ``diff_digest`` is the sha256 of ``git diff-tree -r -p --binary`` between
    the two trees, so equal digests mean equal changes.
    """
    names = git(["diff-tree", "-r", "--no-renames", "--name-only", "-z", base_commit, tree], cwd=workspace).stdout
    patch = _git_bytes(["diff-tree", "-r", "--no-renames", "-p", "--binary", base_commit, tree], workspace)
    return {"changed_paths": sorted(p for p in names.split("\0") if p),
            "diff_digest": hashlib.sha256(patch).hexdigest()}



# --- publication ---------------------------------------------------------------------------


_BRANCH = re.compile(r"^(?!/|.*//|.*/$|.*\.\.|.*@\{|.*\.lock$|-)[A-Za-z0-9._/-]{1,200}$")


def check_branch(branch: object) -> str:
    """A branch name safe to push to (``git check-ref-format`` rules, plain characters only)."""
    if not isinstance(branch, str) or not _BRANCH.match(branch) or branch.endswith("."):
        raise InvalidInput(f"branch {branch!r} must be 1-200 characters of A-Z a-z 0-9 . _ / - forming a valid "
                           "git branch name (e.g. jixu/fix-date-parser)", field="branch")
    return branch


def commit_tree(workspace: Path, tree: str, parent: str, message: str, when: str) -> str:
    """The commit of ``tree`` on ``parent`` made by jixu at ``when`` (ISO time): the same inputs, the same id.

    The author, committer and dates are fixed by the arguments, so the commit a
    publication names is determined by what the journal recorded, and can be
    recomputed after a crash instead of being made anew.
    """
    identity = {"GIT_AUTHOR_NAME": "jixu", "GIT_AUTHOR_EMAIL": "jixu@localhost", "GIT_AUTHOR_DATE": when,
                "GIT_COMMITTER_NAME": "jixu", "GIT_COMMITTER_EMAIL": "jixu@localhost", "GIT_COMMITTER_DATE": when}
    return git(["commit-tree", tree, "-p", parent, "-m", message], cwd=workspace, extra_env=identity).stdout.strip()


def remote_branch(origin: str, branch: str) -> str | None:
    """The commit ``branch`` names on ``origin`` now (read-only ``git ls-remote``), or ``None`` if absent."""
    listing = git(["ls-remote", "--heads", origin, f"refs/heads/{branch}"], timeout=60).stdout
    for line in listing.splitlines():
        sha, _tab, ref = line.partition("\t")
        if ref.strip() == f"refs/heads/{branch}":
            return sha.strip()
    return None


def push(workspace: Path, origin: str, commit: str, branch: str) -> None:
    """Push ``commit`` to ``refs/heads/branch`` on ``origin`` (never forced)."""
    git(["push", "--porcelain", origin, f"{commit}:refs/heads/{branch}"], cwd=workspace, timeout=GIT_TIMEOUT_S)


__all__ = ["GIT_TIMEOUT_S", "changes", "check_branch", "check_origin", "clone", "commit_tree", "default_branch", "git",
           "inspect", "origin_refs", "push", "remote_branch", "resolve_source", "tree_of"]
