"""`interp reproduce`: every reproduction's --quick smoke run writes the report and the claim table with
allowed verdicts; finished runs and measurements are reused; an interrupted run resumes bit for bit;
divergences are retried at a lower lr; bad names and scales name the choices."""

import json

import pytest
import torch

import models
from interp.cli import main
from interp.reproduce import claim_module, engine, names, reproduce
from interp.training.train import TrainingDiverged, train
from tests.browser import assert_renders

REQUIRED = {"error-control", "retrieval", "deltanet-heads", "parity", "reveal-gap", "selective-copy"}


def quiet(_line):
    pass


def test_every_required_reproduction_is_registered():
    assert REQUIRED <= set(names())


@pytest.mark.parametrize("name", sorted(REQUIRED | {"sample-efficiency", "pfsa"}))
def test_quick_run_writes_report_and_claim_table(name, tmp_path):
    torch.set_num_threads(1)
    lines = []
    report = reproduce(name, "quick", tmp_path, progress=False, log=lines.append)
    page = report.read_text()
    for header in ("claim", "what was measured", "runs and seeds", "verdict", "why (the verdict rule)"):
        assert f"<th>{header}</th>" in page
    assert_renders(report)
    saved = json.loads((tmp_path / "claims.json").read_text())
    assert saved["name"] == name and saved["scale"] == "quick" and saved["claims"]
    for claim in saved["claims"]:
        assert claim["verdict"] in engine.VERDICTS
        # every judge routes through the verdict rule (interp.reproduce.verdicts): its reason starts with the
        # verdict, and the row says what stands behind it (runs and seeds, or an exact computation)
        assert claim["rule"].startswith(claim["verdict"]) and claim["basis"]
        assert claim["basis"] == "exact computation" or "seed" in claim["basis"] or claim["basis"] == "no runs"
        if claim["verdict"] in ("reproduces", "does not reproduce") and claim["basis"] != "exact computation":
            assert "seeds" in claim["rule"] and "of" in claim["rule"]
        assert claim["quote"] and claim["measured"] and claim["original"]
        assert claim["source"].endswith(".txt") or "arXiv" in claim["source"]
        # the console says every claim: its verdict and sentence, then what was measured
        assert any(line.startswith(f"[{claim['verdict']}] {claim['quote']}")
                   and f"    measured: {claim['measured']}" in line for line in lines)
    if name == "error-control":   # per site and reading: r between and within runs with intervals, printed
        tables = [line for line in lines if line.startswith("Tcross vs mp at")]
        assert len(tables) == 2 * len(claim_module(name).GROUP_SETS)
        assert all("r between runs" in t and "r within models" in t and "its 95% paired interval" in t for t in tables)
    plan = claim_module(name).plan("quick")
    assert {row["run"] for row in saved["runs"]} == {r.label for r in plan.runs}
    assert all(row["status"] in ("fit", "did not fit", "diverged") for row in saved["runs"])
    for scale in ("cpu", "paper"):   # every number of the real profiles names its source
        assert all(row["source"] for row in claim_module(name).plan(scale).sizes)


def test_rerun_reuses_finished_runs_and_cached_measures(tmp_path, monkeypatch):
    module = claim_module("parity")
    reproduce("parity", "quick", tmp_path, progress=False, log=quiet)
    weights = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("runs/*/checkpoints/*/model.safetensors")}
    assert len(weights) == len(module.plan("quick").runs)
    trained = {r["run"]: r["train s"] for r in json.loads((tmp_path / "claims.json").read_text())["runs"]}
    assert all(s > 0 for s in trained.values())

    def fail(*_):
        raise AssertionError("a finished run's measurement must come from the cache")

    monkeypatch.setattr(module, "measure", fail)
    lines = []
    reproduce("parity", "quick", tmp_path, progress=False, log=lines.append)
    assert all("resuming/reusing" in line for line in lines if line.endswith(("training", "resuming/reusing")))
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("runs/*/checkpoints/*/model.safetensors")} == weights
    again = {r["run"]: r["train s"] for r in json.loads((tmp_path / "claims.json").read_text())["runs"]}
    assert again == trained                     # a reused run keeps its training time; reuse adds none


def test_interrupted_reproduction_resumes_bit_for_bit(tmp_path):
    """A run stopped half-way (as a killed process leaves it) is finished, not restarted: its weights
    equal those of an uninterrupted reproduction; the other runs train as usual."""
    plan = claim_module("parity").plan("quick")
    first = plan.runs[0]
    task = first.task_object()
    config = models.preset_config(first.preset, vocab_size=task.vocab_size, **first.model)
    cfg = engine.train_config(first, first.train["lr"], "cpu")
    train(config, task, cfg, tmp_path / "interrupted" / "runs" / first.label, stop_at=cfg.steps // 2, progress=False)
    lines = []
    reproduce("parity", "quick", tmp_path / "interrupted", progress=False, log=lines.append)
    assert lines[0].endswith("resuming/reusing") and lines[2].endswith("training")
    reproduce("parity", "quick", tmp_path / "straight", progress=False, log=quiet)
    resumed = models.load(tmp_path / "interrupted" / "runs" / first.label).state_dict()
    straight = models.load(tmp_path / "straight" / "runs" / first.label).state_dict()
    assert all(torch.equal(resumed[k], straight[k]) for k in straight)


def test_divergence_is_retried_at_a_lower_documented_lr(tmp_path, monkeypatch):
    run = claim_module("parity").plan("quick").runs[0]
    seen = []

    def diverging_train(model_config, task, cfg, out, **kwargs):
        seen.append((cfg.lr, out.name))
        if cfg.lr > run.train["lr"] / engine.LR_RETRY_FACTOR / 2:
            raise TrainingDiverged("training stopped: the loss is nan at step 3; no checkpoint was written yet")
        return train(model_config, task, cfg, out, **kwargs)

    monkeypatch.setattr(engine, "train", diverging_train)
    outcome = engine.train_run(run, tmp_path, progress=False)
    lrs = [lr for lr, _ in seen]
    assert lrs == pytest.approx([run.train["lr"] / engine.LR_RETRY_FACTOR ** i for i in range(3)])
    assert len({name for _, name in seen}) == 3                   # each retry in its own directory
    assert outcome.status in ("fit", "did not fit") and outcome.lr == pytest.approx(lrs[-1])
    assert len(outcome.retries) == 3 and "diverged at lr" in outcome.retries[0] and "retried at lr" in outcome.retries[-1]

    monkeypatch.setattr(engine, "train", lambda *a, **k: (_ for _ in ()).throw(TrainingDiverged("nan")))
    gave_up = engine.train_run(run, tmp_path / "never", progress=False)
    assert gave_up.status == "diverged" and len(gave_up.retries) == engine.MAX_RETRIES + 1


def test_bad_name_and_scale_list_the_choices(tmp_path, capsys):
    with pytest.raises(ValueError, match="choose from .*parity.*selective-copy"):
        reproduce("partiy", "quick", tmp_path)
    with pytest.raises(ValueError, match="scale must be one of quick, cpu, paper"):
        reproduce("parity", "gpu", tmp_path)
    assert main(["reproduce", "nope", "--out", str(tmp_path)]) == 2
    assert "choose from error-control" in capsys.readouterr().err
    assert main(["reproduce", "parity", "--scale", "gpu", "--out", str(tmp_path)]) == 2
    assert "choose from cpu, medium, paper" in capsys.readouterr().err
    with pytest.raises(ValueError, match="scale must be one of quick, cpu, medium, paper for error-control"):
        reproduce("error-control", "gpu", tmp_path)
    assert main(["reproduce", "parity", "--scale", "medium", "--out", str(tmp_path)]) == 2   # parity has no medium
    assert "scale must be one of quick, cpu, paper for parity" in capsys.readouterr().err
    with pytest.raises(ValueError, match="verdict must be one of"):
        engine.Claim("x.txt", "q", verdict="sort of")


def test_cli_quick_run(tmp_path, capsys):
    assert main(["reproduce", "parity", "--quick", "--no-progress", "--out", str(tmp_path)]) == 0
    assert "wrote" in capsys.readouterr().out and (tmp_path / "report.html").exists()


def test_early_stop_at_fit_stops_where_the_rule_holds_and_is_reused(tmp_path):
    """train_until_fit stops at the first chunk end where the last k curriculum evaluations at the
    training length pass; the weights are those of a plain run stopped at that step; a rerun reuses
    the stop (no training); Plan rejects a malformed rule."""
    torch.set_num_threads(1)
    run = engine.Run("r", "tanh_rnn", "C2", {"format": "acot"}, {"d_model": 8, "n_layers": 1},
                     {"steps": 40, "batch_size": 8, "lr": 1e-2, "train_length": 4, "eval_every": 2, "eval_size": 16,
                      "warmup": 2})
    task = run.task_object()
    config = models.preset_config(run.preset, vocab_size=task.vocab_size, **run.model)
    cfg = engine.train_config(run, run.train["lr"], "cpu")
    rule = {"accuracy": 0.01, "evals": 2}
    result = engine.train_until_fit(config, task, cfg, tmp_path / "early", rule, False, "r")
    evals = [r for r in result.metrics if r["kind"] == "eval"]
    assert result.step == 4 and len(evals) == 2 and engine.fitted_evals(result.metrics, 4, rule)
    assert json.loads((tmp_path / "early" / engine.EARLY_STOP_FILE).read_text())["step"] == 4
    train(config, task, cfg, tmp_path / "plain", stop_at=4, progress=False)
    early, plain = models.load(tmp_path / "early").state_dict(), models.load(tmp_path / "plain").state_dict()
    assert all(torch.equal(early[k], plain[k]) for k in plain)
    stamp = {p: p.stat().st_mtime_ns for p in (tmp_path / "early").rglob("model.safetensors")}
    again = engine.train_until_fit(config, task, cfg, tmp_path / "early", rule, False, "r")
    assert again.step == 4 and {p: p.stat().st_mtime_ns for p in (tmp_path / "early").rglob("model.safetensors")} == stamp
    never = {"accuracy": 1.0, "evals": 40}           # more evaluations than the run makes: trains every step
    assert engine.train_until_fit(config, task, cfg, tmp_path / "full", never, False, "r").step == 40
    assert not engine.fitted_evals([{"kind": "eval", "length": 2, "accuracy": 1.0}] * 3, 4, {"accuracy": 0.5, "evals": 2})
    with pytest.raises(ValueError, match="early_stop"):
        engine.Plan("quick", [], [], early_stop={"accuracy": 0.99})
