"""FedProx Synthetic(alpha, beta) federations, generated from a seed.

The procedure of Li et al., "Federated Optimization in Heterogeneous Networks"
(FedProx, MLSys 2020), as summarised in `reference/upcycled-fl.md` section 4.
For client k = 0..K-1:

    u_k ~ N(0, alpha)                 mean of client k's model
    W_k ~ N(u_k, 1)  (classes x dim), b_k ~ N(u_k, 1)  (classes)
    B_k ~ N(0, beta)                  mean of client k's feature means
    v_k ~ N(B_k, 1)  (dim)
    x   ~ N(v_k, Sigma),  Sigma = diag(j^-1.2), j = 1..dim
    y   = argmax softmax(W_k x + b_k)  (= argmax of the logits)

Synthetic(iid): one global W, b ~ N(0, 1) shared by every client and v_k = 0.

**Convention for N(m, s):** for the scalar/vector draws above the second
argument is a *standard deviation*, exactly as in Li et al.'s scripts (which
pass it as `scale` of `np.random.normal`), so alpha and beta are stds:
`u_k = alpha * z`. Sigma, in contrast, is a *covariance*: coordinate j of x has
variance j^-1.2 (std j^-0.6), as in their `multivariate_normal(mean, cov)`
call. The paper text writes N(0, alpha) without saying which; we follow the
code that produced the published data.

**A property of this construction (kept, to stay faithful):** u_k is one
scalar added to every entry of W_k and b_k, so it adds the same
u_k * (sum(x) + 1) to every class logit and never changes the argmax. The
labels therefore do not depend on alpha: for a fixed seed, Synthetic(a, beta)
gives the same features and labels for every a (the random stream is consumed
identically). Model heterogeneity comes only from the N(0, 1) noise of W_k and
b_k, data heterogeneity from beta. `tests/test_data.py` pins this.

Client k has n_k = floor(lognormal(mean=4, sigma=2)) + 50 samples (>= 50). Its
samples are shuffled and split 90/10: train = floor(0.9 n_k), test = the rest.
The pooled test set is the concatenation of the client test splits, in client
order. Features are float32, labels int64, input_shape = (dim,).

Everything comes from one `np.random.default_rng(seed)`, so the same arguments
give the same federation on every machine (NumPy's PCG64 stream is stable).
Li et al. set no seed, so their exact numbers cannot be regenerated; the
Upcycled-FL federations they released are read by `common.data.released`.
Note that Li et al. use dim = 60 and 10 classes, whereas the released
Upcycled-FL federations have dim = 20 and 2 classes.
"""

from __future__ import annotations

import math

import numpy as np

from .federation import ClientData, Federation


def _check(num_clients: int, dim: int, classes: int, alpha: float, beta: float) -> None:
    if int(num_clients) < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if int(dim) < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    if int(classes) < 2:
        raise ValueError(f"classes must be >= 2, got {classes}")
    if not (0 <= alpha < math.inf and 0 <= beta < math.inf):
        raise ValueError(f"alpha and beta must be finite and >= 0, got alpha={alpha}, beta={beta}")


def generate_synthetic(
    num_clients: int,
    dim: int = 60,
    classes: int = 10,
    alpha: float = 0.5,
    beta: float = 0.5,
    iid: bool = False,
    seed: int = 0,
) -> Federation:
    """Generate a Synthetic(alpha, beta) (or Synthetic(iid)) federation; see the module docstring.

    alpha: std of the per-client model mean u_k (cancels in the argmax: see the module docstring).
    beta:  std of B_k, the centre of the per-client feature mean v_k (data heterogeneity).
    iid:   ignore alpha and beta; one global W, b ~ N(0, 1) and v_k = 0 for every client.
    """
    _check(num_clients, dim, classes, alpha, beta)
    num_clients, dim, classes = int(num_clients), int(dim), int(classes)
    rng = np.random.default_rng(seed)

    sizes = np.floor(rng.lognormal(mean=4.0, sigma=2.0, size=num_clients)).astype(np.int64) + 50
    feature_std = np.arange(1, dim + 1, dtype=np.float64) ** -0.6  # sqrt of Sigma_jj = j^-1.2

    if iid:
        w_global = rng.normal(0.0, 1.0, size=(classes, dim))
        b_global = rng.normal(0.0, 1.0, size=classes)
    else:
        model_mean = rng.normal(0.0, alpha, size=num_clients)  # u_k
        feature_centre = rng.normal(0.0, beta, size=num_clients)  # B_k

    clients: list[ClientData] = []
    for k in range(num_clients):
        if iid:
            w, b, v = w_global, b_global, np.zeros(dim)
        else:
            w = rng.normal(model_mean[k], 1.0, size=(classes, dim))
            b = rng.normal(model_mean[k], 1.0, size=classes)
            v = rng.normal(feature_centre[k], 1.0, size=dim)
        n = int(sizes[k])
        x = v + rng.standard_normal((n, dim)) * feature_std
        y = np.argmax(x @ w.T + b, axis=1)  # softmax is monotone: argmax of the logits
        order = rng.permutation(n)
        x, y = x[order].astype(np.float32), y[order].astype(np.int64)
        n_train = (9 * n) // 10  # floor(0.9 n), exact in integers
        clients.append(ClientData(x[:n_train], y[:n_train], x[n_train:], y[n_train:]))

    x_test = np.concatenate([c.x_test for c in clients])
    y_test = np.concatenate([c.y_test for c in clients])
    name = "Synthetic(iid)" if iid else f"Synthetic({alpha:g},{beta:g})"
    return Federation(
        clients=clients,
        x_test=x_test,
        y_test=y_test,
        input_shape=(dim,),
        num_classes=classes,
        description=f"{name}: {num_clients} generated clients, dim {dim}, {classes} classes, seed {seed}",
        meta={
            "dataset": "synthetic",
            "alpha": float(alpha),
            "beta": float(beta),
            "iid": bool(iid),
            "seed": int(seed),
            "samples_per_client": sizes.tolist(),
        },
    )
