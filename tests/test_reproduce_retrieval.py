"""The retrieval --scale medium profile (issue 26): the runs AR 8 / 16 and ATR need with the length
curriculum the budget search found, its early stop and recorded search; the verdicts it gives on
hand-made outcomes; and the runs committed under results/reproduce/retrieval-medium are the plan's
runs, loaded and read from their measurement cache instead of retrained."""

import json

import pytest

from interp.reproduce import claim_module, engine, reproduce
from interp.reproduce import results as committed
from interp.reproduce.engine import Outcome

MODULE = claim_module("retrieval")


def test_medium_plan_trains_ar8_and_atr_with_the_curriculum_and_early_stop():
    plan = MODULE.plan("medium")
    by_task = {task: sorted(r.info["model"] for r in plan.runs if r.info["task"] == task) for task in ("AR", "ATR")}
    atr = sorted(["attention", "mamba", "mamba d_conv=1"] * 2)          # seeds 0 and 1
    ar = sorted(["attention", "mamba", "mamba d_conv=1", "based", "deltanet", "h3", "hyena"] * 2)
    assert by_task == {"AR": ar, "ATR": atr} and {r.info["seed"] for r in plan.runs} == {0, 1}
    assert {(r.info["pairs"], r.info["keys"]) for r in plan.runs if r.info["task"] == "AR"} == {(8, 16)}
    assert plan.early_stop == MODULE.EARLY_STOP
    for run in plan.runs:
        t = run.train
        assert t["curriculum"] is True and t["curriculum_start"] == 2 and t["eval_every"] == 25 and t["warmup"] == 100
        medium = MODULE.SCALE["medium"]
        assert t["steps"] == (medium["atr_steps"] if run.task == "ATR"
                              else medium["ar_steps"].get(run.info["model"], medium["steps"]))
        assert t["steps"] == {("AR", "attention"): 6000, ("ATR", run.info["model"]): 16000}.get((run.task, run.info["model"]), 3000)
        assert t["lr"] == (1e-3 if run.preset == "transformer" else 3e-3)
        assert run.model["n_layers"] == 2 and run.model["d_model"] == 64
        assert run.model.get("d_conv", 4) == (1 if run.info["model"] == "mamba d_conv=1" else 4)
    # every probe of the budget search is a row of the sizes table
    rows = {r["setting"]: r["value"] for r in plan.sizes}
    assert MODULE.SEARCH and all(f"budget search: {probe}" in rows for probe in MODULE.SEARCH)
    # the cpu profile is unchanged by it: no curriculum, no early stop, the two ATR models
    cpu = MODULE.plan("cpu")
    assert cpu.early_stop is None and not any(r.train.get("curriculum") for r in cpu.runs)
    assert sorted(r.info["model"] for r in cpu.runs if r.task == "ATR") == ["attention", "mamba d_conv=1"]


def layer1_rows(role):
    """Restoration rows where `role` restores 0.9 at layer 1 and every other site 0.1 or 0."""
    return [{"layer": layer, "hook": hook, "role": r, "sem": 0.01,
             "restoration": (0.9 if r == role else 0.1) if layer == 1 else 0.0}
            for layer in (0, 1) for hook in ("hook_resid_pre", "hook_out") for r in ("key", "value", "query")]


def medium_outcomes(reading_of, accuracy_of):
    """Outcomes of the medium plan; a run fits when accuracy_of(run) >= 0.9; restoration rows that read
    as reading_of(run): "value" (induction: on AR the value restores under the key corruption, on ATR
    the key under the value corruption) or "query" (direct retrieval)."""
    done = []
    for run in MODULE.plan("medium").runs:
        acc = accuracy_of(run)
        role = reading_of(run)
        atr = run.task == "ATR"
        measures = {"accuracy": acc, "restoration": layer1_rows("query" if atr else role), "n_kept": 100,
                    "n_pairs": 128, "reading": ""}
        if atr:
            measures["value_corrupted"] = {"restoration": layer1_rows("key" if role == "value" else "query"),
                                           "n_kept": 100}
        status = "fit" if acc >= 0.9 else "did not fit"
        done.append(Outcome(run, status, None, run.train["lr"], run.train["train_length"], acc, [], 1.0,
                            measures=measures))
    return done


def test_medium_verdicts_read_the_atr_mechanism_and_compare_every_atr_model():
    plan = MODULE.plan("medium")
    value_on_atr = lambda run: "value" if run.task == "ATR" or run.info["model"] in ("attention", "based") else "query"  # noqa: E731
    collapse = lambda run: (0.1 if run.task == "AR" and run.info["model"] == "mamba d_conv=1"  # noqa: E731
                            else 0.3 if run.info["model"] in ("h3", "hyena") else 0.97)
    claims, sections = MODULE.judge(medium_outcomes(value_on_atr, collapse), plan)
    # every run kept pairs: a heatmap per run and per ATR value corruption, no "no restoration profile" note
    assert not any("no restoration profile" in str(getattr(x, "heading", "")) for x in sections)
    titles = [x.layout.title.text for x in sections if hasattr(x, "layout")]
    atr = sum(run.task == "ATR" for run in plan.runs)
    assert sum("(key corrupted)" in t for t in titles) == len(plan.runs) and sum("(value corrupted)" in t for t in titles) == atr
    verdicts = [c.verdict for c in claims]
    # attention and Based induction, Mamba and DeltaNet direct retrieval, H3 / Hyena fail where the others fit,
    # collapse, ATR induction, ATR behaviour
    assert verdicts == ["reproduces"] * 6
    assert "AR8-h3-s0: acc 0.30 (did not fit)" in claims[2].measured and "AR8-deltanet-s1" in claims[1].measured
    assert "attention" in claims[5].measured and "mamba 0.97" in claims[5].measured
    # ATR Mamba d_conv = 1 reading direct retrieval, and losing to Mamba with its convolution
    query_on_atr = lambda run: "query" if run.info["model"] != "attention" else "value"  # noqa: E731
    worse = lambda run: 0.92 if run.info["model"] == "mamba d_conv=1" else 0.99  # noqa: E731
    verdicts = [c.verdict for c in MODULE.judge(medium_outcomes(query_on_atr, worse), plan)[0]]
    assert verdicts[4] == "does not reproduce" and verdicts[5] == "does not reproduce"
    # attention, the claim's reference, not reading as induction on ATR either: the premise fails
    nobody = lambda run: "query" if run.task == "ATR" or run.info["model"] != "attention" else "value"  # noqa: E731
    claims, _ = MODULE.judge(medium_outcomes(nobody, collapse), plan)
    assert claims[4].verdict == "premise fails" and "does not read as induction on this ATR either" in claims[4].measured
    assert "ATR-attention-s0: value corrupted 0.10 / 0.10 / 0.90, key corrupted" in claims[4].measured
    # nothing fits on ATR: both ATR claims say so
    unfit = lambda run: 0.8 if run.task == "ATR" else 0.97  # noqa: E731
    verdicts = [c.verdict for c in MODULE.judge(medium_outcomes(value_on_atr, unfit), plan)[0]]
    assert verdicts[4] == verdicts[5] == "did not fit"


def never(*_args, **_kwargs):
    raise AssertionError("a committed medium run must be loaded, not trained or re-measured")


def test_committed_medium_runs_are_the_plans_and_are_reused(tmp_path, monkeypatch):
    """Every run committed under results/reproduce/retrieval-medium has the config the plan trains and a
    measurement cache under the plan's settings: `interp reproduce retrieval --scale medium` trains and
    measures none of them again."""
    kept = committed.results_dir("retrieval", "medium")
    labels = sorted(p.name for p in kept.iterdir() if (p / committed.OUTCOME).is_file()) if kept.is_dir() else []
    if not labels:
        pytest.skip("no retrieval medium run committed yet")
    plan = MODULE.plan("medium")
    assert set(labels) <= {r.label for r in plan.runs}
    monkeypatch.setattr(engine, "train_run", never)
    monkeypatch.setattr(MODULE, "measure", never)
    lines = []
    reproduce("retrieval", "medium", tmp_path / "out", progress=False, log=lines.append, train=False)
    assert sum("committed in" in line for line in lines) == len(labels)
    saved = json.loads((tmp_path / "out" / "claims.json").read_text())
    assert sorted(r["run"] for r in saved["runs"]) == labels
    for row in saved["runs"]:
        outcome = json.loads((kept / row["run"] / committed.OUTCOME).read_text())
        assert row["status"] == outcome["status"] and row["in-dist acc"] == outcome["in_distribution"]
        assert row["measures"]["accuracy"] >= 0 and "reading" in row["measures"]
    assert not list((tmp_path / "out").rglob("*.safetensors"))


def test_atr_value_precedes_key_so_the_induction_reading_uses_the_value_corruption():
    """ATR puts a phrase's head first: the answer's occurrence (value) precedes the queried child (key) in
    every document, so a key corruption leaves the value position untouched (restoration 0 by causality);
    the reading takes the paper's measure, the value corrupted and the key restored."""
    task = MODULE.plan("medium").runs[-1].task_object()
    batch = task.sample(256, 12, 0)
    assert bool((batch.roles["value"] < batch.roles["key"]).all())

    def rows(key, value, query):
        return [{"layer": layer, "hook": hook, "role": role, "sem": 0.01,
                 "restoration": {"key": key, "value": value, "query": query}[role] if layer == 1 else 0.0}
                for layer in (0, 1) for hook in ("hook_resid_pre", "hook_out") for role in ("key", "value", "query")]
    direct = rows(key=0.2, value=0.0, query=0.9)            # key corrupted: the query restores
    stored = {"restoration": direct, "value_corrupted": {"restoration": rows(key=0.8, value=0.0, query=0.1)}}
    assert MODULE.read_measures(stored) == "induction"
    weak = {"restoration": direct, "value_corrupted": {"restoration": rows(key=0.3, value=0.0, query=0.1)}}
    assert MODULE.read_measures(weak) == "direct retrieval"
    at_query = {"restoration": direct, "value_corrupted": {"restoration": rows(key=0.6, value=0.0, query=0.9)}}
    assert MODULE.read_measures(at_query) == "direct retrieval"
    assert MODULE.read_measures({"restoration": direct}) == "direct retrieval"   # AR: the key corruption only
