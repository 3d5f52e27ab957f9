"""Update-rule state that survives a restart, in resumable runs (checkpoint = true).

Update rules keep per-node state in Flower's Context.state: SCAFFOLD's c_i,
FedDyn's g_i, pFedMe's personalised model, FedLAP's carried-over set. A
restarted ServerApp is a new Flower run with fresh Contexts (a restarted
SuperNode loses them too), so in a resumable run each node also saves those
ArrayRecords after every train round, in its state directory beside its
ledger, and a fresh Context restores them.

Which snapshot: the server resumes at the round after its last checkpoint, and
a node may already have trained in the round that was lost. So a node keeps
its last two snapshots and restores the newest one from before the round it is
asked to run, i.e. the state that matches the server's checkpoint. Snapshots
carry the server's lineage token (server/checkpoint.py), so a run started
afresh under the same run-name never picks up an earlier run's state.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Mapping

from flwr.app import ArrayRecord, RecordDict

from client.privacy import state_dir
from client.secagg import STATE as SECAGG_STATE
from common.checkpoint_file import CheckpointError, load_checkpoint, save_checkpoint
from common.records import CONFIG

LINEAGE = "lineage"  # train-config key of the server's lineage token
KEEP = 2  # snapshots kept per node: the last round may be lost with the server

Rule = Callable[[object, RecordDict, RecordDict], RecordDict]


def snapshot_folder(config: Mapping, node_config: Mapping, partition: int) -> Path | None:
    """Where this node's snapshots live; None unless the run is resumable."""
    if not (config.get("checkpoint") and config.get("run-name")):
        return None
    return state_dir(config, node_config) / f"name-{config['run-name']}" / f"partition-{partition}.states"


def _prefix(lineage: str) -> str:
    """The file-name prefix of a lineage's snapshots; the token comes in a message, so it must be hex."""
    if not re.fullmatch(r"[0-9a-f]{1,64}", lineage):
        raise ValueError(f"the train config's {LINEAGE!r} must be a hex token, got {lineage!r}")
    return f"{lineage}-round-"


def _snapshots(folder: Path, lineage: str) -> list[tuple[int, Path]]:
    """This lineage's snapshots, oldest first."""
    prefix = _prefix(lineage)
    return sorted((int(path.stem.removeprefix(prefix)), path) for path in folder.glob(f"{prefix}*.npz")
                  if path.stem.removeprefix(prefix).isdigit())


def restore(folder: Path, lineage: str, server_round: int, state: RecordDict) -> int | None:
    """Put the newest snapshot of `lineage` from before `server_round` into `state`; its round, or None."""
    earlier = [(r, path) for r, path in _snapshots(folder, lineage) if r < server_round]
    if not earlier:
        return None
    snapshot_round, path = earlier[-1]
    for key, record in _records(path).items():
        state[key] = record
    return snapshot_round


def _records(path: Path) -> dict[str, ArrayRecord]:
    """A snapshot's ArrayRecords; CheckpointError naming the file if it is damaged. Never an empty
    state instead: the node would train on with state the server's checkpoint does not match."""
    advice = (f"the node cannot restore its update-rule state: delete {path.name} (the node then restores "
              f"an older snapshot, or none), or restart the run afresh under another run-name")
    snapshot = load_checkpoint(path, advice)
    records = snapshot.get("records") if isinstance(snapshot, dict) else None
    if not isinstance(records, dict) or not all(
            isinstance(k, str) and isinstance(v, ArrayRecord) for k, v in records.items()):
        raise CheckpointError(f"snapshot {path} is corrupted: its 'records' are not all ArrayRecords; {advice}")
    return records


def save(folder: Path, lineage: str, server_round: int, state: RecordDict) -> None:
    """Snapshot the ArrayRecords of `state` for `server_round`; keep this lineage's last KEEP only."""
    records = {key: value for key, value in state.items() if isinstance(value, ArrayRecord)}
    save_checkpoint(folder / f"{_prefix(lineage)}{server_round:08d}.npz", {"round": server_round, "records": records})
    keep = {path for _, path in _snapshots(folder, lineage)[-KEEP:]}
    for path in folder.glob("*-round-*.npz"):
        if path not in keep:
            path.unlink(missing_ok=True)


def resumable(rule: Rule, folder: Path | None) -> Rule:
    """`rule`, restoring its state into a fresh Context first and snapshotting it after."""
    if folder is None:
        return rule

    def run(client, content: RecordDict, state: RecordDict) -> RecordDict:
        instruction = content[CONFIG]
        lineage, server_round = str(instruction.get(LINEAGE, "")), int(instruction["server-round"])
        _prefix(lineage)  # checked before the rule charges and trains: save() would refuse it after
        if not any(isinstance(value, ArrayRecord) for value in state.values()):
            restore(folder, lineage, server_round, state)
        reply = rule(client, content, state)
        unsaved = sorted(key for key, value in state.items() if not isinstance(value, ArrayRecord)
                         and key != SECAGG_STATE)  # secure aggregation's keys never go to disk
        if unsaved:  # a resumed node would silently start them afresh
            raise TypeError(f"the update rule keeps {unsaved} in Context.state as other records than "
                            "ArrayRecords: only ArrayRecords survive a resume (client/resume.py)")
        save(folder, lineage, server_round, state)
        return reply

    return run
