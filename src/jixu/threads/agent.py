"""The immutable Agent definition a harness runs threads under."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from jixu.errors import InvalidInput, JixuError
from jixu.ledger.encoding import content_hash
from jixu.threads.model import ModelDriver
from jixu.threads.tools import Tool


@dataclass(frozen=True)
class Agent:
    """A name, instructions, a model driver and tools (and optionally a context budget).

    ``contract`` is a digest of the name and every tool's contract (name,
    schemas, semantics, approval, probe). ``digest`` also covers instructions,
    the model's name and the limits. A thread records both, and each tool's
    own digest; a thread reopened under a changed definition of the same name
    records a new revision (``agent.revised``, see
    :mod:`jixu.threads.revisions`) unless the change would alter an effect
    still open, which is refused.
    """

    name: str
    model: ModelDriver
    instructions: str = ""
    tools: Sequence[Tool] = field(default_factory=tuple)
    max_steps: int = 32
    """Model calls allowed in one turn before the turn fails."""
    context_budget: int | None = None
    """The conversation's size, in estimated tokens (characters / 4 of the message contents and tool-call
    arguments), above which the messages before the active turn are compacted into a model-written summary
    before the next model call. ``None``: never compact. Leave room for the instructions and tool schemas,
    which the estimate does not count."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise InvalidInput("an agent needs a non-empty name", field="name")
        if not hasattr(self.model, "complete"):
            raise InvalidInput("model must be a model driver (with an async complete())", field="model")
        tools = tuple(self.tools)
        for item in tools:
            if not isinstance(item, Tool):
                raise InvalidInput(f"{item!r} is not a tool; decorate it with @jixu.tool", field="tools")
        names = [t.name for t in tools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise InvalidInput(f"tool names must be unique; repeated: {duplicates}", field="tools")
        if isinstance(self.max_steps, bool) or not isinstance(self.max_steps, int) or self.max_steps < 1:
            raise InvalidInput("max_steps must be an integer >= 1", field="max_steps")
        budget = self.context_budget
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
            raise InvalidInput("context_budget must be an integer >= 1 (estimated tokens) or None",
                               field="context_budget")
        object.__setattr__(self, "tools", tools)

    def tool(self, name: str) -> Tool | None:
        """The tool called ``name``, or ``None``."""
        for candidate in self.tools:
            if candidate.name == name:
                return candidate
        return None

    @property
    def contract(self) -> str:
        """Digest of what must not change under a running thread."""
        return content_hash({"name": self.name, "tools": sorted((t.contract() for t in self.tools),
                                                                key=lambda c: str(c["name"]))})

    @property
    def digest(self) -> str:
        """Digest of the whole definition (contract, instructions, model name, limits)."""
        definition: dict[str, Any] = {"contract": self.contract, "instructions": self.instructions,
                                      "model": self.model.name, "max_steps": self.max_steps}
        if self.context_budget is not None:  # absent when unset, so earlier digests stay as recorded
            definition["context_budget"] = self.context_budget
        return content_hash(definition)

    def tool_digests(self) -> dict[str, str]:
        """Each tool's contract digest, by tool name (what tells a changed tool from an unchanged one)."""
        return {t.name: content_hash(t.contract()) for t in self.tools}

    def prepare(self) -> None:
        """Load now what the model's first call would load (its driver's ``prepare()``, when it has one).

        A worker calls this before it takes turns: a module imported by the first answer (the price
        catalogue, ~0.2 s) would otherwise run on the event loop while every other call in flight waits.
        A driver's failure is an :class:`~jixu.errors.InvalidInput` naming it (a worker then does not start).
        """
        prepare = getattr(self.model, "prepare", None)
        if not callable(prepare):
            return
        try:
            prepare()
        except JixuError:
            raise
        except Exception as error:
            raise InvalidInput(f"agent {self.name!r}: its model {self.model.name!r} could not prepare: "
                               f"{type(error).__name__}: {error}", field="model") from error

    def describe(self) -> dict[str, Any]:
        """What a thread records about its agent (``tools``: :meth:`tool_digests`)."""
        return {"name": self.name, "contract": self.contract, "digest": self.digest, "model": self.model.name,
                "tools": self.tool_digests()}


__all__ = ["Agent"]
