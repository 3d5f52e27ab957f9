"""Privacy events: what a client records in its ledger, one entry per release.

An entry is plain data (kind, round, params, meta) so that it survives a JSON
round trip exactly; `to_dp_event` turns it into the dp-accounting event an
accountant composes. The kinds:

| kind              | mechanism                                   | dp-accounting event                                   |
|-------------------|---------------------------------------------|-------------------------------------------------------|
| `dpsgd`           | `steps` Poisson-sampled Gaussian steps      | `SelfComposed(PoissonSampled(q, Gaussian(sigma)), T)` |
| `gaussian`        | a Gaussian release (output perturbation)    | `SelfComposed(Gaussian(std / sensitivity), count)`    |
| `zcdp`            | a release with a rho-zCDP guarantee          | `ZCDpEvent(rho)`                                      |
| `pure`            | a pure epsilon-DP release (objective pert.) | none: composed on its own line (see `ledger.py`)      |
| `post-processing` | anything computed from released outputs     | `NoOpDpEvent()`: costs nothing, shown in the ledger   |

Neighbouring relations (`params["relation"]`) -- every guarantee is record-level
and per client (one record of this client's local dataset D_i):

- `add-remove`: D' = D with one record added or removed. Poisson-sampled DP-SGD
  is accounted under this relation (Mironov et al. 2019; Opacus, dp-accounting).
  Its step divides by the expected batch q|D_i|, and each client reports |D_i|
  (enrollment, `num-examples`) for FedAvg's weights: |D_i| is treated as public,
  as in the federated DP literature; under add/remove its exact release is not
  itself covered by the epsilon. The Upcycled-FL output-perturbation sensitivity tau/|D_i| of the paper's
  Theorem 6.2 is read under it too, with |D_i| public (see
  `output_perturbation_release`).
- `replace-one`: D' = D with one record replaced (Hu et al. 2021, Def. 1, whose
  per-step sensitivity is 2G/gamma).
- `any`: the bound holds for any pair of datasets (e.g. sensitivity = the
  diameter 2*tau of the ball all clipped outputs lie in).

A Gaussian or zCDP event's noise multiplier / rho already contains the
sensitivity under the entry's relation, so the accountants treat them alike; the
relation is recorded so that a report can say what the epsilon protects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import dp_accounting as dpa

KINDS = ("dpsgd", "gaussian", "zcdp", "pure", "post-processing")
RELATIONS = ("add-remove", "replace-one", "any")


@dataclass(frozen=True)
class LedgerEntry:
    """One recorded release: `kind` (see KINDS), the FL `round` it happened in
    (None when not tied to a round), numeric `params` that define its privacy
    cost, and free-form JSON-able `meta` (labels, notes) that does not."""

    kind: str
    params: dict[str, Any]
    round: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown ledger entry kind {self.kind!r}; known: {', '.join(KINDS)}")
        relation = self.params.get("relation")
        if relation is not None and relation not in RELATIONS:
            raise ValueError(f"unknown neighbouring relation {relation!r}; known: {', '.join(RELATIONS)}")
        if problem := _params_problem(self.kind, self.params):  # e.g. a ledger file edited or damaged
            raise ValueError(f"a {self.kind} entry {problem}")

    # -- JSON -----------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "round": self.round, "params": dict(self.params), "meta": dict(self.meta)}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "LedgerEntry":
        return cls(kind=obj["kind"], params=dict(obj["params"]), round=obj.get("round"), meta=dict(obj.get("meta", {})))

    # -- accounting -------------------------------------------------------------
    @property
    def is_pure(self) -> bool:
        """Pure epsilon-DP entries are kept out of the RDP/PLD composition."""
        return self.kind == "pure"

    @property
    def is_post_processing(self) -> bool:
        return self.kind == "post-processing"

    def to_dp_event(self) -> dpa.DpEvent:
        """The dp-accounting event of this entry (pure entries have none)."""
        p = self.params
        if self.kind == "dpsgd":
            step = dpa.PoissonSampledDpEvent(p["sample_rate"], dpa.GaussianDpEvent(p["noise_multiplier"]))
            return dpa.SelfComposedDpEvent(step, int(p["steps"]))
        if self.kind == "gaussian":
            return dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(p["noise_multiplier"]), int(p.get("count", 1)))
        if self.kind == "zcdp":
            return dpa.ZCDpEvent(p["rho"])
        if self.kind == "post-processing":
            return dpa.NoOpDpEvent()
        raise ValueError(
            "a pure epsilon-DP entry has no dp-accounting event: the ledger composes it on its own line"
        )

    def describe(self) -> str:
        """One human-readable line."""
        p = self.params
        where = f"round {self.round}: " if self.round is not None else ""
        label = self.meta.get("mechanism", self.kind)
        if self.kind == "dpsgd":
            what = f"{p['steps']} DP-SGD steps (q={p['sample_rate']:g}, sigma={p['noise_multiplier']:g})"
        elif self.kind == "gaussian":
            what = f"{label}: Gaussian x{p.get('count', 1)} (noise multiplier {p['noise_multiplier']:g})"
        elif self.kind == "zcdp":
            what = f"{label}: {p['rho']:g}-zCDP"
        elif self.kind == "pure":
            what = f"{label}: pure {p['epsilon']:g}-DP"
        else:
            what = f"post-processing ({self.meta.get('note', 'no data access')}): no privacy cost"
        return where + what


# Python's int and float only (not common.number_checks'): the ledger writes params as JSON, which refuses NumPy's
# integers and float32 (a float64 is a float).
def _is_count(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _is_positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf


# each kind's params that set its cost, and what they must be: the constructors below only make valid ones,
# and an entry read back from a file must be one of them (a NaN sigma, negative steps or a negative epsilon
# would compose to epsilon 0 or less: a false guarantee)
_PARAM_CHECKS: dict[str, dict[str, tuple[str, Any]]] = {
    "dpsgd": {"sample_rate": ("in (0, 1]", lambda v: _is_positive(v) and v <= 1),
              "noise_multiplier": ("a positive finite number", _is_positive),
              "steps": ("an integer >= 0", lambda v: _is_count(v, 0))},
    "gaussian": {"noise_multiplier": ("a positive finite number", _is_positive),
                 "count": ("an integer >= 1", lambda v: _is_count(v, 1))},
    "zcdp": {"rho": ("a positive finite number", _is_positive)},
    "pure": {"epsilon": ("a positive finite number", _is_positive)},
    "post-processing": {},
}
_DEFAULT_PARAMS = {"count": 1}  # a gaussian entry without it is one release


def _params_problem(kind: str, params: dict[str, Any]) -> str | None:
    for name, (what, ok) in _PARAM_CHECKS[kind].items():
        value = params.get(name, _DEFAULT_PARAMS.get(name))
        if not ok(value):
            return f"needs {name} {what}; got {value!r}"
    return None


def _positive(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number; got {value}")
    return value


def _round(round: int | None) -> int | None:  # noqa: A002 - mirrors the field name
    return None if round is None else int(round)


def dpsgd_steps(sample_rate: float, noise_multiplier: float, steps: int, *, round: int | None = None, **meta: Any) -> LedgerEntry:  # noqa: A002
    """`steps` DP-SGD steps, each one Poisson-sampled Gaussian mechanism:
    records included independently with probability `sample_rate`, per-sample
    gradients clipped to C, noise N(0, (noise_multiplier*C)^2 I) on the sum.
    Relation: add/remove one record."""
    q = float(sample_rate)
    if not 0 < q <= 1:
        raise ValueError(f"sample_rate must be in (0, 1]; got {q}")
    if int(steps) != steps or steps < 0:
        raise ValueError(f"steps must be a non-negative integer; got {steps}")
    params = {"sample_rate": q, "noise_multiplier": _positive("noise_multiplier", noise_multiplier),
              "steps": int(steps), "relation": "add-remove"}
    return LedgerEntry("dpsgd", params, _round(round), dict(meta))


def gaussian_release(noise_std: float, sensitivity: float, *, count: int = 1, relation: str = "add-remove",
                     round: int | None = None, **meta: Any) -> LedgerEntry:  # noqa: A002
    """`count` releases of f(D) + N(0, noise_std^2 I) where ||f(D) - f(D')||_2 <=
    `sensitivity` for neighbours under `relation`; noise multiplier std/sensitivity."""
    std = _positive("noise_std", noise_std)
    sens = _positive("sensitivity", sensitivity)
    if int(count) != count or count < 1:
        raise ValueError(f"count must be a positive integer; got {count}")
    params = {"noise_multiplier": std / sens, "noise_std": std, "sensitivity": sens, "count": int(count),
              "relation": relation}
    return LedgerEntry("gaussian", params, _round(round), dict(meta))


OUTPUT_SENSITIVITY_RULES = ("paper", "ball")
# `params["assumption"]`: a condition the entry's bound needs that this run does not enforce (the paper's
# formula applied as the paper applies it). Reports print it: such an epsilon is not a guarantee.
THM62_ASSUMPTION = ("Upcycled-FL Thm 6.2's sensitivity tau/|D_i| (the clipped model modelled as an average of "
                    "per-record terms; clipping does not enforce it: output-sensitivity = 'ball' does)")
THM63_ASSUMPTION = ("Upcycled-FL Thm 6.3's conditions (||x|| <= 1, one record's loss gradient norm < u1 and "
                    "Hessian eigenvalues <= u2, a GLM whose Hessian difference has rank <= 2 (a C-class softmax: up "
                    "to 2(C-1)), the exact minimiser), which privfed does not verify on the data or the training")
FEDLAP_LABELS_ASSUMPTION = ("FedLAP-DP's public label sets (the paper's assumption: the server knows each client's "
                            "classes); the classes a client holds are released with its synthetic set, outside this "
                            "accounting")
ALI_PAPER_MU_ASSUMPTION = ("that the ALI-DPFL paper mu estimator's releases are public: each client's gradient-"
                           "difference norm, computed without clipping or noise, is released outside this accounting")


def output_perturbation_sensitivity(clip_norm: float, dataset_size: int, rule: str = "paper") -> tuple[float, str]:
    """L2 sensitivity of a model (or update) clipped to norm `clip_norm`, and its relation.

    - `paper` (Upcycled-FL Thm 6.2): tau/|D_i|, add/remove one record with |D_i|
      public. The proof models the clipped model as (1/|D_i|) sum_d eta(d) with
      ||eta(d)|| <= tau; a trained model is not such an average, so this is the
      paper's assumption, not a property of the mechanism.
    - `ball`: 2*tau, the diameter of the ball every clipped output lies in; holds
      for any pair of datasets (honest, and far more expensive).
    """
    tau = _positive("clip_norm", clip_norm)
    if rule == "paper":
        n = int(dataset_size)
        if n <= 0:
            raise ValueError(f"dataset_size must be positive; got {dataset_size}")
        return tau / n, "add-remove"
    if rule == "ball":
        return 2.0 * tau, "any"
    raise ValueError(f"unknown sensitivity rule {rule!r}; known: {', '.join(OUTPUT_SENSITIVITY_RULES)}")


def output_perturbation_release(clip_norm: float, noise_std: float, dataset_size: int, *, rule: str = "paper",
                                round: int | None = None, **meta: Any) -> LedgerEntry:  # noqa: A002
    """Upcycled-FL output perturbation: clip to `clip_norm` (tau), add N(0, noise_std^2 I).
    A Gaussian event with the sensitivity of `output_perturbation_sensitivity(rule)`."""
    sens, relation = output_perturbation_sensitivity(clip_norm, dataset_size, rule)
    entry = gaussian_release(noise_std, sens, relation=relation, round=round,
                             mechanism="output-perturbation", **meta)
    params = dict(entry.params, clip_norm=float(clip_norm), dataset_size=int(dataset_size), rule=rule)
    if rule == "paper":
        params["assumption"] = THM62_ASSUMPTION
    return LedgerEntry("gaussian", params, entry.round, entry.meta)


def zcdp_release(rho: float, *, relation: str = "replace-one", round: int | None = None, **meta: Any) -> LedgerEntry:  # noqa: A002
    """A release satisfying rho-zCDP (Bun & Steinke 2016). Default relation:
    replace one record, as in Hu et al. 2021 (Def. 1)."""
    params = {"rho": _positive("rho", rho), "relation": relation}
    return LedgerEntry("zcdp", params, _round(round), dict(meta))


def pure_dp_release(epsilon: float, *, relation: str = "replace-one", round: int | None = None, **meta: Any) -> LedgerEntry:  # noqa: A002
    """A release satisfying pure epsilon-DP (delta = 0)."""
    params = {"epsilon": _positive("epsilon", epsilon), "relation": relation}
    return LedgerEntry("pure", params, _round(round), dict(meta))


def objective_perturbation_release(alpha: float, u1: float, u2: float, mu: float, dataset_size: int, *,
                                   round: int | None = None, **meta: Any) -> LedgerEntry:  # noqa: A002
    """Upcycled-FL objective perturbation (Thm 6.3): one release is pure
    (2*alpha*u1*mu + 2.8*u2) / (|D_i| mu)-DP under the theorem's assumptions (GLM
    loss, ||grad|| < u1, |F''| <= u2, ||x|| <= 1, u2 <= 0.5 |D_i| mu). The
    theorem's neighbours differ in one record (replace one)."""
    from common.privacy.accounting import upcycled_objective_epsilon

    eps = upcycled_objective_epsilon([alpha], u1, u2, mu, dataset_size)
    entry = pure_dp_release(eps, relation="replace-one", round=round, mechanism="objective-perturbation", **meta)
    params = dict(entry.params, alpha=float(alpha), u1=float(u1), u2=float(u2), mu=float(mu),
                  dataset_size=int(dataset_size), assumption=THM63_ASSUMPTION)
    return LedgerEntry("pure", params, entry.round, entry.meta)


def post_processing(*, round: int | None = None, note: str = "", **meta: Any) -> LedgerEntry:  # noqa: A002
    """A step that touches no private data beyond what the ledger already charged (FedLAP-DP's synthesis
    and local steps on the synthetic set): recorded so the ledger shows it, at zero cost (Dwork & Roth,
    Prop. 2.1)."""
    m = dict(meta)
    if note:
        m["note"] = note
    return LedgerEntry("post-processing", {}, _round(round), m)
