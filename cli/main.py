"""The `privfed` command: one sub-command module each, registered here."""

from __future__ import annotations

import argparse
import os
import signal
import sys

# Each module defines register(subparsers) and sets `func` on its parsers.
SUBCOMMANDS = ("cli.run", "cli.repro", "cli.report", "cli.data", "cli.privacy")
DESCRIPTION = ("privfed: differentially private federated learning on Flower. Run presets, reproduction "
               "suites and reports; download datasets; compute privacy budgets. `privfed COMMAND --help` "
               "for each command.")


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(prog="privfed", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that every cleanup runs (worker pools, Flower's processes, temp
    folders): Python's default for SIGTERM is to die at once and leave them running."""


def _terminate(_signum, _frame) -> None:
    raise Terminated


def entry() -> int:
    """`privfed` on a terminal or a pipe: a reader that stops early (`| head`) ends it quietly."""
    signal.signal(signal.SIGTERM, _terminate)
    try:
        return main()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at interpreter exit
        return 1
    except KeyboardInterrupt as stop:  # every round written so far is kept (and a checkpointed run resumes)
        how = "terminated" if isinstance(stop, Terminated) else "interrupted"
        print(f"privfed: {how}; what was written before is kept", file=sys.stderr)
        return 128 + (signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)


if __name__ == "__main__":
    sys.exit(entry())
