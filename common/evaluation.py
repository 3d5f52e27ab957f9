"""Loss and accuracy of a model on arrays (used by the server and clients)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


@torch.no_grad()
def evaluate(model: torch.nn.Module, x: np.ndarray, y: np.ndarray, device: torch.device,
             batch_size: int = 1024) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of `model` on (x, y); (nan, nan) if empty."""
    if len(y) == 0:
        return float("nan"), float("nan")
    model.eval()
    total_loss, correct = 0.0, 0
    for start in range(0, len(y), batch_size):
        xb = torch.as_tensor(x[start:start + batch_size], device=device)
        yb = torch.as_tensor(y[start:start + batch_size], device=device)
        logits = model(xb)
        if torch.isnan(logits).any():  # a diverged model: argmax would pick class 0 and score its rate
            return float("nan"), float("nan")
        total_loss += F.cross_entropy(logits, yb, reduction="sum").item()
        correct += (logits.argmax(dim=1) == yb).sum().item()
    return total_loss / len(y), correct / len(y)


def pick_device(name: str) -> torch.device:
    """`auto` -> cuda if available, else mps, else cpu; an unavailable explicit choice is an error."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device = 'cuda' but this machine has no usable CUDA device (torch.cuda.is_available() is False)")
    if name == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise RuntimeError("device = 'mps' but MPS is not available on this machine")
    return torch.device(name)
