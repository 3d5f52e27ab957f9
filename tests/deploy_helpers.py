"""Process helpers shared by the deployment tests (test_deploy_*.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

BIN = Path(sys.executable).parent  # flwr, flower-superlink, ... of this venv


def offline_env(**extra: str) -> dict[str, str]:
    """This process's environment with the venv's tools first on PATH and Flower kept offline."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(FLWR_DISABLE_UPDATE_CHECK="1", FLWR_TELEMETRY_ENABLED="0",
               FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")
    env.update(extra)
    return env


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie of ours counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False
