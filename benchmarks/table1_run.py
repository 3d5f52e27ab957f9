"""Benchmark: wall time and peak memory of one Table-1 style run on each engine.

The run: FedAvg on the released Upcycled-FL Syn(0.5, 0.5) federation, 30
clients, 30 % (9) per round, 10 local epochs, batch 32, lr 0.1, momentum 0.5,
80 rounds (`presets/fedavg-syn-iid.toml` with dataset = syn-0.5-0.5); about
58k local SGD steps of a 210-weight logistic regression.

- in-process: a fresh Python process runs `run_inprocess` (torch with 1
  thread, the engine's default). Reported: the run's wall time (the
  `run_inprocess` call: data loading, 80 rounds, evaluation, results and
  plot), the whole process's wall time (with Python and library imports), and
  its peak RSS (`resource.getrusage`).
- simulation: `flwr run` through `server.flower_run.run_with_flower` (local
  SuperLink, Flower's simulation engine with Ray). Reported: the wall time of
  the whole command, the ServerApp's own run time (`wall_seconds` in
  summary.json), and the peak of the summed RSS and PSS of every process of
  the run (found by its private FLWR_HOME in /proc, sampled every 0.25 s).

Both runs must end with the same final accuracy (the engines give the same
results). For scale: the Upcycled-FL authors' reference implementation takes
24.0 +- 2.2 s for this run on this kind of machine (measured elsewhere; it
evaluates every client's training data every round).

Needs $PRIVFED_DATA_DIR (default ../shared/data next to the repo) holding
fedprox-synthetic/syn_0.5_0.5.npz.

    python benchmarks/table1_run.py [--engines inprocess,simulation] [--rounds 80] [--repeat 1]

Prints both and a final JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from arguments import positive_int  # noqa: E402  (this folder: the benchmarks' own)
REFERENCE_S = 24.0  # the authors' implementation, measured outside this repo (see the docstring)


def data_dir() -> Path:
    return Path(os.environ.get("PRIVFED_DATA_DIR", REPO.parent / "shared" / "data")).resolve()


def table1_overrides(rounds: int, results_dir: Path) -> dict:
    from common.config import load_preset

    return {**load_preset(REPO / "presets" / "fedavg-syn-iid.toml"), "dataset": "syn-0.5-0.5",
            "num-rounds": rounds, "data-dir": str(data_dir()), "results-dir": str(results_dir),
            "run-name": "table1", "seed": 0}


def child_inprocess(rounds: int, results_dir: Path, started: float) -> None:
    """Runs in a fresh process: one in-process run; prints one JSON line."""
    import io
    import resource

    from rich.console import Console

    from common.config import validate
    from server.inprocess import run_inprocess

    imported = time.perf_counter()
    config = validate(table1_overrides(rounds, results_dir))
    t0, c0 = time.perf_counter(), time.process_time()
    run_dir = run_inprocess(config, console=Console(file=io.StringIO()))
    run_s, run_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    summary = json.loads((run_dir / "summary.json").read_text())
    print(json.dumps({"run_s": run_s, "run_cpu_s": run_cpu_s, "import_s": imported - started,
                      "cpu_s": time.process_time(),
                      "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "accuracy": summary["final"]["accuracy"]}))


def run_inprocess_engine(rounds: int, tmp: Path) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--child", "--rounds", str(rounds), "--out", str(tmp)],
                          capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"in-process run failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_s"] = wall
    return result


def _memory(pids: list[int]) -> tuple[float, float]:
    """Summed RSS and PSS (MiB) of `pids` from /proc/<pid>/smaps_rollup."""
    rss = pss = 0
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("Rss:"):
                rss += int(line.split()[1])
            elif line.startswith("Pss:"):
                pss += int(line.split()[1])
    return rss / 1024, pss / 1024


def run_simulation_engine(rounds: int, tmp: Path) -> dict:
    from server.flower_run import pids_with_home, run_with_flower

    home = tmp / "flwr-home"
    peak = {"rss": 0.0, "pss": 0.0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.25):
            rss, pss = _memory(pids_with_home(home))
            peak["rss"], peak["pss"] = max(peak["rss"], rss), max(peak["pss"], pss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    try:
        code, output, run_dir = run_with_flower(table1_overrides(rounds, tmp / "results"), 30, flwr_home=home,
                                                timeout=1800)
    finally:
        stop.set()
        sampler.join()
    wall = time.perf_counter() - t0
    if code != 0 or run_dir is None:
        raise RuntimeError(f"flwr run failed with exit code {code}:\n{output[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"wall_s": wall, "serverapp_s": summary["wall_seconds"], "peak_rss_mib": peak["rss"],
            "peak_pss_mib": peak["pss"], "accuracy": summary["final"]["accuracy"]}


ENGINES = ("inprocess", "simulation")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default="inprocess,simulation", help="comma-separated: inprocess, simulation")
    parser.add_argument("--rounds", type=positive_int, default=80)
    parser.add_argument("--repeat", type=positive_int, default=1, help="in-process runs (the median is reported)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not engines or set(engines) - set(ENGINES):
        parser.error(f"--engines: comma-separated {', '.join(ENGINES)}; got {args.engines!r}")
    if args.child:
        child_inprocess(args.rounds, Path(args.out), started=time.perf_counter() - _since_start())
        return 0
    if not (data_dir() / "fedprox-synthetic" / "syn_0.5_0.5.npz").is_file():
        print(f"needs {data_dir() / 'fedprox-synthetic' / 'syn_0.5_0.5.npz'} (set PRIVFED_DATA_DIR)", file=sys.stderr)
        return 2
    print(f"Table-1 style run: FedAvg, released Syn(0.5,0.5), 30 clients, 9 per round, E = 10, B = 32, "
          f"{args.rounds} rounds; {os.cpu_count()} CPUs")
    result: dict = {"benchmark": "table1_run", "rounds": args.rounds, "reference_authors_s": REFERENCE_S}
    with tempfile.TemporaryDirectory(prefix="privfed-table1-") as tmp:
        tmp = Path(tmp)
        if "inprocess" in engines:
            runs = [run_inprocess_engine(args.rounds, tmp / f"inprocess-{i}") for i in range(args.repeat)]
            runs.sort(key=lambda r: r["run_s"])
            ours = runs[len(runs) // 2]
            spread = f" (min {runs[0]['run_s']:.2f}, max {runs[-1]['run_s']:.2f} of {len(runs)})" if len(runs) > 1 else ""
            print(f"in-process : run {ours['run_s']:6.2f} s{spread}; process {ours['process_s']:.2f} s "
                  f"(imports {ours['import_s']:.2f} s); CPU: run {ours['run_cpu_s']:.2f} s, process "
                  f"{ours['cpu_s']:.2f} s; peak RSS "
                  f"{ours['peak_rss_mib']:.0f} MiB; final accuracy {ours['accuracy']:.4f}")
            result.update(inprocess_s=round(ours["run_s"], 3), inprocess_cpu_s=round(ours["run_cpu_s"], 3),
                          inprocess_process_s=round(ours["process_s"], 3),
                          inprocess_peak_rss_mib=round(ours["peak_rss_mib"], 1),
                          inprocess_runs_s=[round(r["run_s"], 3) for r in runs], inprocess_accuracy=ours["accuracy"])
        if "simulation" in engines:
            sim = run_simulation_engine(args.rounds, tmp)
            print(f"simulation : `flwr run` {sim['wall_s']:6.2f} s; ServerApp run {sim['serverapp_s']:.2f} s; "
                  f"peak RSS {sim['peak_rss_mib']:.0f} MiB, PSS {sim['peak_pss_mib']:.0f} MiB (all processes); "
                  f"final accuracy {sim['accuracy']:.4f}")
            result.update(simulation_s=round(sim["wall_s"], 3), simulation_serverapp_s=round(sim["serverapp_s"], 3),
                          simulation_peak_rss_mib=round(sim["peak_rss_mib"], 1),
                          simulation_peak_pss_mib=round(sim["peak_pss_mib"], 1), simulation_accuracy=sim["accuracy"])
        if "inprocess_s" in result:
            print(f"authors' reference implementation: {REFERENCE_S} s (measured elsewhere, not in this command); "
                  f"in-process run takes {result['inprocess_s'] / REFERENCE_S:.2f}x its time")
        if "inprocess_s" in result and "simulation_s" in result:
            # like with like: whole command vs whole process, and the ServerApp's run vs the run_inprocess call
            result["ratio"] = round(result["simulation_s"] / result["inprocess_process_s"], 2)
            result["run_ratio"] = round(result["simulation_serverapp_s"] / result["inprocess_s"], 2)
            same = result["inprocess_accuracy"] == result["simulation_accuracy"]
            print(f"ratio (simulation / in-process): whole command {result['ratio']:.1f}x, run alone "
                  f"{result['run_ratio']:.1f}x; same final accuracy: {same}")
    print(json.dumps(result))
    return 0


def _since_start() -> float:
    """Seconds since this process started (for the child's import time)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


if __name__ == "__main__":
    sys.exit(main())
