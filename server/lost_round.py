"""Did the clients charge the round a crashed server lost?

A server that dies after recording a round as in flight (server/checkpoint.py,
`begin_round`) and before checkpointing it cannot know which instructed clients
trained and charged their ledgers. Without more, the resumed mirror counts the
round for every one of them: an upper bound, safe for privacy, but ALI-DPFL's
step counter t follows the mirror, so a round that never left makes the run stop
short of its budget.

In a resumable private run each node's enrollment reply says what its ledger
holds of its last round (`client.privacy.report_and_fence`), and fences off the
dead server start's instructions, so the report stays true. The resume then
counts the lost round for a partition unless its report proves the round was not
charged: the node's ledger belongs to this run (its lineage, or, empty and bound
to no start, the fence the dead start's own enrollment left beside it) and holds,
for that round, exactly what the checkpoint's mirror holds already. Anything else
(no report, another lineage, a malformed or unexpected one, an empty ledger fenced
by no start or another one: its state-dir was deleted or moved since) counts the
round, as before.

Trust: the report concerns the node's own privacy, and the node's own ledger
enforces its budget whatever it reports; a node that understates its charges
only makes the server's report of its own epsilon too low.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping, Sequence

from common.number_checks import is_int
from common.privacy.events import LedgerEntry


MAX_REPORT = 1 << 16  # characters of a report's entries: a round charges a few entries of ~200 each


def empty_but_counted(tail: LedgerTail | None, known: Sequence[LedgerEntry]) -> bool:
    """A node reports an empty ledger bound to no start while the checkpoint's mirror counts entries for its
    partition (either it never received an instruction, or its ledger moved), or one no earlier start
    fenced (it moved, or was deleted): its own ledger may no longer enforce its budget."""
    return tail is not None and not tail.lineage and tail.last_round == -1 and (bool(known) or not tail.fence_started)


@dataclass(frozen=True)
class LedgerTail:
    """A node's report at enrollment: its ledger's lineage ("" if unbound), last round (-1: none), that
    round's entries, and the start time of the start whose enrollment fenced it before (0: none)."""
    lineage: str
    last_round: int
    entries: tuple[LedgerEntry, ...]
    fence_started: int = 0


def parse_tail(info: Mapping) -> LedgerTail | None:
    """The report in an enrollment reply's config record, or None if it has none or a malformed one."""
    lineage, last, entries = (info.get(k) for k in ("ledger-lineage", "ledger-last-round", "ledger-last-entries"))
    if not isinstance(lineage, str) or not is_int(last) \
            or not isinstance(entries, str):
        return None
    if len(entries) > MAX_REPORT:
        return None
    try:
        parsed = tuple(LedgerEntry.from_json(e) for e in json.loads(entries))
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):  # deep nesting: RecursionError
        return None
    if last < -1 or any(e.round != last for e in parsed) or (last == -1) != (not parsed):
        return None
    fenced = info.get("ledger-fence-started", 0)  # absent (an older node): fenced by no known start
    return LedgerTail(lineage, last, parsed, fence_started=fenced if type(fenced) is int and fenced > 0 else 0)


def not_charged(tail: LedgerTail | None, lineage: str, known: Sequence[LedgerEntry],
                lost: Sequence[LedgerEntry], started: int = 0) -> bool:
    """Whether `tail` proves that its node did not charge `lost` (the interrupted round's planned entries),
    given `known`, the entries the checkpoint's mirror holds for the node, and `started`, when the start
    that lost the round enrolled (0: unknown)."""
    rounds = {e.round for e in lost}
    if tail is None or not lost or len(rounds) != 1 or None in rounds:
        return False
    (lost_round,) = rounds
    if tail.lineage != lineage and (tail.lineage or tail.last_round != -1 or known
                                    or not started or tail.fence_started != started):
        # another start's ledger, entries bound to no start, not the ledger that charged `known`, or an empty
        # one the lost round's start did not enroll (deleted or moved since: the one it reached may have charged)
        return False
    if tail.last_round > lost_round:
        return False  # a later round than any the server sent: cannot tell
    held = list(tail.entries) if tail.last_round == lost_round else []
    return _as_json(held) == _as_json(e for e in known if e.round == lost_round)


def _as_json(entries) -> list[dict]:
    return [e.to_json() for e in entries]
