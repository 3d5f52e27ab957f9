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


# Why a generated suite sets a key, written beside it in [suite.overrides].
KEY_COMMENTS = {"dp-noise-seed": "run-seed noise: the same noise everywhere, bit-reproducible on the CPU"}
RUN_SEED_NOISE = {"dp-noise-seed": "run-seed"}  # overrides of every suite that runs a private mechanism


def override_line(key: str, value) -> str:
    """`key = value` for a [suite.overrides] table, with the key's comment if it has one."""
    line = f"{key} = {toml_value(value)}"
    return f"{line}  # {KEY_COMMENTS[key]}" if key in KEY_COMMENTS else line


def inline(d: dict) -> str:
    return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in d.items()) + " }"
