"""Checkpoint and resume of the server's run.

With `checkpoint = true` the ServerApp saves, after every round, one file
`<checkpoint-dir>/<run-name>.ckpt.npz` (atomically: temp file in the same
folder, fsync, `os.replace`), holding

- `meta`: JSON (as a uint8 array): format/version, the round just finished,
  the run config, where the journal ends and its digest (below), and the
  strategy's state with every array replaced by a reference
  `{"__array__": "<npz key>"}`;
- `model/<name>`: the global model's arrays after that round;
- `strategy/<path>`: the arrays of the strategy's state.

What grows with the run, the results rows and the privacy mirror's entries,
is in an append-only journal beside it, `<run-name>.journal.jsonl`: before the
npz is written, each save appends (one write, fsync) one line
`{"round": r, "rows": [...], "mirror": {"<partition>": [entry, ...]}}` with the
rows and mirror entries recorded since the previous line (the mirror's
`pending`), so a save costs O(this round) however long the run. The npz
records the journal's length after that line and a chained SHA-256 digest,
h_r = sha256(h_{r-1} || line_r). A resume reads exactly that many bytes,
checks the digest and rebuilds the rows and the mirror from the lines; a line
after them (its save died before the npz landed) is ignored and cut off by
the next append, its round being counted through the in-flight record below.
A missing, shorter, edited or unparsable journal is refused by name, never
read as fewer rows or a smaller mirror (which would under-count privacy).
Format version 2 (rows and mirror inline in `meta`) still resumes; the first
save after it writes them all as the journal's first line.

Before a round's instructions leave, `<run-name>.inflight.npz` records the
ledger entries the instructed clients will charge; it is deleted once that
round is checkpointed. A server that dies in between cannot know by itself
whether its clients trained (and charged), so the resume counts that round in
the mirror too, for every instructed client except those whose enrollment
report proves they did not charge it (server/lost_round.py): it may over-count
one round, never under-count. A first round interrupted
before any checkpoint is counted the same way by the next start, which saves a
round-0 checkpoint at once so that the count survives a second crash.

A run whose server step made the global model diverge (server/runner.py) ends
without checkpointing that round and writes `<run-name>.diverged.txt`; a
resume, from whatever results-dir, is then refused: it would train the round
again and charge the clients again for the same outcome.

A restarted ServerApp is a new Flower run (new run id), so a run is identified
by privfed's `run-name`, which must be set explicitly for checkpointing. When
a checkpoint for the run-name exists, the run resumes at the next round: the
global model, the strategy's state, the privacy mirror (rounds already
accounted are not re-counted) and the results rows come from the checkpoint.
Clients key their privacy ledgers by the same run-name when `checkpoint` is on
(`client/privacy.py`), so their ledgers continue too, and so do their
update rules' states (SCAFFOLD's c_i, FedDyn's g_i, ...: `client/resume.py`).
The checkpoint holds a lineage token, new at every fresh start and sent in
every train config, so nodes never restore a state of an earlier run that had
the same run-name.

Strategy state protocol: every object of the strategy's wrapper chain
(`strategy`, `strategy.base`, ...) is saved as one state dict. An object may
define

    def state_dict(self) -> dict[str, Any]      # JSON values, numpy arrays, torch tensors,
                                                # ArrayRecords, and dicts/lists/tuples/sets of those
    def load_state_dict(self, state: dict[str, Any]) -> None

`RosterSampling` (server/strategies/fedavg.py, so FedAvg and every strategy
mixing it in) implements it with `auto_state`: every instance attribute that is
plain data (momentum vectors, Yogi moments, SCAFFOLD controls, retired
partitions, ...) except node-id maps, which the new roster rebuilds. A strategy
with state of another kind (an RNG, an object) overrides both and extends:
`{**super().state_dict(), "rng": ...}`. Objects without the methods (e.g. the
Upcycled wrapper) are saved with `auto_state` too. The class names of the
chain are recorded; a resume with another strategy is refused.
"""

from __future__ import annotations

import copy
import math
import re
import secrets
import time
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord

from client.resume import LINEAGE
from common.checkpoint_file import (JOURNAL_START, UNREADABLE, CheckpointError, append_journal, chain,
                                    journal_line, load_checkpoint, read_journal, save_checkpoint)
from common.config import ConfigError, is_inert
from common.durable import write_atomically
from common.number_checks import is_int, is_real
from common.privacy.events import LedgerEntry
from common.privacy.ledger import PrivacyLedger
from server.lost_round import LedgerTail, empty_but_counted, not_charged
from server.replies import arrays_problem
from server.strategies.chain import wrapper_chain

FORMAT, VERSION = "privfed-checkpoint", 3  # 2: with the lineage token; 3: rows and mirror in the journal
INLINE_VERSION = 2  # still resumed: rows and mirror inline
# keys that may differ between the interrupted run and the resumed one (not num-rounds: strategies
# plan with it, e.g. DP-FedAvg's participation schedule and noise calibration, ALI's tau*;
# nor state-dir: the nodes' ledgers live there, and a moved one would open empty, resetting every budget)
MAY_CHANGE = frozenset({"round-timeout", "node-wait-timeout", "poll-interval", "device", "server-device",
                        "checkpoint-dir", "results-dir", "data-dir"})


# what every checkpoint holds, and its type (bool is no int here: see _check_structure)
SCHEMA = {"round": int, "lineage": str, "config": dict, "model": ArrayRecord,
          "strategy_classes": list, "strategy": list}
BY_VERSION = {VERSION: {"journal": dict}, INLINE_VERSION: {"rows": list, "mirror": dict}}
# Not "delete it": the nodes' ledgers are keyed by the run-name and would continue under a fresh start,
# whose mirror would not count them; and the run's results folder would be refused (refuse_taken).
AFRESH = "start the run afresh under another run-name"


# --- strategy state ------------------------------------------------------------


def strategy_classes(strategy) -> list[str]:
    return [type(s).__name__ for s in wrapper_chain(strategy)]


def _is_data(v: Any) -> bool:
    if v is None or isinstance(v, (bool, int, float, str, np.generic, np.ndarray, ArrayRecord)):
        return True
    if hasattr(v, "detach") and hasattr(v, "cpu") and hasattr(v, "numpy"):  # torch tensor
        return True
    if isinstance(v, (list, tuple, set, frozenset)):
        return all(_is_data(x) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, (str, int, float, bool, tuple)) and _is_data(v2) for k, v2 in v.items())
    return False


def auto_state(obj, exclude: frozenset[str] | set[str] = frozenset()) -> dict[str, Any]:
    """Every instance attribute of `obj` that is plain data (numbers, strings, arrays,
    ArrayRecords, tensors and containers of those), except `exclude`. Objects,
    callables, loggers and the roster are skipped."""
    return {k: v for k, v in vars(obj).items() if k not in exclude and _is_data(v)}


def load_auto_state(obj, state: Mapping[str, Any], exclude: frozenset[str] | set[str] = frozenset()) -> None:
    """Set the attributes `auto_state(obj)` saves, and only those: a checkpoint naming any other
    (a method, the roster) is refused rather than allowed to replace it."""
    exclude = frozenset(exclude) | getattr(type(obj), "checkpoint_exclude", frozenset())
    saved = auto_state(obj, exclude)
    unknown = sorted(set(state) - set(saved))
    if unknown:
        raise CheckpointError(f"the state of {type(obj).__name__} names attributes it does not save: {unknown}")
    wrong = sorted(k for k, v in state.items()
                   if v is not None and saved[k] is not None and _kind(v) != _kind(saved[k]))
    if wrong:  # checked before any is set: a refused state changes nothing
        raise CheckpointError(f"the state of {type(obj).__name__} has values of the wrong type for {wrong}")
    for k, v in state.items():
        setattr(obj, k, _as_container_of(saved[k], v))


def _kind(v: Any) -> Any:
    """What a saved value must share with the attribute it replaces (None: not set yet, any kind)."""
    if isinstance(v, bool):
        return bool
    if isinstance(v, (int, float, np.number)):
        return "number"
    if isinstance(v, (list, tuple)):
        return "sequence"
    if isinstance(v, dict):  # the file holds a defaultdict, OrderedDict or Counter as a dict
        return dict
    if isinstance(v, (set, frozenset)):
        return set
    return type(v)


def _as_container_of(current: Any, loaded: Any) -> Any:
    """`loaded` in the container type of the attribute it replaces (a defaultdict keeps its factory)."""
    if isinstance(current, dict) and type(current) is not dict and isinstance(loaded, dict):
        restored = copy.copy(current)
        restored.clear()
        restored.update(loaded)
        return restored
    if isinstance(current, (set, frozenset)) and isinstance(loaded, (set, frozenset)):
        return type(current)(loaded)
    return loaded


def strategy_state(strategy) -> list[dict[str, Any]]:
    """One state per level of the wrapper chain: `state_dict()` where defined, else `auto_state`."""
    return [s.state_dict() if callable(getattr(s, "state_dict", None)) else auto_state(s)
            for s in wrapper_chain(strategy)]


def load_strategy_state(strategy, states: list[Mapping[str, Any]]) -> None:
    for s, state in zip(wrapper_chain(strategy), states, strict=True):
        if callable(getattr(s, "load_state_dict", None)):
            s.load_state_dict(dict(state))
        else:
            load_auto_state(s, state)


def _check_structure(ckpt: dict[str, Any], path: Path) -> None:
    """Every entry the resume reads is there, of the right type: a damaged file fails here, by name."""
    def bad(why: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {path} is corrupted: {why}; {AFRESH}")

    for key, kind in {**SCHEMA, **BY_VERSION[ckpt["version"]]}.items():
        value = ckpt.get(key)
        if isinstance(value, bool) or not isinstance(value, kind):
            raise bad(f"{key!r} is missing or not of type {kind.__name__} (got {type(value).__name__})")
    if not re.fullmatch(r"[0-9a-f]{1,64}", ckpt["lineage"]):  # nodes accept a hex token only
        raise bad(f"'lineage' {ckpt['lineage'][:80]!r} is not a hex token")
    if ckpt["round"] < 0:
        raise bad(f"'round' is {ckpt['round']}")
    if not all(isinstance(state, dict) for state in ckpt["strategy"]) \
            or len(ckpt["strategy"]) != len(ckpt["strategy_classes"]):
        raise bad("'strategy' does not hold one state dict per strategy class")
    earlier = ckpt.get("wall_seconds", 0.0)  # absent before session 16: the earlier segments' time is unknown
    if not _is_duration(earlier):
        raise bad(f"'wall_seconds' is {str(earlier)[:80]}, not a duration")
    if "journal" in ckpt and not _is_journal_reference(ckpt["journal"]):
        raise bad("'journal' does not hold a length in bytes and a SHA-256 digest")
    why = _contents_problem(ckpt.get("rows", []), ckpt.get("mirror", {}))
    if why:
        raise bad(why)


def _is_duration(value: Any) -> bool:
    if not is_real(value):
        return False
    try:
        return 0 <= float(value) < math.inf
    except OverflowError:  # an int too large for a float
        return False


def _is_journal_reference(journal: dict) -> bool:
    length, digest = journal.get("bytes"), journal.get("sha256")
    return is_int(length) and length >= 0 \
        and isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest) is not None


def _contents_problem(rows: Any, mirror: Any) -> str | None:
    """What is wrong with results rows and mirror ledgers (inline, or one journal line's), if anything."""
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        return "'rows' holds a value that is not a results row"
    if not isinstance(mirror, dict) or not all(isinstance(p, str) and p.isdigit() for p in mirror):
        return "'mirror' is not keyed by partition ids"
    return None


def _line_problem(line: Any) -> str | None:
    """What is wrong with one journal line, if anything."""
    if not isinstance(line, dict):
        return "is not an object"
    why = _contents_problem(line.get("rows"), line.get("mirror"))
    if why is None and not all(isinstance(entries, list) for entries in line["mirror"].values()):
        return "'mirror' does not hold lists of entries"
    return why


class _Journal(NamedTuple):
    """How far the journal goes: its bytes, their chained digest, and the results rows they hold."""

    end: int = 0
    digest: str = JOURNAL_START
    rows: int = 0


def _same_state_dir(old: Any, new: Any, run_name: str) -> bool:
    """Whether a resume's state-dir is the interrupted run's. One engine records it as typed, the other
    absolute: a relative one names the same folder only from the folder the run started in, and only
    there does it hold this run's node state (`name-<run-name>`), not an empty one that resets every budget."""
    if old == new:
        return True
    if not old or not new:
        return False
    was, now = Path(str(old)).expanduser(), Path(str(new)).expanduser()
    if was.resolve() != now.resolve():
        return False
    return (was.is_absolute() and now.is_absolute()) or (was.resolve() / f"name-{run_name}").is_dir()


class Checkpointer:
    """The runner's hooks: `resume(...)` before the first round, `save(...)` after each."""

    def __init__(self, config: Mapping[str, Any], log: Callable[[str], None] = print):
        self.config, self.log = config, log
        self.enabled = bool(config["checkpoint"])
        self.path: Path | None = None
        self.lineage = secrets.token_hex(8)  # replaced by the checkpoint's on resume
        self._tails: dict[int, LedgerTail] = {}  # the nodes' ledger reports, given to `resume`
        self._enrolled_at = 0  # when this start enrolled the nodes (ns), given to `resume`
        self._started, self.earlier_seconds = time.perf_counter(), 0.0  # the latter: the resumed segments' time
        self._journal = _Journal()  # what the saves so far journaled (a fresh start: nothing, from byte 0)
        if not self.enabled:
            return
        name = str(config["run-name"])
        if not name:
            raise ConfigError("checkpoint = true needs an explicit run-name: a restarted ServerApp is a new "
                              "Flower run, and the run-name is what identifies the run to resume")
        folder = str(config["checkpoint-dir"]) or str(Path(str(config["results-dir"])) / "checkpoints")
        self.path = Path(folder).expanduser().resolve() / f"{name}.ckpt.npz"

    def wall_seconds(self) -> float:
        """The run's wall time so far: this process's share plus that of every segment it resumes."""
        return self.earlier_seconds + time.perf_counter() - self._started

    def resumes(self) -> bool:
        """Whether this run continues a checkpointed one, or one whose first round died before its
        checkpoint (its in-flight record: round 1's row may be written), else it is a fresh start."""
        return self.enabled and (self.path.exists() or self.inflight_path.exists())

    def resume(self, strategy, mirror, writer, model: ArrayRecord | None = None,
               tails: Mapping[int, LedgerTail] | None = None, enrolled_at: int = 0) -> tuple[ArrayRecord | None, int]:
        """Restore from the checkpoint if there is one: (global arrays, first round to run);
        (None, 1) for a fresh start. `model`: the run's initial model, which the saved one must match
        array for array (names, dtypes, shapes, finite values). `tails`: the nodes' reports of their
        ledgers' last rounds (the roster's), which tell a lost round that never reached them;
        `enrolled_at`: when this start enrolled them (the roster's), recorded with each round in flight."""
        self._tails, self._enrolled_at = dict(tails or {}), int(enrolled_at)
        if not self.enabled:
            return None, 1
        if self.diverged_path.exists():  # the diverged round is not checkpointed: it would be trained again
            raise CheckpointError(f"run {self.config['run-name']!r} diverged ({self.diverged_path.read_text().strip()}"
                                  f"); resuming would train that round again and charge the clients again: "
                                  f"change the config (e.g. lower the learning rates) and {AFRESH}")
        if not self.path.exists():  # a fresh start; but round 1 of a crashed one may have been charged
            if model is not None and self.inflight_path.exists():
                self._warn_moved(mirror)
            if model is not None and self._charge_lost_round(0, mirror, any_lineage=True):
                self.save(0, model, strategy, mirror, writer)  # a round-0 checkpoint: the charge persists
            return None, 1
        ckpt = self._load()
        self._check_compatible(ckpt, strategy)
        wrong = model is not None and arrays_problem(ckpt["model"], model, what="model array")
        if wrong:
            raise CheckpointError(f"checkpoint {self.path} holds another model than this run's ({wrong}); {AFRESH}")
        unknown = sorted(set(map(int, ckpt["mirror"])) - set(mirror.ledgers))
        if unknown:
            raise CheckpointError(f"checkpoint {self.path} holds privacy ledgers of partitions {unknown}, which "
                                  f"this run does not have; {AFRESH}")
        try:
            load_strategy_state(strategy, ckpt["strategy"])
            _restore_mirror(ckpt, mirror)
            mirror.epsilons()  # entries that load but cannot be accounted must fail now, before a round
        except UNREADABLE + (CheckpointError, ArithmeticError) as exc:
            raise CheckpointError(f"checkpoint {self.path} holds a state this run cannot load "
                                  f"({type(exc).__name__}: {exc}); {AFRESH}") from exc
        self.lineage = ckpt["lineage"]
        self.earlier_seconds = float(ckpt.get("wall_seconds", 0.0))
        # version 2: nothing journaled yet, so the next save journals every row and (pending) mirror entry
        self._journal = _Journal(ckpt["journal"]["bytes"], ckpt["journal"]["sha256"], len(ckpt["rows"])) \
            if ckpt["version"] == VERSION else _Journal()
        writer.reset(ckpt["rows"])  # only now: a refused checkpoint leaves the results as they were
        done = int(ckpt["round"])
        self.log(f"resuming run {self.config['run-name']!r} from {self.path}: round {done} done, "
                 f"next round {done + 1}")
        self._warn_moved(mirror)
        if self._charge_lost_round(done, mirror):
            self.save(done, ckpt["model"], strategy, mirror, writer)  # the charge survives a second crash
        return ckpt["model"], done + 1

    @property
    def inflight_path(self) -> Path:
        return self._beside(".inflight.npz")

    @property
    def diverged_path(self) -> Path:
        return self._beside(".diverged.txt")

    def mark_diverged(self, server_round: int, why: str) -> None:
        """Record beside the checkpoint (wherever results-dir points next) that the run diverged."""
        if self.enabled:
            text = f"the global model diverged in round {server_round}: {why}\n"
            write_atomically(self.diverged_path, lambda fh: fh.write(text.encode()))

    @property
    def journal_path(self) -> Path:
        return self._beside(".journal.jsonl")

    def _beside(self, suffix: str) -> Path:
        """A file beside the checkpoint, named after the run: only the final suffix changes (a run-name may
        itself contain '.ckpt.npz', and two runs must never share a file)."""
        return self.path.with_name(self.path.name.removesuffix(".ckpt.npz") + suffix)

    def begin_round(self, server_round: int, planned: Mapping[int, list]) -> None:
        """Before a round's instructions leave: what the instructed clients may release in it. If the
        server dies before that round is checkpointed, the clients' ledgers hold the round (they charge
        before releasing) but the checkpoint's mirror does not; `resume` adds it back (an upper bound)."""
        if not self.enabled or not any(planned.values()):
            return
        save_checkpoint(self.inflight_path, {
            "lineage": self.lineage, "round": server_round, "started": self._enrolled_at,
            "mirror": {str(p): PrivacyLedger(list(entries)).to_json() for p, entries in planned.items() if entries}})

    def _warn_moved(self, mirror) -> None:
        moved = [p for p, ledger in mirror.ledgers.items() if empty_but_counted(self._tails.get(p), ledger.entries)]
        if moved:
            self.log(f"WARNING: the nodes of partitions {moved} report empty privacy ledgers that the checkpoint "
                     "counts charges for, or that no earlier start of this run enrolled: if a node's state-dir "
                     "moved or was deleted (state-dir, results-dir, PRIVFED_STATE_DIR), its own ledger no longer "
                     "holds its charges and enforces its budget only from now on (the server's report still "
                     "counts them, and a lost round)")

    def _charge_lost_round(self, done: int, mirror, any_lineage: bool = False) -> bool:
        """Count round done + 1 in the mirror if it was interrupted after its instructions left.
        `any_lineage`: no checkpoint yet, so the record of any crashed first round counts."""
        if not self.inflight_path.exists():
            return False
        try:
            lost = load_checkpoint(self.inflight_path, "it records the privacy of an interrupted round")
            if (lost["lineage"] != self.lineage and not any_lineage) or lost["round"] != done + 1:
                return False  # another run's, or a round that was checkpointed after all
            ledgers = {int(p): PrivacyLedger.from_json(ledger) for p, ledger in lost["mirror"].items()}
            started = lost.get("started", 0)  # absent (an older record): no empty ledger proves anything
            started = started if type(started) is int else 0
            if not re.fullmatch(r"[0-9a-f]{1,64}", str(lost["lineage"])):
                raise CheckpointError(f"its lineage {str(lost['lineage'])[:80]!r} is not a hex token")
        except UNREADABLE + (CheckpointError,) as exc:  # deleting it would drop that round from the mirror
            raise CheckpointError(f"{self.inflight_path} (the privacy of round {done + 1}, interrupted after its "
                                  f"instructions left) cannot be read ({type(exc).__name__}: {exc}); the clients "
                                  "may have spent that round, so this run cannot be resumed with exact "
                                  "accounting: start afresh under another run-name") from exc
        unknown = sorted(set(ledgers) - set(mirror.ledgers))
        if unknown:
            raise CheckpointError(f"{self.inflight_path} names partitions {unknown}, which this run does not "
                                  f"have; {AFRESH}")
        spared = [p for p, ledger in ledgers.items()
                  if not_charged(self._tails.get(p), str(lost["lineage"]), mirror.ledgers[p].entries, ledger.entries,
                                 started)]
        for p, ledger in ledgers.items():
            if p not in spared:
                mirror.record(p, list(ledger.entries))
        if any_lineage:  # this start continues the crashed one, whose token the nodes' ledgers are bound to
            self.lineage = str(lost["lineage"])
        counted = len(ledgers) - len(spared)
        self.log(f"round {done + 1} was interrupted after its instructions were recorded: of its {len(ledgers)} "
                 f"instructed clients, {len(spared)} report (server/lost_round.py) that they did not charge it; "
                 f"the privacy the other {counted} may have spent is counted")
        return counted > 0

    def _load(self) -> dict[str, Any]:
        """The checkpoint, read and checked for shape: CheckpointError naming the file if it is not one."""
        ckpt = load_checkpoint(self.path, AFRESH)
        if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
            raise CheckpointError(f"{self.path} is not a privfed checkpoint; {AFRESH}")
        version = ckpt.get("version")
        if isinstance(version, bool) or version not in BY_VERSION:
            raise CheckpointError(f"{self.path} has checkpoint format version {version}; this privfed resumes "
                                  f"versions {INLINE_VERSION} and {VERSION} only: start afresh (another run-name)")
        _check_structure(ckpt, self.path)
        if version == VERSION:
            ckpt["rows"], ckpt["mirror"] = self._read_journal(ckpt["journal"])
        return ckpt

    def _read_journal(self, journal: Mapping[str, Any]) -> tuple[list[dict], dict[str, list]]:
        """The rows and mirror entries (JSON, per partition) in the journal's lines that the checkpoint covers."""
        rows: list[dict] = []
        mirror: dict[str, list] = {}
        for i, line in enumerate(read_journal(self.journal_path, journal["bytes"], journal["sha256"], AFRESH), 1):
            why = _line_problem(line)
            if why:
                raise CheckpointError(f"checkpoint journal {self.journal_path} is corrupted: line {i} {why}; {AFRESH}")
            rows.extend(line["rows"])
            for p, entries in line["mirror"].items():
                mirror.setdefault(p, []).extend(entries)
        return rows, mirror

    def _check_compatible(self, ckpt: dict[str, Any], strategy) -> None:
        """Refuse a checkpoint of another run config or strategy."""
        old = ckpt["config"]
        def same(key: str) -> bool:
            if key == "state-dir":
                return _same_state_dir(old.get(key), self.config.get(key), str(self.config["run-name"]))
            return old.get(key) == self.config.get(key)

        changed = sorted(k for k in set(old) | set(self.config)
                         if k not in MAY_CHANGE and not is_inert(k, self.config) and not same(k))
        if changed:
            raise CheckpointError(
                f"checkpoint {self.path} was written with a different run config ({', '.join(changed)}); "
                f"resume with the same config, or {AFRESH}")
        if ckpt["strategy_classes"] != strategy_classes(strategy):
            raise CheckpointError(f"checkpoint {self.path} holds the state of {ckpt['strategy_classes']}, "
                                  f"not {strategy_classes(strategy)}")

    def train_config(self) -> ConfigRecord:
        """What every train instruction carries for resumable runs: the lineage token."""
        return ConfigRecord({LINEAGE: self.lineage} if self.enabled else {})

    def save(self, server_round: int, arrays: ArrayRecord, strategy, mirror, writer) -> None:
        if not self.enabled:
            return
        self._append_journal(server_round, mirror, writer)  # first: the checkpoint names the line's end
        save_checkpoint(self.path, {
            "format": FORMAT, "version": VERSION, "round": server_round, "lineage": self.lineage,
            "config": dict(self.config), "journal": {"bytes": self._journal.end, "sha256": self._journal.digest},
            "model": arrays, "strategy_classes": strategy_classes(strategy),
            "strategy": strategy_state(strategy), "wall_seconds": self.wall_seconds(),
        })
        self.inflight_path.unlink(missing_ok=True)  # the round is in the checkpoint now

    def _append_journal(self, server_round: int, mirror, writer) -> None:
        """One line: the rows and mirror entries since the last one (so a save costs O(this round))."""
        line = journal_line({"round": server_round, "rows": writer.rows[self._journal.rows:],
                             "mirror": {str(p): [e.to_json() for e in entries]
                                        for p, entries in mirror.pending().items()}})
        end = append_journal(self.journal_path, self._journal.end, line)
        mirror.journaled()  # only now: a failed append leaves them pending for the next save
        self._journal = _Journal(end, chain(self._journal.digest, line), len(writer.rows))


def _restore_mirror(ckpt: Mapping[str, Any], mirror) -> None:
    """Put the checkpoint's mirror back: journaled entries as they are; a version-2 checkpoint's inline
    ledgers as pending, so the next save journals them."""
    if ckpt["version"] == VERSION:
        mirror.restore({int(p): [LedgerEntry.from_json(e) for e in entries] for p, entries in ckpt["mirror"].items()})
        return
    for p, ledger in ckpt["mirror"].items():
        mirror.record(int(p), list(PrivacyLedger.from_json(ledger).entries))
