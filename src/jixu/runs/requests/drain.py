"""A cancellation's drain: when the run's executor is provably gone, and the receipt that nothing of the run runs.

A cancellation finishes the run (``run.finished`` naming the request) and is
complete only with ``run.drained`` in the run's journal. That receipt is
written by the executing process when it stops, or, once the executor is
provably gone, by whoever looks: the request's worker (``execute``) or a
reconciliation. The executor is gone (:func:`executor`) when no process holds
the run's lease by the store's clock (none, released, expired), or when its
holder's process is proven dead on this machine
(:func:`~jixu.kernel.ownership.dead_holder`, the claim's recorded identity).

Before the receipt, every process group the run recorded and that may still
run (an agent whose worker was SIGKILLed) is stopped and waited for
(:func:`~jixu.runs.orphans.stop_open`). ``run.drained`` is recorded only when
none remains; a group this machine cannot check keeps the request unsettled.
"""

from __future__ import annotations

from jixu.errors import ConcurrencyError
from jixu.kernel import dead_holder
from jixu.ledger import NewEvent, Store
from jixu.ledger.encoding import JSONObject
from jixu.runs.journal import RunLog
from jixu.runs.model import run_lease_key
from jixu.runs.orphans import describe, stop_open
from jixu.runs.processes import DEFAULT_GRACE_S


def finished_by(run: RunLog, request_id: str) -> bool:
    """Whether the cancellation request ``request_id`` finished the run."""
    return (run.record.finished or {}).get("request_id") == request_id


def drained_receipt(run: RunLog, request_id: str) -> JSONObject | None:
    """The run's ``run.drained`` receipt for the request, if recorded."""
    return next((d for d in run.record.drained if d.get("request_id") == request_id), None)


def executor(store: Store, run: RunLog) -> tuple[bool, JSONObject]:
    """``(live, what was seen)``: whether a process still executes the run, by the one rule of the module
    docstring. What was seen names the lease, the store's clock and, when the holder is proven dead, the
    proof."""
    lease = store.get_lease(run_lease_key(run.run_id))
    now = store.now()
    if lease is None:
        return False, {"owner": None, "epoch": 0, "released": None, "expires_at": None, "store_now": now,
                       "gone": "no process ever held the run's lease"}
    seen: JSONObject = {"owner": lease.owner, "epoch": lease.epoch, "released": lease.released,
                        "expires_at": lease.expires_at, "store_now": now}
    if lease.released:
        return False, {**seen, "gone": "the lease was released"}
    if lease.expires_at <= now:
        return False, {**seen, "gone": "the lease expired by the store's clock"}
    proof = dead_holder(lease, run.holder_process)
    if proof is not None:
        return False, {**seen, "gone": "the lease holder's process is proven gone", "owner_gone": proof}
    return True, seen


def stop_leftovers(run: RunLog, *, by: str, trigger: str,
                   grace: float = DEFAULT_GRACE_S) -> tuple[list[NewEvent], list[JSONObject]]:
    """Stop the run's recorded groups that may still run (blocking): see :func:`~jixu.runs.orphans.stop_open`."""
    return stop_open(run, by=by, trigger=trigger, grace=grace)


def record_drain(store: Store, run: RunLog, request_id: str, *, by: str, trigger: str,
                 stopped: tuple[list[NewEvent], list[JSONObject]]) -> tuple[JSONObject | None, str]:
    """Record ``run.drained`` if the executor is provably gone and nothing of the run remains; ``(the receipt
    or None, why not)``. ``stopped`` is what :func:`stop_leftovers` did just before (its events are recorded
    here, in the same append as the receipt)."""
    drained = drained_receipt(run, request_id)
    if drained is not None:
        return drained, ""
    live, seen = executor(store, run)
    events, remaining = stopped
    if live:
        if events:  # a cancellation stopped the live executor's processes: it drains itself now
            try:
                run.append(events)
            except ConcurrencyError:
                run.sync()
        return None, (f"the process executing the run (owner {seen.get('owner')}, epoch {seen.get('epoch')}) still "
                      "holds its lease by the store's clock and is not proven gone")
    if remaining:
        if events:
            try:
                run.append(events)
            except ConcurrencyError:
                run.sync()
        return None, f"no drain receipt while a process of the run may still run: {describe(remaining)}"
    receipt = NewEvent("run.drained", {"request_id": request_id, "by": by, "how": "no process holds the run's lease",
                                       "lease": seen, "trigger": trigger, "processes_stopped": len(events)},
                       run.meta(by) | {"request_id": request_id})
    try:
        run.append([*events, receipt])
    except ConcurrencyError:
        run.sync()  # the executor wrote meanwhile (perhaps its own drain receipt): the caller looks again
        return drained_receipt(run, request_id), "the run's journal moved; look again"
    return drained_receipt(run, request_id), ""


__all__ = ["drained_receipt", "executor", "finished_by", "record_drain", "stop_leftovers"]
