"""The client's privacy ledger and budget: the data owner decides.

Each node keeps one ledger per run and partition, as an append-only file in its
state directory (`state-dir` node or run config; else `$PRIVFED_STATE_DIR`; else
`<results-dir>/node-state`), so a restarted client process reopens the same
ledger, never a fresh one. `charge` is the only way to spend privacy: it
refuses an instruction whose entries would take epsilon past `target-epsilon`
and records the entries (appended and fsynced) before the update is released.

Several processes may serve the same partition (Flower's simulation hands any
node's message to any idle Ray actor), so the file, not an object in memory, is
the ledger: `charge` decides and records under an exclusive lock, on the ledger
reloaded from disk.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Iterator, Mapping

from flwr.app import Error, Message

from common.durable import write_atomically
from common.privacy.events import LedgerEntry
from common.privacy.ledger import PrivacyLedger

BUDGET_EXHAUSTED = 4001  # error code of a refused train instruction (Flower's own codes are < 100)
EARLIER_START = 4002  # error code of a refused enrollment (`report_and_fence`)
_charges = 0  # charges this process recorded: client/app.py releases a private reply only after one


def charges_recorded() -> int:
    return _charges


class BudgetExhausted(RuntimeError):
    """Carrying out the instruction would exceed this client's privacy budget."""


def state_dir(config: Mapping, node_config: Mapping) -> Path:
    chosen = (str(node_config.get("state-dir", "")) or str(config["state-dir"])
              or os.environ.get("PRIVFED_STATE_DIR", "") or str(Path(str(config["results-dir"])) / "node-state"))
    return Path(chosen).expanduser().resolve()


def ledger_path(config: Mapping, node_config: Mapping, run_id: int, partition: int) -> Path:
    # A resumable run (checkpoint = true, server/checkpoint.py) outlives Flower's run id: a restarted
    # ServerApp is a new Flower run, so its ledgers are keyed by the run-name and continue.
    if config.get("checkpoint") and config.get("run-name"):
        return state_dir(config, node_config) / f"name-{config['run-name']}" / f"partition-{partition}.ledger.json"
    return state_dir(config, node_config) / f"run-{run_id}" / f"partition-{partition}.ledger.json"


_open: dict[Path, PrivacyLedger] = {}  # this process's latest ledgers, brought up to date on each open
_OPEN_MAX = 256


def open_ledger(config: Mapping, node_config: Mapping, run_id: int, partition: int) -> PrivacyLedger:
    """The partition's ledger as on disk now. One this process opened before is reloaded (only what
    other processes appended since is read), not loaded whole again."""
    path = ledger_path(config, node_config, run_id, partition)
    owner = f"partition-{partition}"
    with file_lock(path):  # opening creates a missing file: never over another process's first record
        ledger = _open.get(path)
        if ledger is not None and path.exists():
            ledger.reload()
            if ledger.owner in ("", owner):
                return ledger
        ledger = _open[path] = PrivacyLedger.open(path, owner=owner)  # a missing file, or another owner's
        if len(_open) > _OPEN_MAX:
            del _open[next(iter(_open))]
        return ledger


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on the ledger file `path`, across processes. It locks a lock file beside it:
    a new (or version-1) ledger file is written whole and replaces the file, so a lock on that would
    not be held by the next."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, even on an exception
        yield


@contextlib.contextmanager
def locked(ledger: PrivacyLedger) -> Iterator[PrivacyLedger]:
    """`ledger` reloaded from its file under the file's lock, so a check and a record made inside see
    every other process's entries and lose none (a ledger without a file is yielded as it is)."""
    if ledger.path is None:
        yield ledger
        return
    with file_lock(ledger.path):
        ledger.reload()
        yield ledger


def _beside(path: Path, suffix: str) -> Path:
    """A file beside the ledger file `path`, named after it."""
    return path.with_name(path.name.removesuffix(".ledger.json") + suffix)


class LedgerOfAnotherStart(RuntimeError):
    """The run-name's ledger holds charges made under another start of the run (see `claim`)."""


def claim(ledger: PrivacyLedger, lineage: str) -> None:
    """Bind a resumable run's ledger to the start of the run that charges it (its lineage token,
    server/checkpoint.py), in `<ledger>.lineage` beside it. The ledger is keyed by the run-name, so a
    fresh start under a run-name already used (its checkpoint deleted) would otherwise find charges its
    server's mirror does not hold, and report an epsilon without them. A start that continues the run
    (a resume) has the same token; another start is refused while the ledger holds entries. A ledger
    written before these tags existed is claimed by the first start that presents a token."""
    if ledger.path is None:
        return
    tag = _beside(ledger.path, ".lineage")
    with locked(ledger):
        held = tag.read_text().strip() if tag.exists() else None
        if held == lineage:
            return
        if held is not None and ledger.entries:
            raise LedgerOfAnotherStart(
                f"this node's privacy ledger {ledger.path} holds {len(ledger.entries)} entries charged by an "
                f"earlier start of run-name {ledger.path.parent.name.removeprefix('name-')!r}; this start "
                "(a fresh one: its checkpoint is gone) would report an epsilon without them. Start afresh "
                "under another run-name")
        write_atomically(tag, lambda f: f.write(lineage.encode()))


class StaleInstruction(RuntimeError):
    """A train instruction of a server start that a later start of the same run has replaced."""


class EarlierStart(RuntimeError):
    """An enrollment the fence refuses (`report_and_fence`): of a server start that began before the one the
    fence holds, or one whose start time is far ahead of this node's clock."""


SERVER_STARTED = "server-started"  # enrollment-query key: when the enrolling server start enrolled (ns)
CLOCK_AHEAD_LIMIT_NS = 3600 * 10**9  # a start this far ahead of the node's clock would lock the fence: refused


def report_and_fence(path: Path, server_run: int, started: int | None = None) -> dict[str, int | str]:
    """A resumable run's enrollment: what the ledger at `path` holds of its last round, for the server's
    reconciliation of a round it lost in a crash (server/lost_round.py), and from now on only
    `server_run`'s instructions are charged (the fence). Without the fence an instruction the dead
    server start had sent, delivered after this report, would charge what the report said was not.
    A missing ledger is reported empty and not created (a resume may still be refused).

    `started`: when the enrolling server start enrolled (ns since the epoch, `SERVER_STARTED`). Flower
    run ids are random, so this orders the starts: an enrollment of an earlier start than the fence's
    (a dead start's, delivered late) leaves the fence where it is and is refused (EarlierStart), as is a
    live start whose host's clock is behind the fence's: it must not run rounds every node refuses.
    A start more than CLOCK_AHEAD_LIMIT_NS ahead of the node's clock is refused too: a server clock far ahead
    would lock the fence against every later start until the servers' clocks reached it (a node whose own
    clock is that far behind refuses too; the error names both clocks).
    Without it (an older server), the last enrollment wins.

    The report: `ledger-lineage` (the start the ledger is bound to, "" if none), `ledger-last-round`
    (-1 if no entry has a round), `ledger-last-entries` (that round's entries, JSON) and
    `ledger-fence-started` (the start time of the start whose enrollment fenced it before, 0 if none).
    All are data-independent: entries are planned from the instructions and the enrolled data size."""
    with file_lock(path):
        ledger = PrivacyLedger.load(path) if path.exists() else PrivacyLedger()
        fence = _beside(path, ".server-run")
        held_run, held_start = _fence(fence)
        if started is not None and started > (now := time.time_ns()) + CLOCK_AHEAD_LIMIT_NS:
            raise EarlierStart(
                f"this server start enrolled at server time {started} ns, {(started - now) / 3.6e12:.1f} h ahead "
                f"of this node's clock ({now} ns): the fence would refuse every later start until then. Fix "
                "the server's clock (or this node's)")
        if started is not None and held_run is not None and started < held_start:
            raise EarlierStart(
                f"Flower run {held_run} of run-name {path.parent.name.removeprefix('name-')!r} enrolled this node "
                f"at server time {held_start} ns, after this start's {started} ns: either this is a dead start's "
                "enrollment delivered late, or this server's clock is behind that start's host (fix the clock, "
                f"or delete {fence} if no other start of the run is alive)")
        write_atomically(fence, lambda f: f.write(f"{server_run} {started or 0}".encode()))
        if any(e.round is None for e in ledger.entries):
            return {}  # not tied to rounds: nothing to report (the server counts a lost round)
        tag, last = _beside(path, ".lineage"), max(ledger.rounds(), default=-1)
        return {"ledger-lineage": tag.read_text().strip() if tag.exists() else "",
                "ledger-last-round": last,
                "ledger-last-entries": json.dumps([e.to_json() for e in ledger.entries if e.round == last]),
                # which earlier start enrolled this ledger (0: none): the one a lost round came from proves an
                # empty ledger is the one that round reached, not one deleted or moved since
                "ledger-fence-started": held_start if held_run is not None else 0}


def _fence(path: Path) -> tuple[str | None, int]:
    """The fence file's (Flower run id, start time); (None, 0) if there is none. A fence written before
    start times existed holds the run id only."""
    if not path.exists():
        return None, 0
    run, _, started = path.read_text().strip().partition(" ")
    try:
        return str(int(run)), int(started or 0)
    except ValueError:  # damaged: no fence (the next enrollment rewrites it) rather than a node that never trains
        return None, 0


def _check_fence(ledger: PrivacyLedger, server_run: int | None) -> None:
    """Refuse an instruction of a server start other than the latest that enrolled this node."""
    if server_run is None or ledger.path is None:
        return
    enrolled = _fence(_beside(ledger.path, ".server-run"))[0] or str(server_run)
    if enrolled != str(server_run):
        raise StaleInstruction(
            f"this instruction comes from Flower run {server_run}, but run {enrolled} (the latest "
            f"start of run-name {ledger.path.parent.name.removeprefix('name-')!r}) has enrolled this node since: "
            "refused, nothing charged")


def charge(ledger: PrivacyLedger, config: Mapping, entries: list[LedgerEntry],
           also: Mapping[str, float] | None = None, *, server_run: int | None = None) -> None:
    """Refuse if `entries` would exceed the budget; otherwise record them (persisted).

    `also`: further accountants that must stay within the budget, each with a relative tolerance (Hu et
    al.'s hu-thm1, whose sigma is calibrated to hit the target exactly); checked under the same lock.
    `server_run`: the Flower run of the instruction; refused (StaleInstruction) if a later start of a
    resumable run has enrolled the node since (`report_and_fence`)."""
    global _charges
    if not entries:
        return
    target, delta = float(config["target-epsilon"]), float(config["target-delta"])
    checks = {str(config["accountant"]): 0.0, **(also or {})}
    with locked(ledger):
        _check_fence(ledger, server_run)
        for accountant, tolerance in checks.items():
            if target > 0 and ledger.would_exceed(entries, target * (1 + tolerance), delta, accountant=accountant):
                spent = ledger.epsilon(delta, accountant=accountant)
                raise BudgetExhausted(
                    f"refused: this round would take epsilon past the target {target} at delta {delta} "
                    f"(spent so far {spent:.4f}, {accountant} accountant)"
                )
        ledger.record(*entries)  # appended and fsynced before the lock is released
    _charges += 1


def refusal(msg: Message, error: BudgetExhausted) -> Message:
    return Message(Error(code=BUDGET_EXHAUSTED, reason=str(error)), reply_to=msg)
