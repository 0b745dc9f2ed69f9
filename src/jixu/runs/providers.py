"""Worker providers: what implements a run's brief in its workspace (an agent, an external CLI, a script).

A provider is configuration plus behaviour. Its configuration is frozen in the
run as a *provider snapshot* (:meth:`Provider.snapshot`: kind, name, settings
without secrets, digest); handing a run off to another provider records a new
snapshot and a new plan revision. Providers do I/O and decide nothing about
durability: the run engine records each task's intent before calling them and
the observed outcome after.

Failures a provider reports map to run pauses: ``rate_limit`` and
``transient`` are retried automatically (recorded delay, at most 3 times);
``quota`` and ``authentication`` wait for an operator (resume, or handoff to a
fresh provider snapshot). Any other exception is an implementation failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from jixu.errors import JixuError, seconds_or_none
from jixu.ledger.encoding import JSONObject, content_hash
from jixu.runs.processes import ProcessHook

ProviderErrorKind = Literal["rate_limit", "quota", "authentication", "transient", "invalid"]
PAUSE_KINDS = ("rate_limit", "quota", "authentication", "transient")


class ProviderError(JixuError):
    """A provider refused or failed in a way that pauses the run (see the module docstring); ``retry_after``
    (seconds) is kept only when it is a finite number >= 0."""

    code = "provider_error"

    def __init__(self, message: str, *, kind: ProviderErrorKind, retry_after: float | None = None,
                 **details: Any) -> None:
        retry_after = seconds_or_none(retry_after)
        super().__init__(message, kind=kind, retry_after=retry_after, **details)
        self.kind = kind
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class ImplementContext:
    """What a provider gets besides the workspace: the brief and the run's recorded history."""

    run_id: str
    brief: str
    attempt: int
    repair_of: JSONObject | None = None
    """For a repair attempt: the evidence of the failed checks (recorded before this call)."""
    knowledge: JSONObject = field(default_factory=dict)
    """Retrieved context and its digest, carried across resumes and handoffs."""
    process_started: ProcessHook | None = field(default=None, compare=False)
    """A provider that starts processes hands each one's group to this hook before its program runs
    (:func:`~jixu.runs.checks.run_process` with ``started=``): the run records it, so a drain, a cancellation
    or a resume can find and stop what the provider started even after this worker died."""


@dataclass(frozen=True, slots=True)
class ImplementResult:
    """What the provider reports having done (the engine also inspects the workspace itself)."""

    summary: str
    details: JSONObject = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ProviderTest:
    """The outcome of testing a provider before a handoff."""

    ok: bool
    message: str = ""


class Provider(Protocol):
    """The interface of every worker provider."""

    @property
    def kind(self) -> str:
        """``agent``, ``command`` or ``scripted``."""
        ...

    @property
    def name(self) -> str:
        """The configured provider's name (e.g. ``claude``, ``codex-cli``)."""
        ...

    def settings(self) -> JSONObject:
        """The provider's configuration without secrets (frozen into the run)."""
        ...

    async def test(self) -> ProviderTest:
        """Check that the provider is usable now (credentials, binary present); no side effects."""
        ...

    async def implement(self, workspace: Path, context: ImplementContext) -> ImplementResult:
        """Work on the brief in ``workspace``; raise :class:`ProviderError` to pause the run."""
        ...


def provider_snapshot(provider: Provider, revision: int) -> JSONObject:
    """The frozen record of a provider configuration: kind, name, settings, revision, digest."""
    body = {"kind": provider.kind, "name": provider.name, "settings": provider.settings()}
    return {**body, "revision": revision, "digest": content_hash(body)}


__all__ = [
    "PAUSE_KINDS",
    "ImplementContext",
    "ImplementResult",
    "Provider",
    "ProviderError",
    "ProviderErrorKind",
    "ProviderTest",
    "provider_snapshot",
]
