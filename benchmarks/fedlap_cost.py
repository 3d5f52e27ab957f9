"""Benchmark: FedLAP vs FedAvg client cost per round, on the same model and partition.

For one client (partition 0 of MNIST, 5 clients x 2 disjoint classes) and one
round from the same initial model, it runs the real update rules
(`client/updates/fedlap.py`, `client/updates/sgd.py`) and prints

- client seconds per round (wall clock, median of --repeats), and the ratio
  FedLAP / FedAvg measured in the same run;
- uplink bytes per round: the reply's payload as the runner's meter counts it
  (`common/records.recorddict_nbytes`: arrays + 8 bytes per scalar), the
  model's size, and the ratio uplink / model bytes;
- the exact set size for the paper's setting (50 ipc x 2 classes of 28x28x1
  float32 + uint8 labels) against the paper's ConvNet (317,706 float32), also
  when the run uses other settings.

    python benchmarks/fedlap_cost.py [--preset fedlap-quick] [--model convnet-w32] [--repeats 1]
        [--set fedlap-ipc=50 --set fedlap-real-batches=4 ...] [--fedavg-epochs 1]

Needs the MNIST files (PRIVFED_DATA_DIR or --data-dir).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from arguments import at_least, positive_int  # noqa: E402  (this folder: the benchmarks' own)

import torch  # noqa: E402
from flwr.app import ConfigRecord, RecordDict  # noqa: E402

from common.config import drop_unread, load_preset, validate  # noqa: E402
from common.models import build_model, num_parameters  # noqa: E402
from common.records import ARRAYS, CONFIG, arrays_nbytes, model_to_arrays, recorddict_nbytes  # noqa: E402

PRESETS = Path(__file__).resolve().parents[1] / "presets"


def _value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def paper_uplink() -> tuple[int, int]:
    images = 50 * 2 * 1 * 28 * 28 * 4
    labels = 50 * 2  # uint8
    model = 317_706 * 4
    return images + labels, model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="fedlap-quick")
    ap.add_argument("--model", default=None, help="override the preset's model (convnet, convnet-w32)")
    ap.add_argument("--set", action="append", default=[], help="key=value run-config override")
    ap.add_argument("--repeats", type=positive_int, default=1)
    ap.add_argument("--fedavg-epochs", type=positive_int, default=1)
    ap.add_argument("--partition", type=at_least(0), default=0)
    ap.add_argument("--data-dir", default="")
    ap.add_argument("--threads", type=positive_int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    raw = load_preset(PRESETS / f"{args.preset}.toml")
    if args.model:
        raw["model"] = args.model
    if args.data_dir:
        raw["data-dir"] = args.data_dir
    for item in args.set:
        key, _, value = item.partition("=")
        raw[key] = _value(value)
    raw["device"] = "cpu"
    fedlap_cfg = validate({**raw, "strategy": "fedlap", "state-dir": "/tmp/privfed-bench-state"})
    fedavg_cfg = validate(drop_unread(raw, {"strategy": "fedavg", "privacy": "none",  # less the fedlap-* keys
                                            "local-epochs": args.fedavg_epochs, "momentum": 0.9}))

    from client.node import LocalClient
    from client.updates.fedlap import fedlap_update
    from client.updates.sgd import sgd_update
    from common.data import load_federation

    from common.data.errors import DataFileError

    try:
        federation = load_federation(fedlap_cfg)
    except DataFileError as err:  # the message says where the files go and how to fetch them
        raise SystemExit(f"fedlap_cost: {err}") from None
    torch.manual_seed(0)
    model = build_model(str(fedlap_cfg["model"]), federation.input_shape, federation.num_classes)
    arrays = model_to_arrays(model)
    model_bytes = arrays_nbytes(arrays)

    def once(cfg, rule):
        client = LocalClient(cfg, args.partition, run_id=int(time.time() * 1000) % 2**31)
        content = RecordDict({ARRAYS: arrays, CONFIG: ConfigRecord({"server-round": 1, "train-round": 1})})
        t0 = time.perf_counter()
        reply = rule(client, content, RecordDict())
        return time.perf_counter() - t0, recorddict_nbytes(reply)

    once(fedavg_cfg, sgd_update)  # untimed: the first training in a process pays torch's one-time start-up
    results = {}
    for name, cfg, rule in (("FedAvg", fedavg_cfg, sgd_update), ("FedLAP", fedlap_cfg, fedlap_update)):
        runs = [once(cfg, rule) for _ in range(args.repeats)]
        results[name] = (statistics.median(r[0] for r in runs), runs[0][1])

    print(f"model {fedlap_cfg['model']} ({num_parameters(model):,} weights, {model_bytes:,} bytes), dataset "
          f"{fedlap_cfg['dataset']}, partition {args.partition} of {fedlap_cfg['num-clients']} "
          f"({fedlap_cfg['classes-per-client']} classes each), CPU {args.threads} thread(s), "
          f"median of {args.repeats}")
    print(f"FedLAP: ipc {fedlap_cfg['fedlap-ipc']}, R_i {fedlap_cfg['fedlap-restarts']}, cap "
          f"{fedlap_cfg['fedlap-max-outer']}, N {fedlap_cfg['fedlap-real-batches']}, R_b "
          f"{fedlap_cfg['fedlap-image-steps']}, R_l {fedlap_cfg['fedlap-model-steps']}, privacy "
          f"{fedlap_cfg['privacy']}; FedAvg: {args.fedavg_epochs} local epoch(s), batch {fedavg_cfg['batch-size']}")
    print(f"{'rule':<8} {'client s/round':>15} {'uplink bytes':>13} {'uplink/model':>13}")
    for name, (secs, up) in results.items():
        print(f"{name:<8} {secs:>15.2f} {up:>13,} {up / model_bytes:>13.4f}")
    print(f"ratio FedLAP/FedAvg: client time {results['FedLAP'][0] / results['FedAvg'][0]:.2f}x, "
          f"uplink {results['FedLAP'][1] / results['FedAvg'][1]:.4f}x")
    s, m = paper_uplink()
    print(f"paper setting (50 ipc x 2 classes, 28x28x1 float32 + uint8 labels) vs ConvNet 317,706 float32: "
          f"{s:,} / {m:,} bytes = {s / m:.4f}x (+ 32 bytes of reply metrics)")
    (fedlap_s, fedlap_up), (fedavg_s, fedavg_up) = results["FedLAP"], results["FedAvg"]
    print(json.dumps({"benchmark": "fedlap_cost", "ipc": fedlap_cfg["fedlap-ipc"], "fedlap_s": round(fedlap_s, 3),
                      "fedavg_s": round(fedavg_s, 3), "time_ratio": round(fedlap_s / fedavg_s, 3),
                      "fedlap_uplink_bytes": fedlap_up, "fedavg_uplink_bytes": fedavg_up,
                      "uplink_ratio": round(fedlap_up / fedavg_up, 4), "paper_set_over_model": round(s / m, 4)}))


if __name__ == "__main__":
    main()
