"""Argument types the benchmarks share: a count or a list that leaves nothing to time is a usage error
before any work, not a traceback (or a JSON line of nulls) after it."""

from __future__ import annotations

import argparse
from typing import Callable


def at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value
    parse.__name__ = f"integer >= {low}"  # argparse names the type in its message
    return parse


positive_int = at_least(1)


def positive_list(kind: type) -> Callable[[str], list]:
    """A comma-separated list of positive numbers of `kind` (int or float), at least one."""
    def parse(text: str) -> list:
        try:
            values = [kind(x) for x in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__}s, got {text!r}") from None
        if not all(v > 0 for v in values):
            raise argparse.ArgumentTypeError(f"every value must be positive, got {text!r}")
        return values
    parse.__name__ = f"list of positive {kind.__name__}s"
    return parse
