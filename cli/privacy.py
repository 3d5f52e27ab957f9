"""`privfed privacy`: a privacy calculator for DP-SGD (Poisson-sampled Gaussian steps).

    privfed privacy epsilon --q Q --sigma S --steps T --delta D [--accountant rdp|pld]
    privfed privacy sigma   --epsilon E --delta D --q Q --steps T
    privfed privacy steps   --epsilon E --delta D --q Q --sigma S
    privfed privacy ledger  PATH --delta D

The calculator's guarantees are record-level (epsilon, delta)-DP for one
client's data under add/remove-one neighbours; `ledger` states each entry's own
relation (objective perturbation and Hu et al.'s entries: replace-one). `--conversion` picks the RDP -> DP conversion
(classic: Mironov 2017; balle: Balle et al. 2020, tighter), `--orders` the RDP
order grid; `--json` prints one JSON object instead of text.
"""

from __future__ import annotations

import argparse
import json
import math
import sys


def _finite(text: str) -> float:
    """A float flag: nan and inf would reach the accountant and come back as a nonsense answer."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def _common() -> argparse.ArgumentParser:
    from common.privacy.accounting import ACCOUNTANTS, CONVERSIONS, DEFAULT_ORDERS, ORDER_SETS

    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--delta", type=_finite, required=True, help="target delta")
    p.add_argument("--accountant", choices=ACCOUNTANTS, default="rdp", help="rdp (default) or pld")
    p.add_argument("--conversion", choices=CONVERSIONS,
                   help="RDP -> (epsilon, delta) conversion (default balle; rdp only)")
    p.add_argument("--orders", choices=tuple(ORDER_SETS),
                   help=f"RDP order grid (default {DEFAULT_ORDERS}; 'integer' = ALI-DPFL's 2..63,128,256,512; "
                        "rdp only)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def register(subparsers: argparse._SubParsersAction) -> None:
    from common.privacy.ledger import PAPER_ACCOUNTANTS

    parser = subparsers.add_parser("privacy", help="privacy calculator: epsilon, sigma, steps, ledgers",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])
    sub = parser.add_subparsers(dest="privacy_command")
    common = _common()

    p = sub.add_parser("epsilon", parents=[common], help="epsilon after T Poisson-sampled Gaussian steps")
    p.add_argument("--q", type=_finite, required=True, help="Poisson sampling rate")
    p.add_argument("--sigma", type=_finite, required=True, help="noise multiplier (noise std / clipping norm)")
    p.add_argument("--steps", type=int, required=True, help="number of DP-SGD steps")
    p.set_defaults(func=_run_epsilon)

    p = sub.add_parser("sigma", parents=[common], help="smallest noise multiplier reaching a target epsilon")
    p.add_argument("--epsilon", type=_finite, required=True, help="target epsilon")
    p.add_argument("--q", type=_finite, required=True, help="Poisson sampling rate")
    p.add_argument("--steps", type=int, required=True, help="number of DP-SGD steps")
    p.add_argument("--tol", type=_finite, default=1e-4, help="bisection tolerance on sigma (default 1e-4)")
    p.set_defaults(func=_run_sigma)

    p = sub.add_parser("steps", parents=[common], help="R_c: the most steps with epsilon <= target")
    p.add_argument("--epsilon", type=_finite, required=True, help="target epsilon")
    p.add_argument("--q", type=_finite, required=True, help="Poisson sampling rate")
    p.add_argument("--sigma", type=_finite, required=True, help="noise multiplier")
    p.add_argument("--search", choices=("exact", "ali-code"), default="exact",
                   help="exact integer search (default) or the ALI-DPFL authors' tolerance bisection")
    p.set_defaults(func=_run_steps)

    p = sub.add_parser("ledger", help="report a saved privacy ledger")
    p.add_argument("path", help="a ledger file (*.ledger.json: JSON Lines, or a version-1 JSON object)")
    p.add_argument("--delta", type=_finite, required=True, help="target delta")
    p.add_argument("--accountant", choices=("rdp", "pld", *PAPER_ACCOUNTANTS), default="rdp",
                   help="rdp, pld or a paper accountant (upcycled-thm6.2, hu-thm1, ali-eq12, fedlap-thm5.8)")
    p.add_argument("--conversion", choices=("classic", "balle"),
                   help="RDP -> (epsilon, delta) conversion of the RDP figure (default balle)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_run_ledger)


# What the calculator's (epsilon, delta) statements are about (common.privacy.accounting.dpsgd_event).
RELATION, SAMPLING = "add-remove", "poisson"


def _emit(args: argparse.Namespace, key: str, value: float | int, text: str) -> int:
    if args.json:
        print(json.dumps({key: value, "delta": args.delta, "relation": RELATION, "sampling": SAMPLING,
                          "accountant": args.accountant,
                          "conversion": args.conversion if args.accountant == "rdp" else None,
                          "orders": args.orders if args.accountant == "rdp" else None}))
    else:
        print(text)
    return 0


def _fail(err: Exception | str) -> int:
    print(f"privfed privacy: error: {err}", file=sys.stderr)
    return 2


def _rdp_options(args: argparse.Namespace) -> str | None:
    """Fill in --conversion and --orders for the RDP accountant; the error if given for PLD (which has
    neither, so the answer would silently not be what was asked)."""
    from common.privacy.accounting import DEFAULT_ORDERS

    if args.accountant != "rdp":
        given = [flag for flag, value in (("--conversion", args.conversion), ("--orders", args.orders)) if value]
        verb = "apply" if len(given) > 1 else "applies"
        return f"{' and '.join(given)} {verb} to --accountant rdp only (PLD has neither)" if given else None
    args.conversion, args.orders = args.conversion or "balle", args.orders or DEFAULT_ORDERS
    return None


def _how(args: argparse.Namespace) -> str:
    guarantee = "Poisson sampling, record-level DP under add/remove-one neighbours"
    if args.accountant == "pld":
        return f"{guarantee}; PLD accountant"
    return f"{guarantee}; RDP accountant, {args.conversion} conversion, {args.orders} orders"


def _run_epsilon(args: argparse.Namespace) -> int:
    from common.privacy import accounting

    if problem := _rdp_options(args):
        return _fail(problem)
    if args.steps < 0:  # the accountant would compose a negative count into epsilon 0
        return _fail(f"--steps must be >= 0; got {args.steps}")
    try:
        eps = accounting.dpsgd_epsilon(args.q, args.sigma, args.steps, args.delta, accountant=args.accountant,
                                       conversion=args.conversion, orders=args.orders)
    except ValueError as err:
        return _fail(err)
    return _emit(args, "epsilon", eps,
                 f"epsilon = {eps:.4f} at delta = {args.delta:g} after {args.steps} steps "
                 f"(q = {args.q:g}, sigma = {args.sigma:g}; {_how(args)})")


def _run_sigma(args: argparse.Namespace) -> int:
    from common.privacy import accounting

    if problem := _rdp_options(args):
        return _fail(problem)
    try:
        sigma = accounting.calibrate_noise_multiplier(args.epsilon, args.delta, args.q, args.steps,
                                                      accountant=args.accountant, conversion=args.conversion,
                                                      orders=args.orders, tol=args.tol)
    except ValueError as err:
        return _fail(err)
    digits = max(4, math.ceil(-math.log10(args.tol)))  # what the grid holds: fewer digits could round below it
    return _emit(args, "sigma", sigma,
                 f"sigma = {sigma:.{digits}f}: the smallest noise multiplier with epsilon <= {args.epsilon:g} at "
                 f"delta = {args.delta:g} after {args.steps} steps (q = {args.q:g}; {_how(args)})")


def _run_steps(args: argparse.Namespace) -> int:
    from common.privacy import accounting

    if problem := _rdp_options(args):
        return _fail(problem)
    try:
        steps = accounting.max_steps(args.epsilon, args.delta, args.q, args.sigma, accountant=args.accountant,
                                     conversion=args.conversion, orders=args.orders, search=args.search)
    except ValueError as err:
        return _fail(err)
    note = " (ALI-DPFL code's search: epsilon may exceed the target by 0.01)" if args.search == "ali-code" else ""
    return _emit(args, "steps", steps,
                 f"R_c = {steps} steps: the most with epsilon <= {args.epsilon:g} at delta = {args.delta:g} "
                 f"(q = {args.q:g}, sigma = {args.sigma:g}; {_how(args)}){note}")


def _run_ledger(args: argparse.Namespace) -> int:
    from common.privacy.ledger import PrivacyLedger

    if not 0 < args.delta < 1:  # before reading: each accountant line would only say n/a
        return _fail(f"delta must be in (0, 1), got {args.delta:g}")
    shows_rdp = args.accountant == "rdp" or (args.accountant == "pld" and not args.json)  # text: rdp and pld
    if args.conversion and not shows_rdp:  # it would silently change nothing printed
        return _fail(f"--conversion applies to an RDP figure, which --accountant {args.accountant}"
                     f"{' --json' if args.json else ''} does not print")
    args.conversion = args.conversion or "balle"
    try:
        ledger = PrivacyLedger.load(args.path)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return _fail(f"cannot read ledger {args.path}: {err}")
    try:
        if args.json:
            report = ledger.report(args.delta, args.accountant, conversion=args.conversion)
            print(json.dumps({**report.to_json(), "relations": sorted(ledger.relations()),
                              "sampling": ledger.sampling(),
                              "assumptions": sorted(ledger.assumptions())}))
            return 0
        accountants = ["rdp", "pld"] if args.accountant in ("rdp", "pld") else [args.accountant]
        for line in ledger.summary_lines(args.delta, accountants, args.conversion):
            print(line)
    except (ValueError, KeyError) as err:
        return _fail(err)
    return 0
