"""Is a value read from a record, a JSON file or a config a number? A bool never is here, although Python's
bool is an int: `True` as a count or a weight is a malformed value, not 1."""

from __future__ import annotations

import numbers
from typing import Any


def is_int(value: Any) -> bool:
    """A Python or NumPy integer, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """A Python or NumPy integer or float, not a bool (NaN and the infinities are reals here: callers bound them)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
