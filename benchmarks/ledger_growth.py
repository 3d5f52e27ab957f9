"""Benchmark: privacy-ledger costs that used to grow with the length of a run, ours vs the previous behaviour.

(a) One charge (`client.privacy.charge`, positive target so the budget check runs: lock, reload,
    would_exceed, record) on a file ledger already holding N DP-SGD entries: milliseconds and bytes
    written (`wchar` of /proc/self/io; the file's growth where that is missing).
(b) The server mirror's per-round epsilon (`PrivacyMirror.round_metrics`, RDP) at C clients after R
    full-participation rounds (one DP-SGD entry per client per round).

The reference is the previous behaviour, kept compactly here as a subclass of PrivacyLedger
(`WholeFileLedger`): `record` rewrites the whole file (format version 1: one indented JSON object,
temp file, fsync, os.replace), `reload` parses the whole file, and every epsilon recomposes every
entry and calls the accountant afresh (no epsilon memo; the per-mechanism RDP curve cache it had
stays). Ours: append-only file, incremental reload, composition kept incrementally, memoised epsilon.

    python benchmarks/ledger_growth.py [--sizes 100,1000,3000] [--charges 5] [--clients 100] [--rounds 1000]

Prints both side by side, the ratios, and a final JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from arguments import positive_int, positive_list  # noqa: E402  (this folder: the benchmarks' own)

from client.privacy import charge  # noqa: E402
from common.privacy import accounting  # noqa: E402
from common.privacy import ledger as ledger_mod  # noqa: E402
from common.privacy.events import LedgerEntry, dpsgd_steps  # noqa: E402
from common.privacy.ledger import PrivacyLedger  # noqa: E402
from server.privacy_mirror import PrivacyMirror  # noqa: E402

Q, SIGMA, STEPS, DELTA = 0.0256, 1.1, 40, 1e-5
CONFIG = {"target-epsilon": 1e9, "target-delta": DELTA, "accountant": "rdp", "privacy": "dpsgd",
          "strategy": "fedavg", "dp-noise-seed": "random"}


class WholeFileLedger(PrivacyLedger):
    """The previous behaviour (see the module docstring)."""

    def _set_entries(self, entries: list[LedgerEntry], tally=None) -> None:
        self._entries, self._entries_tuple, self._tally = entries, None, None  # composed in `report` only

    def record(self, *entries: LedgerEntry) -> None:
        self._set_entries([*self._entries, *entries])
        if self.path is not None:
            self.save(self.path)

    def save(self, path=None) -> Path:
        target = Path(path or self.path)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(self.to_json(), indent=1, allow_nan=False))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        return target

    def reload(self) -> None:
        obj = json.loads(self.path.read_text(encoding="utf-8"))
        self._set_entries([LedgerEntry.from_json(e) for e in obj["entries"]])

    def report(self, *args, **kwargs):
        self._tally = ledger_mod._Tally(self._entries)  # recompose every entry
        accounting._rdp_epsilon.cache_clear()  # and ask the accountant afresh
        return super().report(*args, **kwargs)


def written_bytes() -> int | None:
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))
    except (OSError, StopIteration):
        return None


def entry(r: int) -> LedgerEntry:
    return dpsgd_steps(Q, SIGMA, STEPS, round=r)


def bench_charge(cls: type[PrivacyLedger], folder: Path, n: int, charges: int) -> tuple[float, float, int]:
    """(median ms per charge, bytes written per charge, file size after) on a ledger of n entries."""
    path = folder / f"{cls.__name__}-{n}.ledger.json"
    cls([entry(r) for r in range(n)], owner="partition-0").save(path)
    ledger = cls.load(path) if cls is PrivacyLedger else WholeFileLedger(path=path)
    if cls is not PrivacyLedger:
        ledger.reload()
    times, sizes = [], []
    for k in range(charges + 1):  # the first is a warm-up
        before, size = written_bytes(), path.stat().st_size
        t0 = time.perf_counter()
        charge(ledger, CONFIG, [entry(n + k)])
        dt = time.perf_counter() - t0
        after = written_bytes()
        if k:
            times.append(dt)
            sizes.append(after - before if before is not None else path.stat().st_size - size)
    assert len(cls.load(path) if cls is PrivacyLedger else ledger) == n + charges + 1
    return 1e3 * statistics.median(times), statistics.mean(sizes), path.stat().st_size


def _timed_ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return 1e3 * (time.perf_counter() - t0)


def _epsilons_without_memo_hits(mirror: PrivacyMirror) -> None:
    for ledger in mirror.ledgers.values():  # every client pays an accountant call (distinct ledgers)
        accounting._rdp_epsilon.cache_clear()
        ledger.epsilon(mirror.delta, accountant=mirror.accountant)


def bench_mirror(clients: int, rounds: int, repeat: int) -> dict[str, float]:
    """ms per round for the round's epsilons after `rounds` rounds: ours (round_metrics), ours with no
    memo hits (as with distinct ledgers), the reference (round_metrics)."""
    mirror = PrivacyMirror(CONFIG, list(range(clients)))
    for r in range(rounds):
        for p in range(clients):
            mirror.record(p, [entry(r)])
    reference = PrivacyMirror(CONFIG, list(range(clients)))
    reference.ledgers = {p: WholeFileLedger(ledger.entries, owner=ledger.owner) for p, ledger in mirror.ledgers.items()}
    out: dict[str, list[float]] = {"ours": [], "ours_no_memo_hits": [], "reference": []}
    for r in range(rounds, rounds + repeat):  # one more round recorded, then that round's epsilons
        for m in (mirror, reference):
            for p in range(clients):
                m.record(p, [entry(r)])
        out["ours"].append(_timed_ms(mirror.round_metrics))  # the round's first client pays the accountant call
        out["ours_no_memo_hits"].append(_timed_ms(lambda: _epsilons_without_memo_hits(mirror)))
        out["reference"].append(_timed_ms(reference.round_metrics))
        assert mirror.round_metrics() == reference.round_metrics(), "ours differs from the recomposition"
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=positive_list(int), default="100,1000,3000", help="ledger sizes N for (a)")
    parser.add_argument("--charges", type=positive_int, default=5, help="charges timed per size (median)")
    parser.add_argument("--clients", type=positive_int, default=100)
    parser.add_argument("--rounds", type=positive_int, default=1000)
    parser.add_argument("--repeat", type=positive_int, default=3, help="rounds timed for (b) (median)")
    args = parser.parse_args()
    sizes = args.sizes
    result: dict = {"benchmark": "ledger_growth"}

    print(f"(a) one charge on a file ledger of N DP-SGD entries (lock, reload, budget check, record; "
          f"median of {args.charges}); reference: whole-file v1 rewrite + full reload + full recomposition")
    print(f"{'N':>6} {'ours ms':>9} {'ref ms':>9} {'ratio':>7} {'ours B':>9} {'ref B':>9} {'ratio':>7} "
          f"{'ours file':>10} {'ref file':>10}")
    with tempfile.TemporaryDirectory(prefix="privfed-bench-") as tmp:
        for n in sizes:
            ms, written, size = bench_charge(PrivacyLedger, Path(tmp), n, args.charges)
            ref_ms, ref_written, ref_size = bench_charge(WholeFileLedger, Path(tmp), n, args.charges)
            print(f"{n:>6} {ms:>9.2f} {ref_ms:>9.2f} {ref_ms / ms:>6.0f}x {written:>9.0f} {ref_written:>9.0f} "
                  f"{ref_written / written:>6.0f}x {size:>10} {ref_size:>10}")
            result[f"charge_{n}"] = {"ours_ms": round(ms, 3), "reference_ms": round(ref_ms, 3),
                                     "ratio_ms": round(ref_ms / ms, 1), "ours_bytes": round(written),
                                     "reference_bytes": round(ref_written),
                                     "ratio_bytes": round(ref_written / written, 1)}
    per_round = result[f"charge_{sizes[-1]}"]
    print(f"    bytes written by {args.rounds} charges from an empty ledger: ours "
          f"{per_round['ours_bytes'] * args.rounds / 1e6:.2f} MB (each charge writes its own line), reference "
          f"~{sum(ref for ref in _reference_growth(args.rounds)) / 1e6:.0f} MB")

    t0 = time.perf_counter()
    m = bench_mirror(args.clients, args.rounds, args.repeat)
    print(f"(b) mirror's per-round epsilon (RDP), {args.clients} clients after {args.rounds} full-participation "
          f"rounds (setup {time.perf_counter() - t0:.0f} s; median of {args.repeat} rounds):")
    print(f"    ours {m['ours']:.2f} ms/round (no memo hits, as with distinct ledgers: "
          f"{m['ours_no_memo_hits']:.2f} ms); reference (recomposing every entry) {m['reference']:.2f} ms/round; "
          f"ratio {m['reference'] / m['ours']:.0f}x")
    result["mirror"] = {"clients": args.clients, "rounds": args.rounds, "ours_ms": round(m["ours"], 3),
                        "ours_no_memo_hits_ms": round(m["ours_no_memo_hits"], 3),
                        "reference_ms": round(m["reference"], 3), "ratio": round(m["reference"] / m["ours"], 1)}
    print(json.dumps(result))
    return 0


def _reference_growth(rounds: int) -> list[int]:
    """The size of the previous format's whole file after each of `rounds` charges (what it rewrote)."""
    one = len(json.dumps(WholeFileLedger([entry(1)]).to_json(), indent=1)) - len(
        json.dumps(WholeFileLedger().to_json(), indent=1))
    base = len(json.dumps(WholeFileLedger().to_json(), indent=1))
    return [base + one * k for k in range(1, rounds + 1)]


if __name__ == "__main__":
    sys.exit(main())
