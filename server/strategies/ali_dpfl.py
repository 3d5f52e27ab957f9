"""ALI-DPFL (Ling et al.): DP-FedAvg whose number of local DP-SGD iterations
tau* is planned by the server every round (Eq. 9) and broadcast with the model.

Per round k (1-based), with t_i = DP-SGD steps client i has run so far:
1. tau_k = `plan_round` (common/privacy/ali.py): 1 when R_s >= R_c (Lemma 1);
   else the current tau* (the first round: `ali-tau-init`), raised with
   `ali-spend-budget` to ceil((R_c - t_i) / rounds left), capped at R_c - t_i.
   The t_i are equal unless a fault made them differ (a lost round only some
   charged, a node secure aggregation left out); each client is planned from
   its own. tau_k goes out as the instruction's `local-steps`: the client runs
   exactly that many DP-SGD steps and charges its ledger for them
   (client/updates/dpsgd.py).
2. Aggregate (FedAvg, weights |D_i|), then estimate mu (server/ali_mu.py) and
   compute tau* for the next round by Eq. 9 with T = min(R_s * tau*_prev, R_c),
   d = number of model parameters, B-hat = max(1, min_i q |D_i|); round half up,
   clamp to [1, ali-tau-max].
3. A client whose t_i reaches R_c is retired; the runner ends the run when none
   is left (no client can train within its budget). num-rounds = R_s bounds the rounds.

R_c comes from the same accountant the client ledgers enforce (`accountant`;
`ali-eq12` is the paper's), by exact search: the plan never asks for a step the
ledger would refuse, and eps(R_c) <= target < eps(R_c + 1).
"""

from __future__ import annotations

import math
from typing import Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg

from client.privacy import BUDGET_EXHAUSTED
from common.number_checks import is_real
from common.privacy import ali
from common.privacy.plan import ali_iteration_budget
from common.records import ARRAYS, CONFIG, METRICS, arrays_to_vector
from server.ali_mu import GRAD_DIFF_METRIC, PAPER_WARNING, SecantMu, paper_mu
from server.roster import Roster
from server.strategies.fedavg import FedAvg


class AliDpfl(FedAvg):
    def __init__(self, roster: Roster, seed: int, fraction_train: float, log=print, *, config):
        super().__init__(roster, seed, fraction_train, log)
        if config["privacy"] != "dpsgd":
            raise ValueError("strategy 'ali-dpfl' plans DP-SGD iterations: set privacy = 'dpsgd'")
        self.q, self.sigma = float(config["dp-sample-rate"]), float(config["dp-noise-multiplier"])
        self.clip, self.lr = float(config["dp-clip"]), float(config["lr"])
        self.gamma = float(config["ali-gamma"])
        self.tau_max = int(config["ali-tau-max"])
        self.spend_budget = bool(config["ali-spend-budget"])
        self.estimator = str(config["ali-mu-estimator"])
        self.mu_ema = float(config["ali-mu-ema"])
        self.mu_min, self.mu_max = float(config["ali-mu-min"]), float(config["ali-mu-max"])
        self.rounds = int(config["num-rounds"])  # R_s
        target = float(config["target-epsilon"])
        if not target > 0:
            raise ValueError("strategy 'ali-dpfl' needs a privacy budget: set target-epsilon > 0")
        self.rc = ali_iteration_budget(config)  # R_c, as every node computes it to bound local-steps
        if self.rc <= 0:
            raise ValueError(f"target-epsilon {target} allows no DP-SGD step at q={self.q}, sigma={self.sigma}")
        self.b_hat = ali.batch_estimate(self.q, roster.num_examples.values())
        self.condition = "I (R_s >= R_c: tau = 1)" if self.rounds >= self.rc else "II (R_s < R_c: tau* by Eq. 9)"
        # Lemma 1: tau* = 1 throughout when R_s >= R_c; the first tau* is clamped like every later one
        self.tau_star = 1 if self.rounds >= self.rc else min(int(config["ali-tau-init"]), self.tau_max)
        self.steps = {p: 0 for p in roster.partitions}  # t per client (= its ledger's steps)
        self.mu: float | None = None
        self.num_params: int | None = None
        self._tau = 0  # the round's largest tau (its row's ali_tau)
        self._taus: dict[int, int] = {}  # partition -> the tau it was instructed this round
        self._w_start = None
        self._row: dict = {}
        self.history: list[dict] = []
        self.secant = SecantMu(self.lr, self.q, self.clip, self.sigma, roster.num_examples)
        log(f"ALI-DPFL: R_c = {self.rc} DP-SGD steps per client ({config['accountant']}, exact search), "
            f"R_s = {self.rounds} rounds, condition {self.condition}; B-hat = {self.b_hat:.3f}, "
            f"Gamma = {self.gamma}, C = {self.clip}, mu estimator {self.estimator}")
        if self.estimator == "paper":
            log("WARNING: " + PAPER_WARNING)

    # -- planning ---------------------------------------------------------------------------
    def round_config(self, server_round: int, config: ConfigRecord) -> ConfigRecord:
        out = super().round_config(server_round, config)
        out["local-steps"] = self._tau
        return out

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        if self.num_params is None:
            self.num_params = sum(a.numpy().size for a in arrays.values())
        # one tau* for all, each client's cap and budget floor from its own t: they differ only after a fault
        # (a lost round some charged, a node secure aggregation left out). A client behind the others also
        # runs the steps it is behind, so the cohort ends together (else it would be left to finish its
        # budget alone, its update alone the global model; under secure aggregation, not at all)
        active = self.active_partitions()
        ahead = max((self.steps[p] for p in active), default=0)
        plan = {p: ali.plan_round(self.tau_star, self.steps[p], server_round, self.rounds, self.rc,
                                  self.spend_budget, behind=ahead - self.steps[p]) for p in active}
        for p in [p for p, tau in plan.items() if tau == 0]:
            self.retire(p)
        self._tau = max(plan.values(), default=0)
        self._row = {"ali_tau": self._tau, "ali_rc": self.rc}
        self._taus = {}
        if self._tau == 0:  # every active partition was retired above
            return []
        self._w_start = arrays_to_vector(arrays)
        messages = list(super().configure_train(server_round, arrays, config, grid))
        for m in messages:
            p = self._partition_of[m.metadata.dst_node_id]
            self._taus[p] = plan[p]
            if plan[p] != self._tau:
                m.content[CONFIG] = ConfigRecord({**m.content[CONFIG], "local-steps": plan[p]})
            self.steps[p] += plan[p]
        return messages

    def not_sent(self, partitions: list[int]) -> None:
        """These instructed partitions ran and charged nothing this round: the runner's call when secure
        aggregation left them out (not enrolled, excluded, too few usable nodes), and budget refusals."""
        for p in partitions:
            self.steps[p] -= self._taus.pop(p, 0)
        if self._taus:  # the row's tau is one a client ran (a round no instruction left keeps its plan)
            self._row["ali_tau"] = max(self._taus.values())

    # -- aggregation and the next tau* ------------------------------------------------------
    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        # read before screening: the screen drops a metric from every reply when one reply lacks it
        grad_diffs = _grad_diffs(replies) if self.estimator == "paper" else {}
        self.not_sent([self._partition_of[r.metadata.src_node_id] for r in replies  # the runner retires them
                       if r.has_error() and r.error.code == BUDGET_EXHAUSTED
                       and r.metadata.src_node_id in self._partition_of])
        good = self.screened(replies)
        arrays, metrics = FlowerFedAvg.aggregate_train(self, server_round, good)
        raw = None
        if arrays is not None and good:
            raw = self._estimate_mu(arrays, good, grad_diffs)
        if raw is not None and math.isfinite(raw):  # min/max would pass NaN through to Eq. 9
            clamped = min(max(raw, self.mu_min), self.mu_max)
            self.mu = clamped if self.mu is None else self.mu_ema * self.mu + (1 - self.mu_ema) * clamped
        horizon = ali.horizon(self.rounds, self.tau_star, self.rc)
        eq9 = None
        if self.rounds < self.rc and self.mu is not None:
            eq9 = ali.optimal_tau(self.mu, self.clip, self.gamma, horizon, self.sigma, self.num_params, self.b_hat)
            self.tau_star = ali.round_tau(eq9, self.tau_max)
        t = max(self.steps.values(), default=0)
        self._row.update(ali_mu_raw=raw, ali_mu=self.mu, ali_T=horizon, ali_eq9=eq9, ali_tau_next=self.tau_star,
                         ali_steps=t)
        self.history.append({"round": server_round, **self._row})
        self.log(f"ALI-DPFL round {server_round}: tau {self._tau}, t {t}/{self.rc}, mu_raw "
                 f"{_fmt(raw)}, mu {_fmt(self.mu)}, T {horizon}, Eq.9 {_fmt(eq9)} -> tau* {self.tau_star}")
        spent = [p for p in self.active_partitions() if self.steps[p] >= self.rc]
        for p in spent:
            self.retire(p)
        if spent and not self.active_partitions():
            self.log(f"ALI-DPFL: R_c = {self.rc} iterations reached by every client after round {server_round}; "
                     "stopping")
        return arrays, metrics

    def _estimate_mu(self, arrays: ArrayRecord, good: list[Message], grad_diffs: dict[int, float]) -> float | None:
        # the enrolled sizes, not the replies' counts: under secure aggregation each reply stands for the
        # survivors' sum and says num-examples = 1, while the aggregate is still weighted by |D_i|
        partitions = [self._partition_of[m.metadata.src_node_id] for m in good]  # reply order, as before
        sizes = {p: float(self.roster.num_examples[p]) for p in partitions}
        total = sum(sizes.values())
        weights = {p: n / total for p, n in sizes.items()}
        if self.estimator == "paper":
            models = [arrays_to_vector(m.content[ARRAYS]) for m in good]
            diffs = [grad_diffs.get(m.metadata.src_node_id, math.nan) for m in good]
            return paper_mu(self._w_start, models, diffs, [weights[self._partition_of[m.metadata.src_node_id]]
                                                           for m in good])
        taus = {self._taus.get(p) for p in partitions}
        if len(taus) != 1:  # clients ran different step counts (after a fault): the model difference mixes them
            return None
        return self.secant.update(self._w_start, arrays_to_vector(arrays), taus.pop(), weights)

    def state_dict(self) -> dict:
        """Checkpoint state (server/checkpoint.py): the plain attributes plus the secant's last round."""
        return {**super().state_dict(), "secant_prev": self.secant._prev}

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        prev = state.pop("secant_prev", None)
        super().load_state_dict(state)
        self.secant._prev = None if prev is None else (prev[0], prev[1], float(prev[2]))

    def sync_with_mirror(self, mirror) -> None:
        """Before the first round: the mirror also counts a round lost between the clients' charge and the
        checkpoint (an upper bound of what they spent; a fresh start's mirror is empty); t follows it, so no
        tau asks a client for more than it has left."""
        for p in self.steps:
            self.steps[p] = max(self.steps[p], mirror.ledgers[p].steps())

    def extra_round_metrics(self) -> dict:
        """tau of the round, mu estimates and the next tau* (added to metrics.jsonl by the runner)."""
        return dict(self._row)


def _grad_diffs(replies: list[Message]) -> dict[int, float]:
    """node -> its reported ||grad F_i(w^i) - grad F_i(w)||, where the reply holds a number there."""
    out = {}
    for r in replies:
        record = None if r.has_error() else r.content.get(METRICS)
        value = record.get(GRAD_DIFF_METRIC) if isinstance(record, MetricRecord) else None
        if is_real(value):
            out[r.metadata.src_node_id] = float(value)
    return out


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.4g}"
