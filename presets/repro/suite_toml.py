"""TOML text for the suite generators (`*/make_suites.py`): scalars, lists and
one-line inline tables, so each generated `[[cell]]` stays one readable block."""

from __future__ import annotations


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return repr(v)


def inline(d: dict) -> str:
    return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in d.items()) + " }"
