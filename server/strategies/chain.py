"""A strategy and the bases it wraps (Upcycled -> FedAvg ...): what the runner, the checkpoints and
secure aggregation ask of a strategy is declared by the base, whatever wraps it."""

from __future__ import annotations

from typing import Any


def wrapper_chain(strategy) -> list:
    """The strategy and the bases it wraps (`.base`), outermost first."""
    out, s = [], strategy
    while s is not None and all(s is not o for o in out):
        out.append(s)
        s = getattr(s, "base", None)
    return out


def declared(strategy, name: str, default: Any = None) -> Any:
    """The outermost value of attribute `name` along the chain (a base's declaration counts)."""
    return next((getattr(s, name) for s in wrapper_chain(strategy) if getattr(s, name, None) is not None), default)
