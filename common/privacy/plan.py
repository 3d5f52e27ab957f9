"""What a train instruction will spend, as ledger entries.

One function for both sides: the client checks and records these entries
before it releases anything; the server records the same entries in its
mirror for every instruction a client did not refuse (an upper bound on what
clients spent), so the epsilon it reports comes from the same events.
"""

from __future__ import annotations

from typing import Any, Mapping

from common.privacy.events import LedgerEntry, dpsgd_steps


def local_steps(config: Mapping[str, Any], instruction: Mapping[str, Any]) -> int:
    """Steps a DP-SGD instruction asks for: the instruction's `local-steps` beats the run config's."""
    return int(instruction.get("local-steps", config["local-steps"]))


def planned_entries(config: Mapping[str, Any], instruction: Mapping[str, Any]) -> list[LedgerEntry]:
    """Ledger entries for carrying out `instruction` under the run's privacy mechanism."""
    if config["privacy"] == "none":
        return []
    if config["privacy"] == "dpsgd":
        return [dpsgd_steps(float(config["dp-sample-rate"]), float(config["dp-noise-multiplier"]),
                            local_steps(config, instruction), round=int(instruction["server-round"]))]
    raise ValueError(f"no privacy plan for mechanism {config['privacy']!r}")
