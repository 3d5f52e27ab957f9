"""DP-FedAvg of Hu, Guo & Gong (2021), the client: tau noisy local steps, and its zCDP accounting.

The local rule (Algorithm 1; `reference/zcdp-secagg.md` section 2):

    theta^{t,0} = theta^t (the received global model)
    for s = 0 .. tau-1:
        X   = the next gamma samples of the current local epoch
        g   = (1/gamma) sum_{xi in X} clip_G(grad l(theta^{t,s}, xi))     clip_G(v) = v min(1, G/||v||_2)
        b   ~ N(0, sigma^2 I_d)                                             fresh at every step
        theta^{t,s+1} = theta^{t,s} - eta (g + b)

* Noise convention. The paper's b has std sigma on the *averaged* clipped
  gradient. Opacus' DPOptimizer adds N(0, (z C)^2) to the *sum* of clipped
  per-sample gradients and divides by the expected batch size; with C = G, a
  fixed batch of exactly gamma samples and expected batch size gamma, its
  noise on the average has std z G / gamma. We therefore run Opacus (through
  `common.privacy.dpsgd.DpSgd`, which computes the per-sample gradients and
  does clip-sum-noise-divide) with z = sigma * gamma / G: the step is then
  exactly the paper's. Sampling is ours, not Opacus' Poisson sampler: the
  paper's batches are disjoint within a local epoch.
* Batches. At the start of every participation the local data (m samples) is
  shuffled (generator seeded by `common.seeding.mechanism_seed`, keyed by
  partition and training round) and cut into floor(m / gamma) disjoint
  batches of exactly gamma samples (the remainder is unused in that epoch);
  after the last batch a new epoch is
  reshuffled. A round of tau steps therefore touches E = ceil(tau /
  floor(m / gamma)) epochs and uses each sample at most once per epoch.
* The step size eta is `lr`, gamma is `batch-size`, tau is `hu-local-steps`,
  G is `hu-clip`; sigma comes from the server (`hu-sigma` in the instruction:
  calibrated there from `target-epsilon`, see server/strategies/dpfedavg_hu.py).
  G = 0 with sigma = 0 is the non-private baseline (plain minibatch SGD, no
  clipping, no ledger entry).

Accounting (replace-one neighbours, record level, per device; one rho-zCDP
entry per participation, composed by summing rho):

* `conservative` (default): rho = E * 2 G^2 / (gamma^2 sigma^2). One step is
  the Gaussian mechanism with sensitivity 2G/gamma (Corollary 1): 2G^2 /
  (gamma^2 sigma^2)-zCDP; steps within one epoch touch disjoint batches
  (parallel composition, Lemma 3); epochs add up. No credit for secure
  aggregation. Equals the paper's formula without /r when m/gamma divides
  tau, and never undercounts when it does not (digest ambiguity 1).
* `paper`: Theorem 1 literally, rho = 2 tau G^2 / (r m gamma sigma^2), with
  r = the number of nodes in the secure-aggregation announcement (other
  clients' noise counted, the paper's SA credit), and r = 1 when the message
  is not securely aggregated (the paper's "without secure aggregation").
  Labelled paper-faithful: the /r credit assumes no collusion and honest
  noise from every other client (digest ambiguity 4), and the formula
  undercounts when tau gamma < m (ambiguity 1).
* `paper-dsgd`: the DP-DSGD baseline's formula as printed, per round
  rho = 2 G^2 / (n gamma^2 sigma^2) with n the number of devices (tau = 1).

Each (epsilon, delta) is rho + 2 sqrt(rho log 1/delta) (Lemma 4), the ledger's
`hu-thm1` accountant. The node's persistent ledger (`client.ledger`,
client/privacy.py) refuses a participation that would take it past
`target-epsilon` (principle 3).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# The accounting is pure and shared with the server's mirror: common/privacy/hu.py.
from common.privacy.hu import ACCOUNTANTS, calibrate_sigma, epochs_touched, rho_coefficient, round_rho  # noqa: E402,F401


# --- local training ------------------------------------------------------------------
def epoch_batches(n: int, batch_size: int, generator: torch.Generator):
    """Endless stream of index batches: per epoch a fresh permutation cut into floor(n/gamma) batches of gamma."""
    per_epoch = n // batch_size
    if per_epoch < 1:
        raise ValueError(f"batch size {batch_size} exceeds the {n} local samples")
    while True:
        order = torch.randperm(n, generator=generator)[: per_epoch * batch_size]
        yield from order.view(per_epoch, batch_size)


def hu_train(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *, steps: int, batch_size: int,
             clip: float, sigma: float, lr: float, generator: torch.Generator,
             noise_generator: torch.Generator | None = None) -> float:
    """tau = `steps` steps of theta <- theta - eta (mean_i clip_G(grad_i) + N(0, sigma^2 I)); mean batch loss.

    clip = 0 and sigma = 0: plain minibatch SGD (the non-private baseline)."""
    batches = epoch_batches(len(y), batch_size, generator)
    losses = []
    if clip == 0:
        if sigma != 0:
            raise ValueError("noise without a clipping bound has no privacy guarantee")
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        for _ in range(steps):
            idx = next(batches)
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return sum(losses) / max(len(losses), 1)

    from common.privacy.dpsgd import DpSgd

    n = len(y)
    # Opacus adds N(0, (z G)^2) to the sum of clipped gradients and divides by gamma: z = sigma gamma / G.
    # Ghost clipping: the same step without materialising gamma per-sample gradients (~9x faster here).
    with DpSgd(model, dataset_size=n, sample_rate=batch_size / n, max_grad_norm=clip,
               noise_multiplier=sigma * batch_size / clip, lr=lr, noise_generator=noise_generator,
               grad_sample_mode="ghost") as trainer:
        trainer.expected_batch_size = batch_size
        trainer.optimizer.expected_batch_size = batch_size  # exactly gamma (not gamma/n * n in floating point)
        for _ in range(steps):
            idx = next(batches)
            losses.append(trainer.step(x[idx], y[idx]))
    return sum(losses) / max(len(losses), 1)


# --- the update rule ------------------------------------------------------------------
OWN_KEYS = ("hu-accountant", "hu-local-steps", "hu-clip")  # what the ledger charges by: the client's config


def refuse_foreign_accounting(config, instruction) -> None:
    """Refuse (BudgetExhausted) an instruction that asks for another accountant, tau or clip than this
    client's run config: accounted the server's way, it could spend past the client's budget."""
    from client.privacy import BudgetExhausted

    for key in OWN_KEYS:
        if key in instruction and str(instruction[key]) != str(config[key]):
            raise BudgetExhausted(f"refused: the instruction asks for {key} = {instruction[key]!r}, but this "
                                  f"client's run config has {key} = {config[key]!r} (its ledger charges by its own)")


def hu_update(client, content, state):
    """DP-FedAvg (Hu et al.) client: tau noisy clipped SGD steps from the received model; reply with the model.

    The participation's zCDP entry is checked against `target-epsilon` (the paper's conversion, ledger
    accountant `hu-thm1`) and against the run's generic `target-epsilon` (`client.privacy.charge`), and
    recorded in the node's persistent ledger before training; a refusal raises `BudgetExhausted`, which
    the ClientApp turns into a typed refusal (the server then stops selecting this client).
    """
    from flwr.app import MetricRecord, RecordDict

    from client.privacy import BudgetExhausted, charge
    from client.secagg import RECORD as SECAGG, ids_from_bytes
    from common.privacy.plan import is_private, planned_entries
    from common.records import ARRAYS, CONFIG, METRICS, NUM_EXAMPLES, load_arrays, model_to_arrays
    from common.seeding import mechanism_seed, torch_generator

    config, instruction = client.config, content[CONFIG]
    refuse_foreign_accounting(config, instruction)
    sigma = float(instruction["hu-sigma"])
    tau = int(config["hu-local-steps"])  # the client's own: the ledger charges exactly what it runs
    clip = float(config["hu-clip"])
    gamma, m = int(config["batch-size"]), client.num_train
    server_round = int(instruction.get("train-round", instruction["server-round"]))
    secure = SECAGG in content
    # the SA credit only if masked, and only for the clients whose noise is surely in the decoded sum
    r = min(len(ids_from_bytes(content[SECAGG]["selected"])), int(config["secagg-min-survivors"])) if secure else 1

    if is_private(config) and not (sigma > 0 and clip > 0):  # no noise or no clipping: no guarantee, and
        raise BudgetExhausted(                                  # rho would be charged as 0
            f"refused: a private run needs hu-sigma > 0 and hu-clip > 0; the server sent sigma = {sigma:g}, "
            f"clip = {clip:g}")
    if float(config["target-epsilon"]) <= 0 and sigma < float(config["hu-sigma"]):  # no budget: its own sigma
        raise BudgetExhausted(f"refused: the server sent sigma = {sigma:g}, below this client's hu-sigma = "
                              f"{float(config['hu-sigma']):g}")
    # whatever can fail before training fails before the charge: a failed round must not spend budget
    epochs_touched(tau, m, gamma)  # ValueError if gamma > m
    load_arrays(client.model, content[ARRAYS])
    if sigma > 0:
        claimed = int(instruction.get("hu-clients-per-round", 1))
        if claimed != r:  # the secure-aggregation credit only for a masked reply among r clients
            raise ValueError(f"instruction claims r = {claimed} clients per round for the accounting, "
                             f"but this reply is {f'masked, credited for {r}' if secure else 'not masked'}")
        entries = planned_entries(config, instruction, dataset_size=m)
        # records before training; the paper's conversion too (sigma is calibrated to hit the target
        # exactly: float tolerance)
        charge(client.ledger, config, entries, also={"hu-thm1": 1e-9}, server_run=client.run_id)

    # Secret by default under DP: the server must not regenerate the noise or the batches.
    root = mechanism_seed(config) if sigma > 0 else int(config["seed"])
    loss = hu_train(client.model, client.x, client.y, steps=tau, batch_size=gamma, clip=clip, sigma=sigma,
                    lr=float(config["lr"]),
                    generator=torch_generator(root, "hu-batches", client.partition, server_round),
                    noise_generator=torch_generator(root, "hu-noise", client.partition, server_round,
                                                    device=next(client.model.parameters()).device))
    metrics = MetricRecord({NUM_EXAMPLES: m, "train-loss": loss})
    return RecordDict({ARRAYS: model_to_arrays(client.model), METRICS: metrics})
