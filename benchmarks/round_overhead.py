"""Benchmark: framework seconds per round, in-process engine vs Flower's simulation engine.

Both engines run the same privfed app (ServerApp runner + ClientApp) on the
same config: FedAvg, 10 clients, 20 rounds, every client every round, with
trivial client work (a generated 5-feature Synthetic federation, one local
step on each client's data). Each round's `seconds` (written by the runner
into metrics.jsonl: configure_train, send_and_receive, aggregation, central
evaluation) is the same measurement on both engines.

A round = the app's own work (clients' ClientApp calls; the server's
strategy, reply screening, byte metering and evaluation) + the engine's
overhead. The in-process run is instrumented: the ClientApp calls are timed
(client compute C) and so is the time inside the grid's `send_and_receive`
(S). Then, per round (median over rounds 2..R; round 1 pays for Ray's start
in simulation and for data loading in both):

    app work            W = round_inprocess - S + C
    in-process overhead   = S - C                  (delivering messages, contexts, replies)
    simulation overhead   = round_simulation - W   (the same app code does the same work there)

The two overheads differ by exactly the difference of the round times. Also
printed: round time minus client compute for each engine (which includes the
server's app work).

    python benchmarks/round_overhead.py [--clients 10] [--rounds 20] [--skip-simulation]

Prints both, the ratio, and a final JSON line.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from arguments import at_least, positive_int  # noqa: E402  (this folder: the benchmarks' own)

import server.inprocess_grid as inprocess_grid  # noqa: E402
from common.config import validate  # noqa: E402
from server.flower_run import run_with_flower  # noqa: E402
from server.inprocess import run_inprocess  # noqa: E402
from server.inprocess_grid import InProcessGrid  # noqa: E402


def bench_config(clients: int, rounds: int) -> dict:
    return {"strategy": "fedavg", "dataset": "synthetic", "num-clients": clients, "num-rounds": rounds,
            "fraction-train": 1.0, "synthetic-dim": 5, "synthetic-classes": 2, "local-epochs": 1,
            "batch-size": 1_000_000, "seed": 1, "run-name": "round-overhead"}


def rows_of(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


def run_ours(config: dict, results_dir: Path) -> tuple[list[float], list[float], list[float]]:
    """(round seconds, client compute per round, time in the grid's send_and_receive per round), in-process."""
    client_time: list[float] = []
    grid_time: list[float] = []
    deliver, send_and_receive = inprocess_grid.deliver, InProcessGrid.send_and_receive

    def timed_deliver(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return deliver(*args, **kwargs)
        finally:
            client_time.append(time.perf_counter() - t0)

    def timed_send_and_receive(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return send_and_receive(self, *args, **kwargs)
        finally:
            grid_time.append(time.perf_counter() - t0)

    inprocess_grid.deliver, InProcessGrid.send_and_receive = timed_deliver, timed_send_and_receive
    try:
        from rich.console import Console

        run_dir = run_inprocess(validate({**config, "results-dir": str(results_dir)}),
                                console=Console(file=io.StringIO()))
    finally:
        inprocess_grid.deliver, InProcessGrid.send_and_receive = deliver, send_and_receive
    clients, rounds = config["num-clients"], config["num-rounds"]
    round_s = [r["seconds"] for r in rows_of(run_dir)]
    # the first send_and_receive (and `clients` ClientApp calls) is enrollment; then one per round
    per_round_clients = [sum(client_time[clients * (i + 1): clients * (i + 2)]) for i in range(rounds)]
    return round_s, per_round_clients, grid_time[1:]


def steady(values: list[float]) -> float:
    return statistics.median(values[1:]) if len(values) > 1 else values[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=positive_int, default=10)
    parser.add_argument("--rounds", type=at_least(2), default=20)
    parser.add_argument("--skip-simulation", action="store_true", help="in-process only (no ratio)")
    args = parser.parse_args()
    config = bench_config(args.clients, args.rounds)

    with tempfile.TemporaryDirectory(prefix="privfed-bench-") as tmp:
        tmp = Path(tmp)
        run_ours(config, tmp / "warmup")  # imports, data generation and first-call costs out of the way
        round_s, client_s, grid_s = run_ours(config, tmp / "ours")
        clients_ms, round_ms = 1e3 * steady(client_s), 1e3 * steady(round_s)
        ours = 1e3 * steady([g - c for g, c in zip(grid_s, client_s)])
        work = round_ms - ours  # the app's own work per round (clients + server)
        print(f"workload: {args.clients} clients x {args.rounds} rounds, FedAvg, trivial client work "
              f"(one local step on a 5-feature Synthetic federation); medians of rounds 2-{args.rounds}")
        print(f"app work per round (timed in-process, the same on both engines): {work:.2f} ms "
              f"= client compute {clients_ms:.2f} ms + server {work - clients_ms:.2f} ms "
              f"(strategy, screening, metering, evaluation)")
        print(f"in-process engine : round {round_ms:8.2f} ms -> engine overhead {ours:8.2f} ms/round "
              f"(round - client compute: {round_ms - clients_ms:.2f} ms)")
        result = {"benchmark": "round_overhead", "clients": args.clients, "rounds": args.rounds,
                  "ours_ms": round(ours, 3), "ours_round_ms": round(round_ms, 3), "app_work_ms": round(work, 3),
                  "client_compute_ms": round(clients_ms, 3)}
        if not args.skip_simulation:
            t0 = time.perf_counter()
            code, output, run_dir = run_with_flower({**config, "results-dir": str(tmp / "flower")},
                                                    args.clients, flwr_home=tmp / "flwr-home", timeout=900)
            wall = time.perf_counter() - t0
            if code != 0 or run_dir is None:
                print(output[-3000:], file=sys.stderr)
                print(f"flwr run failed with exit code {code}", file=sys.stderr)
                return 1
            sim_round_s = [r["seconds"] for r in rows_of(run_dir)]
            sim_ms = 1e3 * steady(sim_round_s)
            reference = sim_ms - work
            print(f"Flower simulation : round {sim_ms:8.2f} ms -> engine overhead {reference:8.2f} ms/round "
                  f"(round - client compute: {sim_ms - clients_ms:.2f} ms; round 1 {sim_round_s[0]:.2f} s; "
                  f"`flwr run` wall {wall:.1f} s)")
            ratio = reference / ours if ours > 0 else float("inf")
            print(f"ratio (simulation / in-process engine overhead per round): {ratio:.0f}x; round minus client "
                  f"compute: {(sim_ms - clients_ms) / (round_ms - clients_ms):.0f}x; round time: {sim_ms / round_ms:.1f}x")
            result.update(reference_ms=round(reference, 3), reference_round_ms=round(sim_ms, 3), ratio=round(ratio, 1),
                          ours_round_minus_clients_ms=round(round_ms - clients_ms, 3),
                          reference_round_minus_clients_ms=round(sim_ms - clients_ms, 3),
                          ratio_round_minus_clients=round((sim_ms - clients_ms) / (round_ms - clients_ms), 1))
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
