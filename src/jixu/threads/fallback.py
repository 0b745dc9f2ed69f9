"""Fallback models: an ordered list of drivers, the next one tried only when a call provably never happened.

::

    model = FallbackModel([OpenAIModel("gpt-5", api="responses"), AnthropicModel("claude-sonnet-4-5")])
    agent = Agent("support", model, tools=[...])

A model call is an effect: trying another model is safe only when the first
provably did not process the request, or the conversation could hold two
answers to one question (and two bills). :class:`FallbackModel` moves on to
the next model only for an error whose ``details["not_processed"]`` is True:
no connection could be made, or the provider answered that it is overloaded
(see :func:`~jixu.threads.streaming.proves_not_processed`). Every other
error (a 500, a timeout, a dropped stream, a rate limit, quota,
authentication, a bad request) is raised as it is, so the thread records it
and pauses, retries or fails as for a single model: an unknown outcome is
never answered by another model.

Each switch is recorded: the answer's receipt carries ``fallback``
(``{"answered_by": name, "tried": [{"model": name, "error": {...}}, ...]}``)
next to ``model`` (what the provider reported), and a ``fallback`` signal
(``{"from", "to", "error_kind"}``) is published when it happens. When every
model fails, the last error is raised with the same record in its
``details["fallback"]``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from jixu.errors import InvalidInput, ModelError
from jixu.ledger.encoding import JSONObject
from jixu.threads.model import ModelDriver, ModelRequest, ModelResponse
from jixu.threads.streaming import Signal, SignalCallback, SignalSource

_ERROR_FIELDS = ("kind", "message", "status", "error_type", "error_code", "request_id", "exception",
                 "not_processed")


def fails_over(error: ModelError) -> bool:
    """Whether ``error`` proves its request was not processed, so that another model may answer it."""
    return error.details.get("not_processed") is True and not error.indeterminate


class FallbackModel(SignalSource):
    """A :class:`~jixu.threads.model.ModelDriver` trying ``models`` in order (see the module docs).

    ``name`` is what threads record (default ``fallback(<name>, <name>, ...)``).
    Signals of the inner drivers are published here too (subscribe to this
    driver, or use ``thread.signals()``): the ``done`` of an attempt that was
    failed over is replaced by the ``fallback`` signal, so each call still
    ends with one ``done``.
    """

    def __init__(self, models: Sequence[ModelDriver], *, name: str | None = None,
                 on_signal: SignalCallback | None = None) -> None:
        super().__init__(on_signal)
        if isinstance(models, str | bytes) or not isinstance(models, Sequence) or not models:
            raise InvalidInput("FallbackModel needs a non-empty list of model drivers, the first tried first",
                               field="models")
        for model in models:
            if not callable(getattr(model, "complete", None)) or not isinstance(getattr(model, "name", None), str):
                raise InvalidInput(f"{model!r} is not a model driver (with a name and an async complete())",
                                   field="models")
        names = [model.name for model in models]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise InvalidInput(f"the fallback models need distinct names (their receipts tell them apart); "
                               f"repeated: {repeated}; pass name=... to the drivers", field="models")
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise InvalidInput("name must be a non-empty string", field="name")
        self.models: tuple[ModelDriver, ...] = tuple(models)
        self._name = name or f"fallback({', '.join(names)})"
        self._held: dict[str, list[Signal]] = {}
        self._active: dict[str, int] = {}
        """Effect ids of the calls in flight through this driver (only their signals are relayed)."""
        for model in self.models:
            add = getattr(model, "add_listener", None)
            if callable(add):
                add(self._relay)

    @property
    def name(self) -> str:
        """A stable name recorded with each call."""
        return self._name

    def __repr__(self) -> str:
        return f"FallbackModel({[m.name for m in self.models]!r}, name={self._name!r})"

    def _relay(self, signal: Signal) -> None:
        if signal.effect_id not in self._active:
            return  # an inner driver also used on its own: not this driver's call
        if signal.kind == "done" and not signal.data.get("ok"):
            # Held until the call's fate is known: published if the error is raised, dropped if failed over.
            self._held.setdefault(signal.effect_id, []).append(signal)
            return
        self.publish(signal)

    def _release(self, effect_id: str) -> None:
        for signal in self._held.pop(effect_id, []):
            self.publish(signal)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """The answer of the first model that processes ``request``; see the module docs."""
        effect_id = request.effect_id
        self._active[effect_id] = self._active.get(effect_id, 0) + 1
        try:
            return await self._first_answer(request)
        finally:
            self._active[effect_id] -= 1
            if not self._active[effect_id]:
                del self._active[effect_id]
                self._held.pop(effect_id, None)

    async def _first_answer(self, request: ModelRequest) -> ModelResponse:
        tried: list[JSONObject] = []
        for index, model in enumerate(self.models):
            following = self.models[index + 1] if index + 1 < len(self.models) else None
            try:
                response = await model.complete(request)
            except ModelError as error:
                if following is not None and fails_over(error):
                    self._held.pop(request.effect_id, None)
                    tried.append({"model": model.name, "error": _summary(error)})
                    self.publish(Signal("fallback", request.effect_id,
                                        {"from": model.name, "to": following.name, "error_kind": error.kind},
                                        thread_id=request.thread_id, turn_id=request.turn_id,
                                        attempt=request.attempt))
                    continue
                self._release(request.effect_id)
                if tried:
                    error.details["fallback"] = {"failed": model.name, "tried": tried}
                raise
            except BaseException:
                self._release(request.effect_id)
                raise
            self._held.pop(request.effect_id, None)
            if not tried:
                return response
            return dataclasses.replace(response, fallback={"answered_by": model.name, "tried": tried})
        raise AssertionError("unreachable: the last model's error is raised")  # pragma: no cover

    async def aclose(self) -> None:
        """Close every model that can be closed."""
        for model in self.models:
            close: Any = getattr(model, "aclose", None)
            if callable(close):
                await close()


def _summary(error: ModelError) -> JSONObject:
    described = error.to_dict()
    return {key: described[key] for key in _ERROR_FIELDS if described.get(key) is not None}


__all__ = ["FallbackModel", "fails_over"]
