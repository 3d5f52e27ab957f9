"""The Upcycled-FL suites: every shipped suite loads, the committed TOMLs are exactly what the generator
writes from the recorded search, and the search picks the best grid value."""

import importlib.util
import json

import pytest

from server.report import REPRO_DIR, available_suites, load_suite

GENERATOR = REPRO_DIR / "upcycled-table1" / "make_suites.py"


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("make_upcycled_suites", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", available_suites())
def test_every_shipped_suite_loads(name):
    suite = load_suite(name)  # validates every cell's config
    assert suite.cells


def test_committed_suites_are_the_generators_output(gen):
    search = gen.recorded_search()
    expected = {
        "upcycled-search-lr": gen.lr_search_suite(),
        "upcycled-search-theta": gen.theta_search_suite(search),
        "upcycled-table1": gen.table_suite("upcycled-table1", 0.9, gen.TABLE1, "Table 1", search),
        "upcycled-table3": gen.table_suite("upcycled-table3", 0.3, gen.TABLE3, "Table 3", search),
        "upcycled-privacy": gen.privacy_suite(search),
    }
    for name, text in expected.items():
        assert (REPRO_DIR / name / "suite.toml").read_text() == text, f"re-run {GENERATOR.name} for {name}"


def test_table_suites_hold_224_runs_with_searched_hyperparameters(gen):
    suite = load_suite("upcycled-table1")
    assert len(suite.cells) * len(suite.seeds) == 224
    assert gen.SEARCH_SEED not in suite.seeds  # no reported run chose its own hyperparameters
    search = gen.recorded_search()
    for cell in suite.cells:
        if cell.row.startswith("Upc-") and gen.search_key(cell.overrides["strategy"], cell.column) in search["theta"]:
            assert "theta: search" in cell.note


def test_pick_takes_the_best_and_breaks_ties_by_grid_order(gen):
    assert gen._pick({0.1: 80.0, 0.3: 82.5, 0.5: 81.0})["choice"] == 0.3
    assert gen._pick({0.1: 82.5, 0.3: 82.5})["choice"] == 0.1


def test_select_records_complete_grids_only(gen, tmp_path, monkeypatch):
    monkeypatch.setattr(gen, "SEARCH_FILE", tmp_path / "search.json")
    folder = tmp_path / "upcycled-search-lr"
    folder.mkdir()
    rows = ["suite,row,column,ours_mean,ours_std,n_seeds,paper,diff"]
    for lr, acc in zip(gen.lr_grid("fedprox"), (70, 75, 81, 79, 60)):
        rows.append(f"s,FedProx lr={lr:g},Syn(iid),{acc},0,1,,")
    rows.append("s,Scaffold lr=0.001,Syn(iid),90,0,1,,")  # an incomplete grid is not recorded
    (folder / "report.csv").write_text("\n".join(rows) + "\n")
    search = gen.select(tmp_path)
    assert search["lr"] == {"fedprox Syn(iid)": {"choice": 0.01, "accuracy": {
        "0.001": 70.0, "0.005": 75.0, "0.01": 81.0, "0.05": 79.0, "0.1": 60.0}}}
    assert json.loads((tmp_path / "search.json").read_text())["lr"] == search["lr"]
    lr, _, source = gen.hyperparameters("fedprox", "Syn(iid)", search)
    assert (lr, source.startswith("lr: search")) == (0.01, True)


@pytest.mark.parametrize("name", ["upcycled-table1", "upcycled-table3", "upcycled-privacy"])
def test_suites_train_the_authors_model_except_objective_perturbation(name):
    """The paper's numbers are the authors' double-softmax model's; Thm 6.3 needs the convex logreg."""
    for cell in load_suite(name).cells:
        expected = "logreg" if cell.overrides.get("privacy") == "objective" else "logreg-softmax"
        assert cell.overrides["model"] == expected, cell.label
