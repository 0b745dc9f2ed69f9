"""The pure side: projection, derived status, decisions and the workspace expectation, from synthetic journals."""

from __future__ import annotations

from typing import Any

from jixu.ledger.encoding import content_hash
from jixu.recovery import RecoveryResolver
from jixu.runs.model import policy_digest
from jixu.runs.projection import (
    AutoResume,
    Dispatch,
    Finish,
    Pause,
    RequestTask,
    Revise,
    RunProjection,
    RunRecord,
    Stop,
    build_state,
    compare,
    decide,
    derive_status,
    expected_workspace,
)
from tests.helpers import chain

SOURCE = {"origin": "/srv/calc.git", "commit": "c" * 40, "ref": "refs/heads/main"}
POLICY = {"checks": [{"name": "unit", "argv": ["true"], "timeout_s": 5.0}], "allowed_paths": ["*"],
          "limits": {"max_repair_attempts": 1, "check_timeout_s": 600.0}}
TASKS = [{"task_id": "P", "kind": "prepare", "params": {}}, {"task_id": "I", "kind": "implement", "params": {}},
         {"task_id": "V", "kind": "verify", "params": {}}]
SEMANTICS = {"prepare": "idempotent", "implement": "idempotent", "verify": "read_only"}


def created() -> list[tuple[str, dict[str, Any]]]:
    return [("run.created", {"run_id": "R", "project": "calc", "brief": "fix", "source": SOURCE,
                             "provider": {"name": "p", "revision": 1}, "policy": POLICY,
                             "policy_digest": policy_digest(POLICY),
                             "workspace": "/ws/R", "parent_run_id": None, "knowledge": None}),
            ("plan.revised", {"revision": 1, "provider_revision": 1, "reason": "initial", "tasks": TASKS})]


def intent(effect: str, task: str, kind: str, attempt: int = 1) -> tuple[str, dict[str, Any]]:
    args = {"task_id": task, "revision": 1, "attempt": attempt}
    return ("task.requested", {"effect_id": effect, "name": kind, "args": args, "args_hash": content_hash(args),
                               "semantics": SEMANTICS[kind], "idempotency_key": f"jixu:{effect}",
                               "requires_approval": False, "task_id": task, "attempt": attempt})


def dispatched(effect: str, attempt: int = 1) -> tuple[str, dict[str, Any]]:
    return ("task.dispatched", {"effect_id": effect, "attempt": attempt})


def completed(effect: str, result: dict[str, Any], attempt: int = 1) -> tuple[str, dict[str, Any]]:
    return ("task.completed", {"effect_id": effect, "attempt": attempt, "result": result})


def failed(effect: str, error: dict[str, Any], attempt: int = 1) -> tuple[str, dict[str, Any]]:
    return ("task.failed", {"effect_id": effect, "attempt": attempt, "error": error, "indeterminate": False,
                            "workspace": {"head": "c" * 40, "tree": "t2"}})


PREPARED = [intent("e1", "P", "prepare"), dispatched("e1"),
            completed("e1", {"git_root": "/ws/R", "origin": SOURCE["origin"], "head": "c" * 40, "tree": "t0"})]
IMPLEMENTED = [intent("e2", "I", "implement"), dispatched("e2"),
               completed("e2", {"summary": "ok", "head": "c" * 40, "tree": "t1", "changed_paths": ["calc.py"],
                                "diff_digest": "x", "disallowed_paths": []})]


def fold(specs: list[tuple[str, dict[str, Any]]]) -> tuple[RunRecord, Any]:
    projection = RunProjection()
    record = projection.initial()
    for event in chain(specs, stream="run/R"):
        record = projection.apply(record, event)
    return record, RecoveryResolver.analyze(record.lifecycle, check_links=False)


def verify_result(passed: bool, tree: str = "t1") -> dict[str, Any]:
    return {"head": "c" * 40, "tree": tree, "tree_after": tree, "passed": passed,
            "checks": [{"name": "unit", "exit_status": 0 if passed else 1, "passed": passed}]}


def test_a_fresh_run_is_queued_and_its_first_action_is_the_prepare_intent() -> None:
    record, analysis = fold(created())
    assert derive_status(record, analysis, "none") == ("queued", "created; waiting for a worker")
    assert decide(record, analysis) == RequestTask("P", "prepare", 1)
    assert decide(*fold([*created(), intent("e1", "P", "prepare")])) == Dispatch("e1", "P", "prepare", 1)


def test_an_in_flight_task_is_running_while_the_lease_lives_and_interrupted_once_it_is_stale() -> None:
    record, analysis = fold([*created(), ("run.claimed", {"owner": "w", "epoch": 1}), *PREPARED,
                             intent("e2", "I", "implement"), dispatched("e2")])
    assert derive_status(record, analysis, "live")[0] == "running"
    assert derive_status(record, analysis, "stale")[0] == "interrupted"
    assert derive_status(record, analysis, "released")[0] == "interrupted"  # the outcome is still unknown
    resumed, after = fold([*created(), ("run.claimed", {"owner": "w", "epoch": 1}), *PREPARED,
                           intent("e2", "I", "implement"), dispatched("e2"),
                           ("run.resumed", {"reason": "explicit", "actor": "ops"})])
    assert derive_status(resumed, after, "stale")[0] == "queued"
    assert decide(resumed, after) == Dispatch("e2", "I", "implement", 2)  # retry-safe: the same intent again
    expected = expected_workspace(resumed, after)
    assert (expected["head"], expected["tree"], expected["tree_may_differ"]) == ("c" * 40, None, True)


def test_provider_failures_pause_automatically_three_times_then_wait_for_an_operator() -> None:
    specs = [*created(), *PREPARED]
    for attempt in range(1, 5):
        effect = f"i{attempt}"
        specs += [intent(effect, "I", "implement", attempt), dispatched(effect),
                  failed(effect, {"type": "provider_error", "kind": "rate_limit", "retry_after": 0.5})]
        action = decide(*fold(specs))
        assert isinstance(action, Pause) and action.automatic == (attempt <= 3) and action.retry_after == 0.5
        specs.append(("run.paused", {"reason": "rate_limit", "automatic": action.automatic, "delay": 0.5,
                                     "resume_at": 100.0, "effect_id": effect, "task_id": "I"}))
        record, analysis = fold(specs)
        if attempt <= 3:
            assert decide(record, analysis) == AutoResume(100.0)
            assert derive_status(record, analysis, "live")[0] == "paused"
            specs.append(("run.resumed", {"reason": "automatic"}))
            assert decide(*fold(specs)) == RequestTask("I", "implement", attempt + 1)
    record, analysis = fold(specs)
    assert decide(record, analysis) == Stop("paused", "rate_limit: waiting for an explicit resume or a handoff")
    assert record.auto_retries == 3
    quota = [*created(), *PREPARED, intent("q", "I", "implement"), dispatched("q"),
             failed("q", {"type": "provider_error", "kind": "quota"})]
    action = decide(*fold(quota))
    assert isinstance(action, Pause) and action.automatic is False


def test_a_failing_verification_is_repaired_once_then_fails_and_a_passing_one_succeeds() -> None:
    base = [*created(), *PREPARED, *IMPLEMENTED, intent("e3", "V", "verify"), dispatched("e3")]
    action = decide(*fold([*base, completed("e3", verify_result(False))]))
    assert isinstance(action, Revise) and action.repair_of["failing"] == ["unit"]
    repaired = [*base, completed("e3", verify_result(False)),
                ("plan.revised", {"revision": 2, "provider_revision": 1, "reason": "repair", "repair_of": {},
                                  "tasks": [*TASKS, {"task_id": "I2", "kind": "implement", "params": {}},
                                            {"task_id": "V2", "kind": "verify", "params": {}}]})]
    assert decide(*fold(repaired)) == RequestTask("I2", "implement", 1)
    twice = [*repaired, intent("e4", "I2", "implement"), dispatched("e4"), completed("e4", {"tree": "t1",
                                                                                            "head": "c" * 40}),
             intent("e5", "V2", "verify"), dispatched("e5"), completed("e5", verify_result(False))]
    final = decide(*fold(twice))
    assert isinstance(final, Finish) and final.outcome == "failed"
    ok = decide(*fold([*base, completed("e3", verify_result(True))]))
    assert isinstance(ok, Finish) and ok.outcome == "succeeded" and ok.evidence["source"]["tree"] == "t1"
    elsewhere = decide(*fold([*base, completed("e3", verify_result(True, tree="t9"))]))
    assert isinstance(elsewhere, Finish) and elsewhere.outcome == "failed"  # not the implemented snapshot


def test_the_journal_stops_everything_when_finished_mismatched_or_contradictory() -> None:
    finished = fold([*created(), ("run.finished", {"outcome": "cancelled", "reason": "no"})])
    assert derive_status(*finished, "live") == ("cancelled", "no")
    mismatch = fold([*created(), ("run.reconciled", {"outcome": "mismatch", "details": ["HEAD moved"]})])
    assert derive_status(*mismatch, "none")[0] == "needs_reconciliation"
    fixed = fold([*created(), ("run.reconciled", {"outcome": "mismatch", "details": ["HEAD moved"]}),
                  ("run.reconciled", {"outcome": "consistent", "details": []})])
    assert derive_status(*fixed, "none")[0] == "queued"
    contradictory = fold([*created(), intent("e9", "nope", "prepare")])
    assert derive_status(*contradictory, "none")[0] == "corrupt"
    after_finish = fold([*created(), ("run.finished", {"outcome": "failed"}), ("run.resumed", {"reason": "explicit"})])
    assert after_finish[0].problems


def test_a_frozen_policy_must_match_its_digest() -> None:
    changed = [(kind, {**data, "policy": {**POLICY, "checks": []}} if kind == "run.created" else data)
               for kind, data in created()]
    record, analysis = fold(changed)
    assert record.problems[0] == "seq 1 (run.created): the frozen policy does not match its policy_digest"
    assert isinstance(decide(record, analysis), Stop)  # RunLog.corruption() makes it corrupt: nothing runs


def test_a_finished_failed_or_cancelled_run_is_retried_once() -> None:
    failed_run = [*created(), ("run.finished", {"outcome": "failed", "reason": "no"})]
    once = fold([*failed_run, ("run.retried", {"child_run_id": "C1", "provider": "p", "actor": "a"})])
    assert not once[0].problems and derive_status(*once, "none") == ("failed", "no")
    assert build_state(once[0], once[1], "failed", "no", None).lineage == {"parent_run_id": None, "retried_as": "C1"}
    twice = fold([*failed_run, ("run.retried", {"child_run_id": "C1"}), ("run.retried", {"child_run_id": "C2"})])
    assert twice[0].problems == ["seq 5 (run.retried): a second retry (retried as C1)"]
    unfinished = fold([*created(), ("run.retried", {"child_run_id": "C1"})])
    assert unfinished[0].problems == ["seq 3 (run.retried): a retry of a run that is not failed or cancelled "
                                      "(unfinished)"]
    succeeded = fold([*created(), ("run.finished", {"outcome": "succeeded"}), ("run.retried", {"child_run_id": "C"})])
    assert succeeded[0].problems and succeeded[0].retried is None


def test_compare_names_every_difference() -> None:
    expected = {"workspace": "/ws/R", "origin": "/srv/calc.git", "head": "h1", "tree": "t1", "may_be_absent": False,
                "clean": False}
    same = {"exists": True, "git_root": "/ws/R", "origin": "/srv/calc.git", "head": "h1", "tree": "t1", "dirty": True}
    assert compare(same, expected) == ("consistent", [])
    moved = {**same, "head": "h2", "origin": "https://elsewhere", "tree": "t2", "git_root": None}
    outcome, details = compare(moved, expected)
    assert outcome == "mismatch" and len(details) == 4
    assert compare({"exists": False}, expected)[0] == "mismatch"
    assert compare({"exists": False}, {**expected, "may_be_absent": True})[0] == "consistent"


def test_the_record_survives_a_checkpoint_round_trip() -> None:
    import json

    from jixu.ledger.encoding import canonical_text

    record, analysis = fold([*created(), ("run.claimed", {"owner": "w", "epoch": 1}), *PREPARED, *IMPLEMENTED,
                             ("run.finished", {"outcome": "failed"}), ("run.retried", {"child_run_id": "C"})])
    assert record.retried is not None
    projection = RunProjection()
    loaded = projection.load(json.loads(canonical_text(projection.dump(record))))
    assert projection.dump(loaded) == projection.dump(record)
    assert decide(loaded, RecoveryResolver.analyze(loaded.lifecycle, check_links=False)) == decide(record, analysis)
