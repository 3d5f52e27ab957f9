"""Benchmark: seconds per round in Flower's deployment runtime on loopback,
Flower's default reply polling vs privfed's polling grid (server/polling_grid.py).

One federation (deploy/local-federation.sh: TLS, node authentication, 1
SuperLink + N SuperNodes on 127.0.0.1, in a temporary folder) serves every
run. The runs alternate between the two modes:

    default : poll-interval = 0   -> Flower's HttpGrid.send_and_receive (pulls every 3 s)
    wrapper : poll-interval = P   -> PollingGrid: push_messages, then pull_messages every P s

Each round's `seconds` is what the runner writes into metrics.jsonl
(configure_train, send_and_receive, aggregation, central evaluation), so the
two modes are measured the same way. Round 1 pays for data loading and the
first FAB install on every node and is left out: the statistic is the median
(and mean) over rounds 2..R, pooled over the repeats of a mode.

    python benchmarks/deployment_round.py [--nodes 3] [--rounds 6] [--repeats 1] [--poll 0.1]

Prints both, the ratio default/wrapper, and a final JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from arguments import at_least, positive_int  # noqa: E402  (this folder: the benchmarks' own)

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def free_ports(n: int) -> list[int]:
    for base in range(18500 + os.getpid() % 800, 19900):
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return list(range(base, base + n))
    raise RuntimeError("no free ports")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=positive_int, default=3)
    ap.add_argument("--rounds", type=at_least(2), default=6)
    ap.add_argument("--repeats", type=positive_int, default=1, help="runs per mode (alternating)")
    ap.add_argument("--poll", type=float, default=0.1, help="the wrapper's poll interval (s)")
    ap.add_argument("--run-config", default="", help="extra run-config entries, e.g. 'local-epochs=1'")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="privfed-deploy-bench-"))
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", FLWR_HOME=str(tmp / "cli"),
               FLWR_DISABLE_UPDATE_CHECK="1", FLWR_TELEMETRY_ENABLED="0",
               FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")
    ports = free_ports(args.nodes + 1)
    script = str(ROOT / "deploy" / "local-federation.sh")
    fed = ["--run-dir", str(tmp / "run")]
    t0 = time.time()
    r = subprocess.run([script, "start", "-n", str(args.nodes), "--port", str(ports[0]), "--node-port-base",
                        str(ports[1]), "--certs", str(tmp / "certs"), "--workdir", str(tmp), *fed],
                       cwd=ROOT, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        subprocess.run([script, "stop", *fed], env=env, capture_output=True)
        sys.exit(f"federation did not start:\n{r.stdout}\n{r.stderr}")
    print(f"federation: {args.nodes} SuperNodes online after {time.time() - t0:.1f} s (TLS + node auth, loopback)")

    modes = {"default": 0.0, "wrapper": args.poll}
    rounds: dict[str, list[float]] = {m: [] for m in modes}
    walls: dict[str, list[float]] = {m: [] for m in modes}
    try:
        for rep in range(args.repeats):
            for mode, poll in modes.items():
                name = f"{mode}-{rep}"
                rc = (f"num-clients={args.nodes} num-rounds={args.rounds} poll-interval={poll} "
                      f'run-name="{name}" results-dir="{tmp / "results"}" {args.run_config}')
                t = time.time()
                r = subprocess.run([str(BIN / "flwr"), "run", ".", "privfed-local", "--stream", "--run-config", rc],
                                   cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
                wall = time.time() - t
                rows = [json.loads(x) for x in (tmp / "results" / name / "metrics.jsonl").read_text().splitlines()] \
                    if (tmp / "results" / name / "metrics.jsonl").exists() else []
                if r.returncode != 0 or len(rows) != args.rounds:
                    sys.exit(f"run {name} failed (rc {r.returncode}, {len(rows)} rounds):\n{(r.stdout + r.stderr)[-3000:]}")
                secs = [row["seconds"] for row in rows]
                rounds[mode].extend(secs[1:])
                walls[mode].append(wall)
                print(f"{name:>10}: rounds {', '.join(f'{s:.2f}' for s in secs)} s; flwr run wall {wall:.1f} s",
                      flush=True)
    finally:
        subprocess.run([script, "stop", *fed], env=env, capture_output=True, timeout=120)

    stats = {m: {"median": statistics.median(v), "mean": statistics.fmean(v), "n": len(v),
                 "wall_mean": statistics.fmean(walls[m])} for m, v in rounds.items()}
    print(f"\n{'mode':>12}  {'s/round median':>15}  {'mean':>7}  {'rounds':>6}  {'flwr run wall':>13}")
    for m, s in stats.items():
        label = m if m == "default" else f"{m} {args.poll:g}s"
        print(f"{label:>12}  {s['median']:>15.2f}  {s['mean']:>7.2f}  {s['n']:>6}  {s['wall_mean']:>13.1f}")
    ratio = stats["default"]["median"] / stats["wrapper"]["median"]
    print(f"ratio default/wrapper (median s/round, rounds 2..{args.rounds}): {ratio:.2f}x")
    print(json.dumps({"benchmark": "deployment_round", "nodes": args.nodes, "rounds": args.rounds,
                      "repeats": args.repeats, "poll": args.poll, "stats": stats, "ratio_median": ratio,
                      "load_avg": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
