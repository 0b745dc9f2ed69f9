"""The effect kernel: what threads, runs and execution requests share to carry effects out durably.

* :mod:`~jixu.kernel.commits`: the one commit path of a store on an event loop (shared commits).
* :mod:`~jixu.kernel.writer`: one writer per stream in a process; the record moves with durable events
  only; receipts are kept across other writers' events.
* :mod:`~jixu.kernel.ownership`: claims, the ``*.claimed`` record, heartbeats, release.
* :mod:`~jixu.kernel.effects`: dispatch marker -> driver -> receipt.
* :mod:`~jixu.kernel.shutdown`: a loop's shutdown never cuts a call in flight.
* :mod:`~jixu.kernel.loop`: the decide-and-act loop and its pauses.

The kernel sits on the ledger and the recovery resolver; threads and runs sit on it and supply only
their pure decide step, their projection and their drivers.
"""

from jixu.kernel.commits import Commitment, Commits
from jixu.kernel.effects import INTERRUPTED, Outcome, marker, perform
from jixu.kernel.loop import LOOP_STOPPED, asked_too_long, check_backoff, drive, pause_delay, sleep_until
from jixu.kernel.ownership import (
    DEFAULT_LEASE_TTL,
    STOP_GRACE_S,
    Claim,
    LiveClaim,
    Session,
    acquire_claim,
    another_live_process,
    claim_stream,
    dead_holder,
    given_back_on_failure,
    group_gone,
    group_identity,
    group_members,
    holds,
    left_running,
    live_claim,
    own_lease,
    owner_gone,
    process_identity,
    recovery_claim,
    release,
    release_later,
    stop_group,
    take_claim,
    wait_group_gone,
)
from jixu.kernel.shutdown import CallerTask, ServingTask, calls_in_flight
from jixu.kernel.writer import (
    StreamWriter,
    chain_with_recorded_break,
    is_receipt,
    record,
    unrecorded_receipts,
)

__all__ = [
    "CallerTask",
    "Claim",
    "Commitment",
    "Commits",
    "DEFAULT_LEASE_TTL",
    "INTERRUPTED",
    "LOOP_STOPPED",
    "LiveClaim",
    "Outcome",
    "STOP_GRACE_S",
    "ServingTask",
    "Session",
    "StreamWriter",
    "chain_with_recorded_break",
    "acquire_claim",
    "asked_too_long",
    "another_live_process",
    "calls_in_flight",
    "check_backoff",
    "claim_stream",
    "dead_holder",
    "drive",
    "given_back_on_failure",
    "group_gone",
    "group_identity",
    "group_members",
    "holds",
    "is_receipt",
    "left_running",
    "live_claim",
    "marker",
    "own_lease",
    "owner_gone",
    "pause_delay",
    "perform",
    "process_identity",
    "record",
    "recovery_claim",
    "release",
    "release_later",
    "sleep_until",
    "stop_group",
    "take_claim",
    "unrecorded_receipts",
    "wait_group_gone",
]
