"""The ledger file is an append-only log (format version 2), read incrementally, and the ledger's
composition is kept incrementally: every epsilon equals a recomposition of every entry, to the bit."""

import json
import logging
import math
import os
import random

import dp_accounting as dpa
import pytest

from cli.main import main as cli_main
from common.privacy import accounting
from common.privacy import ledger as ledger_mod
from common.privacy.events import (dpsgd_steps, gaussian_release,
                                   output_perturbation_release, post_processing, pure_dp_release, zcdp_release)
from common.privacy.ledger import PAPER_ACCOUNTANTS, PrivacyLedger

DELTA = 1e-5


def _lines(path):
    return path.read_bytes().split(b"\n")


def _v1_text(ledger):
    """A ledger file as format version 1 wrote it (one indented JSON object, no trailing newline)."""
    return json.dumps(ledger.to_json(), indent=1, allow_nan=False)


# --- the file -----------------------------------------------------------------------
def test_record_only_appends_its_own_lines(tmp_path):
    path = tmp_path / "partition-0.ledger.json"
    ledger = PrivacyLedger.open(path, owner="partition-0")
    assert json.loads(_lines(path)[0]) == {"format": "privfed-privacy-ledger", "version": 2, "owner": "partition-0"}
    for r, batch in enumerate([[dpsgd_steps(0.01, 1.0, 5, round=1)],
                               [dpsgd_steps(0.01, 1.0, 5, round=2), post_processing(round=2)], []], start=1):
        before = path.read_bytes()
        ledger.record(*batch)
        after = path.read_bytes()
        assert after.startswith(before) and after.endswith(b"\n")
        added = after[len(before):].splitlines()
        assert [json.loads(x) for x in added] == [e.to_json() for e in batch]
    assert PrivacyLedger.load(path).entries == ledger.entries and len(ledger) == 3


def test_version_1_file_loads_and_its_first_record_converts_it(tmp_path, capsys):
    old = PrivacyLedger([dpsgd_steps(0.0256, 1.0, 200, round=1),
                         pure_dp_release(0.1 + 0.2, relation="add-remove", round=2)], owner="p-1")
    path = tmp_path / "partition-1.ledger.json"
    path.write_text(_v1_text(old))
    ino = path.stat().st_ino
    loaded = PrivacyLedger.load(path)
    assert loaded.entries == old.entries and loaded.owner == "p-1"
    assert loaded.epsilon(DELTA) == old.epsilon(DELTA)
    code = cli_main(["privacy", "ledger", str(path), "--delta", "1e-5", "--json"])  # `privfed privacy ledger`
    assert code == 0 and json.loads(capsys.readouterr().out)["epsilon"] == old.epsilon(DELTA)

    new = dpsgd_steps(0.0256, 1.0, 10, round=3)
    loaded.record(new)
    header, *rest = _lines(path)
    assert json.loads(header)["version"] == 2 and rest[-1] == b"" and path.stat().st_ino != ino  # one rewrite
    assert PrivacyLedger.load(path).entries == (*old.entries, new)
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no temp file left
    assert PrivacyLedger.load(path).epsilon(DELTA) == PrivacyLedger([*old.entries, new]).epsilon(DELTA)


def test_torn_last_line_is_ignored_and_cut_off_before_the_next_append(tmp_path, caplog):
    path = tmp_path / "l.ledger.json"
    first = PrivacyLedger.open(path, owner="o")
    first.record(dpsgd_steps(0.01, 1.0, 5, round=1), dpsgd_steps(0.01, 1.0, 5, round=2))
    whole = path.read_bytes()
    with path.open("ab") as f:  # a record killed inside its write
        f.write(b'{"kind":"dpsgd","round":3,"par')
    with caplog.at_level(logging.WARNING, logger="common.privacy.ledger"):
        ledger = PrivacyLedger.load(path)
        ledger.reload()
        ledger.reload()
        first.reload()
    assert [e.round for e in ledger.entries] == [1, 2] == [e.round for e in first.entries]
    assert sum("incomplete last line" in r.getMessage() for r in caplog.records) == 2  # once per ledger object
    ledger.record(dpsgd_steps(0.01, 1.0, 5, round=4))
    assert path.read_bytes() == whole + ledger_mod._line(ledger.entries[-1].to_json())
    assert [e.round for e in PrivacyLedger.load(path).entries] == [1, 2, 4]
    first.reload()
    assert first.entries == ledger.entries


@pytest.mark.parametrize("damage", ["middle-line", "foreign-header", "no-header", "bad-entry"])
def test_damage_is_an_error_and_the_file_is_left_as_it_is(tmp_path, damage):
    path = tmp_path / "l.ledger.json"
    PrivacyLedger.open(path, owner="o").record(*[dpsgd_steps(0.01, 1.0, 5, round=r) for r in range(3)])
    header, *lines = _lines(path)
    if damage == "middle-line":
        lines[1] = b'{"kind": "dpsgd", "ro'
    elif damage == "foreign-header":
        header = b'{"format":"something-else","version":2,"owner":"o"}'
    elif damage == "no-header":
        header = lines.pop(0)
    else:
        lines[1] = json.dumps({"kind": "dpsgd", "round": 1, "params": {"steps": 5}, "meta": {}}).encode()
    path.write_bytes(b"\n".join([header, *lines]))
    bad = path.read_bytes()
    for attempt in (lambda: PrivacyLedger.load(path), lambda: PrivacyLedger.open(path),
                    lambda: PrivacyLedger(path=path).record(dpsgd_steps(0.01, 1.0, 5, round=9))):
        with pytest.raises(ValueError, match="damaged.*never replaced by an empty one"):
            attempt()
    assert path.read_bytes() == bad


def test_two_ledgers_on_one_file_read_each_other_incrementally(tmp_path, monkeypatch):
    path = tmp_path / "l.ledger.json"
    a = PrivacyLedger.open(path, owner="o")
    b = PrivacyLedger.load(path)
    b.record(dpsgd_steps(0.01, 1.0, 5, round=1), zcdp_release(0.01, relation="add-remove", round=1))

    def whole_file_read(*_args):
        raise AssertionError("an append was read by loading the whole file")

    with monkeypatch.context() as m:
        m.setattr(ledger_mod, "_parse_file", whole_file_read)
        a.reload()
        assert a.entries == b.entries and a.report(DELTA) == b.report(DELTA)
        a.record(pure_dp_release(0.5, relation="add-remove", round=2))  # appends after b's lines
        b.reload()
    assert b.entries == a.entries == PrivacyLedger.load(path).entries

    other = PrivacyLedger([gaussian_release(2.0, 1.0, round=7)], owner="o")
    other.save(path)  # a new inode
    a.reload()
    assert a.entries == other.entries and a.epsilon(DELTA) == other.epsilon(DELTA)

    shorter = PrivacyLedger([gaussian_release(3.0, 1.0, round=8)])
    path.write_bytes(b"".join(ledger_mod._line(x) for x in
                              [{"format": "privfed-privacy-ledger", "version": 2, "owner": ""},
                               shorter.entries[0].to_json()]))  # rewritten in place, shorter: a full load
    assert path.stat().st_size < a._pos.end
    a.reload()
    assert a.entries == shorter.entries and a.steps() == 0


# --- the composition: incremental == a recomposition of every entry -------------------------------
def _reference(entries, delta, accountant):
    """The previous, whole-ledger computation of `report(...).total` (kept here as the reference)."""
    pure = math.fsum(float(e.params["epsilon"]) for e in entries if e.is_pure)
    approx_entries = [e for e in entries if not e.is_pure and not e.is_post_processing]
    counts = {}
    for e in approx_entries:
        key = ledger_mod._event_key(e)
        amount = {"dpsgd": lambda: int(e.params["steps"]), "gaussian": lambda: int(e.params.get("count", 1)),
                  "zcdp": lambda: float(e.params["rho"])}[e.kind]()
        counts[key] = counts.get(key, 0) + amount
    events = []
    for key, amount in counts.items():
        if key[0] == "dpsgd" and amount:
            events.append(accounting.dpsgd_event(key[1], key[2], int(amount)))
        elif key[0] == "gaussian" and amount:
            events.append(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(key[1]), int(amount)))
        elif key[0] == "zcdp":
            events.append(dpa.ZCDpEvent(float(amount)))
    event = dpa.NoOpDpEvent() if not events else events[0] if len(events) == 1 else dpa.ComposedDpEvent(events)

    def rdp(conversion, orders):  # the accountant itself, not through any memo
        o, r = accounting.rdp_curve(event, orders)
        return accounting.rdp_to_epsilon(o, r, delta, conversion)[0]

    if not approx_entries:
        approx = 0.0
    elif accountant == "rdp":
        approx = rdp("balle", None)
    elif accountant == "pld":  # PLD is slow: its cache (keyed by the event's value) is shared
        approx = accounting.epsilon(event, delta, accountant="pld")
    elif accountant == "upcycled-thm6.2":
        zs = []
        for e in approx_entries:
            zs += [float(e.params["noise_multiplier"])] * int(e.params.get("count", 1))
        approx = accounting.upcycled_output_epsilon(zs, delta)
    elif accountant == "hu-thm1":
        approx = accounting.zcdp_epsilon(math.fsum(float(e.params["rho"]) for e in approx_entries), delta)
    elif accountant == "ali-eq12":
        approx = rdp("classic", "integer")
    else:
        approx = rdp("balle", "fedlap")
    return approx + pure, event


_MECHANISMS = {  # accountant -> the entry kinds it composes (pure and post-processing ride along)
    "rdp": ("dpsgd", "gaussian", "zcdp"),
    "pld": ("dpsgd", "gaussian"),
    "upcycled-thm6.2": ("gaussian",),
    "hu-thm1": ("zcdp",),
    "ali-eq12": ("dpsgd",),
    "fedlap-thm5.8": ("dpsgd",),
}


def _random_entry(rng, kinds, qs_sigmas):
    kind = rng.choice([*kinds, "pure", "post-processing"])
    r = rng.randrange(50)
    if kind == "dpsgd":
        q, sigma = rng.choice(qs_sigmas)
        return dpsgd_steps(q, sigma, rng.choice([0, 1, 3, 7]), round=r)
    if kind == "gaussian":
        if rng.random() < 0.5:
            return output_perturbation_release(10.0, rng.choice([0.8, 1.0]), 1000, round=r)
        return gaussian_release(rng.choice([1.1, 2.3, 0.9]), rng.choice([1.0, 0.7]), count=rng.randint(1, 3), round=r)
    if kind == "zcdp":  # one neighbouring relation per ledger (a ledger refuses to compose two)
        return zcdp_release(rng.uniform(1e-4, 0.01), relation="add-remove", round=r)
    if kind == "pure":
        return pure_dp_release(rng.uniform(1e-3, 0.3), relation="add-remove", round=r)
    return post_processing(round=r, note="even round")


@pytest.mark.parametrize("accountant", list(_MECHANISMS))
def test_incremental_epsilon_is_a_full_recomposition(tmp_path, accountant):
    assert set(_MECHANISMS) == {"rdp", "pld", *PAPER_ACCOUNTANTS}
    rng = random.Random(sum(map(ord, accountant)))  # not hash(): salted per process
    path = tmp_path / "l.ledger.json"
    for trial in range(1 if accountant == "pld" else 4):
        qs_sigmas = rng.sample([(0.01, 1.0), (0.02, 1.3), (0.05, 0.9)], rng.choice([2, 3]))
        entries = [_random_entry(rng, _MECHANISMS[accountant], qs_sigmas) for _ in range(rng.randint(5, 25))]
        PrivacyLedger(owner="o").save(path)
        writer, reader = PrivacyLedger.load(path), PrivacyLedger.load(path)
        done = 0
        while done < len(entries):  # recorded in random batches; the reader follows incrementally
            k = rng.randint(1, 4) + 3 * (accountant == "pld")
            writer.record(*entries[done:done + k])
            done += k
            reader.reload()
            recorded = entries[:done]
            extra = [_random_entry(rng, _MECHANISMS[accountant], qs_sigmas)]
            for ledger in (writer, reader):
                want, event = _reference(recorded, DELTA, accountant)
                assert ledger.epsilon(DELTA, accountant) == want
                assert ledger.to_dp_event() == event
                assert ledger.epsilon(DELTA, accountant, extra=extra) == _reference([*recorded, *extra], DELTA,
                                                                                    accountant)[0]
            report = reader.report(DELTA, accountant)
            assert report == PrivacyLedger(recorded).report(DELTA, accountant)
            assert report.counts == {k: sum(e.kind == k for e in recorded) for k in report.counts}
            assert reader.steps() == sum(e.params["steps"] for e in recorded if e.kind == "dpsgd")
            assert reader.relations() == {e.params["relation"] for e in recorded if "relation" in e.params}
            assert reader.assumptions() == {e.params["assumption"] for e in recorded if "assumption" in e.params}
            assert reader.pure_epsilon() == math.fsum(e.params["epsilon"] for e in recorded if e.is_pure)
        assert reader.entries == tuple(entries) == PrivacyLedger.load(path).entries


def test_equal_ledgers_share_one_accountant_call_and_no_value_is_stale():
    entries = [dpsgd_steps(0.013, 1.07, 11, round=r) for r in range(3)]
    a, b = PrivacyLedger(entries), PrivacyLedger(list(entries))
    eps = a.epsilon(DELTA)
    before = accounting._rdp_epsilon.cache_info()
    assert b.epsilon(DELTA) == eps
    after = accounting._rdp_epsilon.cache_info()
    assert (after.hits - before.hits, after.misses - before.misses) == (1, 0)
    b.record(dpsgd_steps(0.013, 1.07, 11, round=3))
    grown = b.epsilon(DELTA)
    assert grown > eps and grown == _reference(b.entries, DELTA, "rdp")[0]
    assert a.epsilon(DELTA) == eps
