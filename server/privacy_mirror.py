"""The server's mirror of every client's privacy ledger.

Clients own their ledgers; the server keeps the same entries for planning and
reporting. For each update a client may have released (a reply without error,
or no reply at all: see `server.runner.account_round`), the mirror records
`planned_entries` (the client recorded the same before training, or refused),
so the reported epsilon is an upper bound computed by an accountant call on
the events that happened, never a running sum.

With `checkpoint = true` the checkpointer journals the entries recorded since
its last save (`pending`, `journaled`), and a resume puts journaled ones back without
making them pending again (`restore`).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from common.privacy.events import LedgerEntry
from common.privacy.ledger import PrivacyLedger
from common.privacy.plan import is_private


class PrivacyMirror:
    def __init__(self, config: Mapping, partitions: list[int]):
        self.delta = float(config["target-delta"])
        self.accountant = str(config["accountant"])
        # objective perturbation's entries are pure: their sum is the epsilon at delta 0, whatever the accountant
        self.row_label = ({"accountant": "pure, basic composition", "delta": 0.0} if config["privacy"] == "objective"
                          else {"accountant": self.accountant, "delta": self.delta})
        self.enabled = is_private(config)
        self.noise_seed = str(config["dp-noise-seed"])  # 'run-seed': whoever knows the config can undo the noise
        self.ledgers = {p: PrivacyLedger(owner=f"partition-{p}") for p in partitions}
        # recorded since the last journaled(); only a checkpointed run journals them
        self._pending: dict[int, list[LedgerEntry]] | None = {} if config.get("checkpoint") else None

    def record(self, partition: int, entries: list[LedgerEntry]) -> None:
        if entries:
            self.ledgers[partition].record(*entries)
            if self._pending is not None:
                self._pending.setdefault(partition, []).extend(entries)

    def pending(self) -> dict[int, list[LedgerEntry]]:
        """The entries recorded since the last `journaled()`, per partition: what a checkpoint save journals."""
        return {p: list(entries) for p, entries in (self._pending or {}).items()}

    def journaled(self) -> None:
        """The pending entries are in the journal now (called only once the append landed)."""
        if self._pending is not None:
            self._pending = {}

    def restore(self, entries: Mapping[int, Sequence[LedgerEntry]]) -> None:
        """Record entries a checkpoint journal holds already (so they are not pending)."""
        for partition, journaled in entries.items():
            if journaled:
                self.ledgers[partition].record(*journaled)

    def epsilons(self) -> dict[int, float]:
        return {p: ledger.epsilon(self.delta, accountant=self.accountant) for p, ledger in self.ledgers.items()}

    def round_metrics(self) -> dict:
        """epsilon spent after this round: max and mean over clients."""
        if not self.enabled:
            return {}
        eps = list(self.epsilons().values())
        return {"epsilon_max": max(eps), "epsilon_mean": sum(eps) / len(eps), **self.row_label}

    def summary(self) -> dict:
        if not self.enabled:
            return {"mechanism": "none"}
        return {
            **self.row_label, "noise_seed": self.noise_seed,  # as the rows state it
            "ledgers": {
                str(p): {
                    "entries": len(ledger.entries), "steps": ledger.steps(), "relations": sorted(ledger.relations()),
                    "assumptions": sorted(ledger.assumptions()),
                    "epsilon": {acc: _epsilon_or_none(ledger, self.delta, acc) for acc in ("rdp", "pld")},
                }
                for p, ledger in self.ledgers.items()
            },
        }


def _epsilon_or_none(ledger: PrivacyLedger, delta: float, accountant: str) -> float | None:
    """None where the accountant does not apply (PLD has no distribution for a bare zCDP bound)."""
    try:
        return ledger.epsilon(delta, accountant=accountant)
    except ValueError:
        return None
