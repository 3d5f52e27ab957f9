"""Write the ALI-DPFL suites: ali-table2, ali-table7 and ali-paper-scale.

    python presets/repro/ali-table2/make_suites.py [--clip C]

Rows: ALI-DPFL and DP-FedAvg with fixed tau in {1, 2, 3, 5, 10} under the same
accounting (`strategy = "fedavg"`, `privacy = "dpsgd"`, `local-steps = tau`:
each client refuses the round that would pass its budget, and the run ends).
Every run: 10 clients all participating, q = 0.015, sigma = 1.1, delta = 1e-5,
lr 0.5, the accountant of the paper's Eq. 12 (`ali-eq12`), R_c by exact search.
Paper numbers: reference/ali-dpfl.md (Tables II, VII).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # presets/repro: the shared TOML helper
from suite_toml import RUN_SEED_NOISE, inline, override_line, toml_value  # noqa: E402

HERE = Path(__file__).resolve().parent
REPRO = HERE.parent

TAUS = (1, 2, 3, 5, 10)
ROWS = ["ALI-DPFL"] + [f"tau={t}" for t in TAUS]

# Table II (R_s = 158): column -> epsilon; paper numbers per row: (MNIST, FMNIST, CIFAR10) per column
T2_COLUMNS = {"Rs=2Rc eps=1.55": 1.55, "Rs=Rc eps=1.75": 1.75, "Rs=Rc/2 eps=2": 2.0, "Rs=Rc/5 eps=2.75": 2.75}
T2_PAPER = {
    "tau=1": [(85.65, 79.98, 39.33), (96.01, 81.94, 46.27), (95.06, 81.64, 47.27), (97.08, 82.14, 47.20)],
    "tau=2": [(81.26, 79.66, 32.55), (95.99, 81.48, 42.91), (96.77, 83.20, 50.79), (97.99, 82.90, 50.96)],
    "tau=3": [(78.63, 78.55, 31.23), (95.21, 81.26, 41.33), (97.51, 82.60, 49.28), (98.15, 83.60, 52.85)],
    "tau=5": [(77.62, 77.68, 26.38), (95.14, 79.64, 41.06), (97.49, 82.25, 47.62), (97.96, 82.45, 53.14)],
    "tau=10": [(76.65, 75.32, 23.46), (91.05, 76.32, 40.20), (95.18, 78.23, 44.38), (96.42, 76.78, 48.30)],
    "ALI-DPFL": [(86.10, 80.17, 39.82), (96.25, 82.02, 46.32), (97.58, 83.44, 51.92), (98.25, 84.07, 53.54)],
}
DATASETS = {"MNIST": ("mnist", "ali-mnist-cnn", 0), "FMNIST": ("fashion-mnist", "ali-mnist-cnn", 1),
            "CIFAR10": ("cifar10", "ali-cifar-cnn", 2)}

# Table VII (FMNIST, eps = 2 so R_c = 314 by exact search, R_s = R_c/3 = 105)
T7_COLUMNS = {"IID": ("iid", None, 0.0), "Dir(0.05)": ("dirichlet", 0.05, 10.0),
              "Dir(0.5)": ("dirichlet", 0.5, 5.0), "Dir(1)": ("dirichlet", 1.0, 1.0)}
T7_PAPER = {
    "tau=1": (84.56, 80.92, 81.01, 82.77), "tau=2": (86.12, 82.15, 84.61, 84.88),
    "tau=3": (89.46, 84.45, 84.89, 85.82), "tau=5": (83.30, 80.62, 81.21, 82.05),
    "tau=10": (76.56, 73.56, 74.06, 74.51), "ALI-DPFL": (89.62, 84.85, 85.45, 86.12),
}


def row_overrides(row: str) -> dict:
    if row == "ALI-DPFL":
        return {"strategy": "ali-dpfl"}
    return {"strategy": "fedavg", "local-steps": int(row.split("=")[1])}



def common(clip: float, device: str) -> dict:
    return {"num-clients": 10, "fraction-train": 1.0, "privacy": "dpsgd", "dp-sample-rate": 0.015,
            "dp-noise-multiplier": 1.1, "dp-clip": clip, "lr": 0.5, "momentum": 0.0, "target-delta": 1e-5,
            "accountant": "ali-eq12", "ali-mu-estimator": "dp-secant", "device": device,
            "eval-every": 5, **RUN_SEED_NOISE}  # central evaluation of 10k images costs more than a round of DP-SGD on CPU


def write(path: Path, header: str, suite: dict, overrides: dict, cells: list[dict]) -> None:
    lines = [header.rstrip(), "", "[suite]"]
    lines += [f"{k} = {toml_value(v)}"
              for k, v in suite.items()]
    lines += ["", "[suite.overrides]"] + [override_line(k, v) for k, v in overrides.items()]
    for c in cells:
        lines += ["", "[[cell]]", f"row = {toml_value(c['row'])}", f"column = {toml_value(c['column'])}",
                  f"overrides = {inline(c['overrides'])}"]
        if c.get("paper") is not None:
            lines.append(f"paper = {c['paper']}")
        if c.get("note"):
            lines.append(f"note = {toml_value(c['note'])}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def table2(clip: float, datasets: list[str], name: str, device: str, seeds: list[int]) -> tuple[dict, dict, list]:
    columns = [f"{c} {d}" for d in datasets for c in T2_COLUMNS]  # "... MNIST" never matches "... FMNIST"
    suite = {"name": name, "description": (
        "ALI-DPFL Table II (R_s = 158, Dir(0.05), 10 clients): ALI-DPFL vs DP-FedAvg with fixed tau under the "
        f"same accounting (Eq. 12 RDP, exact R_c), C = {clip}."),
        "source": "Ling et al., ALI-DPFL (arXiv 2308.10457), Table II", "seeds": seeds,
        "metric": "final-accuracy", "scale": 100.0, "rows": ROWS, "columns": columns}
    overrides = {**common(clip, device), "partition": "dirichlet", "dirichlet-alpha": 0.05, "num-rounds": 158,
                 "ali-gamma": 10.0}
    cells = []
    for ds in datasets:
        dataset, model, idx = DATASETS[ds]
        for j, (col, eps) in enumerate(T2_COLUMNS.items()):
            for row in ROWS:
                cells.append({"row": row, "column": f"{col} {ds}",
                              "overrides": {**row_overrides(row), "dataset": dataset, "model": model,
                                            "target-epsilon": eps},
                              "paper": T2_PAPER[row][j][idx]})
    return suite, overrides, cells


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clip", type=float, default=3.0, help="clipping norm C (3.0: chosen by search_clip.py, see README.md)")
    args = ap.parse_args()
    head = (f"# Generated by presets/repro/ali-table2/make_suites.py (--clip {args.clip}); see "
            "presets/repro/ali-table2/README.md\n# for the decisions (C search, R_c, mu estimator). Needs "
            "PRIVFED_DATA_DIR holding the datasets.")
    suite, ov, cells = table2(args.clip, ["MNIST", "FMNIST"], "ali-table2", "cpu", [1, 2, 3])
    write(REPRO / "ali-table2" / "suite.toml", head, suite, ov, cells)

    suite, ov, cells = table2(args.clip, ["CIFAR10"], "ali-paper-scale", "auto", [1, 2, 3])
    suite["description"] = ("Paper scale (a GPU machine): Table II on CIFAR-10 with the Table VI CNN "
                            f"(d = 550,570), C = {args.clip}; data-dir must hold CIFAR-10.")
    write(REPRO / "ali-paper-scale" / "suite.toml", head, suite, ov, cells)

    columns = list(T7_COLUMNS)
    suite = {"name": "ali-table7", "description": (
        "ALI-DPFL Table VII: Fashion-MNIST, eps = 2 (R_c = 314, exact search), R_s = R_c/3 = 105 rounds, "
        f"IID / Dir(0.05) / Dir(0.5) / Dir(1) with Gamma 0 / 10 / 5 / 1, C = {args.clip}."),
        "source": "Ling et al., ALI-DPFL (arXiv 2308.10457), Table VII", "seeds": [1, 2, 3],
        "metric": "final-accuracy", "scale": 100.0, "rows": ROWS, "columns": columns}
    ov = {**common(args.clip, "cpu"), "dataset": "fashion-mnist", "model": "ali-mnist-cnn",
          "target-epsilon": 2.0, "num-rounds": 105}
    cells = []
    for j, (col, (part, alpha, gamma)) in enumerate(T7_COLUMNS.items()):
        for row in ROWS:
            o = {**row_overrides(row), "partition": part}
            if row == "ALI-DPFL":  # the fixed-tau baselines have no Gamma (a suite drops keys a cell never reads)
                o["ali-gamma"] = gamma
            if alpha is not None:
                o["dirichlet-alpha"] = alpha
            cells.append({"row": row, "column": col, "overrides": o, "paper": T7_PAPER[row][j]})
    write(REPRO / "ali-table7" / "suite.toml", head, suite, ov, cells)


if __name__ == "__main__":
    main()
