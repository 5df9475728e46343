"""The price table: what a call cost, and what a refused call would have cost, in dollars.

The one place prices are computed. A model's price is the first `proxy.prices` glob
(fnmatch, case-sensitive) it matches, in the order written, else the price `genai-prices`
(maintained price data for OpenAI, Anthropic, Google and others) gives the provider of
the route the call came by; a model without either has no cost (None), not a zero cost:
it is charged by tokens only, logged as unpriced, and warned about once per model.

Decisions where DESIGN.md is silent:
- `genai-prices` is read once per model, as its price of 1,000 input and 1,000 output
  tokens (a tiered price at its first tier). Cache reads are charged as input and
  reasoning tokens as output (the providers report them inside those counts), so a
  cached prompt is priced high rather than low.
- Without a provider (`provider=None`, e.g. a replayed log) only `proxy.prices` apply.
- A call whose tokens are unknown (refused, or a stream without a usage chunk) is
  estimated: input tokens as its request body's size / 4 (about four bytes of JSON per
  token), output tokens as its own `max_tokens` (or the provider's name for it), else
  the average output of that model's calls this proxy process has forwarded so far,
  else `proxy.default_output_tokens`.
- Prices and averages are kept for at most `MAX_MODELS` model names (then forgotten and
  read again): a client cannot grow them without bound by naming ever new models.
"""

from __future__ import annotations

import fnmatch
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.config.proxy import Price, ProxyConfig

log = logging.getLogger("loopwarden.proxy")

BYTES_PER_TOKEN = 4
MAX_MODELS = 4096
# The route's provider as genai-prices names it.
CATALOGUE_PROVIDERS: Mapping[str, str] = {
    "openai": "openai",
    "anthropic": "anthropic",
    "gemini": "google",
}


@dataclass(slots=True)
class _Average:
    total: int = 0
    calls: int = 0


def catalogue_price(provider: str, model: str) -> Price | None:
    """The price `genai-prices` has for a provider's model, None when it has none."""
    # Imported here: reading its data takes a third of a second, paid where calls are priced.
    from genai_prices import Usage, calc_price

    provider_id = CATALOGUE_PROVIDERS.get(provider)
    if provider_id is None:
        return None
    try:
        inputs = calc_price(Usage(input_tokens=1000), model, provider_id=provider_id)
        outputs = calc_price(Usage(output_tokens=1000), model, provider_id=provider_id)
    except LookupError:
        return None
    return Price(input_per_1k=float(inputs.total_price), output_per_1k=float(outputs.total_price))


class PriceTable:
    """Prices by model glob and catalogue, and the running output average for estimates."""

    def __init__(self, prices: Mapping[str, Price], default_output_tokens: int) -> None:
        self._prices = list(prices.items())
        self._default_output = default_output_tokens
        self._by_model: dict[tuple[str | None, str], Price | None] = {}
        self._outputs: dict[str, _Average] = {}
        self._warned: set[str] = set()

    @classmethod
    def for_config(cls, proxy: ProxyConfig | None) -> PriceTable:
        """The table of a config's `proxy:` section (its defaults without one)."""
        settings = proxy or ProxyConfig()
        return cls(settings.prices, settings.default_output_tokens)

    def price(self, model: str, provider: str | None = None) -> Price | None:
        """The price of a model (cached per provider and model name)."""
        key = (provider, model)
        if key in self._by_model:
            return self._by_model[key]
        price = next(
            (price for glob, price in self._prices if fnmatch.fnmatchcase(model, glob)), None
        )
        if price is None and provider is not None:
            price = catalogue_price(provider, model)
        if price is None and provider is not None and model not in self._warned:
            if len(self._warned) >= MAX_MODELS:
                self._warned.clear()
            self._warned.add(model)
            log.warning(
                "model %r has no price (proxy.prices, genai-prices): charged by tokens only",
                model[:100],
            )
        if len(self._by_model) >= MAX_MODELS:
            self._by_model.clear()
        self._by_model[key] = price
        return price

    def cost(
        self, model: str, input_tokens: int, output_tokens: int, provider: str | None = None
    ) -> float | None:
        """What these tokens of this model cost in dollars, None without a price."""
        price = self.price(model, provider)
        if price is None:
            return None
        return (input_tokens * price.input_per_1k + output_tokens * price.output_per_1k) / 1000

    def observe(self, model: str, output_tokens: int) -> None:
        """Remember one forwarded call's output size for later estimates."""
        average = self._outputs.get(model)
        if average is None:
            if len(self._outputs) >= MAX_MODELS:
                self._outputs.clear()
            average = self._outputs[model] = _Average()
        average.total += output_tokens
        average.calls += 1

    def estimate(
        self, model: str, request_bytes: int, max_output: int | None = None
    ) -> tuple[int, int]:
        """(input, output) tokens a call of this size (and `max_tokens`) would likely use."""
        average = self._outputs.get(model)
        if max_output is not None:
            output = max_output
        elif average is not None and average.calls:
            output = round(average.total / average.calls)
        else:
            output = self._default_output
        return math.ceil(request_bytes / BYTES_PER_TOKEN), output
