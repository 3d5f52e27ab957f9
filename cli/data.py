"""`privfed data download DATASET [--data-dir DIR] [--force]`: fetch a dataset's files.

The only way privfed downloads anything: runs never do (a missing file stops
them with `DataFileMissing`). DIR defaults to $PRIVFED_DATA_DIR, else ./data.
mnist, fashion-mnist and cifar10 need torchvision (`pip install 'privfed[vision]'`).
"""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    from common.data.download import DATASETS

    parser = subparsers.add_parser("data", help="datasets: explicit download", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])
    sub = parser.add_subparsers(dest="data_command")
    p = sub.add_parser("download", help="download a dataset into the data folder")
    p.add_argument("dataset", choices=DATASETS, help="dataset to fetch")
    p.add_argument("--data-dir", default="", help="data folder (default: $PRIVFED_DATA_DIR, else ./data)")
    p.add_argument("--force", action="store_true", help="fetch again even if the files are present")
    p.set_defaults(func=_download)


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
