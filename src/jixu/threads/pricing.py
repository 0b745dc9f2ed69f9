"""Model prices and the cost of one call.

Prices are USD per million tokens: ``input`` (uncached prompt tokens),
``output``, ``cached_input`` (prompt tokens read from the provider's cache)
and, for providers that bill writing to the cache separately (Anthropic),
``cache_write``. :data:`DEFAULT_PRICES` lists a few well-known models as
published by their providers when this table was written (see
:data:`PRICES_AS_OF`); prices change, so a driver takes ``prices=`` to
override or extend the table. A model that is in neither has no price: its
cost stays ``None`` (unknown), never ``0``.

A model name matches a table entry exactly, or as the entry followed by a
dated snapshot suffix (``gpt-4o-2024-08-06``, ``claude-sonnet-4-20250514``) or
``-latest``; nothing else (``gpt-4o-audio-preview`` is not ``gpt-4o``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from jixu.errors import InvalidInput

PRICES_AS_OF = "2025-06"
"""When :data:`DEFAULT_PRICES` was copied from the providers' price pages."""

_SNAPSHOT = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8}|latest)$")
_PRICE_KEYS = ("input", "output", "cached_input", "cache_write")


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens. ``cached_input`` and ``cache_write`` default to ``input`` when not set."""

    input: float
    output: float
    cached_input: float | None = None
    cache_write: float | None = None

    def cost(self, *, input_tokens: int, output_tokens: int, cached_tokens: int = 0,
             cache_write_tokens: int = 0) -> float:
        """USD for one call. ``input_tokens`` counts every prompt token, cached and cache writes included."""
        cached = max(0, min(cached_tokens, input_tokens))
        written = max(0, min(cache_write_tokens, input_tokens - cached))
        plain = input_tokens - cached - written
        cached_price = self.input if self.cached_input is None else self.cached_input
        write_price = self.input if self.cache_write is None else self.cache_write
        total = (plain * self.input + cached * cached_price + written * write_price
                 + output_tokens * self.output) / 1_000_000
        return round(total, 10)


PriceTable: TypeAlias = Mapping[str, "Price | Mapping[str, float]"]
"""What ``prices=`` accepts: model name -> :class:`Price` or ``{"input", "output", "cached_input"?, ...}``."""

DEFAULT_PRICES: dict[str, Price] = {
    # OpenAI (https://openai.com/api/pricing)
    "gpt-4o": Price(input=2.50, output=10.00, cached_input=1.25),
    "gpt-4o-mini": Price(input=0.15, output=0.60, cached_input=0.075),
    "gpt-4.1": Price(input=2.00, output=8.00, cached_input=0.50),
    "gpt-4.1-mini": Price(input=0.40, output=1.60, cached_input=0.10),
    "gpt-4.1-nano": Price(input=0.10, output=0.40, cached_input=0.025),
    "o3-mini": Price(input=1.10, output=4.40, cached_input=0.55),
    "o4-mini": Price(input=1.10, output=4.40, cached_input=0.275),
    # Anthropic (https://www.anthropic.com/pricing); cache writes (5-minute) cost 1.25x input
    "claude-3-haiku": Price(input=0.25, output=1.25, cached_input=0.03, cache_write=0.30),
    "claude-3-5-haiku": Price(input=0.80, output=4.00, cached_input=0.08, cache_write=1.00),
    "claude-3-5-sonnet": Price(input=3.00, output=15.00, cached_input=0.30, cache_write=3.75),
    "claude-3-7-sonnet": Price(input=3.00, output=15.00, cached_input=0.30, cache_write=3.75),
    "claude-sonnet-4": Price(input=3.00, output=15.00, cached_input=0.30, cache_write=3.75),
    "claude-opus-4": Price(input=15.00, output=75.00, cached_input=1.50, cache_write=18.75),
}


def _price(model: str, value: object) -> Price:
    if isinstance(value, Price):
        return value
    if not isinstance(value, Mapping):
        raise InvalidInput(f"the price of {model!r} must be a Price or a mapping with 'input' and 'output' "
                           f"(USD per million tokens), got {value!r}", field="prices")
    unknown = sorted(str(k) for k in value if k not in _PRICE_KEYS)
    if unknown:
        raise InvalidInput(f"the price of {model!r} has unknown key(s) {unknown}; allowed: {list(_PRICE_KEYS)}",
                           field="prices")
    numbers: dict[str, Any] = {}
    for key in _PRICE_KEYS:
        if key not in value:
            continue
        number = value[key]
        if isinstance(number, bool) or not isinstance(number, int | float) or not math.isfinite(number) \
                or number < 0:
            raise InvalidInput(f"the {key} price of {model!r} must be a finite number >= 0, got {number!r}",
                               field="prices")
        numbers[key] = float(number)
    if "input" not in numbers or "output" not in numbers:
        raise InvalidInput(f"the price of {model!r} needs both 'input' and 'output'", field="prices")
    return Price(**numbers)


def price_table(overrides: PriceTable | None = None) -> dict[str, Price]:
    """:data:`DEFAULT_PRICES` updated with ``overrides`` (validated; raises :class:`InvalidInput`)."""
    table = dict(DEFAULT_PRICES)
    if overrides is None:
        return table
    if not isinstance(overrides, Mapping):
        raise InvalidInput("prices must be a mapping of model name -> price", field="prices")
    for model, value in overrides.items():
        if not isinstance(model, str) or not model:
            raise InvalidInput(f"price table keys must be model names, got {model!r}", field="prices")
        table[model] = _price(model, value)
    return table


def find_price(table: Mapping[str, Price], *models: str | None) -> Price | None:
    """The price of the first of ``models`` found in ``table`` (exactly, or as a dated snapshot), or None."""
    for model in models:
        if not model:
            continue
        if model in table:
            return table[model]
        base = _SNAPSHOT.sub("", model)
        if base != model and base in table:
            return table[base]
    return None


__all__ = ["DEFAULT_PRICES", "PRICES_AS_OF", "Price", "PriceTable", "find_price", "price_table"]
