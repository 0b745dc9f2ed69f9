"""No orphaned agents: what is still running of a run's recorded process groups, and stopping it.

The journal records each process group a task attempt started
(``run.process_started``) before its program runs; the executor records the
attempt's receipt only once its groups ended. So the groups that may still run
are those of attempts without a receipt (:func:`~jixu.runs.projection.open_processes`):
typically an agent whose worker was SIGKILLed. A drain, a cancellation and a
resume look at them here:

* :func:`survey`: each open group with its members now (``[]``: none left,
  ``None``: it cannot be checked from this machine), signalling nothing;
* :func:`stop_open`: SIGTERM, a grace period, SIGKILL, and a wait, for each
  open group this machine can reach; the ``run.process_stopped`` events that
  record it, and the groups that still run or cannot be checked.

Nothing here decides whether the run may continue; the callers do (a drain
receipt only when nothing remains, a resume refused while anything does).
"""

from __future__ import annotations

from jixu.errors import AgentStillRunning
from jixu.kernel.ownership import group_members
from jixu.ledger import NewEvent
from jixu.ledger.encoding import JSONObject
from jixu.runs.journal import RunLog
from jixu.runs.processes import DEFAULT_GRACE_S, stop_group
from jixu.runs.projection import ENDED, RunRecord, open_processes


def survey(record: RunRecord) -> list[JSONObject]:
    """Every open group that still runs or cannot be checked from here: its ``run.process_started`` data
    plus ``state`` (``alive`` | ``unverifiable``) and ``members``. Signals nothing."""
    found = []
    for started in open_processes(record):
        members = group_members(started.get("process"))
        if members is None or members:
            found.append({**started, "state": "unverifiable" if members is None else "alive", "members": members})
    return found


def stop_open(run: RunLog, *, by: str, trigger: str, grace: float = DEFAULT_GRACE_S
              ) -> tuple[list[NewEvent], list[JSONObject]]:
    """Stop the run's open groups that this machine can reach and wait for them (blocking).

    Returns the ``run.process_stopped`` events to record (one per open group,
    ``outcome`` ``gone`` when nothing of it was running) and what remains:
    groups still running after SIGKILL or that cannot be checked from here
    (as :func:`survey` reports them).
    """
    events: list[NewEvent] = []
    remaining: list[JSONObject] = []
    for started in open_processes(run.record):
        identity = started.get("process")
        assert isinstance(identity, dict)
        report = stop_group(identity, grace)
        if report["outcome"] == "unverifiable":
            remaining.append({**started, "state": "unverifiable", "members": None})
            continue
        events.append(NewEvent("run.process_stopped", {
            "effect_id": started.get("effect_id"), "task_id": started.get("task_id"), "what": started.get("what"),
            "process": identity, "by": by, "trigger": trigger, **report}, run.meta(by)))
        if report["outcome"] not in ENDED:
            remaining.append({**started, "state": "alive", "members": report["remaining"]})
    return events, remaining


def describe(found: list[JSONObject]) -> str:
    """One line per group for an error message: what, pid, process group, host, and why it counts."""
    lines = []
    for entry in found:
        process = entry.get("process") or {}
        where = f"pid {process.get('pid')}, process group {process.get('pgid', process.get('pid'))}, host " \
                f"{process.get('host')}"
        if entry.get("state") == "unverifiable":
            lines.append(f"{entry.get('what')} ({where}) was started on another machine, container or boot and "
                         "cannot be checked from here")
        else:
            lines.append(f"{entry.get('what')} ({where}) is still running: processes {entry.get('members')}")
    return "; ".join(lines)


def still_running(run_id: str, found: list[JSONObject], what: str) -> AgentStillRunning:
    """The refusal of ``what`` (an operation) while ``found`` (from :func:`survey` / :func:`stop_open`) runs."""
    unverifiable = any(entry.get("state") == "unverifiable" for entry in found)
    advice = (f"run it on the machine that started them (host {(found[0].get('process') or {}).get('host')})"
              if unverifiable else
              f"stop them first: `jixu runs resume STORE {run_id} --stop-agents` (SIGTERM, then SIGKILL after "
              f"{DEFAULT_GRACE_S:.0f} s), or cancel the run")
    return AgentStillRunning(f"run {run_id} cannot be {what}: an earlier task attempt's process cannot deliver a "
                             f"receipt any more but may still write to the workspace: {describe(found)}. Nothing "
                             f"was started; {advice}", run_id=run_id,
                             processes=[{k: entry.get(k) for k in ("effect_id", "task_id", "what", "process",
                                                                    "state", "members")} for entry in found])


__all__ = ["describe", "still_running", "stop_open", "survey"]
