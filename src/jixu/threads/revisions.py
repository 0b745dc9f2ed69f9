"""Agent revisions: which changes of an agent's definition a thread may take, and what it records (pure).

A thread records its agent (``thread.created``: name, contract, digest, model,
each tool's digest). Reopened by a harness whose agent has the same name but
another definition, the thread takes the new definition as its next revision
(``agent.revised``) unless the change would alter an effect still open: a
call not yet dispatched, one whose outcome is unknown and unresolved, or one
parked for approval, whose tool was removed or changed. Such a change is
refused with :class:`~jixu.errors.IncompatibleAgent`, naming the effect and
what to do. An agent of another name is another agent, never a revision.

The rules read the recorded state and the resolver's analysis only; nothing is
written here (the thread appends what :func:`revision` returns).
"""

from __future__ import annotations

from typing import Any

from jixu.errors import IncompatibleAgent, JixuError
from jixu.ledger.encoding import JSONObject
from jixu.recovery import Analysis
from jixu.threads.agent import Agent
from jixu.threads.projection import ThreadState

OPEN_STATES = ("not_dispatched", "unknown", "parked")
"""The resolver's states of an effect a change of its tool could alter (an unknown one only while unresolved)."""


def _what_to_do(thread_id: str, effect_id: str, state: str) -> str:
    if state == "parked":
        return (f"approve or deny it first (jixu threads approve|deny STORE {thread_id} {effect_id}), or keep the "
                "tool as it was until it is settled")
    if state == "unknown":
        return (f"resolve it first (jixu threads resolve STORE {thread_id} {effect_id} --resolution "
                "occurred|not_occurred|abandoned_unknown), or keep the tool as it was until it is settled")
    return ("let the previous definition finish it, or interrupt the turn (thread.interrupt()) so the call "
            "never runs, then open the thread under the new definition")


def _tool_problem(state: ThreadState, agent: Agent, name: str, intent: JSONObject | None,
                  recorded: object) -> str | None:
    """Why ``agent`` would not carry out a recorded open call of tool ``name`` as recorded, or None."""
    tool = agent.tool(name)
    if tool is None:
        return f"tool {name!r} was removed"
    if isinstance(recorded, dict) and name in recorded:
        # The record names each tool's digest: any change of the tool's contract is a change.
        return None if agent.tool_digests()[name] == recorded[name] else f"tool {name!r} changed"
    if state.agent.get("contract") == agent.contract:
        return None  # the tools are exactly the recorded ones
    # A record from before per-tool digests: compare what the call's intent recorded.
    if intent is None:
        return f"tool {name!r} may have changed (the record names no digest per tool)"
    if intent.get("semantics") != tool.semantics:
        return f"tool {name!r} changed its semantics ({intent.get('semantics')} -> {tool.semantics})"
    if bool(intent.get("requires_approval")) != tool.requires_approval:
        return f"tool {name!r} changed whether it requires approval"
    if (intent.get("probe") is True) != (tool.probe is not None):
        return f"tool {name!r} {'lost' if intent.get('probe') is True else 'gained'} its probe"
    try:
        tool.validate_args(intent.get("args"))
    except JixuError:
        return f"tool {name!r} no longer accepts the call's recorded arguments"
    return None


def revision(state: ThreadState, analysis: Analysis, agent: Agent, *, thread_id: str) -> JSONObject | None:
    """The ``agent.revised`` data that moves the thread to ``agent``'s definition, or ``None`` when it already
    runs under it. Raises :class:`~jixu.errors.IncompatibleAgent` for another agent, or for a change that would
    alter an effect still open (``analysis``: the resolver's answer for the open effects)."""
    recorded = state.agent
    if recorded.get("name") != agent.name:
        raise IncompatibleAgent(
            f"thread {thread_id} was recorded under agent {recorded.get('name')!r}; this harness runs "
            f"{agent.name!r}, another agent (a revision keeps the agent's name)", thread_id=thread_id)
    if recorded.get("digest") == agent.digest and recorded.get("contract") == agent.contract:
        return None
    recorded_tools = recorded.get("tools")
    for effect_id, decision in analysis.decisions.items():
        if decision.kind not in ("tool", "probe") or decision.state not in OPEN_STATES:
            continue
        if decision.state == "unknown" and decision.resolution is not None:
            continue
        intent = state.intent(effect_id)
        name = str(decision.name)
        if decision.kind == "probe":  # a probe in flight needs its tool's probe, unchanged
            target = intent.get("args", {}).get("effect_id") if intent else None
            problem = _tool_problem(state, agent, name, state.intent(str(target)) if target else None,
                                    recorded_tools)
        else:
            problem = _tool_problem(state, agent, name, intent, recorded_tools)
        if problem is not None:
            raise IncompatibleAgent(
                f"thread {thread_id} cannot take the new definition of agent {agent.name!r}: {problem}, and its "
                f"{decision.kind} effect {effect_id} is still {decision.state}; {_what_to_do(thread_id, effect_id, decision.state)}",
                thread_id=thread_id, effect_id=effect_id, state=decision.state, tool=name)
    return {"revision": state.revision + 1, "agent": agent.describe(),
            "previous": {"revision": state.revision, "contract": recorded.get("contract"),
                         "digest": recorded.get("digest"), "model": recorded.get("model")},
            "changes": changes(recorded, agent)}


def changes(recorded: JSONObject, agent: Agent) -> dict[str, Any]:
    """What differs between a recorded agent and ``agent``: tools added, removed, changed (``None`` when the
    record names no digest per tool), the model, and whether anything beyond the tools changed."""
    now = agent.tool_digests()
    found: dict[str, Any] = {"model": None if recorded.get("model") == agent.model.name
                             else {"from": recorded.get("model"), "to": agent.model.name},
                             "contract_changed": recorded.get("contract") != agent.contract}
    before = recorded.get("tools")
    if isinstance(before, dict):
        found["tools_added"] = sorted(set(now) - set(before))
        found["tools_removed"] = sorted(set(before) - set(now))
        found["tools_changed"] = sorted(n for n in set(now) & set(before) if now[n] != before[n])
    else:
        found["tools_added"] = found["tools_removed"] = found["tools_changed"] = None
    return found


__all__ = ["OPEN_STATES", "changes", "revision"]
