"""Evaluation by length, mp, figures and the HTML report, on constructed models and curves."""

import math
import re

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

from interp.report import evaluation as figures
from interp.training.evaluate import LengthEval, evaluate_lengths, max_passing_length, refine_mp, score
from interp.report.html import Table, Text, render_report, write_report
from interp.tasks import make_task
from interp.tasks.base import Batch
from tests.browser import assert_renders


class ParityOracle(torch.nn.Module):
    """Logits of the running parity of the tokens, wrong from position `breaks_at` on (0-based)."""

    def __init__(self, breaks_at: int = 10**9) -> None:
        super().__init__()
        self.breaks_at = breaks_at
        self.dummy = torch.nn.Parameter(torch.zeros(()))

    def forward(self, tokens):  # [B, T] -> [B, T, 2]
        parity = tokens.cumsum(1) % 2
        wrong = torch.arange(tokens.shape[1]) >= self.breaks_at
        parity = torch.where(wrong, 1 - parity, parity)
        return torch.nn.functional.one_hot(parity, 2).float()


@pytest.mark.parametrize("accuracies,threshold,expected", [
    ({60: 1.0, 100: 0.95, 200: 0.89, 500: 0.91, 1000: 0.2}, 0.9, 500),
    ({60: 1.0, 100: 0.95, 200: 0.89, 500: 0.91, 1000: 0.2}, 0.95, 100),
    ({60: 0.9, 100: 0.8999}, 0.9, 60),
    ({60: 0.5, 100: 0.4}, 0.9, None),
    ({60: 1.0, 1000: 1.0}, 0.9, 1000),
    ({}, 0.9, None),
])
def test_max_passing_length(accuracies, threshold, expected):
    assert max_passing_length(accuracies, threshold) == expected


def test_max_passing_length_rejects_bad_threshold():
    with pytest.raises(ValueError, match="threshold must be in"):
        max_passing_length({60: 1.0}, 1.5)


def test_score_on_constructed_predictions():
    targets = torch.tensor([[0, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 1]])
    mask = torch.tensor([[True, True, True, True], [True, True, True, False], [False, False, False, True]])
    pred = targets.clone()
    pred[0, 3] = 1   # example 0 wrong at its last loss position (3)
    pred[1, 0] = 0   # example 1 wrong at position 0, right at its last loss position (2)
    pred[1, 3] = 1   # not a loss position: ignored
    batch = Batch(torch.zeros_like(targets), targets, mask, targets)
    final, per_position = score(pred, batch)
    assert final == pytest.approx(2 / 3)
    np.testing.assert_allclose(per_position, [0.5, 1.0, 1.0, 0.5])


def test_score_marks_positions_without_loss_as_nan():
    targets = torch.zeros(2, 3, dtype=torch.long)
    mask = torch.tensor([[False, True, True], [False, False, True]])
    final, per_position = score(targets.clone(), Batch(targets, targets, mask, targets))
    assert final == 1.0 and math.isnan(per_position[0]) and per_position[1:].tolist() == [1.0, 1.0]


def test_evaluate_lengths_with_oracles():
    task = make_task("C2", format="acot")
    perfect = evaluate_lengths(ParityOracle(), task, [5, 50, 300], n=64, max_tokens=1000)
    assert perfect.final_accuracy == {5: 1.0, 50: 1.0, 300: 1.0} and perfect.mp == 300
    broken = evaluate_lengths(ParityOracle(breaks_at=100), task, [60, 100, 101, 200], n=32)
    assert broken.final_accuracy == {60: 1.0, 100: 1.0, 101: 0.0, 200: 0.0}
    assert broken.mp == 100
    curve = broken.position_accuracy[200]
    assert curve.shape == (200,) and (curve[:100] == 1).all() and (curve[100:] == 0).all()
    as_dict = broken.to_dict()
    assert as_dict["mp"] == 100 and as_dict["final_accuracy"]["101"] == 0.0


@pytest.mark.parametrize("breaks_at", [201, 217, 249])
def test_refine_mp_finds_the_break_between_grid_lengths(breaks_at):
    """An oracle right up to `breaks_at` tokens: the grid says mp 200; the refinement brackets the break
    to 2% (4 tokens) from below, evaluating only lengths inside (200, 250)."""
    task = make_task("C2", format="acot")
    oracle = ParityOracle(breaks_at=breaks_at)
    grid = evaluate_lengths(oracle, task, [60, 100, 200, 250, 500], n=16).final_accuracy
    assert max_passing_length(grid) == 200
    mp, added = refine_mp(oracle, task, grid, resolution=0.02, n=16)
    assert mp <= breaks_at and breaks_at - mp <= int(0.02 * mp)
    assert added and all(200 < t < 250 for t in added) and added.get(mp, 1.0) == 1.0
    assert all((acc == 1.0) == (t <= breaks_at) for t, acc in added.items())


def test_refine_mp_keeps_a_missing_or_longest_mp_and_checks_resolution():
    task = make_task("C2", format="acot")
    assert refine_mp(ParityOracle(), task, {60: 1.0, 100: 1.0}) == (100, {})
    assert refine_mp(ParityOracle(), task, {60: 0.5, 100: 0.2}) == (None, {})
    with pytest.raises(ValueError, match="resolution must be in"):
        refine_mp(ParityOracle(), task, {60: 1.0}, resolution=0)


def test_evaluation_is_deterministic_and_chunking_does_not_matter():
    task = make_task("S3", format="acot")
    torch.manual_seed(0)
    import models

    model = models.build("tanh_rnn", vocab_size=task.vocab_size, d_model=8)
    a = evaluate_lengths(model, task, [7, 30], n=40, seed=3, max_tokens=60)
    b = evaluate_lengths(model, task, [30, 7], n=40, seed=3)
    assert a.final_accuracy == b.final_accuracy
    for length in (7, 30):
        np.testing.assert_array_equal(a.position_accuracy[length], b.position_accuracy[length])


@pytest.mark.parametrize("bad", [[], [0, 10], [5.5], "60"])
def test_evaluate_lengths_rejects_bad_lengths(bad):
    with pytest.raises(ValueError, match="lengths must be a non-empty list of positive ints"):
        evaluate_lengths(ParityOracle(), make_task("C2"), bad)


def fake_results():
    return {
        "tanh_rnn": LengthEval({60: 1.0, 200: 0.97, 1000: 0.93},
                               {60: np.ones(60), 200: np.ones(200), 1000: np.linspace(1, 0.9, 1000)}, n=8),
        "mamba": LengthEval({60: 0.95, 200: 0.4, 1000: 0.2},
                            {60: np.ones(60), 200: np.ones(200), 1000: np.linspace(1, 0.1, 1000)}, n=8),
    }


def test_figures_carry_the_data():
    results = fake_results()
    fig = figures.accuracy_vs_length(results, threshold=0.9, train_length=60)
    assert isinstance(fig, go.Figure) and fig.layout.xaxis.type == "log"
    by_name = {trace.name: trace for trace in fig.data}
    assert list(by_name["mamba"].y) == [0.95, 0.4, 0.2] and list(by_name["tanh_rnn"].x) == [60, 200, 1000]
    rows = figures.mp_rows(results)
    assert rows == [{"model": "tanh_rnn", "mp": 1000, "acc@60": 1.0, "acc@200": 0.97, "acc@1000": 0.93},
                    {"model": "mamba", "mp": 60, "acc@60": 0.95, "acc@200": 0.4, "acc@1000": 0.2}]
    table = figures.mp_table(results)
    assert list(table.data[0].cells.values[1]) == [1000, 60]
    metrics = {"tanh_rnn": [{"kind": "train", "step": 10, "loss": 1.0, "accuracy": 0.5},
                            {"kind": "eval", "step": 10, "length": 2, "accuracy": 0.7}]}
    curves = figures.training_curves(metrics)
    assert [t.name for t in curves.data[3:]] == ["tanh_rnn", "tanh_rnn training accuracy", "tanh_rnn evaluation accuracy"]
    assert list(curves.data[3].y) == [1.0] and list(curves.data[5].y) == [0.7]
    assert len(figures.position_accuracy(results, 1000).data[1].y) == 1000
    with pytest.raises(ValueError, match="non-empty mapping"):
        figures.accuracy_vs_length({})


def test_report_is_self_contained_with_plotly_inline_once(tmp_path):
    results = fake_results()
    sections = [Text("Intro <b>escaped</b>", heading="About"), figures.accuracy_vs_length(results),
                Table(figures.mp_rows(results), heading="mp"), figures.mp_table(results)]
    path = write_report(tmp_path / "r" / "report.html", "Demo & test", sections)
    text = path.read_text()
    assert text.startswith("<!DOCTYPE html>") and "Demo &amp; test" in text
    assert "Intro &lt;b&gt;escaped&lt;/b&gt;" in text
    assert not re.search(r"<script[^>]+src=", text)
    assert text.count("plotly.js v") == 1 and len(text) > 1_000_000  # plotly.js embedded, once
    assert text.count('class="plotly-graph-div"') == 2
    assert "<td>1000</td>" in text
    assert_renders(path)
    with pytest.raises(TypeError, match=r"sections\[0\] must be a go.Figure, Text or Table"):
        render_report("x", ["not a section"])
