"""The evidence rule for remote requests (pure): does a retained inspection show the admitted effect?

An inspection (``request.inspected``) is the provider's read-only answer about
one request's effect, retained before anyone acts on it. It is the request's
*probe*. What it must show to count as evidence that the effect happened:

* a publication: the branch the intent names, on the origin, at exactly the
  intent's commit (computed from the admitted tree on the source commit, so no
  one else's push has that id); for a pull-request publisher also a pull
  request whose head is that branch at that commit. The intent's tree must be
  the admitted source's tree.
* a deploy, a rollback, a knowledge write: a job id or version reported for
  *this* task, i.e. an object with ``job_id`` or ``version`` and ``key`` equal
  to the idempotency key the provider was given (the reported object itself,
  or one in a list it holds).

:func:`matches` answers ``(shown, missing, compared)``. A matching inspection
settles the request as ``occurred`` (recorded by ``probe:<provider>``); an
operator may then not say ``not_occurred``. Without one an operator may not
say ``occurred``. Absence is never proven by an inspection (a push may still be
in flight): ``not_occurred`` and ``abandoned_unknown`` stay operator decisions.
"""

from __future__ import annotations

from typing import Any

from jixu.ledger.encoding import JSONObject


def _publication(admitted: JSONObject, args: JSONObject, found: JSONObject) -> tuple[list[str], JSONObject]:
    branch, commit, tree = args.get("branch"), args.get("commit"), args.get("tree")
    source_tree = (admitted.get("source") or {}).get("tree")
    pull_request = ((admitted.get("target") or {}).get("publisher_kind")) == "pull_request"
    compared: JSONObject = {"branch": branch, "commit": commit, "tree": tree, "admitted_tree": source_tree,
                            "found_branch": found.get("branch"), "found_commit": found.get("remote_commit"),
                            "pull_request_needed": pull_request}
    missing: list[str] = []
    if not (isinstance(tree, str) and tree and tree == source_tree):
        missing.append(f"the intent's tree {tree} is not the admitted source's tree {source_tree}")
    if found.get("branch") != branch:
        missing.append(f"the inspection looked at branch {found.get('branch')!r}, not the intent's {branch!r}")
    remote = found.get("remote_commit")
    if remote is None:
        why = f" (the origin could not be read: {found.get('error')})" if found.get("reachable") is False else ""
        missing.append(f"branch {branch} does not exist on the origin{why}; the intent's commit {commit} was not "
                       "found there")
    elif remote != commit:
        missing.append(f"branch {branch} is at {remote}, not at the intent's commit {commit}")
    if pull_request:
        pulls = found.get("pull_requests")
        if not isinstance(pulls, list):
            missing.append(f"the pull-request API could not be read ({found.get('api_error')})")
        else:
            ours = [p for p in pulls if isinstance(p, dict) and p.get("head_sha") == commit
                    and p.get("head_ref") == branch and isinstance(p.get("number"), int)
                    and isinstance(p.get("url"), str)]
            compared["pull_request"] = ours[0] if ours else None
            if not ours:
                missing.append(f"no pull request has head {branch} at {commit}")
    return missing, compared


def _reported(value: Any) -> list[JSONObject]:
    """The objects a provider's inspection reports: the object itself and those in its list values."""
    if not isinstance(value, dict):
        return []
    found = [value]
    for item in value.values():
        if isinstance(item, list):
            found += [entry for entry in item if isinstance(entry, dict)]
    return found


def _remote(intent: JSONObject, found: JSONObject) -> tuple[list[str], JSONObject]:
    key = intent.get("idempotency_key")
    ours = [entry for entry in _reported(found.get("reported")) if entry.get("key") == key
            and any(isinstance(entry.get(k), str) and entry.get(k) for k in ("job_id", "version"))]
    compared: JSONObject = {"key": key, "job": ours[0] if ours else None}
    missing = [] if ours else [f"the provider's inspection reports no job id or version for this task (key {key})"]
    return missing, compared


def matches(kind: str, admitted: JSONObject, intent: JSONObject, found: object) -> tuple[bool, list[str], JSONObject]:
    """Whether the inspection's ``found`` shows the request's effect: ``(shown, what is missing, what was
    compared)``; see the module docstring."""
    if not isinstance(found, dict):
        return False, ["the inspection recorded no answer from the provider"], {}
    args = intent.get("args") or {}
    if kind == "publication":
        missing, compared = _publication(admitted, args, found)
    else:
        missing, compared = _remote(intent, found)
    return not missing, missing, compared


__all__ = ["matches"]
