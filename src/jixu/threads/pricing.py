"""Model prices and the cost of one call.

Prices are USD per million tokens: ``input`` (uncached prompt tokens),
``output``, ``cached_input`` (prompt tokens read from the provider's cache)
and, for providers that bill writing to the cache separately (Anthropic),
``cache_write``. Some models cost more per token once a call's prompt is
long: a :class:`Price` may carry a ``long_context`` price that applies to the
whole call when its prompt has more than ``long_context_above`` tokens (as
the providers bill it).

Where a price comes from, first that answers (see :func:`call_cost`):

1. ``prices=`` given to the driver (exact model names);
2. the maintained catalogue of the ``genai-prices`` package, when it is
   installed (``pip install 'jixu[prices]'``), which knows dated snapshots,
   date-dependent prices and long-context tiers;
3. :data:`DEFAULT_PRICES`, a small table of well-known models (see
   :data:`PRICES_AS_OF`), matched by exact name only: each dated snapshot it
   knows is listed, because a snapshot can cost something else than its base
   model (``gpt-4o-2024-05-13`` is 5.00/15.00, ``gpt-4o`` 2.50/10.00).

A model none of them knows has no price: its cost stays ``None`` (unknown),
never ``0``, and never a guess from a similar name.
"""

from __future__ import annotations

import datetime
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from jixu.errors import InvalidInput

_log = logging.getLogger("jixu.threads.pricing")

PRICES_AS_OF = "2026-11"
"""When :data:`DEFAULT_PRICES` was last compared with the providers' published prices (as the genai-prices
0.2.3 catalogue holds them)."""

_PRICE_KEYS = ("input", "output", "cached_input", "cache_write")


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens. ``cached_input`` and ``cache_write`` default to ``input`` when not set.

    ``long_context`` is the price of a call whose prompt has more than
    ``long_context_above`` tokens (cached and cache writes included): every
    token of that call is billed at it.
    """

    input: float
    output: float
    cached_input: float | None = None
    cache_write: float | None = None
    long_context_above: int | None = None
    long_context: Price | None = None

    def cost(self, *, input_tokens: int, output_tokens: int, cached_tokens: int = 0,
             cache_write_tokens: int = 0) -> float:
        """USD for one call. ``input_tokens`` counts every prompt token, cached and cache writes included."""
        if self.long_context is not None and self.long_context_above is not None \
                and input_tokens > self.long_context_above:
            return self.long_context.cost(input_tokens=input_tokens, output_tokens=output_tokens,
                                          cached_tokens=cached_tokens, cache_write_tokens=cache_write_tokens)
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


def _table(*entries: tuple[tuple[str, ...], Price]) -> dict[str, Price]:
    table: dict[str, Price] = {}
    for names, price in entries:
        for name in names:
            table[name] = price
    return table


# Anthropic's long-context prices: a prompt over 200K tokens (1M-token context) bills every token of the call
# at twice the input and 1.5 times the output price.
_SONNET_LONG = Price(input=6.00, output=22.50, cached_input=0.60, cache_write=7.50)

DEFAULT_PRICES: dict[str, Price] = _table(
    # OpenAI (https://openai.com/api/pricing): each name as the API accepts it and reports it
    (("gpt-4o", "gpt-4o-2024-08-06", "gpt-4o-2024-11-20"), Price(input=2.50, output=10.00, cached_input=1.25)),
    (("gpt-4o-2024-05-13",), Price(input=5.00, output=15.00)),
    (("gpt-4o-mini", "gpt-4o-mini-2024-07-18"), Price(input=0.15, output=0.60, cached_input=0.075)),
    (("gpt-4.1", "gpt-4.1-2025-04-14"), Price(input=2.00, output=8.00, cached_input=0.50)),
    (("gpt-4.1-mini", "gpt-4.1-mini-2025-04-14"), Price(input=0.40, output=1.60, cached_input=0.10)),
    (("gpt-4.1-nano", "gpt-4.1-nano-2025-04-14"), Price(input=0.10, output=0.40, cached_input=0.025)),
    (("o3", "o3-2025-04-16"), Price(input=2.00, output=8.00, cached_input=0.50)),
    (("o3-mini", "o3-mini-2025-01-31"), Price(input=1.10, output=4.40, cached_input=0.55)),
    (("o4-mini", "o4-mini-2025-04-16"), Price(input=1.10, output=4.40, cached_input=0.275)),
    (("gpt-5", "gpt-5-2025-08-07"), Price(input=1.25, output=10.00, cached_input=0.125)),
    (("gpt-5-mini", "gpt-5-mini-2025-08-07"), Price(input=0.25, output=2.00, cached_input=0.025)),
    (("gpt-5-nano", "gpt-5-nano-2025-08-07"), Price(input=0.05, output=0.40, cached_input=0.005)),
    (("gpt-5.1", "gpt-5.1-2025-11-13"), Price(input=1.25, output=10.00, cached_input=0.125)),
    (("gpt-5.2", "gpt-5.2-2025-12-11"), Price(input=1.75, output=14.00, cached_input=0.175)),
    # Anthropic (https://www.anthropic.com/pricing); cache writes (5-minute) cost 1.25x input
    (("claude-3-haiku-20240307",), Price(input=0.25, output=1.25, cached_input=0.03, cache_write=0.30)),
    (("claude-3-5-haiku-20241022", "claude-3-5-haiku-latest"),
     Price(input=0.80, output=4.00, cached_input=0.08, cache_write=1.00)),
    (("claude-3-7-sonnet-20250219", "claude-3-7-sonnet-latest"),
     Price(input=3.00, output=15.00, cached_input=0.30, cache_write=3.75)),
    (("claude-sonnet-4-20250514", "claude-sonnet-4-0"),
     Price(input=3.00, output=15.00, cached_input=0.30, cache_write=3.75)),
    (("claude-sonnet-4-5", "claude-sonnet-4-5-20250929"),
     Price(input=3.00, output=15.00, cached_input=0.30, cache_write=3.75, long_context_above=200_000,
           long_context=_SONNET_LONG)),
    (("claude-haiku-4-5", "claude-haiku-4-5-20251001"),
     Price(input=1.00, output=5.00, cached_input=0.10, cache_write=1.25)),
    (("claude-opus-4-20250514", "claude-opus-4-0"),
     Price(input=15.00, output=75.00, cached_input=1.50, cache_write=18.75)),
    (("claude-opus-4-1", "claude-opus-4-1-20250805"),
     Price(input=15.00, output=75.00, cached_input=1.50, cache_write=18.75)),
    (("claude-opus-4-5", "claude-opus-4-5-20251101"),
     Price(input=5.00, output=25.00, cached_input=0.50, cache_write=6.25)),
)
"""The fallback table: exact model names (dated snapshots listed one by one) -> :class:`Price`."""


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


def checked_prices(overrides: PriceTable | None) -> dict[str, Price]:
    """``prices=`` validated (raises :class:`InvalidInput`): model name -> :class:`Price`."""
    table: dict[str, Price] = {}
    if overrides is None:
        return table
    if not isinstance(overrides, Mapping):
        raise InvalidInput("prices must be a mapping of model name -> price", field="prices")
    for model, value in overrides.items():
        if not isinstance(model, str) or not model:
            raise InvalidInput(f"price table keys must be model names, got {model!r}", field="prices")
        table[model] = _price(model, value)
    return table


def price_table(overrides: PriceTable | None = None) -> dict[str, Price]:
    """:data:`DEFAULT_PRICES` updated with ``overrides`` (validated; raises :class:`InvalidInput`)."""
    return {**DEFAULT_PRICES, **checked_prices(overrides)}


def find_price(table: Mapping[str, Price], *models: str | None) -> Price | None:
    """The price of the first of ``models`` that ``table`` names exactly, or None.

    No name is derived from another: a dated snapshot the table does not list
    has no price here, whatever its base model costs.
    """
    for model in models:
        if model and model in table:
            return table[model]
    return None


_CATALOGUE: Any = None
"""The ``genai_prices`` module once imported, ``False`` when it is not installed (checked once)."""


def catalogue() -> Any:
    """The ``genai_prices`` module, or None when it is not installed."""
    global _CATALOGUE
    if _CATALOGUE is None:
        try:
            import genai_prices
        except ImportError:
            _CATALOGUE = False
        else:
            _CATALOGUE = genai_prices
    return _CATALOGUE or None


_MISSES: tuple[object, set[tuple[str, str, str]]] = (None, set())
"""The catalogue snapshot last asked and the (model, provider_api_url/provider_id, value) it knows no model for."""


def _misses_of(snapshot: object) -> set[tuple[str, str, str]]:
    """The lookups ``snapshot`` (the catalogue's current data) answered with "no such model".

    The catalogue remembers the models it found but not the ones it did not, and looks for those through
    every provider's models again on each call: a model it does not know (a local or fine-tuned one) paid
    that walk on every call. Which models a snapshot holds does not depend on the call's date (only their
    prices do), so a miss holds until the catalogue's data is replaced (an update makes a new snapshot).
    """
    global _MISSES
    if _MISSES[0] is not snapshot:
        _MISSES = (snapshot, set())
    return _MISSES[1]


def catalogue_cost(models: Sequence[str | None], *, provider: str, api_url: str | None, input_tokens: int,
                   output_tokens: int, cached_tokens: int, cache_write_tokens: int) -> float | None:
    """The cost from the genai-prices catalogue for the first of ``models`` it knows, or None.

    The provider is found from ``api_url`` when the catalogue knows that
    endpoint (OpenRouter, Groq, ...), else taken as ``provider``.
    """
    prices = catalogue()
    if prices is None:
        return None
    usage = now = None  # made for the first lookup that is not a known miss
    misses = _misses_of(prices.data_snapshot.get_snapshot())
    for model in models:
        if not model:
            continue
        attempts = [("provider_api_url", api_url)] if api_url else []
        attempts.append(("provider_id", provider))
        for how, place in attempts:
            if (model, how, place) in misses:
                continue
            if usage is None:
                usage = prices.Usage(input_tokens=input_tokens, output_tokens=output_tokens,
                                     cache_read_tokens=cached_tokens, cache_write_tokens=cache_write_tokens)
                now = datetime.datetime.now(tz=datetime.UTC)
            try:
                calculation = prices.calc_price(usage, model, genai_request_timestamp=now, **{how: place})
            except LookupError as exc:
                if type(exc) is LookupError:  # "no such model or provider" (not a KeyError of a pricing bug)
                    misses.add((model, how, place))
                continue
            except Exception:  # a catalogue that cannot price this usage knows no price for it
                _log.debug("genai-prices could not price %r", model, exc_info=True)
                continue
            return round(float(calculation.total_price), 10)
    return None


def call_cost(models: Sequence[str | None], *, provider: str, api_url: str | None = None,
              overrides: Mapping[str, Price] | None = None, input_tokens: int, output_tokens: int,
              cached_tokens: int = 0, cache_write_tokens: int = 0) -> float | None:
    """USD for one call of the first of ``models`` with a price, or None when none has one.

    ``models`` in the order to try (the driver's own name for a price the
    user gave, then the catalogues; see the module docs). ``overrides`` are
    the user's prices, by exact name, and win over every catalogue.
    """
    counts = {"input_tokens": input_tokens, "output_tokens": output_tokens, "cached_tokens": cached_tokens,
              "cache_write_tokens": cache_write_tokens}
    if overrides:
        price = find_price(overrides, *models)
        if price is not None:
            return price.cost(**counts)
    found = catalogue_cost(models, provider=provider, api_url=api_url, **counts)
    if found is not None:
        return found
    price = find_price(DEFAULT_PRICES, *models)
    return None if price is None else price.cost(**counts)


__all__ = ["DEFAULT_PRICES", "PRICES_AS_OF", "Price", "PriceTable", "call_cost", "catalogue", "catalogue_cost",
           "checked_prices", "find_price", "price_table"]
