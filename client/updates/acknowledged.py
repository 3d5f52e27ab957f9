"""Node state that must move with the server's aggregate: SCAFFOLD's c_i, FedDyn's g_i.

The server moves its own state (SCAFFOLD's c, FedDyn's h) by the replies it
aggregated. A node that kept its next state whatever became of its reply would
fall out of step with the server for the rest of the run whenever a reply is
lost on the way: past the round timeout, in a secure-aggregation round that
aborted, screened out, or in a round the server lost to a crash (SCAFFOLD's
c = mean_i c_i then no longer holds). So a rule keeps its next state pending,
tagged with the server round, and every train instruction carries the last
round whose reply from this node the server aggregated (`acknowledged-round`,
0 for none; server/strategies/fedavg.py): the pending state becomes the
node's state if it is that round's, and is dropped otherwise. An instruction
without the key (a server that does not acknowledge) keeps the next state at
once. Both records are ArrayRecords, so a resumable run snapshots them
(client/resume.py).
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

ACKNOWLEDGED = "acknowledged-round"


def _pending(key: str) -> tuple[str, str]:
    return f"{key}-pending", f"{key}-pending-round"


def settled(state: RecordDict, key: str, instruction: ConfigRecord) -> ArrayRecord | None:
    """The node's state `key` as of the last reply the server aggregated; resolves a pending one."""
    pending, tag = _pending(key)
    if pending in state:
        if tag in state and int(instruction.get(ACKNOWLEDGED, -1)) == int(state[tag]["round"].numpy()[0]):
            state[key] = state[pending]
        state.pop(pending)
        state.pop(tag, None)
    return state.get(key)


def keep(state: RecordDict, key: str, record: ArrayRecord, instruction: ConfigRecord) -> None:
    """Store the node's next state `key`: pending until the server acknowledges this round's reply."""
    if ACKNOWLEDGED not in instruction:
        state[key] = record
        return
    pending, tag = _pending(key)
    state[pending] = record
    state[tag] = ArrayRecord({"round": Array(np.array([int(instruction["server-round"])], dtype=np.int64))})
