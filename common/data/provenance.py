"""Which data files a run read, and whether each is the file its publisher distributed.

The readers check a file's format and shapes, which a damaged or edited file
can still pass (a flipped label, an altered feature). So every reader also
records each file's SHA-256 and compares it with the digest the publisher
distributed (for the released Synthetic federations: the files of the shared
data folder, whose `SHA256SUMS` lists them):

    {"file": "mnist/train-images-idx3-ubyte.gz", "sha256": "...", "published": true}

`published` is False for a file that differs from the publisher's, and None
where no digest is known (an already-decompressed idx file). CIFAR-10's
batch files are compared by the MD5s torchvision lists and checks for them
(the publisher's page gives only its archive's), and their record also
holds the MD5. A differing file is not refused: a user may mean to run on a
modified copy. The run says so in its log and records the digests in
`summary.json` (`data_files`), so results made on other data are never
mistaken for the published dataset's. `privfed data check` compares a whole
data folder.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

PUBLISHED_SHA256 = {
    "mnist/train-images-idx3-ubyte.gz": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    "mnist/train-labels-idx1-ubyte.gz": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    "mnist/t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "mnist/t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
    "fashion-mnist/train-images-idx3-ubyte.gz": "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
    "fashion-mnist/train-labels-idx1-ubyte.gz": "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
    "fashion-mnist/t10k-images-idx3-ubyte.gz": "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
    "fashion-mnist/t10k-labels-idx1-ubyte.gz": "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
    "adult/adult.data": "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d",
    "adult/adult.test": "a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05",
    "adult/adult.names": "c248284c0b5de30c9e1958d6cdd168a34a654758b620e68f46aefa83fc0a576a",
    "fedprox-synthetic/syn_iid.npz": "bcb44268a1b3eecd2d19e684265601fd5d73a3577b29a416680d69f8f8ba90ec",
    "fedprox-synthetic/syn_0_0.npz": "1f5977e331bdc741cc45c50f6b73a04f9753f4752931b6eb91f5f315fdf88a3f",
    "fedprox-synthetic/syn_0.5_0.5.npz": "846bce9d66ad13b40b134f79c3e0d2157017f120a8e0c8e1fdee2e8e5c70e91c",
    "fedprox-synthetic/syn_1_1.npz": "923ad2483908a73f2701e846039c9c70a4843c6c2fdb0e7957bc0481a4c4016e",
}


# CIFAR-10 python version: its batch files' MD5s, as torchvision lists and checks them (the publisher's page,
# www.cs.toronto.edu/~kriz/cifar.html, gives its archive's)
PUBLISHED_MD5 = {
    "cifar-10-batches-py/data_batch_1": "c99cafc152244af753f735de768cd75f",
    "cifar-10-batches-py/data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "cifar-10-batches-py/data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "cifar-10-batches-py/data_batch_4": "634d18415352ddfa80567beed471001a",
    "cifar-10-batches-py/data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "cifar-10-batches-py/test_batch": "40351d587109b95175f43aff81a1287e",
    "cifar-10-batches-py/batches.meta": "5ff9c542aee3614f3951f8cda6e48888",
}


@lru_cache(maxsize=64)
def _digest(path: str, algorithm: str, size: int, mtime_ns: int) -> str:
    """Keyed by size and modification time too: a file replaced during a session is hashed again."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, algorithm).hexdigest()


def digest(path: str | Path, algorithm: str = "sha256") -> str:
    stat = Path(path).stat()
    return _digest(str(Path(path).resolve()), algorithm, stat.st_size, stat.st_mtime_ns)


def file_record(path: str | Path) -> dict[str, Any]:
    """`path` (inside a dataset folder of the data folder) as the module docstring's record."""
    path = Path(path)
    name = f"{path.parent.name}/{path.name}"
    record: dict[str, Any] = {"file": name, "sha256": digest(path)}
    if name in PUBLISHED_MD5:
        record["md5"] = digest(path, "md5")
        return {**record, "published": record["md5"] == PUBLISHED_MD5[name]}
    published = PUBLISHED_SHA256.get(name)
    return {**record, "published": None if published is None else record["sha256"] == published}


def file_records(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    return [file_record(p) for p in paths]


def differing(records: Iterable[dict[str, Any]]) -> list[str]:
    """The log lines a run prints for files that are not their publisher's."""
    return [f"data: {r['file']} is not the published file (its SHA-256 is {r['sha256'][:16]}...): results are "
            "not comparable with runs on the published dataset" for r in records if r["published"] is False]


def check_folder(data_dir: str | Path) -> list[dict[str, Any]]:
    """Every file with a published digest, as found under `data_dir` (`published` None: missing)."""
    out = []
    for name in [*PUBLISHED_SHA256, *PUBLISHED_MD5]:
        path = Path(data_dir) / name
        out.append(file_record(path) if path.is_file() else {"file": name, "sha256": None, "published": None})
    return out
