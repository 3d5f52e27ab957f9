"""The Synthetic(alpha, beta) federations released with Upcycled-FL, with their exact clients.

Files: `<data-dir>/fedprox-synthetic/syn_{iid,0_0,0.5_0.5,1_1}.npz` (see
`data/README.md`), each with arrays x_train (n, 20) float64, y_train (n,) int64,
client_train (n,) int64 in 0..29, and x_test, y_test, client_test for every
client's own 10% test split.

Client k of the federation is owner value k (the `natural` partition), with
its samples in file order; the pooled test set is the file's x_test/y_test in
file order. Features are cast to float32 like every other dataset (a relative
change below 6e-8; the paper's models train in float32 anyway). There are
always 30 clients, 20 features and 2 classes, finite features; anything else
(or a file that is not a readable .npz) raises DataFileCorrupt, a ValueError.
"""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

import numpy as np

from .errors import DataFileCorrupt, require_file
from .federation import ClientData, Federation
from .partition import natural
from .provenance import file_records

FOLDER = "fedprox-synthetic"
FILES = {
    "syn-iid": "syn_iid.npz",
    "syn-0-0": "syn_0_0.npz",
    "syn-0.5-0.5": "syn_0.5_0.5.npz",
    "syn-1-1": "syn_1_1.npz",
}
NUM_CLIENTS, NUM_FEATURES, NUM_CLASSES = 30, 20, 2
ARRAYS = ("x_train", "y_train", "client_train", "x_test", "y_test", "client_test")
_HINT = ("These files are the Upcycled-FL authors' released Synthetic federations converted to "
         ".npz (the shared data folder's README.md, section 4); they cannot be downloaded by privfed. Copy the "
         "fedprox-synthetic/ folder from a machine that has it, or use dataset = \"synthetic\" "
         "to generate a federation from a seed.")


def load_released(name: str, data_dir: str | Path) -> Federation:
    """Load released federation `name` ("syn-iid", "syn-0-0", "syn-0.5-0.5" or "syn-1-1")."""
    if name not in FILES:
        raise ValueError(f"unknown released federation {name!r}; expected one of {list(FILES)}")
    path = require_file(Path(data_dir) / FOLDER / FILES[name], name, hint=_HINT)
    fix = "Copy the fedprox-synthetic/ folder again from a machine that has an intact one."

    def bad(problem: str) -> DataFileCorrupt:
        return DataFileCorrupt(path, name, problem, hint=fix)

    try:
        d = np.load(path, allow_pickle=False)
        if not isinstance(d, np.lib.npyio.NpzFile):  # a lone .npy array
            raise ValueError("a single .npy array, not an .npz archive")
        with d:
            files = list(d.files)
            a = {k: d[k] for k in ARRAYS if k in files}
    except (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error) as e:  # truncated, not an npz, bad CRC
        raise bad(f"cannot read it as .npz ({type(e).__name__}: {e})") from None
    missing = [k for k in ARRAYS if k not in a]
    if missing:
        raise bad(f"missing arrays {missing}; has {sorted(files)}")
    for part in ("train", "test"):
        x, y, owner = a[f"x_{part}"], a[f"y_{part}"], a[f"client_{part}"]
        for key, array, kinds in ((f"x_{part}", x, "fiu"), (f"y_{part}", y, "iu"), (f"client_{part}", owner, "iu")):
            if array.dtype.kind not in kinds:  # text would fail obscurely, complex lose its imaginary part
                raise bad(f"{key} has dtype {array.dtype}; expected {'real numbers' if 'f' in kinds else 'integers'}")
        if x.ndim != 2 or x.shape[1] != NUM_FEATURES or y.ndim != 1 or owner.ndim != 1 \
                or not (len(x) == len(y) == len(owner)):
            raise bad(f"{part} arrays have shapes {x.shape}, {y.shape}, {owner.shape}; "
                      f"expected (n, {NUM_FEATURES}), (n,), (n,)")
        if set(np.unique(owner).tolist()) != set(range(NUM_CLIENTS)):
            raise bad(f"client_{part} must hold every client id 0..{NUM_CLIENTS - 1}")
        if not set(np.unique(y).tolist()) <= set(range(NUM_CLASSES)):
            raise bad(f"y_{part} has labels outside 0..{NUM_CLASSES - 1}")
        finite = np.isfinite(x.astype(np.float32))  # the clients' dtype: 1e300 is finite only in float64
        if not finite.all():
            raise bad(f"x_{part} has {int(np.size(x) - finite.sum())} NaN or infinite values (as float32)")

    x_train, y_train = a["x_train"].astype(np.float32), a["y_train"].astype(np.int64)
    x_test, y_test = a["x_test"].astype(np.float32), a["y_test"].astype(np.int64)
    train_parts, test_parts = natural(a["client_train"]), natural(a["client_test"])
    clients = [
        ClientData(x_train[tr], y_train[tr], x_test[te], y_test[te])
        for tr, te in zip(train_parts, test_parts)
    ]
    return Federation(
        clients=clients,
        x_test=x_test,
        y_test=y_test,
        input_shape=(NUM_FEATURES,),
        num_classes=NUM_CLASSES,
        description=f"released Upcycled-FL federation {name} ({path.name}): {NUM_CLIENTS} clients, "
                    f"{len(y_train)} train + {len(y_test)} test samples",
        meta={"dataset": name, "file": str(path), "partition": "natural", "files": file_records([path])},
    )
