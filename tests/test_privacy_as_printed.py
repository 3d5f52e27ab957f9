"""Epsilon as printed: the calibrated sigma the calculator prints meets its target, and every console line
with an epsilon states its delta."""

import re

import pytest

from cli.main import main
from common.privacy import accounting as acc

DELTA = 1e-5


# --- calibration: the sigma the calculator prints must meet the target ------------------------------
# calibrate_noise_multiplier(0.5, 1e-5, q=0.01, T=1000) returned 2.58421..., which
# `privfed privacy sigma` prints as "sigma = 2.5842"; eps(2.5842) = 0.500003 > 0.5.
@pytest.mark.parametrize("target, q, steps", [(0.5, 0.01, 1000), (3.0, 0.01, 1000)])
def test_calibrated_sigma_as_printed_meets_the_target(capsys, target, q, steps):
    sigma = acc.calibrate_noise_multiplier(target, DELTA, q, steps)
    assert acc.dpsgd_epsilon(q, sigma, steps, DELTA) <= target
    assert acc.dpsgd_epsilon(q, float(f"{sigma:.4f}"), steps, DELTA) <= target  # tol 1e-4: rounded up
    assert acc.dpsgd_epsilon(q, sigma - 2e-4, steps, DELTA) > target  # still (nearly) the smallest
    rc = main(["privacy", "sigma", "--epsilon", str(target), "--delta", str(DELTA), "--q", str(q),
               "--steps", str(steps)])
    printed = float(re.match(r"sigma = ([0-9.]+)", capsys.readouterr().out).group(1))
    assert rc == 0 and acc.dpsgd_epsilon(q, printed, steps, DELTA) <= target


# --- every epsilon printed states its delta: the per-round console line ------------------------------
def test_round_lines_state_the_delta_of_their_epsilon(tmp_path):
    import io

    from rich.console import Console

    from common.config import validate
    from server.inprocess_grid import InProcessGrid
    from server.runner import run_federation

    config = validate({"num-clients": 2, "num-rounds": 2, "privacy": "dpsgd", "local-steps": 2,
                       "dp-sample-rate": 0.2, "dp-noise-multiplier": 1.0, "target-delta": 1e-6,
                       "results-dir": str(tmp_path), "run-name": "review-delta"})
    out = io.StringIO()
    with InProcessGrid("client.app:app", dict(config), 2, run_id=71) as grid:
        run_federation(grid, config, Console(file=out, width=400, highlight=False, soft_wrap=True))
    lines = [line for line in out.getvalue().splitlines() if "epsilon" in line]
    rounds = [line for line in lines if line.startswith("round")]
    assert len(rounds) == 2
    for line in lines:  # the round lines, the final line and the note
        assert "delta" in line and "1e-06" in line, line
