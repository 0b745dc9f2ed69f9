"""Operator-facing helpers of the runs layer: loading configured providers, and what may be done with a run next.

Both the CLI and workers use them, so they live here rather than in an interface.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from jixu.errors import InvalidInput, JixuError
from jixu.exports import load_object
from jixu.ledger.encoding import JSONObject
from jixu.runs.model import RunState
from jixu.runs.providers import Provider
from jixu.runs.publication import GitPublisher, Publisher
from jixu.runs.remote import RemoteProvider

PROVIDERS_ENV = "JIXU_PROVIDERS"
"""The environment variable naming the providers factory when ``--providers`` is not given."""
PUBLISHERS_ENV = "JIXU_PUBLISHERS"
"""The environment variable naming the publishers factory when ``--publishers`` is not given."""
REMOTES_ENV = "JIXU_REMOTES"
"""The environment variable naming the remote providers factory when ``--remotes`` is not given."""
PLACEHOLDER = "MODULE:FACTORY"


def _factory_entries(spec: str | None, option: str, env: str, what: str,
                     required: tuple[str, ...]) -> dict[str, Any]:
    """Call the ``MODULE:FACTORY`` that ``spec`` names; its ``{name: object}`` (typed error if unusable)."""
    if spec is None or not spec.strip():
        raise InvalidInput(f"no {what}s: give --{option} MODULE:FACTORY or set ${env} (a zero-argument callable "
                           f"returning a dict of {what} name -> {what})", field=option)
    target = load_object(spec, option, f"myapp.{option}:{option}")
    if not callable(target):
        raise InvalidInput(f"--{option} {spec!r} is not callable; give a zero-argument factory", field=option)
    try:
        made = target()
    except JixuError:
        raise
    except Exception as error:
        raise InvalidInput(f"{option} factory {spec!r} failed: {type(error).__name__}: {error}",
                           field=option) from error
    if not isinstance(made, Mapping):
        raise InvalidInput(f"{option} factory {spec!r} returned {type(made).__name__}, not a dict of name -> "
                           f"{what}", field=option)
    entries: dict[str, Any] = {}
    for name, entry in made.items():
        missing = [a for a in required if not hasattr(entry, a)]
        if not isinstance(name, str) or missing:
            raise InvalidInput(f"{option} factory {spec!r}: entry {name!r} is not a {what}"
                               + (f" (it lacks {', '.join(missing)})" if missing else ""), field=option)
        entries[name] = entry
    return entries


def load_providers(spec: str | None) -> dict[str, Provider]:
    """Call the providers factory ``MODULE:FACTORY`` names; its ``{name: provider}`` (typed error if unusable)."""
    return _factory_entries(spec, "providers", PROVIDERS_ENV, "Provider",
                            ("kind", "name", "settings", "test", "implement"))


def load_publishers(spec: str | None) -> dict[str, Publisher]:
    """The publishers ``MODULE:FACTORY`` configures, or ``{"git": GitPublisher()}`` without one."""
    if spec is None or not spec.strip():
        return {"git": GitPublisher()}
    return _factory_entries(spec, "publishers", PUBLISHERS_ENV, "Publisher",
                            ("kind", "name", "settings", "preflight", "publish", "inspect"))


def load_remotes(spec: str | None) -> dict[str, RemoteProvider]:
    """The deploy / rollback / knowledge-write providers ``MODULE:FACTORY`` configures."""
    return _factory_entries(spec, "remotes", REMOTES_ENV, "RemoteProvider",
                            ("kind", "name", "settings", "preflight", "perform", "inspect"))


def next_operations(state: RunState, store: str, providers_spec: str | None = None,
                    running: Sequence[JSONObject] = ()) -> list[JSONObject]:
    """What an operator may do with the run now, each with the exact command (for a succeeded run: publish).

    ``running``: what :func:`jixu.runs.orphans.survey` found of an earlier attempt still running; while it runs,
    resume is offered with ``--stop-agents`` (it refuses without) and handoff is not offered (it refuses)."""
    head = f"{shlex.quote(store)} {state.run_id}"
    spec = shlex.quote(providers_spec) if providers_spec else PLACEHOLDER
    ops: list[JSONObject] = []
    alive = [entry for entry in running if entry.get("state") == "alive"]
    pids = sorted({pid for entry in alive for pid in entry.get("members") or []})

    def add(operation: str, why: str, extra: str = "") -> None:
        if alive and operation == "handoff":
            return  # refused while an earlier attempt's process runs: resume --stop-agents first
        if alive and operation == "resume":
            why = (f"stop what an earlier attempt left running (processes {', '.join(map(str, pids))}: SIGTERM, then "
                   f"SIGKILL), then {why}")
            extra += " --stop-agents"
        ops.append({"operation": operation, "why": why, "command": f"jixu runs {operation} {head}{extra}"})

    status = state.status
    if status == "corrupt":
        return ops  # no operation acts on a journal that does not hold: there is nothing to offer
    blocked = state.blocked
    if blocked is not None:  # only what settles the blocker (nothing for a corrupt project: its operator's job)
        if blocked.get("by") == "cancellation":
            request = str(blocked.get("request_id"))
            if blocked.get("request_status") == "pending":
                add("execute-request", "carry out the admitted cancellation (or let a worker do it)", f" {request}")
            elif blocked.get("request_status") == "needs_reconciliation":
                add("reconcile-execution-request", "settle the cancellation in doubt from the run's journal (it "
                                                   "completes the cancellation if the run never finished)",
                    f" {request} --reconciliation-id HEX")
        return ops
    if status == "succeeded":
        add("publish", "push the verified source to a branch on the authorized origin (or open a pull request "
                       "with --publisher): an execution request, executed here with --execute or by a worker",
            " --execute")
        return ops
    if status in ("failed", "cancelled"):
        if state.lineage.get("retried_as"):
            return ops  # retried once already: its retry is the run to look at
        add("retry", "a fresh run (new id, fresh clone) of the same brief, source and policy, with lineage; this "
                     "run's history stays as it is", f" --providers {spec} --execute")
        return ops
    broken = bool(state.problems) or state.analysis.has_corruption or bool(state.analysis.requires_resolution)
    pause = state.pauses[-1] if state.pauses and status == "paused" else None
    if status == "queued":
        add("execute", "run it to its next stop in this process (or let a worker run it)", f" --providers {spec}")
    elif status == "paused" and pause is not None:
        if pause.get("automatic"):
            add("execute", "continue: the automatic retry waits out its recorded delay", f" --providers {spec}")
        add("resume", "continue with the same provider (the workspace is reconciled first)",
            f" --providers {spec} --execute")
        add("handoff", "continue with another provider (tested first; a new plan revision)",
            f" --agent NAME --providers {spec} --execute")
    elif status == "interrupted":
        add("resume", "reconcile the workspace against the journal, then continue without redoing completed "
                      "tasks", f" --providers {spec} --execute")
        add("handoff", "continue with another provider (tested first; a new plan revision)",
            f" --agent NAME --providers {spec} --execute")
    elif status == "needs_reconciliation" and not broken:
        stuck = [d.effect_id for d in state.analysis.decisions.values()
                 if d.state == "unknown" and d.resolution is None]
        for effect_id in stuck:
            add("resolve-task", "after checking the workspace: not_occurred tries the task again under a new effect "
                                "id, abandoned_unknown fails the run", f" {effect_id} --resolution not_occurred "
                                                                      "--note TEXT")
        add("resume", "once the workspace is restored to what the journal says (git root, origin, HEAD, tree)",
            f" --providers {spec} --execute")
    add("cancel", "finish it as cancelled" + (" (the executing process stops at its next step)"
                                               if status == "running" else ""), " --reason TEXT")
    return ops


__all__ = ["PLACEHOLDER", "PROVIDERS_ENV", "PUBLISHERS_ENV", "REMOTES_ENV", "load_providers", "load_publishers",
           "load_remotes", "next_operations"]
