"""The run config: one schema for every key, validated before any training.

Flower hands the ServerApp and each ClientApp `context.run_config`, a flat dict
of TOML scalars (the `[tool.flwr.app.config]` table of `pyproject.toml` with
the `--run-config` overrides applied). `validate` turns it into a complete,
checked `RunConfig`; anything unknown, mistyped or out of range raises
`ConfigError` naming the key and what is allowed.

`pyproject.toml` must list every key below with the same default (Flower only
accepts overrides of keys it already knows); `tests/test_config.py` checks it.
"""

from __future__ import annotations

import difflib
import math
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping

Scalar = bool | int | float | str
INT64_MAX = 2**63 - 1
NOISE_MAX = 1e6  # noise parameters: far above any use; dp-accounting's arithmetic overflows near 1e300


def clients_per_round(num_clients: int, fraction: float) -> int:
    """How many clients a round selects: max(floor(fraction * N), 1), as the Upcycled-FL code (9 of 30 at
    0.3). Every strategy samples this many (server/sampling.py); secure aggregation's codec is sized for it."""
    return max(math.floor(fraction * num_clients + 1e-9), 1)


class ConfigError(ValueError):
    """A run-config key is unknown, of the wrong type or out of range."""


@dataclass(frozen=True)
class Key:
    default: Scalar
    doc: str
    choices: tuple[Scalar, ...] | None = None
    low: float | None = None  # inclusive unless low_open
    high: float | None = None  # inclusive unless high_open
    low_open: bool = False
    high_open: bool = False

    @property
    def kind(self) -> type:
        return type(self.default)

    def allowed(self) -> str:
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        lo, hi = "(" if self.low_open else "[", ")" if self.high_open else "]"
        kind = {int: "an int", bool: "a bool", float: "a float", str: "a str"}[self.kind]
        if self.low is not None and self.high is not None:
            return f"{kind} in {lo}{self.low}, {self.high}{hi}"
        if self.low is not None:
            return f"{kind} {'>' if self.low_open else '>='} {self.low}"
        return kind


DATASETS = (
    "synthetic",  # generated FedProx Synthetic(alpha, beta): needs no files
    "syn-iid", "syn-0-0", "syn-0.5-0.5", "syn-1-1",  # released Upcycled-FL federations
    "mnist", "fashion-mnist", "cifar10", "adult",
)
DEFAULT_MODEL = {  # model = "auto"
    "synthetic": "logreg", "syn-iid": "logreg", "syn-0-0": "logreg", "syn-0.5-0.5": "logreg", "syn-1-1": "logreg",
    "mnist": "ali-mnist-cnn", "fashion-mnist": "ali-mnist-cnn", "cifar10": "ali-cifar-cnn", "adult": "adult-mlp",
}


def resolve_model_name(model: str, dataset: str) -> str:
    if model != "auto":
        return model
    if dataset not in DEFAULT_MODEL:  # a dataset added without its entry (docs/extending.md)
        raise ConfigError(f"model = \"auto\" has no default for dataset {dataset!r}: set model, or add "
                          "the dataset to DEFAULT_MODEL (common/config.py)")
    return DEFAULT_MODEL[dataset]


MODELS = ("auto", "logreg", "logreg-softmax", "femnist-mlp", "ali-mnist-cnn", "ali-cifar-cnn", "fedavg-cnn",
          "convnet", "adult-mlp", "convnet-w32")  # convnet-w32: FedLAP ConvNet at width 32 (CPU quick profiles)
STRATEGIES = ("fedavg", "fedavgm", "fedprox", "scaffold", "feddyn", "pfedme", "fedyogi", "dpfedavg-hu",
              "fedlap")
STRATEGIES += ("ali-dpfl",)  # ALI-DPFL
# what upcycled = true cannot wrap, and why (its bases key client draws on the training round)
NOT_UPCYCLED = {"fedlap": "its clients key their draws on the server round, so vanilla and Upcycled runs would "
                          "not share them",
                "ali-dpfl": "it plans tau* over R_s = num-rounds rounds that all train, and even rounds train none"}

SCHEMA: dict[str, Key] = {
    # run
    "run-name": Key("", "name of the results folder; empty: <strategy>-<dataset>-<timestamp>"),
    "seed": Key(0, "seed for data generation, client sampling and model init", low=0),
    "strategy": Key("fedavg", "server algorithm", choices=STRATEGIES),
    "num-rounds": Key(10, "number of FL rounds", low=1),
    "num-clients": Key(2, "number of clients (= SuperNodes = data partitions) the server waits for", low=1),
    "fraction-train": Key(1.0, "fraction of clients sampled each round", low=0.0, high=1.0, low_open=True),
    "node-wait-timeout": Key(120.0, "seconds to wait for num-clients nodes before failing", low=0.0, low_open=True),
    "round-timeout": Key(3600.0, "seconds to wait for the replies of one round", low=0.0, low_open=True),
    # data
    "dataset": Key("synthetic", "dataset", choices=DATASETS),
    "data-dir": Key("", "folder holding dataset files; empty: $PRIVFED_DATA_DIR, else ./data"),
    "partition": Key("iid", "how image/tabular data is split across clients "
                     "(syn-* and synthetic are always split by their own owner column)",
                     choices=("iid", "dirichlet", "classes")),
    "dirichlet-alpha": Key(0.5, "Dirichlet concentration for partition = dirichlet", low=0.0, low_open=True),
    "classes-per-client": Key(2, "labels per client for partition = classes", low=1),
    "synthetic-alpha": Key(0.5, "Synthetic(alpha, beta): model heterogeneity", low=0.0),
    "synthetic-beta": Key(0.5, "Synthetic(alpha, beta): data heterogeneity", low=0.0),
    "synthetic-iid": Key(False, "Synthetic(iid): one global model, same feature distribution"),
    "synthetic-dim": Key(60, "Synthetic feature dimension", low=1, high=100_000),
    "synthetic-classes": Key(10, "Synthetic number of classes", low=2, high=10_000),
    # model and local training
    "model": Key("auto", "model; auto picks the dataset's usual one", choices=MODELS),
    "local-epochs": Key(1, "local epochs per round", low=1),
    "batch-size": Key(32, "local minibatch size", low=1),
    "lr": Key(0.1, "local SGD learning rate", low=0.0, low_open=True),
    # below 1: at 1 the velocity is the undecayed sum of every gradient of the round
    "momentum": Key(0.0, "local SGD momentum (reset every round; ali-dpfl with the dp-secant mu estimator: "
                    "must be 0)", low=0.0, high=1.0, high_open=True),
    "device": Key("auto", "where clients train", choices=("auto", "cpu", "cuda", "mps")),
    "server-device": Key("auto", "where the server evaluates the global model (and trains it: FedLAP-DP)",
                         choices=("auto", "cpu", "cuda", "mps")),
    # Upcycled-FL and base algorithms
    "upcycled": Key(False, "Upcycled-FL: odd rounds run the base strategy; even rounds contact no client and set "
                    "w2m = w2m-1 + theta_m (w2m-1 - w2m-2) on the server"),
    "upcycled-theta": Key(0.3, "Upcycled-FL extrapolation coefficient theta = mu/(mu+lambda_m), constant over rounds "
                          "(the authors' --upcycled_param); used when upcycled-lambda = 0", low=0.0, high=1.0),
    "upcycled-mu": Key(0.5, "Upcycled-FL mu in theta_m = mu/(mu+lambda_m); used when upcycled-lambda > 0 (under "
                       "FedProx it must equal prox-mu: the paper's mu is the odd rounds' proximal one)", low=0.0),
    "upcycled-lambda": Key(0.0, "Upcycled-FL lambda: > 0 replaces upcycled-theta by theta_m = mu/(mu+lambda_m) with "
                           "lambda_m = lambda * m^growth (m: index of the even round 2m)", low=0.0),
    "upcycled-lambda-growth": Key(0.0, "exponent g of lambda_m = lambda * m^g; 0: constant, 0.5: theta_m = O(1/sqrt(m)), "
                                  "the increasing schedule of Corollary 5.8", low=0.0),
    "stragglers": Key(0.0, "probability that a sampled client straggles: it runs floor(U*E) local epochs "
                      "(U uniform, redrawn until >= 1) and is still aggregated; drawn from (seed, training round)",
                      low=0.0, high=1.0),
    "server-momentum": Key(0.3, "FedAvgM server momentum (server lr 1)", low=0.0, high=1.0, high_open=True),
    "server-nesterov": Key(True, "FedAvgM: Nesterov momentum as the Upcycled-FL code; false: Flower's heavy-ball"),
    "prox-mu": Key(0.5, "FedProx proximal coefficient mu (client adds mu/2 ||w - w_global||^2)", low=0.0),
    "scaffold-server-lr": Key(1.0, "SCAFFOLD global step size eta_g on the averaged model change", low=0.0, low_open=True),
    "feddyn-alpha": Key(0.01, "FedDyn regularisation alpha", low=0.0, low_open=True),
    "feddyn-max-grad-norm": Key(10.0, "FedDyn local gradient-norm clipping (0: none)", low=0.0),
    "pfedme-k": Key(5, "pFedMe inner steps K on the personalised model per minibatch", low=1),
    "pfedme-lambda": Key(15.0, "pFedMe lambda: pull of the personalised model towards the local model", low=0.0,
                         low_open=True),
    "pfedme-mu": Key(1e-3, "pFedMe L2 coefficient mu on the personalised model", low=0.0),
    "yogi-lr": Key(0.1, "FedYogi server learning rate eta", low=0.0, low_open=True),
    "yogi-tau": Key(1e-3, "FedYogi adaptivity tau", low=0.0, low_open=True),
    "yogi-beta1": Key(0.9, "FedYogi first-moment decay beta1", low=0.0, high=1.0, high_open=True),
    "yogi-beta2": Key(0.99, "FedYogi second-moment decay beta2", low=0.0, high=1.0, high_open=True),
    # secure aggregation and DP-FedAvg (Hu et al.)
    "secure-aggregation": Key(False, "mask every training reply with pairwise PRF masks (common/secagg, "
                              "server/secagg_grid.py): the server learns only the weighted average of the "
                              "selected clients' updates and their averaged metrics; only for strategies whose "
                              "aggregate is a weighted sum (SECAGG_STRATEGIES)"),
    "secagg-bits": Key(32, "secure aggregation: masked words live mod 2^bits; 32: uint32 on the wire (the bytes "
                       "of float32), 64: uint64 with a much finer fixed-point step", choices=(32, 64)),
    "secagg-clip": Key(1024.0, "secure aggregation: codec bound B (>= 1) on every encoded value: |w_i * (local - "
                       "global)| per coordinate, w_i itself (examples / largest enrolled examples, <= 1) and "
                       "|w_i * metric|; "
                       "a client with a value outside is dropped for the round, never wrapped", low=0.0,
                       low_open=True),
    "secagg-min-survivors": Key(2, "secure aggregation: fewest replies a round is decoded with (else the model "
                                "stays unchanged for that round)", low=2),
    "adult-split": Key("uci", "adult: 'uci' splits the UCI train file across clients by `partition` and tests "
                       "on the UCI test file; 'hu-devices' pools all 48,842 rows (missing values as all-zero "
                       "one-hot), deals 3052 to each of num-clients <= 16 devices, 80/10/10 train/val/test "
                       "per device (Hu et al.; common/data/adult_devices.py)", choices=("uci", "hu-devices")),
    "adult-eval": Key("test", "adult-split = hu-devices: the per-device split the server evaluates on "
                      "('val' for tuning)", choices=("test", "val")),
    "hu-local-steps": Key(10, "DP-FedAvg (Hu et al.) tau: local minibatch SGD steps per round "
                          "(batch-size = gamma, lr = eta)", low=1),
    "hu-clip": Key(1.0, "DP-FedAvg (Hu et al.) G: per-sample gradient L2 clipping bound; 0 (only with "
                   "hu-sigma = 0 and target-epsilon = 0): no clipping, the non-private baseline", low=0.0),
    "hu-sigma": Key(0.0, "DP-FedAvg (Hu et al.) sigma: std of the N(0, sigma^2 I) added to the averaged "
                    "clipped minibatch gradient at every local step; used when target-epsilon = 0 (else calibrated from target-epsilon and target-delta over the drawn participation schedule)", low=0.0,
                    high=NOISE_MAX),
    "hu-accountant": Key("conservative", "DP-FedAvg (Hu et al.) rho per participation: 'conservative' = "
                         "ceil(tau gamma / m) * 2 G^2 / (gamma^2 sigma^2), no secure-aggregation credit; "
                         "'paper' = Thm 1, 2 tau G^2 / (r m gamma sigma^2) with r only under secure "
                         "aggregation; 'paper-dsgd' = the DP-DSGD baseline formula 2 G^2 / (n gamma^2 sigma^2) "
                         "(tau = 1)", choices=("conservative", "paper", "paper-dsgd")),
    # FedLAP-DP (client/updates/fedlap.py, server/strategies/fedlap.py, common/fedlap/)
    "fedlap-ipc": Key(10, "FedLAP: synthetic images per class the client holds (|S_k| = ipc x its classes)", low=1),
    "fedlap-init": Key("noise", "FedLAP: initialise S_k from N(0,1) noise, or (non-DP only; reveals raw images "
                       "to the server) from real images", choices=("noise", "real")),
    "fedlap-reinit": Key(False, "FedLAP: re-initialise S_k every round (authors' non-DP code); false: carry "
                         "S_k over between rounds"),
    "fedlap-restarts": Key(1, "FedLAP R_i: trajectory restarts from the global model per round", low=1),
    "fedlap-max-outer": Key(5, "FedLAP: cap on while-loop iterations (||w - w_g|| < r) per restart", low=1),
    "fedlap-real-batches": Key(40, "FedLAP N: real batches per while-iteration (each one gradient access)", low=1),
    "fedlap-image-steps": Key(5, "FedLAP R_b: synthetic-image updates per real batch", low=1),
    "fedlap-model-steps": Key(0, "FedLAP R_l: model steps on S_k per while-iteration (full batch)", low=0),
    "fedlap-radius": Key(10.0, "FedLAP r: trust-region radius around the global model", low=0.0, low_open=True),
    "fedlap-image-lr": Key(100.0, "FedLAP tau: SGD learning rate of the synthetic images", low=0.0, low_open=True),
    "fedlap-image-momentum": Key(0.5, "FedLAP: SGD momentum of the synthetic images", low=0.0, high=1.0,
                                 high_open=True),
    "fedlap-mse-weight": Key(0.1, "FedLAP lambda: weight of the squared-L2 term of the matching distance", low=0.0),
    "fedlap-dsa": Key(True, "FedLAP: DSA augmentation (same seeded op on real and synthetic batches, local "
                      "model steps, calibration and server training)"),
    "fedlap-calibrate": Key(True, "FedLAP non-DP: calibrate r_k (distance at the real-loss minimum while "
                            "training on S_k, clipped to r); under DP r_k = r always"),
    "fedlap-calib-steps": Key(100, "FedLAP non-DP calibration: steps on S_k", low=1),
    "fedlap-calib-samples": Key(2048, "FedLAP non-DP calibration: real examples the loss is read on", low=1),
    "fedlap-server-radius": Key("min", "FedLAP: r_g from the clients' radii (fixed: no truncation); under DP "
                                "r_g = fedlap-radius unless fixed (Sec. 4.4: no data-dependent r)",
                                choices=("min", "max", "median", "fixed")),
    "fedlap-server-steps": Key(100, "FedLAP: most server SGD steps per round on the union of the sets", low=1),
    "fedlap-server-batch": Key(512, "FedLAP: per-set minibatch of the server steps (sets up to this size: "
                               "full batch)", low=1),
    "fedlap-lr-rounds": Key(0, "FedLAP: cosine learning-rate horizon E in rounds (0: num-rounds + 1, as the "
                            "authors' loop over rounds 1..E-1); the rate "
                            "`lr` decays over it for client model steps and server training", low=0),
    # privacy: DP-SGD, ledgers and budgets (common/privacy, client/privacy.py)
    "privacy": Key("none", "client-side DP mechanism: none, or dpsgd (Opacus DP-SGD: Poisson sampling, "
                   "per-sample clipping, Gaussian noise; counted in local-steps), or the Upcycled-FL private "
                   "variants output (clip the reply to output-clip, add N(0, output-noise-std^2 I)) and objective "
                   "(linear term <n, w>, density of n ~ exp(-objective-alpha ||n||))",
                   choices=("none", "dpsgd", "output", "objective")),
    # Upcycled-FL private variants (client/updates/perturbation.py; ledger: common/privacy/plan.py)
    "output-clip": Key(10.0, "output perturbation: clip norm tau of the released model (or update)", low=0.0,
                       low_open=True),
    "output-noise-std": Key(1.0, "output perturbation: std sigma of the N(0, sigma^2 I) added after clipping "
                            "(the std, not the variance; the authors' code used sigma^2 as the std)", low=0.0,
                            low_open=True, high=NOISE_MAX),
    "output-perturb": Key("model", "output perturbation: clip and noise the model (paper) or the update "
                          "w - w_global", choices=("model", "update")),
    "output-sensitivity": Key("ball", "output perturbation ledger: 'ball' = 2 tau (any two datasets: what the "
                              "clip guarantees; a much larger epsilon), 'paper' = tau/|D_i| (Thm 6.2, add/remove "
                              "one record, the paper's modelling assumption: its epsilon is reported as not a "
                              "guarantee)", choices=("ball", "paper")),
    "objective-alpha": Key(10.0, "objective perturbation: alpha of the noise density exp(-alpha ||n||) "
                           "(larger: less noise)", low=0.0, low_open=True),
    "objective-u1": Key(2.0, "objective perturbation, Thm 6.3 constant u1: bound on the norm of one record's "
                        "loss gradient (logreg, softmax cross-entropy with a bias, ||x|| <= 1: "
                        "sqrt(2) sqrt(1 + ||x||^2) <= 2); accounting only", low=0.0, low_open=True),
    "objective-u2": Key(1.0, "objective perturbation, Thm 6.3 constant u2: bound on the eigenvalues of one "
                        "record's loss Hessian (logreg, ||x|| <= 1: (1 + ||x||^2) / 2 <= 1); accounting only; "
                        "needs u2 <= 0.5 |D_i| mu", low=0.0),
    "local-steps": Key(0, "DP-SGD steps per round (privacy = dpsgd, which needs it > 0, except FedLAP and "
                       "ALI-DPFL, whose server sets them); every other local rule trains local-epochs and refuses "
                       "local-steps > 0", low=0),
    "dp-sample-rate": Key(0.01, "DP-SGD Poisson sampling rate q (expected batch q*|D|)", low=0.0, high=1.0,
                          low_open=True),
    "dp-clip": Key(1.0, "DP-SGD per-sample gradient L2 clipping norm C", low=0.0, low_open=True),
    "dp-noise-multiplier": Key(1.0, "DP-SGD noise multiplier sigma (noise std sigma*C on the summed gradient)",
                               low=0.0, high=NOISE_MAX),
    "dp-grad-sample-mode": Key("hooks", "DP-SGD clients (privacy = dpsgd): how Opacus gets the clipped "
                               "per-sample gradient sum, the same step either way; 'ghost' (ghost clipping) "
                               "is several times faster for models with large linear layers",
                               choices=("hooks", "functorch", "ew", "ghost")),  # = dpsgd.GRAD_SAMPLE_MODES
                               # (spelled out so that config does not import Opacus; a test keeps them equal)
    "dp-noise-seed": Key("secret", "seed of every private mechanism's randomness (DP noise, Poisson sampling, "
                         "Hu's batches): 'secret' = fresh OS randomness per client and round (runs are not "
                         "bit-reproducible); 'run-seed' = derived from `seed`, reproducible, but whoever knows "
                         "the run config (the server) can regenerate and subtract the noise: DP then holds "
                         "only against parties that do not know the run config", choices=("secret", "run-seed")),
    "target-epsilon": Key(0.0, "each client's privacy budget: it refuses training that would take its epsilon "
                          "past this (0: no budget; epsilon is still reported)", low=0.0),
    "target-delta": Key(1e-5, "delta of every epsilon reported and of the budget", low=0.0, high=1.0, low_open=True,
                        high_open=True),
    "accountant": Key("rdp", "accountant for budgets and reports (dp-accounting): rdp or pld; ali-eq12 = "
                      "ALI-DPFL's Eq. 12 (RDP, integer orders 2..63,128,256,512, classic conversion)",
                      choices=("rdp", "pld", "ali-eq12")),
    "state-dir": Key("", "where each node keeps its privacy ledger; empty: $PRIVFED_STATE_DIR, else "
                     "<results-dir>/node-state"),
    # deployment (server/polling_grid.py, server/checkpoint.py)
    "poll-interval": Key(0.1, "seconds between the ServerApp's polls for replies on Flower's grids "
                         "(server/polling_grid.py); 0: Flower's own send_and_receive (3 s ticks in deployment)",
                         low=0.0, high=60.0),
    "checkpoint": Key(False, "save the global model, the strategy's state and the privacy mirror after every "
                      "round; a later run with the same run-name resumes from it (needs run-name)"),
    "checkpoint-dir": Key("", "folder for checkpoints/<run-name>.ckpt.npz; empty: <results-dir>/checkpoints"),
    # ALI-DPFL (server/strategies/ali_dpfl.py, common/privacy/ali.py, server/ali_mu.py)
    "ali-gamma": Key(10.0, "ALI-DPFL Gamma (non-IIDness constant of Eq. 9): 10 for Dir(0.05), 5 Dir(0.5), "
                     "1 Dir(1), 0 IID", low=0.0),
    "ali-tau-init": Key(1, "ALI-DPFL tau* of the first round (and tau*_prev of its T)", low=1),
    "ali-tau-max": Key(100, "ALI-DPFL clamp: tau* in [1, ali-tau-max] (the authors' code: 100)", low=1),
    "ali-spend-budget": Key(True, "ALI-DPFL: raise tau to ceil((R_c - t) / rounds left) so runs with R_s < R_c "
                            "end with the budget spent (false: the paper's tau* only)"),
    "ali-mu-estimator": Key("dp-secant", "ALI-DPFL mu estimate: 'dp-secant' = post-processing of the aggregated "
                            "DP updates (no leak, server/ali_mu.py); 'paper' = true full-batch gradients of the "
                            "clients (leaks outside the accounting; logs a warning, and its epsilon is "
                            "reported as not a guarantee)",
                            choices=("dp-secant", "paper")),
    "ali-mu-ema": Key(0.5, "ALI-DPFL: mu = ema * mu_prev + (1 - ema) * estimate (0: the raw estimate)",
                      low=0.0, high=1.0),
    "ali-mu-min": Key(1e-3, "ALI-DPFL: mu estimates are clamped to [ali-mu-min, ali-mu-max]", low=0.0,
                      low_open=True),
    "ali-mu-max": Key(1e3, "ALI-DPFL: upper clamp of mu estimates", low=0.0, low_open=True),
    "eval-every": Key(1, "evaluate the global model every this many rounds (and always after the run's last "
                      "round); rows in between repeat the last accuracy/loss with evaluated = false", low=1),
    # results
    "results-dir": Key("results", "folder for results/<run-name>/; relative paths resolve "
                       "against the ServerApp process's working directory"),
}


class RunConfig(Mapping[str, Scalar]):
    """A validated, complete, read-only run config."""

    def __init__(self, values: Mapping[str, Scalar]):
        self._values = MappingProxyType(dict(values))

    def __getitem__(self, key: str) -> Scalar:
        if key not in self._values:
            raise KeyError(_unknown_key_message(key))
        return self._values[key]

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"RunConfig({dict(self._values)!r})"

    def replace(self, **changes: Scalar) -> "RunConfig":
        return validate({**self._values, **{k.replace("_", "-"): v for k, v in changes.items()}})


# The keys a run reads only in one mode (a strategy, a mechanism, a dataset): (prefix or key, the mode in
# words, whether a config is in it). Outside its mode such a key changes nothing, so validation refuses a
# value other than its default (the run would not be the one asked for), and a finished run or a checkpoint
# with another value of it is the same run.
_MODES: tuple[tuple[str, str, Callable[[Mapping[str, Any]], bool]], ...] = (
    ("server-momentum", "strategy = 'fedavgm'", lambda c: c.get("strategy") == "fedavgm"),
    ("server-nesterov", "strategy = 'fedavgm'", lambda c: c.get("strategy") == "fedavgm"),
    ("prox-mu", "strategy = 'fedprox'", lambda c: c.get("strategy") == "fedprox"),
    ("scaffold-", "strategy = 'scaffold'", lambda c: c.get("strategy") == "scaffold"),
    ("feddyn-", "strategy = 'feddyn'", lambda c: c.get("strategy") == "feddyn"),
    ("pfedme-", "strategy = 'pfedme'", lambda c: c.get("strategy") == "pfedme"),
    ("yogi-", "strategy = 'fedyogi'", lambda c: c.get("strategy") == "fedyogi"),
    ("hu-", "strategy = 'dpfedavg-hu'", lambda c: c.get("strategy") == "dpfedavg-hu"),
    ("fedlap-", "strategy = 'fedlap'", lambda c: c.get("strategy") == "fedlap"),
    ("ali-", "strategy = 'ali-dpfl'", lambda c: c.get("strategy") == "ali-dpfl"),
    ("upcycled-theta", "upcycled = true and upcycled-lambda = 0",
     lambda c: bool(c.get("upcycled")) and not c.get("upcycled-lambda")),
    *((k, "upcycled = true and upcycled-lambda > 0", lambda c: bool(c.get("upcycled")) and bool(c.get("upcycled-lambda")))
      for k in ("upcycled-mu", "upcycled-lambda-growth")),
    ("upcycled-", "upcycled = true", lambda c: bool(c.get("upcycled"))),
    ("secagg-", "secure-aggregation = true", lambda c: bool(c.get("secure-aggregation"))),
    ("output-", "privacy = 'output'", lambda c: c.get("privacy") == "output"),
    ("objective-", "privacy = 'objective'", lambda c: c.get("privacy") == "objective"),
    *((k, "privacy = 'dpsgd'", lambda c: c.get("privacy") == "dpsgd")
      for k in ("dp-sample-rate", "dp-clip", "dp-noise-multiplier", "dp-grad-sample-mode")),
    ("synthetic-", "dataset = 'synthetic'", lambda c: c.get("dataset") == "synthetic"),
    ("adult-split", "dataset = 'adult'", lambda c: c.get("dataset") == "adult"),
    ("adult-eval", "dataset = 'adult' and adult-split = 'hu-devices'",
     lambda c: c.get("dataset") == "adult" and c.get("adult-split") == "hu-devices"),
    ("dirichlet-alpha", "partition = 'dirichlet'", lambda c: c.get("partition") == "dirichlet"),
    ("classes-per-client", "partition = 'classes'", lambda c: c.get("partition") == "classes"),
    # FedLAP-DP runs its fedlap-* loops; ALI-DPFL's server sends every round's tau (its presets set
    # local-steps = 1 until session 19)
    ("local-steps", "privacy = 'dpsgd' and a strategy other than 'fedlap' and 'ali-dpfl' (whose server sends "
     "each round's tau)", lambda c: c.get("privacy") == "dpsgd" and c.get("strategy") not in ("fedlap", "ali-dpfl")),
)


def read_only_when(key: str) -> tuple[str, Callable[[Mapping[str, Any]], bool]] | None:
    return next(((why, when) for prefix, why, when in _MODES if key.startswith(prefix)), None)


def is_inert(key: str, config: Mapping[str, Any]) -> bool:
    mode = read_only_when(key)
    return mode is not None and not mode[1](config)


def drop_unread(base: Mapping[str, Any], given: Mapping[str, Any] = MappingProxyType({})) -> dict[str, Any]:
    """`base` overridden by `given`, less the keys of `base` that the result does not read: a preset's or a
    suite's shared keys apply where they are read (upcycled-theta once `upcycled = false` is given); a key
    in `given` stays, and validation refuses it if it is not read."""
    merged = {**base, **given}
    config = {**defaults(), **merged}
    return {k: v for k, v in merged.items() if k in given or not is_inert(k, config)}


def _unknown_key_message(key: str) -> str:
    close = difflib.get_close_matches(key, SCHEMA, n=3)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return f"unknown config key {key!r}.{hint} Known keys: {', '.join(sorted(SCHEMA))}"


def _check_value(key: str, spec: Key, value: Any) -> Scalar:
    kind = spec.kind
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            value, ok = float(value), True
        except OverflowError:  # a TOML int of hundreds of digits
            raise ConfigError(f"config key {key!r} must be a finite {spec.allowed()[2:]}; got an integer of "
                              f"{len(str(value))} digits") from None
    if not ok:
        raise ConfigError(
            f"config key {key!r} must be {spec.allowed()}; got {value!r} ({type(value).__name__})"
        )
    if kind is float and not math.isfinite(value):  # NaN passes every range check below
        raise ConfigError(f"config key {key!r} must be a finite {spec.allowed()[2:]}; got {value!r}")
    if kind is int and not -INT64_MAX <= value <= INT64_MAX:  # numpy, torch and the wire hold int64
        raise ConfigError(f"config key {key!r} must be {spec.allowed()} and fit in 64 bits; got {value!r}")
    if spec.choices is not None and value not in spec.choices:
        raise ConfigError(f"config key {key!r} must be {spec.allowed()}; got {value!r}")
    if spec.low is not None and (value <= spec.low if spec.low_open else value < spec.low):
        raise ConfigError(f"config key {key!r} must be {spec.allowed()}; got {value!r}")
    if spec.high is not None and (value >= spec.high if spec.high_open else value > spec.high):
        raise ConfigError(f"config key {key!r} must be {spec.allowed()}; got {value!r}")
    return value


def validate(raw: Mapping[str, Any]) -> RunConfig:
    """Check every key of `raw` and fill in defaults; raise ConfigError on the first problem."""
    unknown = [k for k in raw if k not in SCHEMA]
    if unknown:
        raise ConfigError(_unknown_key_message(unknown[0]))
    values = {key: _check_value(key, spec, raw.get(key, spec.default)) for key, spec in SCHEMA.items()}
    _check_combinations(values)
    return RunConfig(values)


# Every privacy mechanism (a `privacy` choice other than "none") is declared here, once; its code is
# registered in client/updates/__init__.py, whose `update_rule` reads these declarations and refuses what
# they do not allow (this module imports no torch, so the declarations live here).
# A mechanism that REPLACES the base rule (PRIVATE_RULES) trains on its own, so it lists the strategies
# whose local rule it implements: with any other strategy it would silently drop that strategy's local
# correction (FedDyn's, SCAFFOLD's, pFedMe's) while the server aggregates as if the clients had applied
# it. DP-SGD replaces plain SGD (the FedAvg family) and adds FedProx's proximal term; ALI-DPFL and FedLAP
# run DP-SGD inside their own rules.
DPSGD_STRATEGIES = ("fedavg", "fedavgm", "fedyogi", "fedprox", "ali-dpfl", "fedlap")
PRIVATE_RULE_STRATEGIES: dict[str, tuple[str, ...]] = {"dpsgd": DPSGD_STRATEGIES}
# A mechanism that WRAPS the base rule (PRIVATE_WRAPPERS) keeps every strategy's own rule; it protects
# only the model in the reply, so a base rule's reply holding any other record is refused on the node
# (client/updates/__init__.py refuse_unprotected); a strategy known to reply with one is refused below,
# before any charge (SCAFFOLD's control-delta, _check_upcycled_private).
PRIVATE_WRAPPER_MECHANISMS: tuple[str, ...] = ("output", "objective")


def _check_privacy_mechanism(v: Mapping[str, Scalar]) -> None:
    """The run's mechanism is declared, and (if it replaces the base rule) supports the run's strategy."""
    privacy, strategy = v["privacy"], v["strategy"]
    if privacy == "none" or privacy in PRIVATE_WRAPPER_MECHANISMS:
        return
    if privacy not in PRIVATE_RULE_STRATEGIES:
        raise ConfigError(f"privacy = {privacy!r} is not declared in common/config.py: list a mechanism that "
                          f"replaces the base rule in PRIVATE_RULE_STRATEGIES (with the strategies it supports), "
                          f"one that wraps it in PRIVATE_WRAPPER_MECHANISMS")
    supported = PRIVATE_RULE_STRATEGIES[privacy]
    if strategy not in supported:
        raise ConfigError(f"privacy = {privacy!r} replaces the local update rule and has no local rule of "
                          f"strategy {strategy!r} (its correction would be dropped); use one of "
                          f"{', '.join(supported)}")


RUN_NAME_MAX_BYTES = 200


def _check_run_name(name: str) -> None:
    """run-name names folders (results, and the nodes' ledgers and snapshots under their state directory):
    one path component, so that no run config can point them elsewhere."""
    if any(c in name for c in "/\\") or any(ord(c) < 32 for c in name) or name in (".", ".."):
        raise ConfigError(f"run-name must be a single folder name (no '/', '\\', control characters or '..'); "
                          f"got {name!r}")
    if len(name.encode()) > RUN_NAME_MAX_BYTES:  # file names end in suffixes such as "-s<seed>.ckpt.npz"
        raise ConfigError(f"run-name must be at most {RUN_NAME_MAX_BYTES} bytes (file names are limited to "
                          f"255); got {len(name.encode())}")


# the models that take images, and the image size each needs (None: any); the image datasets' sizes. Checked
# here, before anything starts: the nodes would build the model only at enrollment (common/models.py)
IMAGE_MODELS = {"ali-mnist-cnn": 28, "ali-cifar-cnn": 32, "fedavg-cnn": None, "convnet": None, "convnet-w32": None}
IMAGE_SIZES = {"mnist": 28, "fashion-mnist": 28, "cifar10": 32}


def _check_model_inputs(v: Mapping[str, Scalar]) -> None:
    model, dataset = resolve_model_name(str(v["model"]), str(v["dataset"])), str(v["dataset"])
    if model not in IMAGE_MODELS:
        return  # the flat models take any input
    size, needs = IMAGE_SIZES.get(dataset), IMAGE_MODELS[model]
    if size is None:
        raise ConfigError(f"model {model!r} takes images, and dataset {dataset!r} holds feature vectors: set model "
                          "(e.g. 'logreg', or \"auto\" for the dataset's usual one)")
    if needs is not None and needs != size:
        raise ConfigError(f"model {model!r} takes {needs}x{needs} images, and dataset {dataset!r} holds "
                          f"{size}x{size} ones: set model (e.g. \"auto\")")


def _check_combinations(v: Mapping[str, Scalar]) -> None:
    _check_run_name(str(v["run-name"]))
    _check_model_inputs(v)
    if v["dataset"].startswith("syn-") and v["num-clients"] != 30:
        raise ConfigError(
            f"dataset {v['dataset']!r} is a released federation of exactly 30 clients; "
            f"set num-clients = 30 (got {v['num-clients']})"
        )
    _check_secure_aggregation(v)
    _check_upcycled_private(v)  # Upcycled-FL private variants
    _check_fedlap(v)  # FedLAP-DP
    _check_accountant(v)
    if v["strategy"] == "ali-dpfl" and (v["privacy"] != "dpsgd" or v["target-epsilon"] <= 0):  # ALI-DPFL
        raise ConfigError("strategy 'ali-dpfl' plans DP-SGD iterations from the budget: set privacy = 'dpsgd' "
                          "and target-epsilon > 0 (local-steps is then set by the server every round)")
    if v["strategy"] == "ali-dpfl" and _ali_iteration_budget(v) == 0:
        raise ConfigError(f"target-epsilon = {v['target-epsilon']} allows no DP-SGD step at dp-sample-rate = "
                          f"{v['dp-sample-rate']}, dp-noise-multiplier = {v['dp-noise-multiplier']} and target-delta = "
                          f"{v['target-delta']} ({v['accountant']} accountant): raise target-epsilon or the noise")
    if v["strategy"] == "ali-dpfl" and v["fraction-train"] < 1:  # one tau for all: t must stay common
        raise ConfigError("strategy 'ali-dpfl' plans one tau per round from the clients' common step count t "
                          "(the paper: every client, every round); with fraction-train < 1 the clients' t "
                          "drift apart and the run stops when the first reaches R_c: set fraction-train = 1.0")
    if v["strategy"] == "ali-dpfl" and v["ali-mu-estimator"] == "dp-secant" and v["momentum"] != 0:
        raise ConfigError(f"strategy 'ali-dpfl' with ali-mu-estimator = 'dp-secant' cannot run with momentum = "
                          f"{v['momentum']}: the estimator subtracts the DP noise of plain SGD steps from the "
                          "secant (server/ali_mu.py), and momentum carries each step's noise into later steps, so "
                          "noise alone would read as curvature and give a spurious mu: set momentum = 0.0 (the "
                          "paper's plain SGD)")
    if v["strategy"] == "pfedme" and (step := v["lr"] * (v["pfedme-lambda"] + v["pfedme-mu"])) >= 2:
        raise ConfigError(f"strategy 'pfedme' with lr * (pfedme-lambda + pfedme-mu) = {step:g} >= 2: its personal "
                          "step theta <- theta (1 - lr (lambda + mu)) + lr (lambda w - g) then grows theta by "
                          "|1 - lr (lambda + mu)| >= 1 per inner step whatever the data, and the run diverges; "
                          "lower lr or pfedme-lambda (the authors: lr * lambda < 1)")
    if v["upcycled"] and v["strategy"] in NOT_UPCYCLED:
        raise ConfigError(f"strategy {v['strategy']!r} cannot run with upcycled = true: {NOT_UPCYCLED[v['strategy']]}")
    if v["upcycled"] and v["upcycled-lambda"] > 0 and v["upcycled-mu"] == 0:
        raise ConfigError("upcycled-lambda > 0 with upcycled-mu = 0 makes theta_m = mu/(mu+lambda_m) = 0 on every "
                          "even round: the Upcycled run would silently be the vanilla one with twice the rounds; "
                          "set upcycled-mu > 0 (Algorithm 1's mu), or upcycled-lambda = 0 and upcycled-theta")
    if v["upcycled"] and v["upcycled-lambda"] > 0 and v["strategy"] == "fedprox" \
            and v["upcycled-mu"] != v["prox-mu"]:
        raise ConfigError(f"upcycled-mu = {v['upcycled-mu']:g} under FedProx: the paper's mu in theta_m = "
                          f"mu/(mu+lambda_m) is the odd rounds' proximal mu; set upcycled-mu = prox-mu "
                          f"({v['prox-mu']:g})")
    _check_privacy_mechanism(v)  # declared, and (replacing the base rule) for the strategies it declares
    if v["privacy"] == "dpsgd" and v["local-steps"] == 0 and v["strategy"] not in ("fedlap", "ali-dpfl"):
        raise ConfigError("privacy = 'dpsgd' counts DP-SGD steps: set local-steps > 0 "
                          "(e.g. local-steps = ceil(epochs / dp-sample-rate) for about that many epochs)")
    _check_ignored_keys(v)
    _check_keys_outside_their_mode(v)
    if v["strategy"] == "fedlap" and v["fedlap-dsa"] and v["dataset"] not in IMAGE_SIZES:
        raise ConfigError(f"fedlap-dsa = true augments images, and dataset {v['dataset']!r} holds feature vectors: "
                          "set fedlap-dsa = false")
    if v["ali-tau-init"] > v["ali-tau-max"]:
        raise ConfigError(f"ali-tau-init = {v['ali-tau-init']} exceeds ali-tau-max = {v['ali-tau-max']}: every tau* "
                          "is clamped to ali-tau-max, the first round's too")
    if v["ali-mu-min"] > v["ali-mu-max"]:
        raise ConfigError(f"ali-mu-min = {v['ali-mu-min']} exceeds ali-mu-max = {v['ali-mu-max']}: every mu "
                          "estimate would be clamped to ali-mu-max")


def _ali_iteration_budget(v: Mapping[str, Scalar]) -> int:
    from common.privacy.plan import ali_iteration_budget  # imported late: it loads dp-accounting

    try:
        return ali_iteration_budget(v)
    except ValueError as err:  # epsilon stays below the target however many steps: no R_c
        raise ConfigError(f"strategy 'ali-dpfl' needs a finite step budget R_c: {err}; epsilon stays below "
                          f"target-epsilon = {v['target-epsilon']:g} however many steps run, so lower target-epsilon "
                          "(or let epsilon grow faster: a lower dp-noise-multiplier, a higher dp-sample-rate)") from None
    except ArithmeticError as err:  # a target near 1e200, a sigma near 1e-200: beyond the accountants' floats
        raise ConfigError(f"strategy 'ali-dpfl': target-epsilon = {v['target-epsilon']:g} with dp-noise-multiplier "
                          f"= {v['dp-noise-multiplier']:g} puts the step budget R_c beyond what the accountant can "
                          f"compute ({type(err).__name__}); use values of a real privacy budget") from None


def _check_keys_outside_their_mode(v: Mapping[str, Scalar]) -> None:
    for key, value in v.items():
        if value != SCHEMA[key].default and is_inert(key, v):
            raise ConfigError(f"{key} = {value!r} is read only with {read_only_when(key)[0]}, which this run "
                              f"does not have: it would be ignored; remove it, or set {key} = "
                              f"{SCHEMA[key].default!r}")


OWN_LOCAL_LOOPS = ("fedlap", "dpfedavg-hu")  # strategies whose local rule runs its own plain-SGD step counts


def _check_ignored_keys(v: Mapping[str, Scalar]) -> None:
    """Refuse a key that the run's local rule would silently ignore: the run would not be the one asked for."""
    dpsgd_steps = v["privacy"] == "dpsgd" and v["strategy"] != "fedlap"  # the rules that count DP-SGD steps
    own_counts = dpsgd_steps or v["strategy"] in OWN_LOCAL_LOOPS  # no rule of these reads epochs
    if v["stragglers"] > 0 and own_counts:
        raise ConfigError("stragglers shorten local-epochs, but DP-SGD clients run local-steps (and ALI-DPFL's, "
                          "FedLAP's and Hu et al.'s their own counts): set stragglers = 0")
    if v["local-epochs"] != 1 and own_counts:
        raise ConfigError(f"local-epochs = {v['local-epochs']} is not read by this run (privacy {v['privacy']!r}, "
                          f"strategy {v['strategy']!r}): DP-SGD runs local-steps, ALI-DPFL the server's tau, "
                          "FedLAP-DP its fedlap-* loop counts, Hu et al. hu-local-steps; set local-epochs = 1")
    if v["privacy"] == "dpsgd" and v["batch-size"] != SCHEMA["batch-size"].default:  # FedLAP-DP's real batches too
        raise ConfigError(f"batch-size = {v['batch-size']} is not read by DP-SGD: its lots are Poisson samples of "
                          f"expected size dp-sample-rate * |D_i| (the rate the accountant uses); set dp-sample-rate "
                          f"instead, and batch-size = {SCHEMA['batch-size'].default}")
    if v["momentum"] != 0 and v["strategy"] in OWN_LOCAL_LOOPS:
        raise ConfigError(f"momentum = {v['momentum']} is not read by strategy {v['strategy']!r} (its local steps "
                          "are plain SGD; FedLAP-DP's synthetic images have fedlap-image-momentum): set momentum = 0")
    if v["dataset"] == "adult" and v["adult-split"] == "hu-devices" and v["partition"] != "iid":
        raise ConfigError(f"adult-split = 'hu-devices' deals Hu et al.'s IID devices and ignores partition = "
                          f"{v['partition']!r}: set partition = 'iid', or adult-split = 'uci' for a label skew")
    if (v["dataset"] == "synthetic" or v["dataset"].startswith("syn-")) and v["partition"] != "iid":
        raise ConfigError(f"dataset = {v['dataset']!r} is split by its own generator (one owner per client) and "
                          f"ignores partition = {v['partition']!r}: set partition = 'iid' (the skew of Synthetic"
                          "(alpha, beta) is set by synthetic-alpha / synthetic-beta, or the syn-* file chosen)")
    if v["target-epsilon"] > 0 and v["privacy"] == "none" and v["strategy"] != "dpfedavg-hu":
        raise ConfigError(f"target-epsilon = {v['target-epsilon']} with privacy = 'none': a run without a "
                          "mechanism has no budget to enforce; set privacy (e.g. 'dpsgd') or target-epsilon = 0")


# accountants and noise ----------------------------------------------------------
# What each mechanism's ledger entries can be accounted by (common/privacy/ledger.py): DP-SGD and pure-DP
# entries by all; Gaussian releases (output perturbation) not by 'ali-eq12' (DP-SGD entries only); Hu's
# rho-zCDP entries only by 'rdp' (PLD has no loss distribution for a bare zCDP bound). Anything else
# passes validation and then crashes inside the clients' charge and the server's mirror.
def _check_accountant(v: Mapping[str, Scalar]) -> None:
    if v["strategy"] == "dpfedavg-hu" and v["accountant"] != "rdp":
        raise ConfigError(f"strategy 'dpfedavg-hu' records rho-zCDP entries, which only accountant = 'rdp' can "
                          f"compose (PLD has no privacy loss distribution for a zCDP bound; 'ali-eq12' covers "
                          f"DP-SGD entries only); got accountant = {v['accountant']!r}")
    if v["privacy"] == "output" and v["accountant"] == "ali-eq12":
        raise ConfigError("accountant = 'ali-eq12' covers DP-SGD entries only, not output perturbation's "
                          "Gaussian releases: use 'rdp' or 'pld'")
    if v["privacy"] == "dpsgd" and v["dp-noise-multiplier"] == 0:
        raise ConfigError("privacy = 'dpsgd' with dp-noise-multiplier = 0 adds no noise and has no finite "
                          "epsilon: set dp-noise-multiplier > 0 (or privacy = 'none' for a non-private run)")


# FedLAP-DP ---------------------------------------------------------------------
def _check_fedlap(v: Mapping[str, Scalar]) -> None:
    if v["strategy"] != "fedlap":
        return
    if v["privacy"] not in ("none", "dpsgd"):
        raise ConfigError(f"strategy 'fedlap' runs without DP or with privacy = 'dpsgd'; got {v['privacy']!r}")
    if v["privacy"] == "dpsgd" and v["fedlap-init"] == "real":
        raise ConfigError("fedlap-init = 'real' puts raw images into the reply: not allowed with privacy = "
                          "'dpsgd' (use 'noise')")


# Upcycled-FL private variants ---------------------------------------------------
def _check_upcycled_private(v: Mapping[str, Scalar]) -> None:
    if v["privacy"] == "output" and v["strategy"] == "scaffold":
        raise ConfigError("privacy = 'output' perturbs the model in the reply, but SCAFFOLD also sends its "
                          "control-variate change, an unperturbed function of the local data; use another base")
    if v["privacy"] == "objective" and (v["strategy"] != "fedprox" or v["prox-mu"] <= 0):
        raise ConfigError("privacy = 'objective' is accounted by Upcycled-FL Thm 6.3, which needs the "
                          "mu-strongly convex local objective F_i + mu/2 ||w - w_global||^2: set strategy = "
                          f"'fedprox' and prox-mu > 0 (got strategy {v['strategy']!r}, prox-mu {v['prox-mu']})")
    if v["privacy"] == "objective":  # Thm 6.3's epsilon is largest at |D_i| = 1: it must be a number
        worst = 2 * v["objective-alpha"] * v["objective-u1"] + 2.8 * v["objective-u2"] / v["prox-mu"]  # the
        if not math.isfinite(worst):  # accountant's arithmetic (upcycled_objective_epsilon) at |D_i| = 1
            raise ConfigError(f"objective-alpha = {v['objective-alpha']:g}, objective-u1 = {v['objective-u1']:g}, "
                              f"objective-u2 = {v['objective-u2']:g} and prox-mu = {v['prox-mu']:g} make Thm 6.3's "
                              f"per-release epsilon (2 alpha u1 mu + 2.8 u2) / (|D_i| mu) overflow")
    model = resolve_model_name(str(v["model"]), str(v["dataset"]))
    if v["privacy"] == "objective" and model != "logreg":
        raise ConfigError(f"privacy = 'objective' is accounted by Upcycled-FL Thm 6.3, which needs a convex GLM "
                          f"loss; model {model!r} is not convex: use model = 'logreg'")


# secure aggregation and DP-FedAvg (Hu et al.) ------------------------------------
# Strategies whose aggregate is a weighted sum of per-client terms: under
# secure aggregation the server learns only those sums (server/secagg_grid.py).
# Refused: anything that needs individual replies (FedLAP's synthetic sets,
# robust aggregators such as the median or Krum).
SECAGG_STRATEGIES = ("fedavg", "fedavgm", "fedprox", "scaffold", "feddyn", "pfedme", "fedyogi", "dpfedavg-hu",
                     "ali-dpfl")
HU_DEVICES, HU_DEVICE_SIZE = 16, 3052


def _check_secure_aggregation(v: Mapping[str, Scalar]) -> None:
    import math

    if v["adult-split"] == "hu-devices" and v["dataset"] == "adult" and v["num-clients"] > HU_DEVICES:
        raise ConfigError(f"adult-split = 'hu-devices' deals {HU_DEVICE_SIZE} rows to each of at most "
                          f"{HU_DEVICES} devices; got num-clients = {v['num-clients']}")
    if v["strategy"] == "dpfedavg-hu":
        if v.get("privacy", "none") != "none":
            raise ConfigError("strategy 'dpfedavg-hu' brings its own mechanism (noise at every local step, "
                              f"hu-* keys): set privacy = 'none' (got {v['privacy']!r})")
        if v["hu-clip"] == 0 and (v["hu-sigma"] > 0 or v["target-epsilon"] > 0):
            raise ConfigError("hu-clip = 0 (no clipping) is only the non-private baseline: it needs hu-sigma = 0 "
                              "and target-epsilon = 0 (noise without a clipping bound has no privacy guarantee)")
        if v["hu-accountant"] == "paper-dsgd" and v["hu-local-steps"] != 1:
            raise ConfigError("hu-accountant = 'paper-dsgd' is the DP-DSGD baseline's formula: it needs "
                              f"hu-local-steps = 1 (got {v['hu-local-steps']})")
    if not v["secure-aggregation"]:
        return
    if v["strategy"] not in SECAGG_STRATEGIES:
        raise ConfigError(
            f"secure-aggregation = true cannot run strategy {v['strategy']!r}: under secure aggregation the "
            f"server sees only the weighted sum of the clients' replies, and {v['strategy']!r} needs the "
            f"individual replies. Strategies that work with it: {', '.join(SECAGG_STRATEGIES)}"
        )
    if v["strategy"] == "ali-dpfl" and v["ali-mu-estimator"] == "paper":
        raise ConfigError("secure-aggregation = true cannot run ali-mu-estimator = 'paper': it reads each client's "
                          "model and gradient difference; the default 'dp-secant' needs only the aggregate")
    per_round = clients_per_round(v["num-clients"], v["fraction-train"])
    if per_round < v["secagg-min-survivors"]:
        raise ConfigError(
            f"secure-aggregation = true needs at least secagg-min-survivors = {v['secagg-min-survivors']} "
            f"clients per round (a sum of one client is that client's update); fraction-train = "
            f"{v['fraction-train']} of num-clients = {v['num-clients']} samples {per_round}"
        )
    if v["secagg-min-survivors"] > v["num-clients"]:
        raise ConfigError(f"secagg-min-survivors = {v['secagg-min-survivors']} exceeds num-clients = "
                          f"{v['num-clients']}")
    if v["secagg-clip"] < 1:
        raise ConfigError(f"secagg-clip = {v['secagg-clip']} is below 1: each client's weight w_i (examples / "
                          "largest enrolled examples, up to 1) is encoded under the same bound, so the largest "
                          "client could never reply; set secagg-clip >= 1")
    limit = (1 << (v["secagg-bits"] - 1)) - 1
    if per_round * round(v["secagg-clip"]) > limit:
        raise ConfigError(
            f"secagg-clip = {v['secagg-clip']} with {per_round} clients per round leaves no headroom in "
            f"{v['secagg-bits']}-bit words (clients per round * clip must stay below 2^{v['secagg-bits'] - 1}); "
            "lower secagg-clip or use secagg-bits = 64"
        )


def defaults() -> dict[str, Scalar]:
    return {key: spec.default for key, spec in SCHEMA.items()}


def load_preset(path: str | os.PathLike) -> dict[str, Scalar]:
    """Read a preset TOML file (flat `key = value` overrides) and validate its keys."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"preset file not found: {path}")
    try:
        with path.open("rb") as fh:
            raw = tomllib.load(fh)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"preset {path} is not valid TOML ({err})") from None
    validate(raw)  # fail early, naming the bad key
    return raw


def resolve_data_dir(config: Mapping[str, Scalar]) -> Path:
    """Where dataset files are read from, resolved in the process that reads them.

    `data-dir` if set, else `$PRIVFED_DATA_DIR`, else `./data`; relative paths
    resolve against this process's working directory (under `flwr run`: the
    SuperLink's or SuperNode's, not the shell's; pass an absolute path there).
    """
    chosen = str(config["data-dir"]) or os.environ.get("PRIVFED_DATA_DIR", "") or "data"
    return Path(chosen).expanduser().resolve()
