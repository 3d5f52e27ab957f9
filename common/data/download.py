"""Explicit, user-requested download of dataset files into the layout the readers use.

Nothing in privfed calls this on its own: readers raise `DataFileMissing`
when a file is absent, and only a user's explicit request (the
`privfed data download` command, or calling `download` directly) fetches
anything.

- mnist, fashion-mnist, cifar10: through torchvision (`pip install
  'privfed[vision]'`), which checks the publishers' MD5 digests. torchvision
  is imported inside `download`, never at module import time.
- adult: the three UCI files over HTTPS with the standard library, checked
  against their published SHA-256 digests.

Resulting layout (what `common.data.idx`, `.cifar` and `.adult` read):

    <data-dir>/mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz
    <data-dir>/fashion-mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz
    <data-dir>/cifar-10-batches-py/data_batch_1..5, test_batch, batches.meta
    <data-dir>/adult/adult.data, adult.test, adult.names

The released Synthetic federations (syn-*) cannot be downloaded.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import urllib.request
from pathlib import Path

from common.durable import write_atomically

from .idx import FILES as IDX_FILES
from .provenance import PUBLISHED_SHA256

DATASETS = ("mnist", "fashion-mnist", "cifar10", "adult")

ADULT_URL = "https://archive.ics.uci.edu/ml/machine-learning-databases/adult/"
ADULT_SHA256 = {name: PUBLISHED_SHA256[f"adult/{name}"] for name in ("adult.data", "adult.test", "adult.names")}


def _present(dataset: str, data_dir: Path) -> bool:
    if dataset in ("mnist", "fashion-mnist"):
        return all((data_dir / dataset / f"{stem}.gz").is_file() for stem in IDX_FILES.values())
    if dataset == "cifar10":
        folder = data_dir / "cifar-10-batches-py"
        return all((folder / f).is_file() for f in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"])
    return all((data_dir / "adult" / f).is_file() for f in ADULT_SHA256)


def _torchvision():
    try:
        import torchvision.datasets as tvd  # noqa: PLC0415 (deliberately lazy)
    except ImportError as e:  # not installed, or a CUDA build next to CPU torch
        raise ImportError(
            f"downloading this dataset needs torchvision, which could not be imported ({e}). "
            "Install it with: pip install 'privfed[vision]'"
        ) from e
    return tvd


def _fetch_adult(target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for name, digest in ADULT_SHA256.items():
        try:
            with urllib.request.urlopen(ADULT_URL + name, timeout=60) as resp:  # noqa: S310 (fixed https URL)
                body = resp.read()
        except OSError as err:  # URLError, timeouts: say what could not be fetched, from where
            raise OSError(f"cannot download adult ({ADULT_URL + name}): {getattr(err, 'reason', err)}") from err
        got = hashlib.sha256(body).hexdigest()
        if got != digest:
            raise OSError(f"{ADULT_URL + name}: SHA-256 {got} does not match the published {digest}; not saved")
        # whole or not at all: an interrupted download never leaves a cut file that `_present` would count
        write_atomically(target / name, lambda fh: fh.write(body))


def download(dataset: str, data_dir: str | Path, force: bool = False) -> Path:
    """Fetch `dataset`'s files into `data_dir` (the layout above) and return its folder.

    Files already present are kept unless `force` is true. Needs a network;
    for mnist/fashion-mnist/cifar10 also torchvision.
    """
    if dataset not in DATASETS:
        raise ValueError(
            f"cannot download {dataset!r}: downloadable datasets are {', '.join(DATASETS)} "
            "(the released syn-* federations must be copied by hand; 'synthetic' needs no files)"
        )
    data_dir = Path(data_dir).expanduser().resolve()
    folder = data_dir / ("cifar-10-batches-py" if dataset == "cifar10" else dataset)
    if _present(dataset, data_dir) and not force:
        return folder
    data_dir.mkdir(parents=True, exist_ok=True)
    if dataset == "adult":
        _fetch_adult(folder)
        return folder

    tvd = _torchvision()
    try:
        _fetch_with_torchvision(tvd, dataset, data_dir, folder)
    except RuntimeError as err:  # torchvision's "Error downloading ..." (no network) or a failed MD5 check
        raise OSError(f"cannot download {dataset}: {err}") from err
    return folder


def _fetch_with_torchvision(tvd, dataset: str, data_dir: Path, folder: Path) -> None:
    with tempfile.TemporaryDirectory(dir=data_dir, prefix=".download-") as tmp:
        tmp = Path(tmp)
        if dataset in ("mnist", "fashion-mnist"):
            cls = tvd.MNIST if dataset == "mnist" else tvd.FashionMNIST
            cls(root=str(tmp), train=True, download=True)
            cls(root=str(tmp), train=False, download=True)
            raw = tmp / cls.__name__ / "raw"
            folder.mkdir(parents=True, exist_ok=True)
            for stem in IDX_FILES.values():
                write_atomically(folder / f"{stem}.gz",
                                 lambda fh, src=raw / f"{stem}.gz": fh.write(src.read_bytes()))
        else:
            tvd.CIFAR10(root=str(tmp), train=True, download=True)
            if folder.exists():
                shutil.rmtree(folder)
            shutil.move(str(tmp / "cifar-10-batches-py"), str(folder))
