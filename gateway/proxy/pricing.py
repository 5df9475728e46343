"""The price table: what a call cost, and what a refused call would have cost.

Decisions where DESIGN.md is silent:
- A model's price is the first `proxy.prices` glob (fnmatch, case-sensitive) it matches,
  in the order written; a model without a price has no cost (None), not a zero cost.
- A call whose tokens are unknown (refused, or a stream without a usage chunk) is
  estimated: input tokens as its request body's size / 4 (about four bytes of JSON per
  token), output tokens as the average output of that model's calls this proxy process
  has forwarded so far, else `proxy.default_output_tokens`.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.proxy.config import Price

BYTES_PER_TOKEN = 4


@dataclass(slots=True)
class _Average:
    total: int = 0
    calls: int = 0


class PriceTable:
    """Prices by model glob, and the running output average used for estimates."""

    def __init__(self, prices: Mapping[str, Price], default_output_tokens: int) -> None:
        self._prices = list(prices.items())
        self._default_output = default_output_tokens
        self._by_model: dict[str, Price | None] = {}
        self._outputs: dict[str, _Average] = {}

    def price(self, model: str) -> Price | None:
        """The price of a model (cached per model name)."""
        if model not in self._by_model:
            self._by_model[model] = next(
                (price for glob, price in self._prices if fnmatch.fnmatchcase(model, glob)), None
            )
        return self._by_model[model]

    def cost(self, model: str, input_tokens: int, output_tokens: int) -> float | None:
        """What these tokens of this model cost, None without a price."""
        price = self.price(model)
        if price is None:
            return None
        return (input_tokens * price.input_per_1k + output_tokens * price.output_per_1k) / 1000

    def observe(self, model: str, output_tokens: int) -> None:
        """Remember one forwarded call's output size for later estimates."""
        average = self._outputs.setdefault(model, _Average())
        average.total += output_tokens
        average.calls += 1

    def estimate(self, model: str, request_bytes: int) -> tuple[int, int]:
        """(input, output) tokens a call of this size would likely use."""
        average = self._outputs.get(model)
        output = (
            round(average.total / average.calls)
            if average is not None and average.calls
            else self._default_output
        )
        return math.ceil(request_bytes / BYTES_PER_TOKEN), output
