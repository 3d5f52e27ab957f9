"""Accountants: epsilon(delta) of dp-accounting events, calibration, and the
papers' closed forms.

Two general accountants, both from dp-accounting:

- `rdp`: `RdpAccountant` (Mironov 2017; sampled Gaussian: Mironov, Talwar &
  Zhang 2019) over a grid of orders, then an RDP -> (epsilon, delta) conversion:
  - `classic`: epsilon = min_a rdp(a) + log(1/delta)/(a-1) (Mironov 2017, Prop. 3).
    ALI-DPFL's accountant (with the `integer` orders).
  - `balle`: epsilon = min_a rdp(a) + log((a-1)/a) - (log delta + log a)/(a-1)
    (Balle et al. 2020, Thm 21; Canonne, Kamath & Steinke 2020, Prop. 12). This
    is what `RdpAccountant.get_epsilon` computes, and FedLAP-DP's accountant.
    Never larger than `classic` at the same orders.
- `pld`: `PLDAccountant` (privacy loss distributions, pessimistic
  discretisation). Tighter than RDP for the same events; it has no notion of a
  bare zCDP bound, so a `ZCDpEvent` is refused.

The neighbouring relation of the accountant is add/remove one record (that is
what Poisson sampling is analysed under); Gaussian and zCDP events carry their
own sensitivity, see `events.py`. `delta` is always the target delta of the
(epsilon, delta)-DP statement for one client's local dataset.

Order grids (`ORDER_SETS`):
- `privfed` (default): dp-accounting's defaults (1.1..10.9 step .1, 11..63,
  128, 256, 512, 1024) plus points between 64 and 2048. The extra points make a
  zCDP event's `classic` conversion land within 0.5% of the continuous optimum
  rho + 2 sqrt(rho log(1/delta)) for rho in [1e-4, 100], delta in [1e-10, 1e-3]
  (the default grid alone is up to 6% off: optimal orders fall in 64..1024).
- `dp-accounting`: `DEFAULT_RDP_ORDERS`.
- `integer`: 2..63, 128, 256, 512: the integer orders of the ALI-DPFL code.
- `fedlap`: 1.1..10.9 step .1, 12..63: FedLAP-DP's `RDP_record_level.py`.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Sequence

import dp_accounting as dpa
import numpy as np
from dp_accounting.pld import pld_privacy_accountant, privacy_loss_distribution
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import optimize


class _SkipUnconvergedOrders(logging.Filter):
    """dp-accounting warns for each fractional RDP order whose series does not converge and leaves that
    order out of the minimum (epsilon stays a valid bound): hundreds of lines in a run's output. Only that
    warning is dropped; every other (e.g. a negative Renyi divergence) still shows. On the "absl" logger,
    which dp-accounting logs to, in every process that imports this module (client workers too)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("_compute_log_a_frac failed to converge")


logging.getLogger("absl").addFilter(_SkipUnconvergedOrders())

ACCOUNTANTS = ("rdp", "pld")
CONVERSIONS = ("classic", "balle")

_DEFAULT = tuple(float(a) for a in rdp_privacy_accountant.DEFAULT_RDP_ORDERS)
_EXTRA = (72, 80, 88, 96, 104, 112, 120, 144, 160, 176, 192, 224, 288, 320, 384, 448, 640, 768, 896, 1280, 1536, 2048)
ORDER_SETS: dict[str, tuple[float, ...]] = {
    "privfed": tuple(sorted(set(_DEFAULT) | {float(a) for a in _EXTRA})),
    "dp-accounting": _DEFAULT,
    "integer": tuple(float(a) for a in [*range(2, 64), 128, 256, 512]),
    "fedlap": tuple([round(1 + x / 10.0, 10) for x in range(1, 100)] + [float(a) for a in range(12, 64)]),
}
DEFAULT_ORDERS = "privfed"
PLD_DISCRETIZATION = 1e-4
# Longest privacy-loss grid one mechanism may get. A Gaussian's loss spans about 1/(2 sigma^2) + 10/sigma,
# so a tiny sigma (a "noise-free" probe, sigma = 0.01) would need ~1e8 points at 1e-4 and ~25 GiB to compose.
PLD_MAX_POINTS = 300_000

Orders = str | Sequence[float]


def resolve_orders(orders: Orders | None) -> tuple[float, ...]:
    """A named order set (see ORDER_SETS) or an explicit list of orders > 1."""
    if orders is None:
        orders = DEFAULT_ORDERS
    if isinstance(orders, str):
        try:
            return ORDER_SETS[orders]
        except KeyError:
            raise ValueError(f"unknown order set {orders!r}; known: {', '.join(ORDER_SETS)}") from None
    out = tuple(float(a) for a in orders)
    if not out or min(out) <= 1:
        raise ValueError("RDP orders must be a non-empty list of numbers > 1")
    return out


def _check_delta(delta: float) -> float:
    delta = float(delta)
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1); got {delta}")
    return delta


# ---------------------------------------------------------------------------
# RDP -> (epsilon, delta)
# ---------------------------------------------------------------------------
def rdp_to_epsilon(orders: Sequence[float], rdp: Sequence[float], delta: float,
                   conversion: str = "balle") -> tuple[float, float]:
    """(epsilon, optimal order) of an RDP curve at `delta` by `conversion`."""
    delta = _check_delta(delta)
    rdp = np.nan_to_num(np.asarray(rdp, dtype=float), nan=np.inf, posinf=np.inf)  # a nan order is unusable
    if not np.any(rdp):  # no loss at any order (zero steps): the classic bound's log(1/delta)/(a-1) is slack
        return 0.0, float(orders[-1])
    if conversion == "balle":
        eps, order = rdp_privacy_accountant.compute_epsilon(orders, rdp, delta)
        return float(eps), float(order)
    if conversion == "classic":
        a = np.asarray(orders, dtype=float)
        r = np.asarray(rdp, dtype=float)
        with np.errstate(invalid="ignore"):
            eps = r + math.log(1 / delta) / (a - 1)
        if np.all(np.isnan(eps)):
            return math.inf, float("nan")
        i = int(np.nanargmin(eps))
        return max(0.0, float(eps[i])), float(a[i])
    raise ValueError(f"unknown RDP conversion {conversion!r}; known: {', '.join(CONVERSIONS)}")


def rdp_curve(event: dpa.DpEvent, orders: Orders | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(orders, RDP at each order) of `event`, from dp-accounting's RdpAccountant.

    Compositions are unrolled here (RDP adds up over composition, exactly what
    the accountant does internally), so each distinct mechanism's curve is
    computed by the accountant once per process and reused: a ledger that
    grows by one DP-SGD round would otherwise redo the expensive
    Poisson-subsampled Gaussian curve on every epsilon query."""
    o = resolve_orders(orders)
    return np.asarray(o, dtype=float), _rdp_of(event, o)


def _rdp_of(event: dpa.DpEvent, orders: tuple[float, ...]) -> np.ndarray:
    if isinstance(event, dpa.SelfComposedDpEvent):
        return event.count * _rdp_of(event.event, orders)
    if isinstance(event, dpa.ComposedDpEvent):
        return sum((_rdp_of(e, orders) for e in event.events), np.zeros(len(orders)))
    return _leaf_rdp(event, orders)


def clear_caches() -> None:
    """Forget every memoised RDP curve and epsilon (a benchmark times cold calls)."""
    for memo in (_leaf_rdp, _rdp_epsilon, _pld_epsilon, _step_rdp):
        memo.cache_clear()


@functools.lru_cache(maxsize=1024)
def _leaf_rdp(event: dpa.DpEvent, orders: tuple[float, ...]) -> np.ndarray:
    accountant = rdp_privacy_accountant.RdpAccountant(list(orders))
    if not accountant.supports(event):
        raise ValueError(f"the RDP accountant cannot account {event}")
    accountant.compose(event)
    rdp = np.asarray(accountant.rdp, dtype=float)
    rdp.setflags(write=False)
    return rdp


def epsilon(event: dpa.DpEvent, delta: float, *, accountant: str = "rdp", conversion: str = "balle",
            orders: Orders | None = None, pld_discretization: float = PLD_DISCRETIZATION) -> float:
    """epsilon(delta) of a dp-accounting event by `accountant` ('rdp' | 'pld'); inf where dp-accounting's
    arithmetic overflows (noise multipliers far below 1e-4): no finite bound is claimed there."""
    delta = _check_delta(delta)
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"unknown accountant {accountant!r}; known: {', '.join(ACCOUNTANTS)}")
    try:
        if accountant == "rdp":
            return _rdp_epsilon(_hashable(event), delta, conversion, resolve_orders(orders))
        return _pld_epsilon(_hashable(event), delta, pld_discretization)
    except ArithmeticError:
        return math.inf


def _hashable(event: dpa.DpEvent):
    """ComposedDpEvent holds a list; a tuple makes it a cache key (same event)."""
    if isinstance(event, dpa.ComposedDpEvent):
        return ("composed", tuple(_hashable(e) for e in event.events))
    if isinstance(event, dpa.SelfComposedDpEvent):
        inner = _hashable(event.event)
        return event if inner is event.event else ("self-composed", inner, event.count)
    return event


def _unhash(key) -> dpa.DpEvent:
    if isinstance(key, tuple) and key and key[0] == "composed":
        return dpa.ComposedDpEvent([_unhash(k) for k in key[1]])
    if isinstance(key, tuple) and key and key[0] == "self-composed":
        return dpa.SelfComposedDpEvent(_unhash(key[1]), key[2])
    return key


def _gaussian_noise_multipliers(event: dpa.DpEvent):
    if isinstance(event, dpa.GaussianDpEvent):
        yield float(event.noise_multiplier)
    for child in getattr(event, "events", None) or [getattr(event, "event", None)]:
        if child is not None:
            yield from _gaussian_noise_multipliers(child)


def _gaussian_precision(event: dpa.DpEvent, count: int = 1) -> float:
    """Sum of count / z^2 over the Gaussian releases of `event` that are not subsampled: dp-accounting
    composes them as one Gaussian of noise multiplier sum^-1/2, whose loss grid grows with the count."""
    if isinstance(event, dpa.GaussianDpEvent):
        return count / float(event.noise_multiplier) ** 2 if event.noise_multiplier > 0 else math.inf
    if isinstance(event, dpa.SelfComposedDpEvent):
        return _gaussian_precision(event.event, count * int(event.count))
    if isinstance(event, dpa.ComposedDpEvent):
        return sum(_gaussian_precision(e, count) for e in event.events)
    return 0.0  # subsampled and other events: their own loss grids, sized by the per-release multiplier


def pld_interval(event: dpa.DpEvent, discretization: float = PLD_DISCRETIZATION) -> float:
    """The value-discretisation interval for `event`: `discretization`, or coarser where its smallest
    Gaussian noise multiplier (of one release, or of its unsampled Gaussian releases composed) would make
    the loss grid longer than PLD_MAX_POINTS. The discretisation is pessimistic, so a coarser grid still
    gives an upper bound on epsilon, only a looser one."""
    sigma = min(_gaussian_noise_multipliers(event), default=math.inf)
    precision = _gaussian_precision(event)
    if precision > 0:
        sigma = min(sigma, precision ** -0.5)
    if sigma == 0:  # no noise: dp-accounting's PLD is the infinite-loss point mass, no grid
        return discretization
    return max(discretization, (1 / (2 * sigma**2) + 10 / sigma) / PLD_MAX_POINTS)


@functools.lru_cache(maxsize=4096)
def _rdp_epsilon(key, delta: float, conversion: str, orders: tuple[float, ...]) -> float:
    """RDP epsilon, cached by event (DpEvents compare by value, so a grown ledger is a new key): the
    server's mirror asks once per client per round, and clients with equal ledgers ask for the same."""
    o, r = rdp_curve(_unhash(key), orders)
    return rdp_to_epsilon(o, r, delta, conversion)[0]


@functools.lru_cache(maxsize=256)
def _pld_epsilon(key, delta: float, discretization: float) -> float:
    """PLD epsilon, cached: building a PLD is costly and clients with equal
    ledgers (the usual case) ask for the same event."""
    event = _unhash(key)
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=pld_interval(event, discretization))
    if not acc.supports(event):
        raise ValueError(
            f"the PLD accountant cannot account {event} (a bare zCDP bound has no privacy loss "
            "distribution); use accountant='rdp'"
        )
    acc.compose(event)
    return float(acc.get_epsilon(delta))


def dpsgd_event(sample_rate: float, noise_multiplier: float, steps: int) -> dpa.DpEvent:
    """`steps` Poisson-sampled Gaussian steps (add/remove-one relation)."""
    return dpa.SelfComposedDpEvent(
        dpa.PoissonSampledDpEvent(float(sample_rate), dpa.GaussianDpEvent(float(noise_multiplier))), int(steps)
    )


def dpsgd_epsilon(sample_rate: float, noise_multiplier: float, steps: int, delta: float, *,
                  accountant: str = "rdp", conversion: str = "balle", orders: Orders | None = None) -> float:
    """epsilon(delta) after `steps` DP-SGD steps at sampling rate q and noise multiplier sigma."""
    _check_dpsgd(sample_rate, noise_multiplier)
    _check_delta(delta)  # before the shortcut: epsilon 0 "at delta = 2" is no statement
    if steps < 0:
        raise ValueError(f"steps must be >= 0; got {steps}")
    if steps == 0:
        return 0.0
    return epsilon(dpsgd_event(sample_rate, noise_multiplier, steps), delta, accountant=accountant,
                   conversion=conversion, orders=orders)


def _check_dpsgd(sample_rate: float, noise_multiplier: float | None = None) -> None:
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sampling rate q must be in (0, 1]; got {sample_rate}")
    if noise_multiplier is not None and not noise_multiplier > 0:
        raise ValueError(f"noise multiplier sigma must be positive; got {noise_multiplier}")


# ---------------------------------------------------------------------------
# Calibration
# ---------------------------------------------------------------------------
@functools.lru_cache(maxsize=256)
def _step_rdp(sample_rate: float, noise_multiplier: float, orders: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    o, r = rdp_curve(dpsgd_event(sample_rate, noise_multiplier, 1), orders)
    o.setflags(write=False)
    r.setflags(write=False)
    return o, r


def _steps_epsilon_fn(sample_rate: float, noise_multiplier: float, delta: float, accountant: str,
                      conversion: str, orders: Orders | None) -> Callable[[float], float]:
    """epsilon as a function of the number of steps. For RDP the per-step curve
    is computed once by the accountant and scaled (RDP composes additively:
    exactly what SelfComposedDpEvent does); PLD composes afresh each time."""
    if accountant == "rdp":
        o, r = _step_rdp(float(sample_rate), float(noise_multiplier), resolve_orders(orders))

        def eps(steps: float) -> float:
            return 0.0 if steps <= 0 else rdp_to_epsilon(o, steps * r, delta, conversion)[0]

        return eps
    if accountant == "pld":
        return _pld_steps_epsilon(float(sample_rate), float(noise_multiplier), delta)
    raise ValueError(f"unknown accountant {accountant!r}; known: {', '.join(ACCOUNTANTS)}")


def _pld_steps_epsilon(sample_rate: float, noise_multiplier: float, delta: float) -> Callable[[float], float]:
    """epsilon(steps) by the PLD accountant, bit for bit what `PLDAccountant` computes for
    `dpsgd_event(q, sigma, steps)` (tests/test_privacy_accounting.py), with the one-step distribution built
    once: building it is 60% of a probe's time, and a search probes several step counts."""
    interval = pld_interval(dpsgd_event(sample_rate, noise_multiplier, 1))
    try:
        one_step = privacy_loss_distribution.from_gaussian_mechanism(
            standard_deviation=noise_multiplier, value_discretization_interval=interval, sampling_prob=sample_rate,
            neighboring_relation=dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
    except ArithmeticError:  # as `epsilon` does: no finite bound where dp-accounting's arithmetic overflows
        return lambda steps: 0.0 if steps <= 0 else math.inf

    def eps(steps: float) -> float:
        if steps <= 0:
            return 0.0
        composed = privacy_loss_distribution.identity(value_discretization_interval=interval)
        try:
            return float(composed.compose(one_step.self_compose(int(steps))).get_epsilon_for_delta(delta))
        except ArithmeticError:
            return math.inf

    return eps


MAX_STEPS_CAP = 10**9
STEPS_SEARCHES = ("exact", "ali-code")


def max_steps(target_epsilon: float, delta: float, sample_rate: float, noise_multiplier: float, *,
              accountant: str = "rdp", conversion: str = "balle", orders: Orders | None = None,
              search: str = "exact") -> int:
    """R_c: the largest number of DP-SGD steps whose epsilon(delta) is <= target.

    `search='exact'` (default): integer search (`largest_within`), so
    epsilon(R_c) <= target < epsilon(R_c + 1). `search='ali-code'`: the ALI-DPFL
    authors' procedure (bisection on a real T in [0, 1e5] until epsilon is within
    0.01 *above* the target, then int(T)); it reproduces the paper's R_c, whose
    epsilon may exceed the target by up to 0.01 (RDP only)."""
    delta = _check_delta(delta)
    _check_dpsgd(sample_rate, noise_multiplier)
    if target_epsilon <= 0:
        raise ValueError(f"target epsilon must be positive; got {target_epsilon}")
    eps = _steps_epsilon_fn(sample_rate, noise_multiplier, delta, accountant, conversion, orders)
    if search == "ali-code":
        if accountant != "rdp":
            raise ValueError("search='ali-code' is the ALI-DPFL authors' RDP procedure; use accountant='rdp'")
        return _ali_code_steps(eps, target_epsilon)
    if search != "exact":
        raise ValueError(f"unknown search {search!r}; known: {', '.join(STEPS_SEARCHES)}")
    if accountant == "pld":  # PLD is at least as tight as RDP here: the RDP answer is a cheap first probe
        guess = max_steps(target_epsilon, delta, sample_rate, noise_multiplier, orders=orders)
    else:
        guess = None
    return largest_within(eps, target_epsilon, guess)


def largest_within(eps: Callable[[int], float], target: float, guess: int | None = None) -> int:
    """The largest integer k >= 0 with eps(k) <= target, for a nondecreasing eps with eps(0) = 0.

    Written here rather than taken from scipy, whose root finders work on reals: the answer must be the
    exact integer boundary, eps(k) <= target < eps(k + 1), and every probe of a PLD accountant costs
    up to a second. Probes are secant steps on the sqrt(k) scale (the epsilon of composed DP-SGD grows
    about like sqrt(k)), with a bisection wherever a secant step would not be half the one two probes
    before (Brent's safeguard), so the worst case stays logarithmic. `guess` (any integer) is probed first."""
    e1 = eps(1)
    if e1 > target:
        return 0
    bracket = _Bracket(eps, target, lo=1, e_lo=e1)
    if guess is not None and bracket.inside(guess):
        bracket.probe(guess)
    steps = [math.inf, math.inf]  # how far past lo each of the last two probes went
    while not bracket.closed:
        if bracket.hi is None:
            bracket.probe(bracket.grown())
            continue
        k = bracket.secant() if math.isfinite(bracket.e_hi) else None  # no line through an overflow
        if k is None or not k - bracket.lo < steps[0] / 2:  # Brent's safeguard
            k = (bracket.lo + bracket.hi) // 2
        steps = [steps[1], k - bracket.lo]
        bracket.probe(k)
    return bracket.lo


class _Bracket:
    """lo < hi with eps(lo) <= target < eps(hi); hi None until a probe passes the target."""

    def __init__(self, eps: Callable[[int], float], target: float, lo: int, e_lo: float):
        self.eps, self.target = eps, target
        self.lo, self.e_lo, self.hi, self.e_hi = lo, e_lo, None, math.inf
        self.below = (0, 0.0)  # the previous lo: with lo, a secant to extrapolate from

    @property
    def width(self) -> float:
        return math.inf if self.hi is None else self.hi - self.lo

    @property
    def closed(self) -> bool:
        return self.width <= 1

    def inside(self, k: int) -> bool:
        return self.lo < k < (MAX_STEPS_CAP + 1 if self.hi is None else self.hi)

    def probe(self, k: int) -> None:
        e = self.eps(k)
        if e <= self.target:
            self.below, self.lo, self.e_lo = (self.lo, self.e_lo), k, e
        else:
            self.hi, self.e_hi = k, e

    def grown(self) -> int:
        """A little past the root of the secant through the last two lo's, 2 to 16 times lo."""
        if self.lo > MAX_STEPS_CAP:
            raise ValueError(f"epsilon stays <= {self.target} beyond {MAX_STEPS_CAP} steps; "
                             "the target is beyond what this noise and sampling rate reach: no R_c")
        root = _sqrt_secant_root(*self.below, self.lo, self.e_lo, self.target)
        k = max(2 * self.lo, math.ceil(1.05 * min(root, 16 * self.lo)) + 1)
        return min(16 * self.lo, k, MAX_STEPS_CAP + 1)

    def secant(self) -> int:
        """floor of the root of the secant through lo and hi, strictly inside the bracket."""
        root = _sqrt_secant_root(self.lo, self.e_lo, self.hi, self.e_hi, self.target)
        return min(self.hi - 1, max(self.lo + 1, math.floor(root)))


def _sqrt_secant_root(k0: int, e0: float, k1: int, e1: float, target: float) -> float:
    """Where the line through (sqrt k0, e0) and (sqrt k1, e1) reaches target (inf if it never rises)."""
    s0, s1 = math.sqrt(k0), math.sqrt(k1)
    if not e1 > e0:
        return math.inf
    return (s1 + (target - e1) * (s1 - s0) / (e1 - e0)) ** 2


def _ali_code_steps(eps: Callable[[float], float], target: float, tolerance: float = 0.01) -> int:
    lo, hi = 0.0, 100000.0
    eps_hi = eps(hi)
    if eps_hi < target:
        raise ValueError("the ALI-DPFL code searches at most 100000 steps; epsilon stays below the target")
    while eps_hi - target > tolerance:
        mid = (lo + hi) / 2
        e = eps(mid)
        if e > target:
            hi, eps_hi = mid, e
        else:
            lo = mid
    return int(hi)


def calibrate_noise_multiplier(target_epsilon: float, delta: float, sample_rate: float, steps: int, *,
                               accountant: str = "rdp", conversion: str = "balle", orders: Orders | None = None,
                               tol: float = 1e-4) -> float:
    """The smallest noise multiplier sigma on the grid of multiples of `tol` (rounded up) whose
    `steps` DP-SGD steps at rate q have epsilon(delta) <= target. Bracketing and Brent root-finding;
    the returned sigma always meets the target, and so does sigma written to tol's precision."""
    delta = _check_delta(delta)
    _check_dpsgd(sample_rate)
    if target_epsilon <= 0:
        raise ValueError(f"target epsilon must be positive; got {target_epsilon}")
    if steps <= 0:
        raise ValueError(f"steps must be positive; got {steps}")
    if not 0 < tol <= 0.1:
        raise ValueError(f"tol must be in (0, 0.1]; got {tol}")

    @functools.lru_cache(maxsize=None)
    def eps(sigma: float) -> float:
        return dpsgd_epsilon(sample_rate, sigma, steps, delta, accountant=accountant, conversion=conversion,
                             orders=orders)

    # Bracket: eps(lo) > target >= eps(hi).
    hi = 1.0
    while eps(hi) > target_epsilon:
        hi *= 2
        if hi > 1e6:
            raise ValueError(f"no noise multiplier below 1e6 reaches epsilon {target_epsilon}")
    lo = hi / 2
    while eps(lo) <= target_epsilon:
        hi, lo = lo, lo / 2
        if lo < 1e-4:
            return _grid_up(hi, tol, eps, target_epsilon)
    # Brent's method to within tol/2, then up to the tol grid and on up until the target is met, so the
    # result meets the target, is within about tol of the smallest sigma, and is what a caller printing
    # it to tol's precision shows (a sigma rounded down when printed may miss the target).
    root = optimize.brentq(lambda s: eps(s) - target_epsilon, lo, hi, xtol=tol / 2)
    return _grid_up(min(root, hi), tol, eps, target_epsilon)


def _grid_up(sigma: float, tol: float, eps: Callable[[float], float], target_epsilon: float) -> float:
    """The smallest multiple of `tol` near `sigma` (as written to 12 digits) whose epsilon meets the target:
    up from the grid point at or above `sigma` until it is met, then down while the point below meets it
    too (Brent's bracket is only within tol / 2 of the root)."""
    sigma = float(f"{math.ceil(sigma / tol) * tol:.12g}")
    while eps(sigma) > target_epsilon:
        sigma = float(f"{sigma + tol:.12g}")
    while sigma - tol > 0 and eps(below := float(f"{sigma - tol:.12g}")) <= target_epsilon:
        sigma = below
    return sigma


# ---------------------------------------------------------------------------
# The papers' accountants (closed forms and paper-specific settings)
# ---------------------------------------------------------------------------
def zcdp_epsilon(rho: float, delta: float) -> float:
    """Bun & Steinke 2016, Prop. 1.3: rho-zCDP => (rho + 2 sqrt(rho log(1/delta)), delta)-DP."""
    delta = _check_delta(delta)
    return rho + 2 * math.sqrt(rho * math.log(1 / delta))


def zcdp_rho_for_epsilon(epsilon_: float, delta: float) -> float:
    """The inverse of `zcdp_epsilon`: rho* = (sqrt(log(1/delta) + eps) - sqrt(log(1/delta)))^2, computed as
    (eps / (sqrt(log(1/delta) + eps) + sqrt(log(1/delta))))^2: the difference of two close roots loses its
    digits for a small eps (at 1e-8 the calibrated epsilon overshot its target by 6e-8, relative)."""
    log_inv = math.log(1 / _check_delta(delta))
    return (epsilon_ / (math.sqrt(log_inv + epsilon_) + math.sqrt(log_inv))) ** 2  # the ratio: eps^2 overflows


def upcycled_output_epsilon(noise_multipliers: Sequence[float], delta: float) -> float:
    """Upcycled-FL Thm 6.2 (moments accountant, closed form) for output-perturbed
    releases with noise multipliers z_m = sigma_m / sensitivity_m:
    c = sum_m 1/(2 z_m^2) and epsilon = c + 2 sqrt(c log(1/delta)). With the
    paper's sensitivity tau/|D_i| and M equal releases, c = M tau^2/(2 sigma^2 |D_i|^2)."""
    c = sum(1.0 / (2.0 * z * z) for z in noise_multipliers)
    return zcdp_epsilon(c, delta) if c > 0 else 0.0


def upcycled_output_epsilon_from_params(rounds: int, clip_norm: float, noise_std: float, dataset_size: int,
                                        delta: float) -> float:
    """Thm 6.2 as printed: c = M tau^2 / (2 sigma^2 |D_i|^2), epsilon = c + 2 sqrt(c log(1/delta))."""
    c = rounds * clip_norm**2 / (2 * noise_std**2 * dataset_size**2)
    return zcdp_epsilon(c, delta)


def thm63_holds(u2: float, mu: float, dataset_size: int) -> bool:
    """Upcycled-FL Thm 6.3's condition on a client: u2 <= 0.5 |D_i| mu."""
    return u2 <= 0.5 * dataset_size * mu


def upcycled_objective_epsilon(alphas: Sequence[float], u1: float, u2: float, mu: float, dataset_size: int) -> float:
    """Upcycled-FL Thm 6.3: sum over releases of (2 alpha_m u1 mu + 2.8 u2) / (|D_i| mu),
    pure DP. (The theorem sums m = 0..M, i.e. M+1 releases; pass one alpha per
    actual release.) Requires u2 <= 0.5 |D_i| mu."""
    n = int(dataset_size)
    if n <= 0 or mu <= 0:
        raise ValueError("objective perturbation needs |D_i| > 0 and mu > 0")
    if not thm63_holds(u2, mu, n):
        raise ValueError(f"Thm 6.3 needs u2 <= 0.5 |D_i| mu; got u2={u2}, |D_i|={n}, mu={mu}")
    return sum(2 * a * u1 / n + 2.8 * u2 / n / mu for a in alphas)  # divided first: no product overflows


def hu_rho(participations: int, local_steps: int, clip_norm: float, dataset_size: int, batch_size: int,
           noise_std: float, clients_per_round: int = 1) -> float:
    """Hu et al. 2021, Thm 1: rho_i = 2 C_i tau G^2 / (r m gamma sigma^2), replace-one
    relation. `clients_per_round` r > 1 is the secure-aggregation gain of the
    paper (other clients' noise counted); r = 1 is the same analysis without
    secure aggregation. Assumes m/gamma divides tau (whole local epochs)."""
    return 2.0 * participations * local_steps * clip_norm**2 / (
        clients_per_round * dataset_size * batch_size * noise_std**2
    )


def hu_epsilon(participations: int, local_steps: int, clip_norm: float, dataset_size: int, batch_size: int,
               noise_std: float, delta: float, clients_per_round: int = 1) -> float:
    """Hu et al. 2021, Eq. (10): epsilon_i = rho_i + 2 sqrt(rho_i log(1/delta))."""
    rho = hu_rho(participations, local_steps, clip_norm, dataset_size, batch_size, noise_std, clients_per_round)
    return zcdp_epsilon(rho, delta)


def ali_epsilon(steps: int, sample_rate: float, noise_multiplier: float, delta: float) -> float:
    """ALI-DPFL Thm 2 / Eq. 12, corrected: epsilon_T = min over integer orders a of
    T log(A_a)/(a-1) + log(1/delta)/(a-1), A_a from Eq. 15 (dp-accounting's
    sampled-Gaussian RDP at integer orders), orders 2..63, 128, 256, 512."""
    return dpsgd_epsilon(sample_rate, noise_multiplier, steps, delta, conversion="classic", orders="integer")


def ali_max_steps(target_epsilon: float, delta: float, sample_rate: float, noise_multiplier: float,
                  search: str = "ali-code") -> int:
    """R_c as ALI-DPFL computes it (integer orders, classic conversion); `search`
    'ali-code' reproduces the paper's numbers, 'exact' gives epsilon(R_c) <= target."""
    return max_steps(target_epsilon, delta, sample_rate, noise_multiplier, conversion="classic",
                     orders="integer", search=search)


def fedlap_epsilon(rounds: int, steps_per_round: int, sample_rate: float, noise_multiplier: float, delta: float,
                   client_selection_rate: float = 1.0) -> float:
    """FedLAP-DP Thm 5.8: min_a [M xi(a|q1) + M(T-1) xi(a|q2) + log((a-1)/a) - (log delta + log a)/(a-1)]
    with q1 = C_sel * q, q2 = q, FedLAP's orders and the Balle et al. conversion."""
    q1 = client_selection_rate * sample_rate
    event = dpa.ComposedDpEvent([
        dpsgd_event(q1, noise_multiplier, rounds),
        dpsgd_event(sample_rate, noise_multiplier, rounds * (steps_per_round - 1)),
    ])
    return epsilon(event, delta, conversion="balle", orders="fedlap")
