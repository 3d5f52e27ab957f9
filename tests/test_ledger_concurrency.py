"""One partition's ledger charged from several processes (in Flower's simulation any idle Ray actor
handles any node's message): no entry is lost and the budget holds across processes."""

import multiprocessing as mp
import queue

from client.node import LocalClient
from client.privacy import BudgetExhausted, charge, ledger_path
from common.config import validate
from common.privacy.events import dpsgd_steps
from common.privacy.ledger import PrivacyLedger

DELTA, FITS, ATTEMPTS = 1e-5, 6, 10  # the budget fits FITS charges; each process tries ATTEMPTS


def _entry(round_):
    return dpsgd_steps(0.01, 1.5, 200, round=round_)


def _hammer(path, target, first_round, start, out):
    """A Ray actor: keeps its ledger object across messages and charges as fast as it can."""
    ledger = PrivacyLedger.open(path, owner="partition-0")
    config = {"target-epsilon": target, "target-delta": DELTA, "accountant": "rdp"}
    start.wait()  # both processes hold their ledger object before either charges
    accepted = []
    for r in range(first_round, first_round + 2 * ATTEMPTS, 2):  # one process even rounds, one odd
        try:
            charge(ledger, config, [_entry(r)])
            accepted.append(r)
        except BudgetExhausted:
            pass
    out.put(accepted)


def test_two_processes_charging_one_ledger_lose_nothing_and_keep_the_budget(tmp_path):
    path = tmp_path / "partition-0.ledger.json"
    PrivacyLedger.open(path, owner="partition-0")
    fits = PrivacyLedger([_entry(r) for r in range(FITS)]).epsilon(DELTA)
    target = (fits + PrivacyLedger([_entry(r) for r in range(FITS + 1)]).epsilon(DELTA)) / 2
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(2, timeout=300), ctx.Queue()
    procs = [ctx.Process(target=_hammer, args=(path, target, first, start, out)) for first in (1, 2)]
    for p in procs:
        p.start()
    try:
        accepted = sorted(out.get(timeout=300) + out.get(timeout=300))
    except queue.Empty:
        raise AssertionError("a charging process died or hung; see its stderr") from None
    for p in procs:
        p.join(timeout=60)
    on_disk = PrivacyLedger.load(path)
    assert sorted(e.round for e in on_disk.entries) == accepted  # every accepted charge is on disk
    assert len(accepted) == FITS  # the whole budget is usable, and no more
    assert on_disk.epsilon(DELTA) <= target


def test_node_ledger_sees_what_another_process_recorded(tmp_path):
    config = validate({"dataset": "synthetic", "num-clients": 2, "results-dir": str(tmp_path)})
    client = LocalClient(config, 0, run_id=5)
    assert len(client.ledger) == 0
    PrivacyLedger.load(ledger_path(config, {}, 5, 0)).record(_entry(1))  # another actor's charge
    assert [e.round for e in client.ledger.entries] == [1]
