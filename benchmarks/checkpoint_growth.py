"""Benchmark: the server checkpoint's save, whose cost used to grow with the length of a run, ours vs the
previous behaviour.

One `Checkpointer.save` at C clients after R rounds (one DP-SGD entry per client per round in the privacy
mirror, one results row per round, a FedAvg strategy, a 60x10 model): milliseconds and bytes written
(`wchar` of /proc/self/io; the files' growth where that is missing).

The reference is the previous behaviour (checkpoint format version 2), kept compactly here as a subclass
of Checkpointer (`InlineCheckpointer`): every save rewrites the npz whole, with every results row and
every mirror ledger (`PrivacyLedger.to_json()`) inline in its meta. Ours (version 3) appends the round's
rows and mirror entries to the journal (one line, fsync) and writes an npz that holds the journal's length
and digest instead.

    python benchmarks/checkpoint_growth.py [--rounds 10,100,1000] [--clients 100] [--repeat 5]

Both arms save the same states. Ours saves every round from 1 (its journal must hold the rounds before);
each figure is the median of its saves at rounds R-repeat+1..R. The reference saves the round-R state
`repeat` times. Prints both side by side, the ratios, and a final JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from arguments import positive_int, positive_list  # noqa: E402  (this folder: the benchmarks' own)

from flwr.app import Array, ArrayRecord  # noqa: E402

from common.checkpoint_file import save_checkpoint  # noqa: E402
from common.config import validate  # noqa: E402
from common.privacy.events import dpsgd_steps  # noqa: E402
from server import checkpoint  # noqa: E402
from server.privacy_mirror import PrivacyMirror  # noqa: E402
from server.roster import Roster  # noqa: E402
from server.strategies.registry import build_strategy  # noqa: E402
from ledger_growth import written_bytes  # noqa: E402  (this folder: the script's own)

Q, SIGMA, STEPS = 0.0256, 1.1, 40
MODEL = ArrayRecord({"w": Array(np.zeros((60, 10), np.float32)), "b": Array(np.zeros(10, np.float32))})


class InlineCheckpointer(checkpoint.Checkpointer):
    """The previous behaviour (format version 2): rows and mirror inline in every save."""

    def save(self, server_round, arrays, strategy, mirror, writer) -> None:
        save_checkpoint(self.path, {
            "format": checkpoint.FORMAT, "version": checkpoint.INLINE_VERSION, "round": server_round,
            "lineage": self.lineage, "config": dict(self.config), "rows": list(writer.rows),
            "model": arrays, "strategy_classes": checkpoint.strategy_classes(strategy),
            "strategy": checkpoint.strategy_state(strategy),
            "mirror": {str(p): ledger.to_json() for p, ledger in mirror.ledgers.items()},
        })


class Rows:
    """What the checkpointer reads of the ResultsWriter (its rows), without writing metrics.jsonl."""

    def __init__(self) -> None:
        self.rows: list[dict] = []


def files_size(paths: list[Path]) -> int:
    return sum(p.stat().st_size for p in paths if p.exists())


def timed_save(ckpt: checkpoint.Checkpointer, r: int, strategy, mirror, rows: Rows) -> tuple[float, int]:
    """(ms, bytes written) of one save."""
    paths = [ckpt.path, ckpt.journal_path]
    before, size = written_bytes(), files_size(paths)
    t0 = time.perf_counter()
    ckpt.save(r, MODEL, strategy, mirror, rows)
    ms = 1e3 * (time.perf_counter() - t0)
    after = written_bytes()
    return ms, (after - before if before is not None else files_size(paths) - size)


def play_round(r: int, mirror: PrivacyMirror, rows: Rows) -> None:
    """What the runner records in round r: one DP-SGD entry per client, then the round's row."""
    for p in mirror.ledgers:
        mirror.record(p, [dpsgd_steps(Q, SIGMA, STEPS, round=r)])
    rows.rows.append({"round": r, "accuracy": 0.8123456789, "loss": 0.5123456789, "seconds": 1.23456789,
                      "bytes_up": 2_440_000, "bytes_down": 2_440_000, "clients": len(mirror.ledgers),
                      "train_loss": 0.4123456789, "epsilon_max": 1.23456789, "epsilon_mean": 1.23456789,
                      "accountant": "rdp", "delta": 1e-5})


def setup(folder: Path, clients: int, name: str, cls: type[checkpoint.Checkpointer]):
    config = validate({"num-clients": clients, "strategy": "fedavg", "privacy": "dpsgd", "dataset": "synthetic",
                       "local-steps": STEPS, "dp-sample-rate": Q, "dp-noise-multiplier": SIGMA,
                       "results-dir": str(folder), "run-name": name, "checkpoint": True})
    roster = Roster(node_of={p: 1000 + p for p in range(clients)}, num_examples={p: 100 for p in range(clients)})
    return cls(config, lambda *_: None), build_strategy(config, roster, lambda *_: None), \
        PrivacyMirror(config, roster.partitions)


def bench(folder: Path, clients: int, sizes: list[int], repeat: int) -> dict[int, dict[str, float]]:
    """Per size R: median ms and bytes written per save at round R, ours and the reference's."""
    ours, strategy, mirror = setup(folder, clients, "ours", checkpoint.Checkpointer)
    reference = setup(folder, clients, "reference", InlineCheckpointer)[0]
    rows, out, timed = Rows(), {}, {}
    for r in range(1, max(sizes) + 1):
        play_round(r, mirror, rows)
        timed[r] = timed_save(ours, r, strategy, mirror, rows)
        if r not in sizes:
            continue
        recent = [timed[k] for k in range(max(1, r - repeat + 1), r + 1)]
        ref = [timed_save(reference, r, strategy, mirror, rows) for _ in range(repeat)]
        out[r] = {"ours_ms": statistics.median(t for t, _ in recent),
                  "reference_ms": statistics.median(t for t, _ in ref),
                  "ours_bytes": statistics.median(b for _, b in recent),
                  "reference_bytes": statistics.median(b for _, b in ref),
                  "ours_total_bytes": sum(b for _, b in timed.values())}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=positive_list(int), default="10,100,1000", help="rounds R after which a save is measured")
    parser.add_argument("--clients", type=positive_int, default=100)
    parser.add_argument("--repeat", type=positive_int, default=5, help="saves per figure (median)")
    args = parser.parse_args(argv)
    sizes = sorted(set(args.rounds))
    result: dict = {"benchmark": "checkpoint_growth", "clients": args.clients}

    print(f"one checkpoint save at {args.clients} clients after R rounds (one DP-SGD entry per client per round, "
          f"one row per round; median of {args.repeat}); reference: version 2, rows and mirror inline, rewritten "
          "whole at every save")
    print(f"{'R':>6} {'ours ms':>9} {'ref ms':>9} {'ratio':>7} {'ours B':>10} {'ref B':>12} {'ratio':>7}")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="privfed-bench-") as tmp:
        figures = bench(Path(tmp), args.clients, sorted(set(sizes) | {1}), args.repeat)  # save 1: the run total
    for r, f in ((r, figures[r]) for r in sizes):
        ratio_ms, ratio_bytes = f["reference_ms"] / f["ours_ms"], f["reference_bytes"] / f["ours_bytes"]
        print(f"{r:>6} {f['ours_ms']:>9.2f} {f['reference_ms']:>9.2f} {ratio_ms:>6.1f}x {f['ours_bytes']:>10.0f} "
              f"{f['reference_bytes']:>12.0f} {ratio_bytes:>6.1f}x")
        result[f"rounds_{r}"] = {"ours_ms": round(f["ours_ms"], 3), "reference_ms": round(f["reference_ms"], 3),
                                 "ratio_ms": round(ratio_ms, 1), "ours_bytes": round(f["ours_bytes"]),
                                 "reference_bytes": round(f["reference_bytes"]), "ratio_bytes": round(ratio_bytes, 1)}
    last = figures[sizes[-1]]
    # the reference writes a whole checkpoint per save, growing linearly in R: the run's T saves write
    # T x (save 1 + save T) / 2
    reference_total = sizes[-1] * (figures[1]["reference_bytes"] + last["reference_bytes"]) / 2
    print(f"    bytes written by the {sizes[-1]} saves of a run: ours {last['ours_total_bytes'] / 1e6:.1f} MB "
          f"(measured), reference ~{reference_total / 1e6:.0f} MB (O(T^2)); {time.perf_counter() - t0:.0f} s")
    result["run_total_bytes"] = {"rounds": sizes[-1], "ours": round(last["ours_total_bytes"]),
                                 "reference_estimate": round(reference_total)}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
