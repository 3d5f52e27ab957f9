import logging
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

for key, value in {"FLWR_DISABLE_UPDATE_CHECK": "1", "FLWR_TELEMETRY_ENABLED": "0",
                   "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}.items():
    os.environ.setdefault(key, value)
logging.getLogger("flwr").setLevel(logging.WARNING)


def data_dir_or_skip(*parts: str) -> Path:
    """The shared data folder (or $PRIVFED_DATA_DIR) if it holds `parts`; else skip (never download)."""
    base = Path(os.environ.get("PRIVFED_DATA_DIR", SHARED_DATA))
    if not (base.joinpath(*parts)).exists():
        pytest.skip(f"{base.joinpath(*parts)} not present (tests never download data)")
    return base


@pytest.fixture
def one_torch_thread():
    """torch with 1 intra-op thread (the in-process engine's default), restored after the test."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
