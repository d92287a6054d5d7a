"""A training collapse (finite loss, accuracy at the current curriculum length falling to a fraction of its
best there) stops an early-stopped run and is retried at a lower lr like a divergence; the rule flags the
committed run that collapsed and none of the committed runs that did not, at any logged step."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from interp.reproduce import claim_module, engine
from interp.training.train import TrainingDiverged

RESULTS = Path(__file__).resolve().parents[1] / "results" / "reproduce"
COLLAPSED = RESULTS / "error-control-medium" / "S3-aussm-L2-s0" / "attempts" / "S3-aussm-L2-s0"   # kept on commit


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train_rows(accuracies: list[tuple[int, float]], start: int = 0) -> list[dict]:
    """(length, accuracy) per logged step, every 10 steps from `start`."""
    return [{"kind": "train", "step": start + 10 * (i + 1), "length": length, "accuracy": acc}
            for i, (length, acc) in enumerate(accuracies)]


def first_collapse(metrics: list[dict]) -> tuple[int, str] | None:
    for step in sorted({r["step"] for r in metrics}):
        reason = engine.collapse([r for r in metrics if r["step"] <= step])
        if reason:
            return step, reason
    return None


def test_the_committed_collapse_is_flagged_where_it_happened():
    step, reason = first_collapse(rows(COLLAPSED / "metrics.jsonl"))
    assert 1000 < step < 1600 and "length 16" in reason and "fell from 0.8" in reason


def test_exactly_the_committed_runs_marked_collapsed_are_flagged():
    """Every committed run or unfinished copy is flagged at some logged step exactly when the engine
    recorded a collapse for it (collapsed.json, kept with the copy)."""
    paths = list(RESULTS.glob("**/metrics.jsonl"))
    assert len(paths) > 40
    flagged = {str(p.parent.relative_to(RESULTS)) for p in paths if first_collapse(rows(p))}
    marked = {str(p.parent.relative_to(RESULTS)) for p in RESULTS.glob("**/" + engine.COLLAPSE_FILE)}
    assert str(COLLAPSED.relative_to(RESULTS)) in marked
    assert flagged == marked


def test_the_drop_when_the_curriculum_moves_on_and_noise_are_not_collapses():
    moved = train_rows([(16, 0.97)] * 60 + [(32, 0.3)] * 60)     # a new length starts low
    assert engine.collapse(moved) is None
    noisy = train_rows([(60, 0.9 if i % 2 else 0.4) for i in range(120)])
    assert engine.collapse(noisy) is None                        # one step above half the best is enough
    fell = train_rows([(60, 0.9)] * 60 + [(60, 0.3)] * 50)
    assert "fell from 0.90 to at most 0.30" in engine.collapse(fell)
    assert engine.collapse(train_rows([(60, 0.3)] * 30)) is None  # nothing before the window


def test_a_collapse_is_retried_at_a_lower_lr_and_remembered(tmp_path, monkeypatch):
    run = claim_module("parity").plan("quick").runs[0]
    rule = {"accuracy": 0.99, "evals": 4}
    calls = []

    def collapsing_train(config, task, cfg, out, stop_at=None, **kwargs):
        calls.append((cfg.lr, out.name, stop_at))
        out.mkdir(parents=True, exist_ok=True)
        metrics = train_rows([(cfg.train_length, 0.9)] * 60 + [(cfg.train_length, 0.2)] * 60)
        return SimpleNamespace(step=stop_at, metrics=metrics, model=None)

    monkeypatch.setattr(engine, "train", collapsing_train)
    cfg = engine.train_config(run, 1e-2, "cpu")
    cfg.steps = 10_000
    with pytest.raises(TrainingDiverged, match="collapsed"):
        engine.train_until_fit(None, None, cfg, tmp_path / "a", rule, False, "a")
    assert json.loads((tmp_path / "a" / engine.COLLAPSE_FILE).read_text())["rule"] == engine.COLLAPSE
    calls.clear()
    with pytest.raises(TrainingDiverged, match="collapsed"):   # a rerun trains nothing
        engine.train_until_fit(None, None, cfg, tmp_path / "a", rule, False, "a")
    assert calls == []
