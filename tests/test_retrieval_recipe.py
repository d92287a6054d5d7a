"""examples/retrieval_mechanisms.py end to end (--quick) and its figure builders."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from interp.report.interventions import accuracy_vs_d_conv, restoration_grid, restoration_heatmap
from interp.analysis.interventions import InterchangeResult, Site
from tests.browser import assert_renders

RECIPE = Path(__file__).resolve().parents[1] / "examples" / "retrieval_mechanisms.py"


def load_recipe():
    spec = importlib.util.spec_from_file_location("retrieval_mechanisms", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_result(kept=(True, True, False)) -> InterchangeResult:
    """2 layers x 2 hooks x 3 roles; restoration of site s, example b = s / 10 + b (b kept)."""
    sites = [Site(f"blocks.{layer}.{hook}", role) for layer in (0, 1)
             for hook in ("hook_resid_pre", "mixer.hook_out") for role in ("key", "value", "query")]
    n = len(kept)
    values = torch.arange(len(sites), dtype=torch.float64)[:, None] / 10 + torch.arange(n, dtype=torch.float64)
    kept = torch.tensor(kept)
    values[:, ~kept] = float("nan")
    zeros = torch.zeros(n, dtype=torch.float64)
    return InterchangeResult(sites, values, values.clone(), zeros + 1, zeros, kept, 0.01)


def test_restoration_grid_places_every_site():
    components, layers, roles, grid = restoration_grid(fake_result())
    assert components == ["hook_resid_pre", "mixer.hook_out"]
    assert layers == [0, 1] and roles == ["key", "value", "query"]
    # site index s = 6 * layer + 3 * component + role; mean over kept examples 0, 1 -> s / 10 + 0.5
    for c in range(2):
        for layer in range(2):
            for r in range(3):
                assert grid[c, layer, r] == pytest.approx((6 * layer + 3 * c + r) / 10 + 0.5)


def test_restoration_heatmap_one_panel_per_hook():
    result = fake_result()
    fig = restoration_heatmap(result, title="m")
    assert len(fig.data) == 2
    for index, trace in enumerate(fig.data):
        assert trace.type == "heatmap"
        assert list(trace.x) == ["key", "value", "query"] and list(trace.y) == ["layer 0", "layer 1"]
        assert (trace.zmin, trace.zmax, trace.zmid) == (-1.6, 1.6, 0.0)       # symmetric to the largest |value|
        expected = (6 * np.arange(2)[:, None] + 3 * index + np.arange(3)) / 10 + 0.5
        np.testing.assert_allclose(np.asarray(trace.z), expected)
    assert [a.text for a in fig.layout.annotations] == ["hook_resid_pre", "mixer.hook_out"]
    assert "2 of 3 pairs kept" in fig.layout.title.text


def test_restoration_grid_needs_layered_sites():
    result = fake_result()
    result.sites[0] = Site("embed.hook_out", "key")
    with pytest.raises(ValueError, match="per-layer"):
        restoration_grid(result)


def test_accuracy_vs_d_conv_bars():
    fig = accuracy_vs_d_conv({"mamba": {1: 0.1, 4: 1.0, 2: 0.5}, "based": {4: 0.9, 1: 0.8}})
    assert [t.name for t in fig.data] == ["mamba", "based"]
    assert list(fig.data[0].x) == ["4", "2", "1"] and list(fig.data[0].y) == [1.0, 0.5, 0.1]
    assert list(fig.data[1].x) == ["4", "1"] and list(fig.data[1].y) == [0.9, 0.8]
    assert fig.layout.barmode == "group"
    with pytest.raises(ValueError, match="non-empty"):
        accuracy_vs_d_conv({})


def test_quick_recipe_writes_report(tmp_path):
    recipe = load_recipe()
    args = recipe.parse_args(["--quick", "--out", str(tmp_path)])
    results = recipe.run(args)
    html = Path(results["report"]).read_text()
    names = list(recipe.MODELS)
    assert [row["model"] for row in results["summary"]] == names
    for name in names:  # one heatmap (two panels, one per hook) per model, titled with its name
        assert re.search(rf'"title":\{{"text":"{name}: accuracy', html), name
    for hook in ("hook_resid_pre", "mixer.hook_out"):  # heatmap traces are named by their hook
        assert html.count(f'"name":"{hook}"') == len(names)
    assert "Accuracy vs short-conv width" in html and "<script" in html
    assert_renders(results["report"])
    # 2 layers x 2 hooks x 3 roles per model; restoration of layer 0's block input at the key (the
    # corrupted token itself) is 1 for every kept pair: exactly with whole passes, up to float32
    # rounding over the effect (>= 0.01) with the recipe's resumed passes (measured 7e-7 once)
    assert len(results["restoration"]) == 12 * len(names)
    for row in results["restoration"]:
        if row["n_kept"] and (row["layer"], row["hook"], row["role"]) == (0, "hook_resid_pre", "key"):
            assert row["restoration"] == pytest.approx(1.0, abs=1e-5)
        if row["n_kept"] and row["hook"] == "hook_resid_pre" and row["layer"] == 0 and row["role"] != "key":
            assert row["restoration"] == pytest.approx(0.0, abs=1e-9)  # untouched tokens
    # Mamba (trained with d_conv 4) and every other model with short convs get all four widths
    assert set(results["d_conv"]) == {"based", "mamba", "h3", "hyena", "deltanet"}
    assert all(sorted(by) == [1, 2, 3, 4] for by in results["d_conv"].values())
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["summary"][0]["model"] == names[0]
