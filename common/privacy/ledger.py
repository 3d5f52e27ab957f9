"""The privacy ledger: one client's list of privacy events, persisted.

Usage on a client (the data owner):

    ledger = PrivacyLedger.open(state_dir / "privacy-ledger.json")   # never a fresh one if the file exists
    planned = [dpsgd_steps(q, sigma, steps, round=r)]
    if ledger.would_exceed(planned, target_epsilon, target_delta):
        refuse(...)
    ...train...
    ledger.record(*planned)          # saved atomically before the reply leaves the client

`epsilon(delta)` composes every entry with an accountant:

- Gaussian-type entries (`dpsgd`, `gaussian`, `zcdp`) are composed by the RDP
  or PLD accountant of dp-accounting (see `accounting.py`), or by one of the
  papers' accountants (`PAPER_ACCOUNTANTS`), which apply only to the entry kinds
  their paper covers.
- Pure epsilon-DP entries (objective perturbation) are kept out of that
  composition and summed on their own line; the total is the basic composition
  (eps_approx + eps_pure, delta).
- Post-processing entries cost nothing; they are in the ledger so that a report
  shows, e.g., that Upcycled-FL's even rounds touched no data.

Every guarantee is record-level for this client's local dataset; `relations()`
says under which neighbouring relations the recorded entries were analysed.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dp_accounting as dpa

from common.privacy import accounting
from common.privacy.events import LedgerEntry

FORMAT = "privfed-privacy-ledger"
VERSION = 1

PAPER_ACCOUNTANTS: dict[str, str] = {
    "upcycled-thm6.2": "Upcycled-FL Thm 6.2: c + 2 sqrt(c log 1/delta), c = sum 1/(2 z^2) (gaussian entries)",
    "hu-thm1": "Hu et al. Thm 1: rho + 2 sqrt(rho log 1/delta), rho = sum of rho (zcdp entries)",
    "ali-eq12": "ALI-DPFL Eq. 12 (corrected): RDP, integer orders, classic conversion (dpsgd entries)",
    "fedlap-thm5.8": "FedLAP-DP Thm 5.8: RDP, FedLAP orders, Balle et al. conversion (dpsgd entries)",
}
_PAPER_KINDS = {
    "upcycled-thm6.2": {"gaussian"},
    "hu-thm1": {"zcdp"},
    "ali-eq12": {"dpsgd"},
    "fedlap-thm5.8": {"dpsgd"},
}


@dataclass(frozen=True)
class EpsilonReport:
    """epsilon(delta) of a ledger: the Gaussian-type composition (`approx`), the
    pure-DP line (`pure`), and their basic composition (`total`)."""

    accountant: str
    delta: float
    approx: float
    pure: float
    total: float
    conversion: str | None = None
    counts: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"accountant": self.accountant, "conversion": self.conversion, "delta": self.delta,
                "epsilon": self.total, "epsilon_approx": self.approx, "epsilon_pure": self.pure,
                "counts": dict(self.counts)}


class PrivacyLedger:
    """A client's privacy ledger. Bound to a file (`open`/`load`), every
    `record` is saved atomically before it returns."""

    def __init__(self, entries: Iterable[LedgerEntry] = (), *, owner: str = "", path: str | os.PathLike | None = None):
        self._entries: list[LedgerEntry] = list(entries)
        self.owner = owner
        self.path: Path | None = Path(path) if path is not None else None

    # -- contents -----------------------------------------------------------
    @property
    def entries(self) -> tuple[LedgerEntry, ...]:
        return tuple(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PrivacyLedger) and self.to_json() == other.to_json()

    def __repr__(self) -> str:
        return f"PrivacyLedger(owner={self.owner!r}, entries={len(self._entries)}, path={self.path})"

    def record(self, *entries: LedgerEntry) -> None:
        """Append entries (and save, if bound to a file). Record *before* the
        output leaves the client, so a crash can only over-count."""
        for e in entries:
            if not isinstance(e, LedgerEntry):
                raise TypeError(f"expected a LedgerEntry, got {type(e).__name__}")
        self._entries.extend(entries)
        if self.path is not None:
            self.save(self.path)

    def steps(self) -> int:
        """Total DP-SGD steps recorded (ALI-DPFL's t)."""
        return sum(int(e.params["steps"]) for e in self._entries if e.kind == "dpsgd")

    def rounds(self) -> list[int]:
        """The distinct rounds with an entry, in order."""
        return sorted({e.round for e in self._entries if e.round is not None})

    def relations(self) -> set[str]:
        """The neighbouring relations the recorded guarantees were derived under."""
        return {e.params["relation"] for e in self._entries if "relation" in e.params}

    def assumptions(self) -> set[str]:
        """Conditions some recorded bound needs that the run did not enforce (events.py): with any, the
        epsilon is the papers' formula, not a guarantee."""
        return {e.params["assumption"] for e in self._entries if "assumption" in e.params}

    # -- accounting ------------------------------------------------------------
    def to_dp_event(self, extra: Sequence[LedgerEntry] = ()) -> dpa.DpEvent:
        """The composition of every non-pure entry (plus `extra`) as one
        dp-accounting event. Identical events are merged into one
        SelfComposedDpEvent (composition is commutative) to keep PLD fast."""
        return _compose([e for e in (*self._entries, *extra) if not e.is_pure])

    def pure_epsilon(self, extra: Sequence[LedgerEntry] = ()) -> float:
        """Sum of the pure-DP entries (basic composition)."""
        return math.fsum(float(e.params["epsilon"]) for e in (*self._entries, *extra) if e.is_pure)

    def report(self, delta: float, accountant: str = "rdp", *, conversion: str = "balle",
               orders: accounting.Orders | None = None, extra: Sequence[LedgerEntry] = ()) -> EpsilonReport:
        """epsilon(delta) of the ledger (plus the prospective `extra` entries,
        without recording them), by `accountant`: 'rdp' (with `conversion`
        'classic'|'balle' and `orders`), 'pld', or a name in PAPER_ACCOUNTANTS."""
        entries = [*self._entries, *extra]
        counts: dict[str, int] = {}
        for e in entries:
            counts[e.kind] = counts.get(e.kind, 0) + 1
        pure = self.pure_epsilon(extra)
        approx_entries = [e for e in entries if not e.is_pure and not e.is_post_processing]
        conv: str | None = conversion if accountant == "rdp" else None
        if accountant in PAPER_ACCOUNTANTS:
            approx, conv = _paper_epsilon(accountant, approx_entries, delta)
        elif not approx_entries:
            accounting._check_delta(delta)
            approx = 0.0
        else:
            approx = accounting.epsilon(_compose(approx_entries), delta, accountant=accountant,
                                        conversion=conversion, orders=orders)
        return EpsilonReport(accountant, float(delta), approx, pure, approx + pure, conv, counts)

    def epsilon(self, delta: float, accountant: str = "rdp", *, conversion: str = "balle",
                orders: accounting.Orders | None = None, extra: Sequence[LedgerEntry] = ()) -> float:
        """Total epsilon(delta): the accountant's epsilon plus the pure-DP line."""
        return self.report(delta, accountant, conversion=conversion, orders=orders, extra=extra).total

    def would_exceed(self, planned: Sequence[LedgerEntry], target_epsilon: float, delta: float,
                     accountant: str = "rdp", *, conversion: str = "balle",
                     orders: accounting.Orders | None = None) -> bool:
        """Whether recording `planned` would take epsilon(delta) past
        `target_epsilon`. Does not modify the ledger."""
        return self.epsilon(delta, accountant, conversion=conversion, orders=orders, extra=planned) > target_epsilon

    def remaining_steps(self, target_epsilon: float, delta: float, sample_rate: float, noise_multiplier: float,
                        accountant: str = "rdp", *, conversion: str = "balle",
                        orders: accounting.Orders | None = None) -> int:
        """The largest number k of further DP-SGD steps (q, sigma) with
        epsilon(ledger + k steps) <= target (0 if already at or past it)."""
        from common.privacy.events import dpsgd_steps

        if accountant == "rdp":
            # RDP composes additively: the ledger's curve plus k times one step's
            # curve is exactly what the accountant computes for ledger + k steps.
            o, base = accounting.rdp_curve(self.to_dp_event(), orders)
            _, step = accounting._step_rdp(float(sample_rate), float(noise_multiplier),
                                           accounting.resolve_orders(orders))
            pure = self.pure_epsilon()

            def ok(k: int) -> bool:
                eps = accounting.rdp_to_epsilon(o, base + k * step if k else base, delta, conversion)[0]
                return eps + pure <= target_epsilon
        else:
            def ok(k: int) -> bool:
                extra = [dpsgd_steps(sample_rate, noise_multiplier, k)] if k else []
                return not self.would_exceed(extra, target_epsilon, delta, accountant, conversion=conversion,
                                             orders=orders)

        if not ok(0) or not ok(1):
            return 0
        lo, hi = 1, 2
        while ok(hi):
            lo, hi = hi, hi * 2
            if hi > accounting.MAX_STEPS_CAP:
                raise ValueError("the budget allows more than 1e9 further steps")
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if ok(mid) else (lo, mid)
        return lo

    def sampling(self) -> list[str]:
        """Sampling schemes the entries are accounted with: Poisson for DP-SGD, none (no amplification) else."""
        kinds = {e.kind for e in self._entries if not e.is_post_processing}
        return sorted({"poisson" if kind == "dpsgd" else "none" for kind in kinds})

    def summary_lines(self, delta: float, accountants: Sequence[str] = ("rdp", "pld"),
                      conversion: str = "balle") -> list[str]:
        """A human-readable report: one line per entry, the guarantee, then one line per accountant."""
        lines = [e.describe() for e in self._entries]
        rels = ", ".join(sorted(self.relations())) or "-"
        lines.append(f"record-level DP for this client's data; neighbouring relation(s): {rels}; delta = {delta:g}")
        schemes = {"poisson": "Poisson for the DP-SGD entries (at their q)",
                   "none": "no amplification by sampling for the other entries"}
        lines.append(f"sampling: {'; '.join(schemes[s] for s in self.sampling()) or '-'}")
        for name in accountants:
            try:
                r = self.report(delta, name, conversion=conversion)
            except ValueError as err:
                lines.append(f"epsilon [{name}]: n/a ({err})")
                continue
            lines.append(f"epsilon [{name}{'/' + r.conversion if r.conversion else ''}] = {r.approx:.4f}")
        pure = self.pure_epsilon()
        if pure:
            lines.append(f"epsilon [pure-DP entries, basic composition] = {pure:.4f} (add to each line above)")
        return lines

    # -- persistence ------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "owner": self.owner,
                "entries": [e.to_json() for e in self._entries]}

    @classmethod
    def from_json(cls, obj: dict[str, Any], path: str | os.PathLike | None = None) -> "PrivacyLedger":
        if obj.get("format") != FORMAT or obj.get("version") != VERSION:
            raise ValueError(f"not a privfed privacy ledger (version {VERSION}): format={obj.get('format')!r}, "
                             f"version={obj.get('version')!r}")
        return cls([LedgerEntry.from_json(e) for e in obj["entries"]], owner=obj.get("owner", ""), path=path)

    def save(self, path: str | os.PathLike | None = None) -> Path:
        """Write the ledger as JSON atomically (temp file in the same folder,
        fsync, os.replace), so a crash leaves the old or the new ledger."""
        target = Path(path) if path is not None else self.path
        if target is None:
            raise ValueError("no path to save the ledger to")
        target.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps(self.to_json(), indent=1, allow_nan=False)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        try:  # make the rename durable
            dir_fd = os.open(target.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError:
            pass
        return target

    @classmethod
    def load(cls, path: str | os.PathLike) -> "PrivacyLedger":
        """Load a saved ledger (bound to `path`). A missing or unreadable file is
        an error: a ledger is never silently replaced by a fresh one."""
        p = Path(path)
        try:
            with p.open(encoding="utf-8") as f:
                obj = json.load(f)
            return cls.from_json(obj, path=p)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:  # JSONDecodeError is a ValueError
            raise ValueError(f"privacy ledger {p} is damaged ({type(exc).__name__}: {exc}); it is never replaced "
                             "by an empty one: restore it, or start the run under another run-name") from None

    def reload(self) -> None:
        """Replace the entries with those in the bound file: another process may have recorded since.
        A bound ledger whose file does not exist yet keeps its entries (its first `record` writes it)."""
        if self.path is None:
            raise ValueError("the ledger is not bound to a file")
        if self.path.exists():
            self._entries = list(PrivacyLedger.load(self.path)._entries)

    @classmethod
    def open(cls, path: str | os.PathLike, owner: str = "") -> "PrivacyLedger":
        """The ledger at `path` if the file exists, else a new empty one that is
        saved there immediately. Bound to `path`."""
        p = Path(path)
        if p.exists():
            ledger = cls.load(p)
            if owner and ledger.owner and owner != ledger.owner:
                raise ValueError(f"ledger {p} belongs to {ledger.owner!r}, not {owner!r}")
            return ledger
        ledger = cls(owner=owner, path=p)
        ledger.save()
        return ledger


def _event_key(e: LedgerEntry) -> tuple[Any, ...]:
    p = e.params
    if e.kind == "dpsgd":
        return ("dpsgd", float(p["sample_rate"]), float(p["noise_multiplier"]))
    if e.kind == "gaussian":
        return ("gaussian", float(p["noise_multiplier"]))
    if e.kind == "zcdp":
        return ("zcdp",)
    return (e.kind,)


def _compose(entries: Sequence[LedgerEntry]) -> dpa.DpEvent:
    counts: dict[tuple[Any, ...], float] = {}
    for e in entries:
        if e.is_post_processing:
            continue
        key = _event_key(e)
        p = e.params
        amount = {"dpsgd": lambda: int(p["steps"]), "gaussian": lambda: int(p.get("count", 1)),
                  "zcdp": lambda: float(p["rho"])}[e.kind]()
        counts[key] = counts.get(key, 0) + amount
    events: list[dpa.DpEvent] = []
    for key, amount in counts.items():
        if key[0] == "dpsgd":
            if amount:
                events.append(accounting.dpsgd_event(key[1], key[2], int(amount)))
        elif key[0] == "gaussian":
            if amount:
                events.append(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(key[1]), int(amount)))
        else:
            events.append(dpa.ZCDpEvent(float(amount)))
    if not events:
        return dpa.NoOpDpEvent()
    return events[0] if len(events) == 1 else dpa.ComposedDpEvent(events)


def _paper_epsilon(name: str, entries: Sequence[LedgerEntry], delta: float) -> tuple[float, str | None]:
    allowed = _PAPER_KINDS[name]
    other = {e.kind for e in entries} - allowed
    if other:
        raise ValueError(f"accountant {name!r} covers {', '.join(sorted(allowed))} entries only; "
                         f"the ledger also holds {', '.join(sorted(other))}")
    accounting._check_delta(delta)
    if not entries:
        return 0.0, None
    if name == "upcycled-thm6.2":
        zs = []
        for e in entries:
            zs += [float(e.params["noise_multiplier"])] * int(e.params.get("count", 1))
        return accounting.upcycled_output_epsilon(zs, delta), None
    if name == "hu-thm1":
        return accounting.zcdp_epsilon(math.fsum(float(e.params["rho"]) for e in entries), delta), None
    if name == "ali-eq12":
        return accounting.epsilon(_compose(entries), delta, conversion="classic", orders="integer"), "classic"
    return accounting.epsilon(_compose(entries), delta, conversion="balle", orders="fedlap"), "balle"
