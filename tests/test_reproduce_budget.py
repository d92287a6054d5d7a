"""The budget search (interp.reproduce.budget) and reveal-gap's use of it: the cheapest budget that
fits is chosen, every budget is recorded (tried with its accuracy, or not tried after the choice), a
rerun trains nothing, committed study runs are loaded instead of trained."""

import json

import pytest
import torch

from interp.reproduce import budget, engine, reproduce
from interp.reproduce import results as committed_runs
from interp.reproduce import reveal_gap
from interp.reproduce.engine import Outcome, Run

BASE = Run("t", "transformer", "REPL", {"n_vars": 3}, {"d_model": 8, "n_layers": 1, "n_heads": 2},
           {"steps": 10, "lr": 1e-3, "train_length": 4}, {"model": "transformer"})
GRID = [dict(n_layers=4, d_model=64, n_heads=4, lr=1e-3, warmup=5, steps=100),     # cost 1.64e6
        dict(n_layers=2, d_model=64, n_heads=4, lr=1e-3, warmup=5, steps=100),     # 8.19e5
        dict(n_layers=2, d_model=32, n_heads=4, lr=3e-4, warmup=5, steps=100),     # 2.05e5
        dict(n_layers=2, d_model=32, n_heads=4, lr=1e-3, warmup=5, steps=100)]     # 2.05e5, after lr 3e-4 (stable)


def quiet(_line):
    pass


def stub(fits: set[str], trained: list[str]):
    """obtain(run): an Outcome that fits when the run's budget is in `fits`; the labels go to `trained`."""
    def obtain(run):
        trained.append(run.label)
        ok = run.info["budget"] in fits
        return Outcome(run, "fit" if ok else "did not fit", None, run.train["lr"], 4 if ok else 2,
                       0.99 if ok else 0.3 + 0.01 * len(trained), [], 1.0, run.train["steps"])
    return obtain


def test_search_picks_the_cheapest_budget_that_fits_and_records_every_budget():
    runs = budget.candidates(BASE, GRID)
    labels = [budget.budget_label(e) for e in GRID]
    assert [r.label for r in runs] == labels and all(r.info["budget"] == r.label for r in runs)
    assert runs[0].model == {"d_model": 64, "n_layers": 4, "n_heads": 4} and runs[0].train["warmup"] == 5
    trained = []
    found = budget.search(runs, stub({labels[0], labels[1]}, trained), quiet)
    # cheapest first: the two width-32 budgets (grid order between equals), then L2 d64 fits, L4 is never trained
    assert trained == [labels[2], labels[3], labels[1]]
    assert found["chosen"] == labels[1]
    assert [r["budget"] for r in found["rows"]] == [labels[2], labels[3], labels[1], labels[0]]
    assert [r["status"] for r in found["rows"]] == ["did not fit", "did not fit", "fit", budget.NOT_TRIED]
    assert found["rows"][0]["in-dist acc"] == pytest.approx(0.31) and found["rows"][3]["in-dist acc"] is None
    assert set(found["outcomes"]) == set(trained)


def test_search_where_none_fits_tries_every_budget():
    runs = budget.candidates(BASE, GRID)
    trained = []
    found = budget.search(runs, stub(set(), trained), quiet)
    assert found["chosen"] is None and len(trained) == len(GRID)
    assert all(r["status"] == "did not fit" and r["in-dist acc"] is not None for r in found["rows"])


def test_bad_grids_are_refused_by_name():
    with pytest.raises(ValueError, match="at least one budget"):
        budget.candidates(BASE, [])
    with pytest.raises(ValueError, match="missing \\['warmup'\\]"):
        budget.candidates(BASE, [dict(n_layers=1, d_model=8, n_heads=2, lr=1e-3, steps=10)])
    with pytest.raises(ValueError, match="must differ"):
        budget.candidates(BASE, [GRID[0], dict(GRID[0])])
    with pytest.raises(ValueError, match="warmup must be in"):
        budget.candidates(BASE, [dict(GRID[0], warmup=100)])
    with pytest.raises(ValueError, match="at least one candidate"):
        budget.search([], stub(set(), []), quiet)


def fit_at_width(width):
    """A fit metric that passes the runs of this width (and any wider) only: the search's choice is then known."""
    def metric(model, task, run, device, n):
        return 1.0 if run.model["d_model"] >= width else 0.0
    return metric


def mtimes(root):
    return {p: p.stat().st_mtime_ns for p in root.rglob("runs/*/checkpoints/*/model.safetensors")}


@pytest.mark.parametrize("width, chosen", [(8, 0), (16, 1), (32, None)])
def test_reveal_gap_study_chooses_trains_every_gap_and_resumes(tmp_path, monkeypatch, width, chosen):
    torch.set_num_threads(1)
    monkeypatch.setattr(reveal_gap, "reveal_fit", fit_at_width(width))
    monkeypatch.setattr(committed_runs, "RESULTS", tmp_path / "results")
    grid = reveal_gap.SCALE["quick"]["search"]
    labels = [budget.budget_label(e) for e in grid]
    reproduce("reveal-gap", "quick", tmp_path / "out", progress=False, log=quiet)
    saved = json.loads((tmp_path / "out" / "claims.json").read_text())
    first = mtimes(tmp_path / "out")
    trained = {p.parts[-4] for p in first}
    transformer = {label for label in trained if label.startswith("transformer-")}
    gaps = reveal_gap.SCALE["quick"]["gaps"]
    if chosen is None:   # every budget tried at the densest gap, none at the others
        assert transformer == {f"transformer-{b}-gap{min(gaps)}-s0" for b in labels}
        assert saved["claims"][0]["verdict"] == "did not fit" and "none fit" in saved["claims"][0]["measured"]
    else:                # the budgets up to the chosen one at the densest gap, the chosen one at every gap
        assert transformer == ({f"transformer-{b}-gap{min(gaps)}-s0" for b in labels[:chosen + 1]}
                               | {f"transformer-{labels[chosen]}-gap{g}-s0" for g in gaps})
        assert f"chosen: {labels[chosen]}" in saved["claims"][0]["measured"]
    for label in labels[:(len(labels) if chosen is None else chosen + 1)]:
        assert label in saved["claims"][0]["measured"]   # every tried budget is named with its accuracy
    page = (tmp_path / "out" / "report.html").read_text()
    assert "Transformer budget search" in page and all(label in page for label in labels)
    # a rerun trains nothing and chooses the same budget
    lines = []
    reproduce("reveal-gap", "quick", tmp_path / "out", progress=False, log=lines.append)
    assert mtimes(tmp_path / "out") == first
    assert json.loads((tmp_path / "out" / "claims.json").read_text())["claims"] == saved["claims"]
    # committed study runs are loaded by a fresh output directory, not trained
    committed = engine.commit_finished(reveal_gap, "quick", tmp_path / "out",
                                               runs=reveal_gap.study_runs("quick"))
    assert set(committed) == transformer
    reproduce("reveal-gap", "quick", tmp_path / "fresh", progress=False, log=quiet)
    assert not {p.parts[-4] for p in mtimes(tmp_path / "fresh")} & transformer
    assert json.loads((tmp_path / "fresh" / "claims.json").read_text())["claims"][0] == saved["claims"][0]


def test_sample_efficiency_budget_search_decides_the_transformer_sweep(tmp_path, monkeypatch):
    from interp.analysis import sample_efficiency as se
    from interp.reproduce import sample_efficiency as claim

    plan = claim.plan("quick")
    s = claim.SCALE["quick"]
    assert "transformer" not in plan.settings["spec"]["models"]   # the Transformer's sweep waits for its budget
    seen = []

    def trial(params, run_dir):   # converges from width 16 on: the second budget is the cheapest that fits
        seen.append(params)
        ok = params["model_options"]["d_model"] >= 16
        return {"converged": ok, "val_accuracy": 1.0 if ok else 0.2, "seconds": 0.1, "steps_run": params["steps"]}

    monkeypatch.setattr(se, "train_trial", trial)
    found = claim.transformer_budget(tmp_path, plan, quiet)
    assert found["chosen"] == s["budget"][1]
    assert [r["status"] for r in found["search"]] == ["did not fit", "fit"]
    first = seen[0]   # the budget's format at the longest length, with the largest training set the data allows
    assert first["format"] == s["budget_format"] and first["lengths"] == [s["max_length"]]
    assert first["n"] == min(s["search"]["n_max"], se.data_capacity(first))
    assert first["lr"] == s["budget"][0]["lr"] and first["steps"] == s["budget"][0]["steps"]
    data = claim.spec(s, "quick", ["transformer"], found["chosen"])
    assert data["models"] == ["transformer"] and data["lrs"] == [found["chosen"]["lr"]]
    assert data["model_options"]["transformer"] == {k: found["chosen"][k] for k in budget.MODEL_KEYS}
    assert data["train"]["steps"] == found["chosen"]["steps"] and data["train"]["warmup"] == found["chosen"]["warmup"]
    # no Transformer sweep where no budget fit: its claim is "did not fit", naming every budget tried
    plan.settings["study"] = {"kappa": [], "n_star": [], "trials": 0,
                              "budget": {"chosen": None, "search": found["search"]}}
    claims, sections = claim.judge([], plan)
    assert claims[0].verdict == "did not fit" and all(budget.budget_label(e) in claims[0].measured for e in s["budget"])


def test_search_stops_at_a_budget_that_is_not_trained():
    """obtain -> None (reproduce(train=False) with nothing committed): no choice, the rest 'not trained yet'."""
    runs = budget.candidates(BASE, GRID)
    labels = [budget.budget_label(e) for e in GRID]
    trained = []
    fits = stub(set(), trained)
    found = budget.search(runs, lambda run: None if run.label == labels[3] else fits(run), quiet)
    assert found["chosen"] is None and trained == [labels[2]]
    assert [r["status"] for r in found["rows"]] == ["did not fit"] + [budget.NOT_TRAINED] * 3
    assert set(found["outcomes"]) == {labels[2]}


def test_reveal_gap_study_with_train_false_trains_nothing_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(committed_runs, "RESULTS", tmp_path / "results")
    reproduce("reveal-gap", "quick", tmp_path / "out", progress=False, log=quiet, train=False)
    assert not list((tmp_path / "out").rglob("model.safetensors"))
    saved = json.loads((tmp_path / "out" / "claims.json").read_text())
    first = reveal_gap.transformer_runs("quick", [min(reveal_gap.SCALE["quick"]["gaps"])])
    cheapest = min(first, key=budget.cost).label
    assert cheapest in saved["pending"]
    assert saved["claims"][0]["verdict"] == "inconclusive"   # not "did not fit": nothing was trained
    assert "stopped at a budget not trained yet" in saved["claims"][0]["measured"]
    page = (tmp_path / "out" / "report.html").read_text()
    assert "not trained yet" in page and cheapest in page


def test_sample_efficiency_sweeps_are_committed_and_continue_elsewhere(tmp_path, monkeypatch):
    """A finished quick study committed as table rows: a fresh directory with train=False rebuilds the same
    N*s and kappas from them, training nothing; with nothing committed it says what is pending."""
    from interp.reproduce import sample_efficiency as claim

    torch.set_num_threads(1)
    monkeypatch.setattr(committed_runs, "RESULTS", tmp_path / "results")
    reproduce("sample-efficiency", "quick", tmp_path / "first", progress=False, log=quiet)
    added = claim.commit(tmp_path / "first", "quick")
    assert added["budget"] >= 1 and added["sweep"] >= 1
    assert claim.commit(tmp_path / "first", "quick") == {name: 0 for name in added}   # merging twice adds nothing
    saved = json.loads((tmp_path / "first" / "claims.json").read_text())
    reproduce("sample-efficiency", "quick", tmp_path / "again", progress=False, log=quiet, train=False)
    again = json.loads((tmp_path / "again" / "claims.json").read_text())
    assert again["claims"] == saved["claims"] and again["pending"] == []
    assert not list((tmp_path / "again").rglob("model.safetensors"))   # every trial came from the committed rows
    monkeypatch.setattr(committed_runs, "RESULTS", tmp_path / "empty")
    reproduce("sample-efficiency", "quick", tmp_path / "none", progress=False, log=quiet, train=False)
    none = json.loads((tmp_path / "none" / "claims.json").read_text())
    assert any("N* sweep sweep" in p for p in none["pending"]) and not list((tmp_path / "none").rglob("*.safetensors"))
    assert {c["verdict"] for c in none["claims"][:2]} == {"inconclusive"}
