"""examples/attribution_screen.py end to end (--quick), `agreement` and the figures it draws."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from interp.analysis.interventions import InterchangeResult, Site, agreement
from interp.report.interventions import attribution_scatter, restoration_heatmap
from tests.browser import assert_renders

RECIPE = Path(__file__).resolve().parents[1] / "examples" / "attribution_screen.py"


def result(values, kept=None, logit_diff=None) -> InterchangeResult:
    """A result over sites blocks.{0,1}.{hook_resid_pre, mixer.hook_out} x S / 4 positions, restoration
    = values [S, N] (p_clean 1, p_corrupt 0), optional logit differences (clean 1, corrupt 0)."""
    values = torch.as_tensor(values, dtype=torch.float64)
    s, n = values.shape
    sites = [Site(f"blocks.{l}.{h}", t) for l in range(2) for h in ("hook_resid_pre", "mixer.hook_out")
             for t in range(s // 4)]
    kept = torch.ones(n, dtype=torch.bool) if kept is None else torch.tensor(kept)
    zeros = torch.zeros(n, dtype=torch.float64)
    out = InterchangeResult(sites, values.masked_fill(~kept, float("nan")), values.clone(), zeros + 1, zeros, kept, 0.01)
    if logit_diff is not None:
        out.logit_diff_patched, out.logit_diff_clean, out.logit_diff_corrupt = (
            torch.as_tensor(logit_diff, dtype=torch.float64), zeros + 1, zeros.clone())
    return out


def test_agreement_of_a_result_with_itself_and_with_a_rescaled_copy():
    rng = np.random.default_rng(0)
    exact = result(rng.normal(size=(8, 5)))
    for estimate in (exact, result(2 * exact.restoration + 0.5)):  # Pearson r is affine-invariant
        score = agreement(exact, estimate, top=3)
        assert score["r_pairs"] == pytest.approx(1.0) and score["r_site_means"] == pytest.approx(1.0)
        assert score["r_site_median"] == pytest.approx(1.0)
        assert score["recall_top"] == 1.0 and score["n_nonzero"] == 40


def test_agreement_known_values():
    # site means exact 0..7, estimate reversed: r over means -1, the top 2 sets {7, 6} vs {0, 1} disjoint
    exact = result(np.repeat(np.arange(8.0)[:, None], 3, 1) + np.array([0.0, 0.1, -0.1]))
    estimate = result(np.repeat(np.arange(8.0)[::-1, None], 3, 1))
    score = agreement(exact, estimate, top=2)
    assert score["r_site_means"] == pytest.approx(-1.0) and score["recall_top"] == 0.0
    assert agreement(exact, estimate, top=8)["recall_top"] == 1.0   # every site is in both tops
    # zeros in both do not count as nonzero pairs; examples dropped by either are left out
    exact, estimate = result([[0.0, 1.0, 2.0]] * 4, kept=[True, True, False]), result([[0.0, 2.0, 5.0]] * 4)
    score = agreement(exact, estimate, top=1)
    assert score["n_nonzero"] == 4 and math.isnan(score["r_nonzero"])   # one distinct value pair: undefined
    none_kept = agreement(result(np.ones((4, 3)), kept=[False] * 3), result(np.ones((4, 3))), top=2)
    assert all(math.isnan(none_kept[k]) for k in ("r_pairs", "r_site_means", "recall_top"))


def test_agreement_logit_difference_and_bad_input():
    rng = np.random.default_rng(1)
    ld = rng.normal(size=(4, 6))
    exact, estimate = result(np.zeros((4, 6)), logit_diff=ld), result(np.zeros((4, 6)), logit_diff=-ld)
    assert agreement(exact, estimate, "logit_diff_restoration", top=1)["r_pairs"] == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="of must be"):
        agreement(exact, estimate, of="p")
    with pytest.raises(ValueError, match=r"top must be an int in \[1, 4\]"):
        agreement(exact, estimate, top=5)
    with pytest.raises(ValueError, match="same sites"):
        agreement(exact, result(np.zeros((8, 6))))
    with pytest.raises(ValueError, match="no logit differences"):
        agreement(result(np.zeros((4, 6))), estimate, "logit_diff_restoration")


def test_attribution_scatter_plots_site_means_against_each_other():
    exact = result(np.arange(8.0)[:, None] + np.zeros((8, 3)), logit_diff=np.ones((8, 3)))
    estimate = result(2 * exact.restoration, logit_diff=np.ones((8, 3)))
    fig = attribution_scatter(exact, estimate)
    markers = [t for t in fig.data if t.mode == "markers"]
    assert [t.name for t in markers] == ["hook_resid_pre", "mixer.hook_out"] * 2
    xs = np.concatenate([t.x for t in markers[:2]])
    ys = np.concatenate([t.y for t in markers[:2]])
    np.testing.assert_allclose(np.sort(ys), 2 * np.sort(xs))
    assert sorted(xs.tolist()) == list(range(8))
    with pytest.raises(ValueError, match="quantities"):
        attribution_scatter(exact, estimate, quantities=["kl"])


def test_restoration_heatmap_shared_bound_and_stacked_positions():
    wide = result(np.full((24, 2), 0.5))   # 6 positions per hook and layer -> side by side
    fig = restoration_heatmap(wide, bound=3.0)
    assert all((t.zmin, t.zmax) == (-3.0, 3.0) for t in fig.data)
    sites = [Site(f"blocks.{l}.{h}", t) for l in range(2) for h in ("hook_resid_pre", "mixer.hook_out") for t in range(12)]
    many = InterchangeResult(sites, torch.full((48, 2), 0.5, dtype=torch.float64), torch.zeros(48, 2),
                             torch.ones(2), torch.zeros(2), torch.ones(2, dtype=torch.bool), 0.01)
    fig = restoration_heatmap(many)
    assert [t.xaxis for t in fig.data] == ["x", "x2"] and fig.layout.xaxis2.domain == fig.layout.xaxis.domain  # stacked
    assert list(fig.data[0].x) == [str(t) for t in range(12)]
    with pytest.raises(ValueError, match="bound must be"):
        restoration_heatmap(many, bound=0)


def test_quick_recipe_writes_report(tmp_path):
    spec = importlib.util.spec_from_file_location("attribution_screen", RECIPE)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    out = recipe.run(recipe.parse_args(["--quick", "--out", str(tmp_path)]))
    exact, estimate = out["exact"], out["estimate"]
    assert exact.labels == estimate.labels and len(exact.sites) == out["summary"]["sites"]
    assert {s.component for s in exact.sites} == {"hook_resid_pre", "mixer.hook_out", "mixer.hook_state"}
    assert set(out["agreement"]) == {"p(y)", "logit(y) - logit(y')"}
    assert (tmp_path / "run" / "config.json").exists()
    text = out["report"].read_text()
    assert "QUICK MODE" in text and "does NOT solve AR" in text
    assert_renders(out["report"])
