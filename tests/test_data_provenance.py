"""Data provenance: every run records the SHA-256 of each data file it read and says so when a file is
not the one its publisher distributed; `privfed data check` compares a whole data folder."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from cli.main import main
from common.data import clear_cache, load_released
from common.data.provenance import PUBLISHED_SHA256
from tests.conftest import data_dir_or_skip

RELEASED = "fedprox-synthetic/syn_iid.npz"


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_cache()
    yield
    clear_cache()


@pytest.fixture
def released_copy(tmp_path):
    """A data folder holding a copy of the published syn_iid.npz."""
    source = data_dir_or_skip(*RELEASED.split("/")) / RELEASED
    target = tmp_path / "data" / RELEASED
    target.parent.mkdir(parents=True)
    shutil.copyfile(source, target)
    return tmp_path / "data"


def _edit_one_label(data_dir):
    """The file stays well-formed (every check of the reader passes), but one training label is flipped."""
    path = data_dir / RELEASED
    with np.load(path) as d:
        arrays = {k: d[k] for k in d.files}
    arrays["y_train"][0] = 1 - arrays["y_train"][0]
    np.savez(path, **arrays)


def test_the_published_file_is_recognised(released_copy):
    (record,) = load_released("syn-iid", released_copy).meta["files"]
    assert record == {"file": RELEASED, "sha256": PUBLISHED_SHA256[RELEASED], "published": True}


def test_an_edited_file_loads_but_is_marked_not_published(released_copy):
    _edit_one_label(released_copy)
    (record,) = load_released("syn-iid", released_copy).meta["files"]
    assert record["file"] == RELEASED and record["published"] is False
    assert record["sha256"] != PUBLISHED_SHA256[RELEASED]


def _run(data_dir, tmp_path, capsys):
    code = main(["run", "upcycled-syn", "--set", 'dataset="syn-iid"', "--set", "num-rounds=1",
                 "--set", "upcycled=false", "--set", "local-epochs=1", "--set", f'data-dir="{data_dir}"',
                 "--set", f'results-dir="{tmp_path / "results"}"', "--set", 'run-name="r"'])
    out = capsys.readouterr().out
    assert code == 0, out
    return out, json.loads((tmp_path / "results" / "r" / "summary.json").read_text())


def test_a_run_records_its_data_files(released_copy, tmp_path, capsys, one_torch_thread):
    out, summary = _run(released_copy, tmp_path, capsys)
    assert summary["data_files"] == [{"file": RELEASED, "sha256": PUBLISHED_SHA256[RELEASED], "published": True}]
    assert "not the published file" not in out


def test_a_run_on_an_edited_file_says_so(released_copy, tmp_path, capsys, one_torch_thread):
    _edit_one_label(released_copy)
    out, summary = _run(released_copy, tmp_path, capsys)
    assert summary["data_files"][0]["published"] is False
    assert f"data: {RELEASED} is not the published file" in out


def test_data_check_reports_ok_differing_and_missing(released_copy, capsys):
    assert main(["data", "check", "--data-dir", str(released_copy)]) == 0
    out = capsys.readouterr().out
    assert f"{RELEASED}" in out and "1 of 22 known files" in out and "0 differ" in out
    assert "mnist/train-images-idx3-ubyte.gz" in out and "missing" in out
    _edit_one_label(released_copy)
    assert main(["data", "check", "--data-dir", str(released_copy)]) == 1
    assert "DIFFERS from the published file" in capsys.readouterr().out


def test_the_shared_data_folder_is_the_published_data():
    shared = data_dir_or_skip("mnist")
    assert main(["data", "check", "--data-dir", str(shared)]) == 0


def test_data_check_of_a_folder_that_does_not_exist_is_an_error(tmp_path, capsys):
    assert main(["data", "check", "--data-dir", str(tmp_path / "typo")]) == 2
    assert "is not a folder" in capsys.readouterr().err
