"""jixu: a durable runtime for AI agents that never guesses whether a side effect happened.

The public surface is what ``__all__`` lists; everything else is internal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jixu.errors import (
    ConcurrencyError,
    EffectNotParked,
    EffectNotUnknown,
    FencingError,
    HarnessClosed,
    IdempotencyConflict,
    IncompatibleAgent,
    InvalidId,
    InvalidInput,
    JixuError,
    LeaseHeld,
    MalformedEvent,
    ModelError,
    NotFound,
    PayloadTooLarge,
    ResolutionConflict,
    SchemaTooNew,
    StepFailed,
    StepMismatch,
    StepOutcomeUnknown,
    StoreError,
    StoreLocked,
    StoreNotFound,
    StoreReadOnly,
    ThreadBusy,
    ThreadCorrupt,
    ThreadNotFound,
)
from jixu.ledger import (
    DEFAULT_STORE_URL,
    Checkpoint,
    Event,
    Fence,
    Lease,
    MemoryStore,
    NewEvent,
    Projected,
    Projection,
    SQLiteStore,
    Store,
    StreamInfo,
    VerifyReport,
    canonical_bytes,
    content_hash,
    new_id,
    open_store,
    project,
    save_checkpoint,
    verify,
    verify_all,
)
from jixu.recovery import Analysis, EffectDecision, RecoveryResolver
from jixu.threads import (
    Agent,
    DontKnow,
    DurableRun,
    Harness,
    ModelDriver,
    ModelRequest,
    ModelResponse,
    NotOccurred,
    Occurred,
    ProbeQuery,
    ScriptedModel,
    State,
    SyncHarness,
    SyncThread,
    Thread,
    ThreadSummary,
    Tool,
    ToolCall,
    ToolContext,
    ToolError,
    Usage,
    durable,
    tool,
)

if TYPE_CHECKING:
    from jixu.ledger.postgres import PostgresStore
    from jixu.threads.anthropic import AnthropicModel
    from jixu.threads.fallback import FallbackModel
    from jixu.threads.openai import OpenAIModel

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """Import :class:`PostgresStore` (and psycopg) and the provider drivers only when first used.

    The drivers import their SDK (an optional extra) only when constructed.
    """
    if name == "PostgresStore":
        from jixu.ledger.postgres import PostgresStore

        return PostgresStore
    if name == "OpenAIModel":
        from jixu.threads.openai import OpenAIModel

        return OpenAIModel
    if name == "AnthropicModel":
        from jixu.threads.anthropic import AnthropicModel

        return AnthropicModel
    if name == "FallbackModel":
        from jixu.threads.fallback import FallbackModel

        return FallbackModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_STORE_URL",
    "Agent",
    "AnthropicModel",
    "DontKnow",
    "DurableRun",
    "EffectNotParked",
    "EffectNotUnknown",
    "FallbackModel",
    "Harness",
    "HarnessClosed",
    "IncompatibleAgent",
    "ModelDriver",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "NotOccurred",
    "Occurred",
    "OpenAIModel",
    "ProbeQuery",
    "ResolutionConflict",
    "ScriptedModel",
    "State",
    "StepFailed",
    "StepMismatch",
    "StepOutcomeUnknown",
    "SyncHarness",
    "SyncThread",
    "Thread",
    "ThreadBusy",
    "ThreadCorrupt",
    "ThreadNotFound",
    "ThreadSummary",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "Usage",
    "tool",
    "Analysis",
    "Checkpoint",
    "ConcurrencyError",
    "EffectDecision",
    "Event",
    "Fence",
    "FencingError",
    "IdempotencyConflict",
    "InvalidId",
    "InvalidInput",
    "JixuError",
    "Lease",
    "LeaseHeld",
    "MalformedEvent",
    "MemoryStore",
    "NewEvent",
    "NotFound",
    "PayloadTooLarge",
    "PostgresStore",
    "Projected",
    "Projection",
    "RecoveryResolver",
    "SQLiteStore",
    "SchemaTooNew",
    "Store",
    "StoreError",
    "StoreLocked",
    "StoreNotFound",
    "StoreReadOnly",
    "StreamInfo",
    "VerifyReport",
    "__version__",
    "canonical_bytes",
    "durable",
    "content_hash",
    "new_id",
    "open_store",
    "project",
    "save_checkpoint",
    "verify",
    "verify_all",
]
