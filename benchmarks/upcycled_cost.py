"""Benchmark: what Upcycled-FL saves at equal rounds: uploaded bytes, client compute seconds, wall time.

Two runs of the same number of rounds T on the in-process engine (1 torch thread), in this process:

- vanilla: T training rounds of the base;
- Upcycled: T rounds of which T/2 are training rounds (odd) and T/2 server-only extrapolations (even).

Measured per run: bytes uploaded by clients (sum of `bytes_up` in metrics.jsonl, as metered by the
runner), bytes downloaded, client compute seconds (wall and CPU time spent inside the clients' local
update rule, timed around every call of the ClientApp's rule), and the whole run's wall time. Printed:
each number and the ratio Upcycled / vanilla measured in the same process, beside the paper's Table 5
ratio (training time, output perturbation, Syn(iid): FedAvg 86.44 / 147.50 = 0.586).

Settings (`--setting`):
- `table1`: the Table 1 setting: FedAvg on Syn(0.5,0.5), 30% of 30 clients, 90% stragglers, E = 10,
  batch 32, lr 5e-3, momentum 0.5, theta 0.7.
- `table5`: the Table 5 setting: FedAvg with output perturbation (tau 10, sigma 1.0 vs 0.8) on Syn(iid),
  all 30 clients every round, lr 0.1, theta 0.3.

    PRIVFED_DATA_DIR=../shared/data python benchmarks/upcycled_cost.py [--setting table1|table5]
        [--rounds 80] [--repeat 1] [--strategy fedavg]

Prints a table and a final JSON line.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from arguments import positive_int  # noqa: E402  (this folder: the benchmarks' own)
PAPER_TABLE5_RATIO = 86.44 / 147.50  # Upc-FedAvg / FedAvg training time, output perturbation, Syn(iid)

SETTINGS = {
    "table1": {"preset": "upcycled-syn.toml", "dataset": "syn-0.5-0.5", "lr": 5e-3, "upcycled-theta": 0.7,
               "stragglers": 0.9, "fraction-train": 0.3},
    "table5": {"preset": "upcycled-output.toml", "dataset": "syn-iid", "lr": 0.1, "upcycled-theta": 0.3,
               "fraction-train": 1.0, "stragglers": 0.0},
}


class ClientTimer:
    """Wraps the ClientApp's `update_rule` lookup so every local update is timed (wall and CPU)."""

    def __init__(self):
        self.wall = self.cpu = 0.0
        self.calls = 0

    def install(self):
        import client.app as app

        original = app.update_rule
        timer = self

        def timed_lookup(strategy, privacy="none"):
            rule = original(strategy, privacy)

            def timed(client, content, state):
                w0, c0 = time.perf_counter(), time.thread_time()
                try:
                    return rule(client, content, state)
                finally:
                    timer.wall += time.perf_counter() - w0
                    timer.cpu += time.thread_time() - c0
                    timer.calls += 1
            return timed

        app.update_rule = timed_lookup
        return lambda: setattr(app, "update_rule", original)


def one_run(setting: str, upcycled: bool, rounds: int, strategy: str, out: Path, seed: int) -> dict:
    from rich.console import Console

    from common.config import drop_unread, load_preset, validate
    from server.inprocess import run_inprocess

    s = dict(SETTINGS[setting])
    preset = load_preset(REPO / "presets" / s.pop("preset"))
    overrides = drop_unread({**preset, **s}, {  # the vanilla runs less upcycled-theta
        "strategy": strategy, "num-rounds": rounds, "upcycled": upcycled, "seed": seed, "results-dir": str(out),
        "run-name": f"{setting}-{'upc' if upcycled else 'vanilla'}-{seed}",
        "data-dir": os.environ.get("PRIVFED_DATA_DIR", str(REPO.parent / "shared" / "data"))})
    if setting == "table5":
        overrides["output-noise-std"] = 0.8 if upcycled else 1.0
    config = validate(overrides)
    timer = ClientTimer()
    restore = timer.install()
    try:
        t0, p0 = time.perf_counter(), time.process_time()
        run_dir = run_inprocess(config, console=Console(file=io.StringIO()))
        wall, cpu = time.perf_counter() - t0, time.process_time() - p0
    finally:
        restore()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"wall_s": wall, "process_cpu_s": cpu, "client_wall_s": timer.wall, "client_cpu_s": timer.cpu,
            "client_calls": timer.calls,
            "bytes_up": sum(r["bytes_up"] for r in rows), "bytes_down": sum(r["bytes_down"] for r in rows),
            "training_rounds": sum(1 for r in rows if r["clients"]), "accuracy": summary["final"]["accuracy"],
            "epsilon_max": rows[-1].get("epsilon_max")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setting", choices=sorted(SETTINGS), default="table1")
    ap.add_argument("--rounds", type=positive_int, default=80)
    ap.add_argument("--repeat", type=positive_int, default=1)
    ap.add_argument("--strategy", default="fedavg")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    results: dict[str, list[dict]] = {"vanilla": [], "upcycled": []}
    with tempfile.TemporaryDirectory() as tmp:
        one_run(args.setting, True, 2, args.strategy, Path(tmp) / "warmup", seed=0)  # imports, data: not timed
        for i in range(args.repeat):
            for name in ("vanilla", "upcycled"):  # interleaved, so load changes hit both
                results[name].append(one_run(args.setting, name == "upcycled", args.rounds, args.strategy,
                                             Path(tmp), seed=i + 1))

    def mean(name, key):
        vals = [r[key] for r in results[name] if r[key] is not None]
        return sum(vals) / len(vals) if vals else None

    keys = ["wall_s", "process_cpu_s", "client_wall_s", "client_cpu_s", "client_calls", "bytes_up", "bytes_down",
            "training_rounds", "accuracy", "epsilon_max"]
    print(f"Upcycled vs vanilla, {args.strategy}, setting {args.setting}, {args.rounds} rounds each, "
          f"{args.repeat} repeat(s), means:")
    print(f"{'':16}{'vanilla':>14}{'upcycled':>14}{'ratio':>8}")
    summary = {"benchmark": "upcycled_cost", "setting": args.setting, "strategy": args.strategy, "rounds": args.rounds,
               "repeat": args.repeat}
    for key in keys:
        v, u = mean("vanilla", key), mean("upcycled", key)
        ratio = (u / v) if (v and u is not None) else None
        fmt = lambda x: "—" if x is None else (f"{x:.4g}" if isinstance(x, float) else str(x))  # noqa: E731
        print(f"{key:16}{fmt(v):>14}{fmt(u):>14}{fmt(ratio):>8}")
        summary[key] = {"vanilla": v, "upcycled": u, "ratio": ratio}
    print(f"paper Table 5 training-time ratio (Upc-FedAvg / FedAvg, output perturbation, Syn(iid)): "
          f"{PAPER_TABLE5_RATIO:.3f}")
    summary["paper_table5_ratio"] = PAPER_TABLE5_RATIO
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
