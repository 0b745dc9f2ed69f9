"""A deterministic provider for tests and demos: each ``implement`` call plays the next scripted step.

A step is either

* a function ``(workspace: Path, context: ImplementContext) -> ImplementResult``
  (sync functions run in a worker thread, so a slow step does not stall the
  run's lease heartbeat; ``async`` functions are awaited), or
* an exception to raise, typically a :class:`~jixu.runs.providers.ProviderError`
  (``ProviderError("429", kind="rate_limit", retry_after=0.01)``).

When the script is exhausted, ``implement`` raises ``ProviderError(kind="invalid")``
(the run fails: an implementation failure). ``calls`` keeps every context
received, in order.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

from jixu.ledger.encoding import JSONObject, canonical_text
from jixu.runs.providers import ImplementContext, ImplementResult, ProviderError, ProviderTest

StepFunction = Callable[[Path, ImplementContext], ImplementResult | Awaitable[ImplementResult]]
Step = StepFunction | BaseException


class ScriptedProvider:
    """A provider whose behaviour is a list of steps (see the module docstring)."""

    kind = "scripted"

    def __init__(self, name: str, steps: Sequence[Step], *, settings: JSONObject | None = None,
                 test_result: ProviderTest | BaseException | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("a provider needs a name")
        self._name = name
        self._steps = list(steps)
        self._settings: JSONObject = dict(settings or {})
        canonical_text(self._settings, path="settings")
        self._test_result = test_result
        self.calls: list[ImplementContext] = []

    @property
    def name(self) -> str:
        return self._name

    @property
    def remaining(self) -> int:
        """Steps not played yet."""
        return len(self._steps)

    def settings(self) -> JSONObject:
        """The settings given at construction (the script itself is code and is not recorded)."""
        return dict(self._settings)

    async def test(self) -> ProviderTest:
        """``test_result`` (raised if it is an exception); by default ok."""
        if isinstance(self._test_result, BaseException):
            raise self._test_result
        return self._test_result or ProviderTest(True, f"scripted provider {self._name} with {self.remaining} steps")

    async def implement(self, workspace: Path, context: ImplementContext) -> ImplementResult:
        """Play the next step."""
        self.calls.append(context)
        if not self._steps:
            raise ProviderError(f"scripted provider {self._name!r} has no step left", kind="invalid")
        step = self._steps.pop(0)
        if isinstance(step, BaseException):
            raise step
        if inspect.iscoroutinefunction(step):
            outcome = await step(workspace, context)
        else:
            outcome = await asyncio.to_thread(step, workspace, context)
            if inspect.isawaitable(outcome):
                outcome = await outcome
        if not isinstance(outcome, ImplementResult):
            raise TypeError(f"scripted step returned {type(outcome).__name__}, not an ImplementResult")
        return outcome


def write_files(files: Mapping[str, str], summary: str = "wrote files") -> StepFunction:
    """A step that writes ``files`` (relative path -> text) into the workspace."""
    def step(workspace: Path, context: ImplementContext) -> ImplementResult:
        for relative, text in files.items():
            target = workspace / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        return ImplementResult(summary, {"files": sorted(files)})
    return step


__all__ = ["ScriptedProvider", "Step", "StepFunction", "write_files"]
