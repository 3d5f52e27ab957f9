"""Errors raised by the dataset readers."""

from __future__ import annotations

from pathlib import Path

# Datasets that `common.data.download.download` can fetch (see that module).
DOWNLOADABLE = ("mnist", "fashion-mnist", "cifar10", "adult")


class DataFileError(Exception):
    """A dataset file is missing or unusable: reported in one line (the message says what to do)."""


class DataFileMissing(DataFileError, FileNotFoundError):
    """A dataset file the run needs is not in the data folder.

    The message names the file and the folder, how to point privfed at another
    folder, and how to fetch the file where a network exists. privfed never
    downloads on its own.
    """

    def __init__(self, path: str | Path, dataset: str, hint: str = ""):
        path = Path(path)
        self.path = path
        self.dataset = dataset
        self.hint = hint
        lines = [
            f"{dataset}: data file {path.name!r} not found in folder {str(path.parent)!r} "
            f"(looked for {str(path)!r}).",
            "Set the data folder with the `data-dir` run-config key (privfed run: --set "
            "data-dir=/abs/path/to/data; flwr run: --run-config 'data-dir=\"/abs/path/to/data\"') or "
            "the $PRIVFED_DATA_DIR environment variable (under flwr run: in the SuperLink's and "
            "SuperNodes' environment); the dataset's files go in a sub-folder of it.",
        ]
        if hint:
            lines.append(hint)
        elif dataset in DOWNLOADABLE:
            extra = "pip install 'privfed[vision]'" if dataset != "adult" else "no extra needed"
            lines.append(
                "privfed never downloads on its own. Where a network exists, fetch it explicitly: "
                f"{extra}, then `privfed data download {dataset} --data-dir <data-dir>` "
                f"(Python: common.data.download.download({dataset!r}, data_dir))."
            )
        self.message = " ".join(lines)
        super().__init__(self.message)
        self.filename = str(path)  # as for any FileNotFoundError

    def __reduce__(self):  # picklable across processes (Ray, multiprocessing)
        return (type(self), (self.path, self.dataset, self.hint))

    def __str__(self) -> str:  # OSError would print "[Errno None] ..." once filename is set
        return self.message


class DataFileCorrupt(DataFileError, ValueError):
    """A dataset file is there but damaged or not the expected file (truncated,
    not the format, labels out of range, non-finite values). A ValueError, as
    the readers raised before."""

    def __init__(self, path: str | Path, dataset: str, problem: str, hint: str = ""):
        path = Path(path)
        self.path, self.dataset, self.problem, self.hint = path, dataset, problem, hint
        fix = hint or ("Replace it with an intact copy"
                       + (f" (where a network exists: `privfed data download {dataset} --force "
                          f"--data-dir <data-dir>`)." if dataset in DOWNLOADABLE else "."))
        self.message = f"{dataset}: data file {str(path)!r} is damaged or not the expected file: {problem}. {fix}"
        super().__init__(self.message)

    def __reduce__(self):  # picklable across processes (Ray, multiprocessing)
        return (type(self), (self.path, self.dataset, self.problem, self.hint))


def require_file(path: Path, dataset: str, hint: str = "") -> Path:
    """Return `path` if it is a file, else raise DataFileMissing."""
    if not path.is_file():
        raise DataFileMissing(path, dataset, hint)
    return path
