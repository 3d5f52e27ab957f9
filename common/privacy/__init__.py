"""Privacy core: mechanisms (pure tensor functions) and accounting (a per-client
ledger of dp-accounting events). No Flower here.

- `events`: ledger entries for each kind of release, with their neighbouring relation.
- `ledger`: `PrivacyLedger` -- record, persist (atomic JSON), epsilon(delta), budget checks.
- `accounting`: RDP / PLD epsilon, calibration of sigma and R_c, the papers' closed forms.
- `mechanisms`: clipping, output perturbation, objective-perturbation noise (torch).
- `dpsgd`: DP-SGD local training through Opacus (torch + opacus).

The torch-based modules are not imported here, so the accountant and the CLI
load without torch.
"""

from common.privacy.accounting import (
    calibrate_noise_multiplier,
    dpsgd_epsilon,
    max_steps,
)
from common.privacy.events import (
    LedgerEntry,
    dpsgd_steps,
    gaussian_release,
    objective_perturbation_release,
    output_perturbation_release,
    post_processing,
    pure_dp_release,
    zcdp_release,
)
from common.privacy.ledger import EpsilonReport, PrivacyLedger

__all__ = [
    "EpsilonReport",
    "LedgerEntry",
    "PrivacyLedger",
    "calibrate_noise_multiplier",
    "dpsgd_epsilon",
    "dpsgd_steps",
    "gaussian_release",
    "max_steps",
    "objective_perturbation_release",
    "output_perturbation_release",
    "post_processing",
    "pure_dp_release",
    "zcdp_release",
]
