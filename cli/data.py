"""`privfed data download DATASET [--data-dir DIR] [--force]`: fetch a dataset's files.
`privfed data check [--data-dir DIR]`: is each file the one its publisher distributed?

The only way privfed downloads anything: runs never do (a missing file stops
them with `DataFileMissing`). DIR defaults to $PRIVFED_DATA_DIR, else ./data. `check` compares every file
with its publisher's digest (SHA-256; CIFAR-10's batches: MD5; common/data/provenance.py) and exits 1 if
one differs.
mnist, fashion-mnist and cifar10 need torchvision (`pip install 'privfed[vision]'`).
"""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    from common.data.download import DATASETS

    parser = subparsers.add_parser("data", help="datasets: explicit download, digest check", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])
    sub = parser.add_subparsers(dest="data_command")
    p = sub.add_parser("download", help="download a dataset into the data folder")
    p.add_argument("dataset", choices=DATASETS, help="dataset to fetch")
    p.add_argument("--data-dir", default="", help="data folder (default: $PRIVFED_DATA_DIR, else ./data)")
    p.add_argument("--force", action="store_true", help="fetch again even if the files are present")
    p.set_defaults(func=_download)
    c = sub.add_parser("check", help="compare the data folder's files with their publishers' digests "
                                     "(SHA-256; CIFAR-10's batches: MD5)")
    c.add_argument("--data-dir", default="", help="data folder (default: $PRIVFED_DATA_DIR, else ./data)")
    c.set_defaults(func=_check)


def _download(args: argparse.Namespace) -> int:
    from common.config import resolve_data_dir
    from common.data.download import download

    data_dir = resolve_data_dir({"data-dir": args.data_dir})
    try:
        folder = download(args.dataset, data_dir, force=args.force)
    except (ImportError, ValueError, OSError) as err:
        print(f"privfed data: error: {err}", file=sys.stderr)
        return 2
    print(f"privfed: {args.dataset} in {folder}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from common.config import resolve_data_dir
    from common.data.provenance import check_folder

    data_dir = resolve_data_dir({"data-dir": args.data_dir})
    if not data_dir.is_dir():
        print(f"privfed data: error: {data_dir} is not a folder (set --data-dir or $PRIVFED_DATA_DIR)", file=sys.stderr)
        return 2
    try:
        found = check_folder(data_dir)
    except OSError as err:
        print(f"privfed data: error: {err}", file=sys.stderr)
        return 2
    status = {True: "ok", False: "DIFFERS from the published file", None: "missing"}
    for record in found:
        print(f"{record['file']:44s} {status[record['published']]}")
    differ = sum(r["published"] is False for r in found)
    present = sum(r["sha256"] is not None for r in found)
    print(f"privfed: {present} of {len(found)} known files in {data_dir}; {differ} differ")
    return 1 if differ else 0
