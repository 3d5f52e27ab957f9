"""What every dataset loader returns: per-client train/test arrays plus the
pooled test set the server evaluates on."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class ClientData:
    x_train: np.ndarray  # float32, shape (n, *input_shape)
    y_train: np.ndarray  # int64, shape (n,)
    x_test: np.ndarray  # the client's own test split; may have 0 rows
    y_test: np.ndarray

    @property
    def num_train(self) -> int:
        return len(self.y_train)


@dataclass(frozen=True)
class Federation:
    clients: list[ClientData]
    x_test: np.ndarray  # pooled test set for central evaluation
    y_test: np.ndarray
    input_shape: tuple[int, ...]
    num_classes: int
    description: str = ""
    meta: dict = field(default_factory=dict)

    @property
    def num_clients(self) -> int:
        return len(self.clients)
