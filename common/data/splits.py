"""What a dataset reader returns: the dataset's own train and test splits."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Splits:
    x_train: np.ndarray  # float32, shape (n_train, *input_shape)
    y_train: np.ndarray  # int64, shape (n_train,)
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    name: str
    meta: dict = field(default_factory=dict)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])
