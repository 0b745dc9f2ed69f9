"""One small hierarchy of typed errors, each with a stable ``code``.

Every error jixu raises on purpose derives from :class:`JixuError`. The
``code`` is stable across releases: the CLI maps it to an exit status and the
HTTP API to a problem ``type``. Messages name the offending id and say what to
do next.
"""

from __future__ import annotations

import math
from typing import Any


class JixuError(Exception):
    """Base class of every error jixu raises deliberately."""

    code: str = "jixu_error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description: ``{"code", "message", **details}``."""
        return {"code": self.code, "message": self.message, **self.details}


class MissingExtra(JixuError, ImportError):
    """A feature needs an optional dependency that is not installed; the message names the ``pip install``.

    Also an :class:`ImportError`, so code that guards an optional import keeps working.
    """

    code = "missing_extra"

    @classmethod
    def needed(cls, extra: str, feature: str, error: ImportError) -> MissingExtra:
        """The error for ``feature``, which needs ``jixu[extra]`` and failed to import with ``error``."""
        missing = error.name or str(error)
        return cls(f'{feature} needs the {extra!r} extra ({missing} is not installed): pip install "jixu[{extra}]"',
                   extra=extra, module=missing)


def require_extra(module: str, extra: str, feature: str) -> None:
    """Import ``module`` (whose package comes with ``jixu[extra]``), or raise :class:`MissingExtra`."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError as error:
        raise MissingExtra.needed(extra, feature, error) from error


# --- bad input: nothing was written -------------------------------------------------


class InvalidInput(JixuError):
    """The caller passed something malformed; nothing was changed."""

    code = "invalid_input"


class InvalidId(InvalidInput):
    """An event id, stream name or other identifier has the wrong form."""

    code = "invalid_id"


class MalformedEvent(InvalidInput):
    """An event's type, data or meta cannot be encoded canonically."""

    code = "malformed_event"


class PayloadTooLarge(InvalidInput):
    """An event's encoded data and meta exceed the store's size limit."""

    code = "payload_too_large"


class ToolDefinitionError(InvalidInput):
    """A ``@tool`` declaration is unusable (bad option, annotation or signature)."""

    code = "tool_definition_invalid"


class ToolInputError(InvalidInput):
    """Arguments for a tool call do not match the tool's parameter schema."""

    code = "tool_input_invalid"


class ToolOutputError(JixuError):
    """A tool returned a value that is not plain JSON or does not match its return annotation."""

    code = "tool_output_invalid"


class NotFound(JixuError):
    """A stream, event or other object does not exist."""

    code = "not_found"


# --- append contract ----------------------------------------------------------------


class ConcurrencyError(JixuError):
    """The stream's head moved: ``expected_seq`` is no longer the head."""

    code = "concurrency_conflict"


class FencingError(JixuError):
    """The fence (lease key, owner, epoch) is no longer current."""

    code = "stale_fence"


class IdempotencyConflict(JixuError):
    """An id was reused with different content."""

    code = "idempotency_conflict"


class LeaseHeld(JixuError):
    """Another owner holds an unexpired lease on the key."""

    code = "lease_held"


# --- the effect kernel --------------------------------------------------------------


class StreamBusy(JixuError):
    """This process's writer of the stream has an append waiting for its commit; wait for it first."""

    code = "stream_busy"


class StreamCorrupt(JixuError):
    """The stream's events do not verify or contradict themselves; nothing acts on it."""

    code = "stream_corrupt"


class ReceiptConflict(JixuError):
    """A call's receipt was not recorded because another writer recorded an event of the same effect
    meanwhile (an operator's resolution, say): appending it would contradict the record. The receipt is
    kept in the error (``unrecorded_receipts``)."""

    code = "receipt_conflict"


# --- the store itself ---------------------------------------------------------------


class StoreError(JixuError):
    """The store cannot be used as asked."""

    code = "store_error"


class StoreNotFound(StoreError):
    """The database does not exist and creating it was not allowed."""

    code = "store_not_found"


class StoreLocked(StoreError):
    """Another process held the database lock past the busy timeout."""

    code = "store_locked"


class StoreReadOnly(StoreError):
    """The store was opened read-only (or the file is not writable)."""

    code = "store_read_only"


class SchemaTooNew(StoreError):
    """The database was written by a newer jixu; this code fails closed."""

    code = "schema_too_new"


class OutcomeUnknown(StoreError):
    """A write's commit failed, or its connection broke before the answer came: it may or may not be stored.

    Read back before going on; appending the same batch again (same ids) is a
    no-op if it was stored.
    """

    code = "outcome_unknown"


class StoreNotDurable(StoreError):
    """The database server would not keep commits through a crash (e.g. PostgreSQL with ``fsync = off``)
    and the store was not told to accept that."""

    code = "store_not_durable"


class UnsupportedStoreUrl(StoreError):
    """A store URL names a scheme jixu does not know."""

    code = "unsupported_store_url"


class KeyUnavailable(StoreError):
    """No checkpoint key can seal here: the key file is missing and cannot be made, is malformed, or others
    may read it. Nothing is sealed (checkpoints are not written); opening replays the events instead."""

    code = "key_unavailable"


class ArtifactNotFound(NotFound):
    """No artifact with this hash is stored."""

    code = "artifact_not_found"


class ArtifactCorrupt(StoreError):
    """A stored artifact does not reassemble to the text its hash names."""

    code = "artifact_corrupt"


# --- threads --------------------------------------------------------------------------


class ThreadNotFound(NotFound):
    """No thread with this id exists in the store."""

    code = "thread_not_found"


class ThreadCorrupt(StreamCorrupt):
    """The thread's events contradict themselves; it will not run until an operator repairs it."""

    code = "thread_corrupt"


class ThreadBusy(JixuError):
    """The thread cannot take this request in its current status (running, waiting, failed)."""

    code = "thread_busy"


class HarnessClosed(ThreadBusy):
    """The harness was closed (or belongs to another process, before a fork): it admits no more work."""

    code = "harness_closed"


class TurnNotPaused(ThreadBusy):
    """An explicit resume of a thread whose turn is not paused (nothing to resume)."""

    code = "turn_not_paused"


class NoActiveTurn(ThreadBusy):
    """An interrupt of a thread with no turn in progress (nothing to interrupt)."""

    code = "no_active_turn"


class TurnOwned(ThreadBusy):
    """Another process owns the thread's active turn (its lease is live, or expired but not recovered)."""

    code = "turn_owned"


class OwnershipLost(JixuError):
    """This process's claim on a turn was fenced out (its lease expired or was taken over)."""

    code = "ownership_lost"


class IncompatibleAgent(JixuError):
    """The thread was recorded under an agent whose name or tool contract differs."""

    code = "incompatible_agent"


class StepOutcomeUnknown(JixuError):
    """A durable step (``Harness.durable``) was dispatched and its outcome is unknown: it is unsafe to run again,
    and no probe settled it. ``details``: ``thread_id``, ``effect_id``, ``step``, ``probe`` (what the probe
    answered, if one was asked). An operator resolves it (``jixu threads resolve``), then the code runs again."""

    code = "step_outcome_unknown"


class StepMismatch(JixuError):
    """A durable step's recorded intent differs from what the code asks now (name, arguments' hash, semantics or
    approval under the same step key): the code changed under a run in progress. Nothing is run."""

    code = "step_mismatch"


class StepFailed(JixuError):
    """A durable step ended without a result, as recorded: a determinate failure (``ToolError``), a denial, or an
    operator's ``abandoned_unknown``. ``details["reason"]`` says which; re-running the code raises it again."""

    code = "step_failed"


class EffectNotUnknown(JixuError):
    """An outcome resolution names an effect that is not in the ``unknown`` state."""

    code = "effect_not_unknown"


class EffectNotParked(JixuError):
    """An approval or denial names an effect that is not waiting for one."""

    code = "effect_not_parked"


class ResolutionConflict(JixuError):
    """The effect was already resolved differently, or a resolution id was reused with another body."""

    code = "resolution_conflict"


# --- runs ---------------------------------------------------------------------------


class ProjectNotFound(NotFound):
    """No project with this name is registered in the store."""

    code = "project_not_found"


class ProjectCorrupt(StreamCorrupt):
    """The project's stream does not verify; nothing (a run, an admission, a policy change) acts on it."""

    code = "project_corrupt"


class ProjectExists(JixuError):
    """A project with this name is already registered with a different origin or policy."""

    code = "project_exists"


class InvalidPolicy(InvalidInput):
    """A project policy is malformed (checks, timeouts, allowed paths, limits); nothing was written."""

    code = "invalid_policy"


class SourceUnavailable(JixuError):
    """The project's git origin cannot be read, or the requested commit or ref does not exist there."""

    code = "source_unavailable"


class GitError(JixuError):
    """A git command in a run's workspace failed (the message carries git's own words)."""

    code = "git_error"


class RunNotFound(NotFound):
    """No run with this id exists in the store."""

    code = "run_not_found"


class RunStateError(JixuError):
    """The run cannot take this operation in its current status (e.g. resuming a succeeded run)."""

    code = "run_state_error"


class RunCorrupt(StreamCorrupt):
    """The run's journal does not verify or contradicts itself; no operation acts on it."""

    code = "run_corrupt"


class RunOwned(RunStateError):
    """Another process is executing the run (its run lease is live)."""

    code = "run_owned"


class AgentStillRunning(RunStateError):
    """A process an earlier task attempt of the run started (an agent, a check) is still running, or cannot be
    checked from here: nothing may start another one in the same workspace (HTTP 409).

    ``details["processes"]`` lists them (what, pid, process group, host, and ``alive`` or ``unverifiable``).
    """

    code = "agent_still_running"


class WorkspaceMismatch(JixuError):
    """The run's workspace does not match its journal (git root, origin, HEAD or tree moved).

    The finding is recorded (``run.reconciled`` with outcome ``mismatch``); the run needs reconciliation.
    """

    code = "workspace_mismatch"


class UnknownProvider(InvalidInput):
    """No provider with this name is configured."""

    code = "unknown_provider"


class ProviderTestFailed(JixuError):
    """A provider failed its test before a handoff; nothing was written."""

    code = "provider_test_failed"


class ProviderMismatch(JixuError):
    """The configured provider no longer matches the run's frozen provider snapshot; hand the run off."""

    code = "provider_mismatch"



class RequestNotFound(NotFound):
    """No execution request with this id exists for this run."""

    code = "request_not_found"


class RequestStateError(JixuError):
    """The execution request cannot be admitted or take this operation now (limits, unresolved intents)."""

    code = "request_state_error"


class RequestOwned(RequestStateError):
    """Another process is carrying the execution request out (its claim on the request is live): its outcome
    settles there, so it is neither executed again nor inspected, resolved or reconciled meanwhile."""

    code = "request_owned"


class RequestCorrupt(StreamCorrupt):
    """The execution request's stream does not verify or contradicts itself; nothing acts on it."""

    code = "request_corrupt"


class ReconciliationNeedsProof(JixuError):
    """Reconciliation found no proof of the request's outcome: it stays unknown (HTTP 409).

    The finding is retained (``request.reconciled``, ``settled`` false); the
    same reconciliation id returns it again. ``details["result"]`` holds it.
    """

    code = "reconciliation_needs_proof"


class ResolutionNeedsEvidence(JixuError):
    """An operator's resolution of a remote request contradicts, or is not backed by, the retained evidence
    (HTTP 409): ``occurred`` needs an inspection that found the admitted source (branch and commit, pull
    request, job or version); ``not_occurred`` is refused when one did. ``abandoned_unknown`` claims neither.

    ``details["missing"]`` says what the evidence lacks; ``details["inspection"]`` cites the inspection.
    """

    code = "resolution_needs_evidence"


class AlreadyReconciled(JixuError):
    """The request was already settled by a reconciliation with another reconciliation id."""

    code = "already_reconciled"

class MCPConnectionError(JixuError):
    """An MCP server cannot be connected to, or its session ended during a call (whose outcome is then unknown)."""

    code = "mcp_connection"


class MCPToolOutcomeUnknown(JixuError):
    """An ``unsafe`` MCP tool answered ``isError``: the server SDK answers an exception its tool code raised after
    acting the same way, so whether the tool acted is unknown (unless the tool is declared in
    ``errors_before_acting``)."""

    code = "mcp_tool_outcome_unknown"


def seconds_or_none(value: object) -> float | None:
    """``value`` as seconds to wait (a finite number >= 0, not a bool), else None: a provider's retry-after as
    recorded (a value that is none, NaN or infinite could not be recorded, and would stop the failure's receipt)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


class ModelError(JixuError):
    """A model driver failed. ``indeterminate`` says whether the call may have been processed; ``retry_after``
    (seconds) is kept only when it is a finite number >= 0."""

    code = "model_error"

    def __init__(self, message: str, *, kind: str = "transient", indeterminate: bool = True,
                 retry_after: float | None = None, **details: Any) -> None:
        retry_after = seconds_or_none(retry_after)
        super().__init__(message, kind=kind, indeterminate=indeterminate, retry_after=retry_after, **details)
        self.kind = kind
        self.indeterminate = indeterminate
        self.retry_after = retry_after


__all__ = [
    "AgentStillRunning",
    "AlreadyReconciled",
    "ArtifactCorrupt",
    "ArtifactNotFound",
    "ConcurrencyError",
    "EffectNotParked",
    "EffectNotUnknown",
    "FencingError",
    "GitError",
    "HarnessClosed",
    "IdempotencyConflict",
    "IncompatibleAgent",
    "InvalidId",
    "InvalidInput",
    "InvalidPolicy",
    "KeyUnavailable",
    "JixuError",
    "LeaseHeld",
    "MCPConnectionError",
    "MCPToolOutcomeUnknown",
    "MissingExtra",
    "MalformedEvent",
    "ModelError",
    "NotFound",
    "OutcomeUnknown",
    "OwnershipLost",
    "PayloadTooLarge",
    "ProjectCorrupt",
    "ProjectExists",
    "ProjectNotFound",
    "ProviderMismatch",
    "ProviderTestFailed",
    "ReceiptConflict",
    "RequestCorrupt",
    "ReconciliationNeedsProof",
    "ResolutionNeedsEvidence",
    "RequestNotFound",
    "RequestOwned",
    "RequestStateError",
    "ResolutionConflict",
    "RunCorrupt",
    "RunNotFound",
    "RunOwned",
    "RunStateError",
    "SchemaTooNew",
    "SourceUnavailable",
    "StoreError",
    "StoreLocked",
    "StoreNotDurable",
    "StoreNotFound",
    "StoreReadOnly",
    "StepFailed",
    "StepMismatch",
    "StepOutcomeUnknown",
    "StreamBusy",
    "StreamCorrupt",
    "ThreadBusy",
    "ThreadCorrupt",
    "ThreadNotFound",
    "ToolDefinitionError",
    "ToolInputError",
    "ToolOutputError",
    "TurnNotPaused",
    "TurnOwned",
    "UnknownProvider",
    "UnsupportedStoreUrl",
    "WorkspaceMismatch",
    "require_extra",
    "seconds_or_none",
]
