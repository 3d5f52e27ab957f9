"""The privacy ledger: one client's list of privacy events, persisted.

Usage on a client (the data owner):

    ledger = PrivacyLedger.open(state_dir / "privacy-ledger.json")   # never a fresh one if the file exists
    planned = [dpsgd_steps(q, sigma, steps, round=r)]
    if ledger.would_exceed(planned, target_epsilon, target_delta):
        refuse(...)
    ...train...
    ledger.record(*planned)          # on disk (fsync) before the reply leaves the client

The file (format version 2) is append-only JSON Lines: a header line
`{"format": "privfed-privacy-ledger", "version": 2, "owner": ...}`, then one
entry per line. `record` appends its entries' lines in one write and fsyncs
before it returns, so a charge writes its own bytes only, however long the run;
a new file (and `save`) is written whole and atomically. A crash inside `record`
can leave a last line without its newline: nothing was released for it, so
loading ignores it and the next `record` cuts it off before appending. Any other
damage is an error: a ledger is never replaced by an empty one. (A file cut at a
line boundary by something else reads as a shorter ledger, as an old copy of a
whole-file ledger would: the server's mirror is the independent record.) Version-1 files
(one JSON object, which is also what `to_json` gives, e.g. in checkpoints) still
load; their first `record` converts them to version 2 (one atomic rewrite).

`reload()` parses only the lines appended since the last read, and the ledger
keeps its composition up to date entry by entry (`_Tally`), so an epsilon costs
O(distinct mechanisms), not O(entries), and equals a recomposition of every
entry to the last bit. `accounting.epsilon` memoises by event, so clients with
equal ledgers (full participation) share one accountant call.

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
import logging
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import dp_accounting as dpa

from common.durable import naming, write_atomically
from common.privacy import accounting
from common.privacy.events import LedgerEntry

FORMAT = "privfed-privacy-ledger"
VERSION = 2  # the file: JSON Lines, a header line then one entry per line
OBJECT_VERSION = 1  # one JSON object with every entry: `to_json` (checkpoints) and version-1 files
_APPROX_KINDS = ("dpsgd", "gaussian", "zcdp")  # composed by an accountant (pure: own line; post-processing: free)
_DAMAGE = (ValueError, KeyError, TypeError, AttributeError)  # JSONDecodeError and UnicodeDecodeError are ValueErrors
_log = logging.getLogger(__name__)

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
    `record` is on disk (appended, fsynced) before it returns."""

    def __init__(self, entries: Iterable[LedgerEntry] = (), *, owner: str = "", path: str | os.PathLike | None = None):
        self.owner = owner
        self.path: Path | None = Path(path) if path is not None else None
        self._pos: _Pos | None = None  # the part of the bound file read so far (None: not read, or version 1)
        self._torn_warned: _Pos | None = None
        self._set_entries(list(entries))
        self._on_disk = not self._entries  # entries made in memory are not the bound file's

    # -- contents -----------------------------------------------------------
    @property
    def entries(self) -> tuple[LedgerEntry, ...]:
        if self._entries_tuple is None:
            self._entries_tuple = tuple(self._entries)
        return self._entries_tuple

    def __len__(self) -> int:
        return len(self._entries)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PrivacyLedger) and self.to_json() == other.to_json()

    def __repr__(self) -> str:
        return f"PrivacyLedger(owner={self.owner!r}, entries={len(self._entries)}, path={self.path})"

    def _set_entries(self, entries: list[LedgerEntry], tally: _Tally | None = None) -> None:
        self._entries, self._entries_tuple = entries, None
        self._tally = tally if tally is not None else _Tally(entries)

    def _extend(self, entries: Sequence[LedgerEntry], tally: _Tally) -> None:
        self._entries.extend(entries)
        self._entries_tuple, self._tally = None, tally

    def record(self, *entries: LedgerEntry) -> None:
        """Append entries; bound to a file, append them to it (one write, fsync) before returning. Record
        *before* the output leaves the client, so a crash can only over-count. Lines another process
        appended since the last read are read first: the file is the ledger."""
        for e in entries:
            if not isinstance(e, LedgerEntry):
                raise TypeError(f"expected a LedgerEntry, got {type(e).__name__}")
        _Tally(entries)  # a malformed entry is refused before anything is written
        if self.path is None:
            self._extend(entries, self._tally.plus(entries))
            return
        lines = b"".join(_line(e.to_json()) for e in entries)
        try:
            f = open(self.path, "r+b")
        except FileNotFoundError:
            self._rewrite(entries)  # the first record of a ledger made in memory: a new file
            return
        with f:
            end = self._catch_up(f)
            if end is None:  # a version-1 file: converted to version 2 (one atomic rewrite) with the entries
                self._rewrite(entries)
                return
            tally = self._tally.plus(entries)
            if f.seek(0, os.SEEK_END) > end:
                f.truncate(end)  # a torn last line (a record that never returned) must not join these lines
            f.seek(end)
            try:
                with naming(self.path):
                    f.write(lines)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError:
                _cut(f, end)  # a record that raised released nothing: it must not count
                raise
        self._extend(entries, tally)
        self._pos = self._pos._replace(end=end + len(lines))

    def _rewrite(self, entries: Sequence[LedgerEntry]) -> None:
        """Write the file whole (atomically) with the entries so far and `entries`."""
        tally, everything = self._tally.plus(entries), [*self._entries, *entries]
        self._pos = _write_new(self.path, self.owner, everything)
        self._set_entries(everything, tally)
        self._on_disk = True

    def steps(self) -> int:
        """Total DP-SGD steps recorded (ALI-DPFL's t)."""
        return self._tally.steps

    def rounds(self) -> list[int]:
        """The distinct rounds with an entry, in order."""
        return sorted({e.round for e in self._entries if e.round is not None})

    def relations(self) -> set[str]:
        """The neighbouring relations the recorded guarantees were derived under."""
        return set(self._tally.relations)

    def assumptions(self) -> set[str]:
        """Conditions some recorded bound needs that the run did not enforce (events.py): with any, the
        epsilon is the papers' formula, not a guarantee."""
        return set(self._tally.assumptions)

    # -- accounting ------------------------------------------------------------
    def to_dp_event(self, extra: Sequence[LedgerEntry] = ()) -> dpa.DpEvent:
        """The composition of every non-pure entry (plus `extra`) as one
        dp-accounting event. Identical events are merged into one
        SelfComposedDpEvent (composition is commutative) to keep PLD fast."""
        return self._tally.plus(extra).dp_event()

    def pure_epsilon(self, extra: Sequence[LedgerEntry] = ()) -> float:
        """Sum of the pure-DP entries (basic composition)."""
        return math.fsum(self._tally.plus(extra).pure)

    def report(self, delta: float, accountant: str = "rdp", *, conversion: str = "balle",
               orders: accounting.Orders | None = None, extra: Sequence[LedgerEntry] = ()) -> EpsilonReport:
        """epsilon(delta) of the ledger (plus the prospective `extra` entries,
        without recording them), by `accountant`: 'rdp' (with `conversion`
        'classic'|'balle' and `orders`), 'pld', or a name in PAPER_ACCOUNTANTS."""
        tally = self._tally.plus(extra)
        mixed = sorted(set(tally.relations) - {"any"})  # 'any' (two arbitrary datasets) implies every relation
        if len(mixed) > 1:
            raise ValueError(f"this ledger holds guarantees under different neighbouring relations "
                             f"({', '.join(mixed)}): no single epsilon composes them (each bound says nothing "
                             "under the other relation)")
        pure = math.fsum(tally.pure)
        conv: str | None = conversion if accountant == "rdp" else None
        if accountant in PAPER_ACCOUNTANTS:
            approx, conv = _paper_epsilon(accountant, tally, delta)
        elif not tally.approx_kinds():
            accounting._check_delta(delta)
            approx = 0.0
        else:
            approx = accounting.epsilon(tally.dp_event(), delta, accountant=accountant,
                                        conversion=conversion, orders=orders)
        return EpsilonReport(accountant, float(delta), approx, pure, approx + pure, conv, dict(tally.kinds))

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
        kinds = {k for k, n in self._tally.kinds.items() if n and k != "post-processing"}
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
        if self.assumptions():
            lines.append(f"NOT A GUARANTEE of this run: it assumes {'; and '.join(sorted(self.assumptions()))}")
        return lines

    # -- persistence ------------------------------------------------------------
    # The file names stay `*.ledger.json` whatever the format: a resumed run looks its ledger up by name,
    # and one that did not find it would start a fresh ledger and under-count.
    def to_json(self) -> dict[str, Any]:
        """The ledger as one JSON object (format version 1: checkpoints, and version-1 files)."""
        return {"format": FORMAT, "version": OBJECT_VERSION, "owner": self.owner,
                "entries": [e.to_json() for e in self._entries]}

    @classmethod
    def from_json(cls, obj: dict[str, Any], path: str | os.PathLike | None = None) -> "PrivacyLedger":
        _check_format(obj, OBJECT_VERSION)
        return cls([LedgerEntry.from_json(e) for e in obj["entries"]], owner=obj.get("owner", ""), path=path)

    def save(self, path: str | os.PathLike | None = None) -> Path:
        """Write the whole ledger (version 2) atomically (temp file in the same folder, fsync,
        os.replace), so a crash leaves the old or the new file: for a new path, or a new file."""
        target = Path(path) if path is not None else self.path
        if target is None:
            raise ValueError("no path to save the ledger to")
        pos = _write_new(target, self.owner, self._entries)
        if target == self.path:
            self._pos, self._on_disk = pos, True
        return target

    @classmethod
    def load(cls, path: str | os.PathLike) -> "PrivacyLedger":
        """Load a saved ledger (bound to `path`). A missing or unreadable file is
        an error: a ledger is never silently replaced by a fresh one."""
        ledger = cls(path=path)
        with open(ledger.path, "rb") as f:
            ledger._catch_up(f)
        return ledger

    def reload(self) -> None:
        """Bring the entries up to date with the bound file: another process may have recorded since.
        Reads only what was appended since the last read; a bound ledger whose file does not exist yet
        keeps its entries (its first `record` writes it)."""
        if self.path is None:
            raise ValueError("the ledger is not bound to a file")
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            return
        with f:
            self._catch_up(f)

    def _catch_up(self, f: BinaryIO) -> int | None:
        """Read the open ledger file `f`: only the lines after those read before when it is the same file
        (inode) and not shorter (the file is only ever appended to, or replaced whole by a new inode), else
        all of it. Returns where its complete lines end (None for a version-1 file)."""
        st = os.fstat(f.fileno())
        pos = self._pos
        if pos is not None and (pos.dev, pos.ino) == (st.st_dev, st.st_ino) and st.st_size >= pos.end:
            f.seek(pos.end - 1)
            data = f.read()
            if data[:1] == b"\n":  # still a line boundary: an append, not a rewrite in place
                try:
                    entries, n = _complete_lines(data[1:])
                    tally = self._tally.plus(entries)
                except _DAMAGE as exc:
                    raise _damaged(self.path, exc) from None
                self._extend(entries, tally)
                return self._read_to(st, pos.end + n, len(data) - 1 - n)
        if not self._on_disk:  # reading the file would silently drop them (a lower epsilon)
            raise ValueError(f"this ledger holds {len(self._entries)} entries made in memory, and {self.path} "
                             "already exists: the file is the ledger; load it, or save these to a new path")
        f.seek(0)
        data = f.read()
        try:
            owner, entries, end = _parse_file(data)
            self._set_entries(entries)
        except _DAMAGE as exc:
            raise _damaged(self.path, exc) from None
        self.owner = owner
        if end is None:
            self._pos = None
            return None
        return self._read_to(st, end, len(data) - end)

    def _read_to(self, st: os.stat_result, end: int, torn: int) -> int:
        self._pos = _Pos(st.st_dev, st.st_ino, end)
        if torn and self._torn_warned != self._pos:
            self._torn_warned = self._pos
            _log.warning("privacy ledger %s: ignoring an incomplete last line (%d bytes) of a record that never "
                         "returned; the next record cuts it off", self.path, torn)
        return end

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


# ---------------------------------------------------------------------------
# The composition, kept up to date entry by entry
# ---------------------------------------------------------------------------
class _Tally:
    """What the accountants read from a list of entries, updated entry by entry in recording order, so
    every figure is the float a pass over all entries gives (order matters for float sums and for the
    order of the composed events)."""

    def __init__(self, entries: Iterable[LedgerEntry] = ()) -> None:
        self.kinds: dict[str, int] = {}  # entries per kind, in order of first appearance
        self.amounts: dict[tuple[Any, ...], Any] = {}  # _event_key -> steps, count or rho: the composition
        self.pure: list[float] = []  # epsilons of the pure-DP entries (basic composition, fsum)
        self.rho: list[float] = []  # rhos of the zcdp entries (hu-thm1, fsum)
        self.thm62_c: float = 0  # Upcycled-FL Thm 6.2's c, summed in the order upcycled_output_epsilon sums it
        self.steps = 0
        self.relations: set[str] = set()
        self.assumptions: set[str] = set()
        self.add(entries)

    def add(self, entries: Iterable[LedgerEntry]) -> None:
        for e in entries:
            p = e.params
            self.kinds[e.kind] = self.kinds.get(e.kind, 0) + 1
            if "relation" in p:
                self.relations.add(p["relation"])
            if "assumption" in p:
                self.assumptions.add(p["assumption"])
            if e.is_pure:
                self.pure.append(float(p["epsilon"]))
            elif not e.is_post_processing:
                self._add_approx(e)

    def _add_approx(self, e: LedgerEntry) -> None:
        key, p = _event_key(e), e.params
        amount = {"dpsgd": lambda: int(p["steps"]), "gaussian": lambda: int(p.get("count", 1)),
                  "zcdp": lambda: float(p["rho"])}[e.kind]()
        self.amounts[key] = self.amounts.get(key, 0) + amount
        if e.kind == "dpsgd":
            self.steps += amount
        elif e.kind == "zcdp":
            self.rho.append(amount)
        else:
            z = key[1]
            term = 1.0 / (2.0 * z * z) if z * z else math.inf  # a noise multiplier so small z^2 is 0: no bound
            for _ in range(amount):
                self.thm62_c += term

    def copy(self) -> "_Tally":
        new = object.__new__(_Tally)
        new.__dict__.update(self.__dict__)
        new.kinds, new.amounts = dict(self.kinds), dict(self.amounts)
        new.pure, new.rho = list(self.pure), list(self.rho)
        new.relations, new.assumptions = set(self.relations), set(self.assumptions)
        return new

    def plus(self, extra: Sequence[LedgerEntry]) -> "_Tally":
        """This tally with `extra` added after the recorded entries (itself, unchanged, without extra)."""
        if not extra:
            return self
        new = self.copy()
        new.add(extra)
        return new

    def approx_kinds(self) -> set[str]:
        return {k for k in _APPROX_KINDS if self.kinds.get(k)}

    def dp_event(self) -> dpa.DpEvent:
        """One event per distinct mechanism, in order of first appearance."""
        events: list[dpa.DpEvent] = []
        for key, amount in self.amounts.items():
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
    """The dp-accounting event of `entries` (pure entries are not in it)."""
    return _Tally(e for e in entries if not e.is_pure).dp_event()


def _paper_epsilon(name: str, tally: _Tally, delta: float) -> tuple[float, str | None]:
    allowed = _PAPER_KINDS[name]
    other = tally.approx_kinds() - allowed
    if other:
        raise ValueError(f"accountant {name!r} covers {', '.join(sorted(allowed))} entries only; "
                         f"the ledger also holds {', '.join(sorted(other))}")
    accounting._check_delta(delta)
    if not tally.approx_kinds():
        return 0.0, None
    if name == "upcycled-thm6.2":  # accounting.upcycled_output_epsilon, with its c kept as entries arrive
        c = tally.thm62_c
        return (accounting.zcdp_epsilon(c, delta) if c > 0 else 0.0), None
    if name == "hu-thm1":
        return accounting.zcdp_epsilon(math.fsum(tally.rho), delta), None
    if name == "ali-eq12":
        return accounting.epsilon(tally.dp_event(), delta, conversion="classic", orders="integer"), "classic"
    return accounting.epsilon(tally.dp_event(), delta, conversion="balle", orders="fedlap"), "balle"


# ---------------------------------------------------------------------------
# The file
# ---------------------------------------------------------------------------
class _Pos(NamedTuple):
    """How far a ledger file has been read: its device and inode, and where its last complete line ends."""

    dev: int
    ino: int
    end: int


def _line(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, allow_nan=False, separators=(",", ":")) + "\n").encode()


def _check_format(obj: dict[str, Any], version: int) -> None:
    if obj.get("format") != FORMAT or obj.get("version") != version:
        raise ValueError(f"not a privfed privacy ledger (version {version}): format={obj.get('format')!r}, "
                         f"version={obj.get('version')!r}")


def _complete_lines(data: bytes) -> tuple[list[LedgerEntry], int]:
    """The entries on the complete lines of `data` and the bytes they take; a last line without its
    newline (a record that never returned) is left out."""
    n = data.rfind(b"\n") + 1
    return [LedgerEntry.from_json(json.loads(line)) for line in data[:n].split(b"\n")[:-1]], n


def _parse_file(data: bytes) -> tuple[str, list[LedgerEntry], int | None]:
    """(owner, entries, where the complete lines end) of a ledger file's bytes; None for version 1."""
    first = data.split(b"\n", 1)[0]
    try:
        header = json.loads(first)
    except ValueError:
        header = None
    if not isinstance(header, dict) or "entries" in header:  # version 1: one JSON object, maybe indented
        obj = json.loads(data)
        ledger = PrivacyLedger.from_json(obj)
        return ledger.owner, ledger._entries, None
    _check_format(header, VERSION)
    if len(first) == len(data):
        raise ValueError("the header line is incomplete")
    entries, n = _complete_lines(data[len(first) + 1:])
    return str(header.get("owner", "")), entries, len(first) + 1 + n


def _damaged(path: Path | None, exc: Exception) -> ValueError:
    return ValueError(f"privacy ledger {path} is damaged ({type(exc).__name__}: {exc}); it is never replaced "
                      "by an empty one: restore it, or start the run under another run-name")


def _write_new(target: Path, owner: str, entries: Sequence[LedgerEntry]) -> _Pos:
    """Write a version-2 file whole, atomically."""
    data = _line({"format": FORMAT, "version": VERSION, "owner": owner}) + b"".join(
        _line(e.to_json()) for e in entries)
    st = write_atomically(target, lambda f: f.write(data), private=True)  # node state, 0600 as before
    return _Pos(st.st_dev, st.st_ino, len(data))


def _cut(f: BinaryIO, end: int) -> None:
    """Best effort: the file back to `end` bytes. Failing, the ledger keeps the lines and over-counts."""
    try:
        f.truncate(end)
        os.fsync(f.fileno())
    except OSError:
        pass
