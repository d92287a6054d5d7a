"""Every figure builder in interp/report, on small synthetic inputs: every trace's data lies inside the
axis range a browser would draw (log axes in log10 units), no axis is stretched far past its data
(the add_vline-on-a-log-axis bug), and no colour scale clips its values (tests/figure_ranges.py)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

import interp.report
from interp.analysis import dynamics
from interp.analysis.interventions import InterchangeResult, Site
from interp.analysis.effective_attention import EffectiveAttention
from interp.report import dynamics as fd, effective_attention as fa, evaluation as fe, heads as fh, interventions as fi
from interp.report import circuits as fc, sample_efficiency as fs
from interp.training.evaluate import LengthEval
from probes.fisher import fisher_tcross
from probes.readability import readability_threshold
from probes.subspace import DriftResult, centroids, state_subspace, tcross
from tests.figure_ranges import axes_of, range_problems


def length_eval(accuracy: dict[int, float]) -> LengthEval:
    positions = {t: np.linspace(1.0, a, t) for t, a in accuracy.items()}
    return LengthEval(accuracy, positions, n=16)


def drift_result(q, tau=0.5, M=2.0) -> DriftResult:
    q = np.asarray(q, dtype=float)
    return DriftResult(q, q * M, M, tau, "mean", np.arange(1, len(q) + 1), np.zeros((1, len(q))))


def interchange(values) -> InterchangeResult:
    """2 layers x 3 roles of one hook, restoration `values` [2, 3] (one kept example)."""
    sites = [Site(f"blocks.{layer}.hook_resid_pre", role) for layer in (0, 1) for role in ("key", "value", "query")]
    restoration = torch.tensor(values, dtype=torch.float64).reshape(-1, 1)
    one = torch.ones(1, dtype=torch.float64)
    return InterchangeResult(sites, restoration, restoration.clone(), one, one * 0, torch.tensor([True]), 0.01)


def calibration():
    states = np.array([[[-1.0], [1.0], [-1.0], [1.0]]])
    labels = np.array([[0, 1, 0, 1]])
    sub = state_subspace(centroids(states, labels))
    return readability_threshold(lambda h: (h[..., 0] > 0.2).long(), states, labels, sub, direction="nearest")


def summary_rows():
    definitions = ("pooled/fixed", "time/fixed", "time/calibrated")
    rows = []
    for index, (mp, tc) in enumerate([(100, 80.0), (200, 260.0), (1000, 700.0), (60, 3.0)]):
        rows.append({"model": f"m{index % 2}", "mp": mp,
                     "tcross_by_definition": {d: tc * (1 + i) for i, d in enumerate(definitions)},
                     "tcross_estimated_by_definition": {d: index == 2 for d in definitions}})
    return rows


def spectra():
    values = torch.tensor([[[0.5 + 0.5j, -0.9 + 0.0j], [1.0j, 0.2 + 0.0j], [0.1 + 0.0j, 0.3 + 0.0j]]])
    return dynamics.spectra(dynamics.Jacobians(values, True, (2,), "structured"))


def n_star_rows():
    rows = [{"model": m, "task": "Z5", "format": f, "length": n, "n_star": (None if n == 6 and m == "lstm" else s * n),
             "n_max": 4096} for m, s in (("lstm", 40), ("transformer", 15)) for f in ("outcome", "acot")
            for n in (2, 4, 6)]
    return rows + [{"model": "lstm", "task": "Z5", "format": "acot", "length": "joint", "n_star": 300, "n_max": 4096}]


def small_circuit():
    """The top 6 edges of a 2-layer attention model's graph under made-up scores."""
    import models
    from interp.analysis.circuits import EdgeScores, build_graph, extract

    torch.manual_seed(0)
    graph = build_graph(models.build("transformer", vocab_size=5, d_model=8, n_heads=2, n_layers=2))
    per_example = torch.linspace(-1.0, 2.0, len(graph.edges), dtype=torch.float64)[:, None]  # [E, 1]
    return extract(EdgeScores(graph, per_example, "eap", None), n=6)


def kappa_rows():
    return [{"model": m, "task": "Z5", "format": f, "max_length": 6, "kappa": k, "ood_acc_12": a, "ood_acc_24": a / 2}
            for (m, f, k, a) in (("lstm", "outcome", 0.4, 0.3), ("lstm", "acot", 2.5, 0.9),
                                 ("transformer", "outcome", 8.0, 0.1), ("mamba", "acot", float("nan"), 0.5))]


def training_records():
    records = [{"kind": "train", "step": s, "loss": 2.0 / s, "accuracy": min(1.0, s / 50)} for s in range(1, 60, 5)]
    return records + [{"kind": "eval", "step": 30, "accuracy": 0.7, "length": 60}]


# builder "module.function" -> figures built from small synthetic inputs (the cases that broke included)
CASES = {
    "evaluation.accuracy_vs_length": lambda: [
        fe.accuracy_vs_length({"m": length_eval({60: 1.0, 100: 0.95, 200: 0.6, 500: 0.3, 1000: 0.2})}, 0.9, 60),
        fe.accuracy_vs_length({"m": {3: 1.0, 6: 1.0, 12: 0.8, 24: 0.6}}, train_length=6,
                              title="Reveal accuracy vs trace length")],
    "evaluation.position_accuracy": lambda: [fe.position_accuracy({"m": length_eval({20: 0.5})}, 20)],
    "evaluation.training_curves": lambda: [fe.training_curves({"m": training_records()})],
    "evaluation.mp_table": lambda: [fe.mp_table({"m": {60: 1.0, 120: 0.5}})],
    "evaluation.curves": lambda: [fe.curves({"norm": np.exp(-np.arange(30) / 5)}, "t", "norm", "decay", log_y=True),
                                  fe.curves({"r2": np.linspace(0, 1, 10)}, "t", "R^2", "probe", x=np.arange(5, 15))],
    "interventions.restoration_heatmap": lambda: [fi.restoration_heatmap(interchange([[-2.0, 0.5, 1.0],
                                                                                      [-1.25, 1.6, 0.0]]))],
    "interventions.attribution_scatter": lambda: [
        fi.attribution_scatter(interchange([[0.0, 0.5, 1.0], [-0.2, 0.9, 0.1]]),
                               interchange([[0.0, 1.5, 4.2], [-0.1, 0.4, 0.0]]), quantities=["restoration"])],
    "interventions.accuracy_vs_d_conv": lambda: [fi.accuracy_vs_d_conv({"mamba": {4: 1.0, 2: 0.4, 1: 0.1}})],
    "heads.beta_histograms": lambda: [fh.beta_histograms({"L0": (np.linspace(0, 2, 11), np.arange(20).reshape(2, 10)),
                                                          "L1": (np.linspace(0, 2, 11), np.ones((2, 10)))})],
    "heads.head_ablation": lambda: [fh.head_ablation([{"layer": 0, "head": h, "mode": m, "accuracy": a}
                                                      for h in (0, 1) for m, a in (("clamp", 0.4), ("mean", 0.9))],
                                                     0.95)],
    "heads.head_metric_bars": lambda: [fh.head_metric_bars([{"layer": 0, "head": h, "state_rank": 2.0 + h,
                                                             "traj_rank": 1.5} for h in (0, 1)],
                                                           ["state_rank", "traj_rank"])],
    "dynamics.drift_curves": lambda: [fd.drift_curves(
        {"a": drift_result(np.linspace(0.05, 0.9, 120)), "b": drift_result(0.001 * np.arange(1, 121))},
        {"a": tcross(drift_result(np.linspace(0.05, 0.9, 120))), "b": tcross(drift_result(0.001 * np.arange(1, 121)))},
        train_length=60)],
    "dynamics.fisher_figure": lambda: [fd.fisher_figure(np.geomspace(40.0, 0.5, 300), fisher_tcross(np.geomspace(40.0, 0.5, 300)),
                                                        train_length=60),
                                       fd.fisher_figure(np.full(50, 8.0), None)],
    "dynamics.tcross_vs_mp": lambda: [fd.tcross_vs_mp([{"model": "m", "mp": mp, "tcross": tc}
                                                       for mp, tc in ((100, 90.0), (200, 150.0), (1000, 1500.0))]),
                                      fd.tcross_vs_mp([{"model": "m", "mp": mp, "tcross": 47.0} for mp in (100, 200)])],
    "dynamics.tcross_vs_mp_by_definition": lambda: [
        fd.tcross_vs_mp_by_definition(summary_rows(), ["pooled/fixed", "time/fixed", "time/calibrated"])],
    "dynamics.readability_curves": lambda: [fd.readability_curves({"m": calibration()})],
    "dynamics.jacobian_spectra": lambda: [fd.jacobian_spectra(spectra())],
    "effective_attention.effective_attention_heatmap": lambda: [fa.effective_attention_heatmap(
        EffectiveAttention(torch.tensor([[[[1.0, 0.0, 0.0], [-0.5, 0.25, 0.0], [2.0, -3.0, 0.1]]]]), "head",
                           "v", "o")), fa.effective_attention_heatmap(EffectiveAttention(  # dense blocks: their norms
                               torch.tensor([[[[1.0, 0.0], [0.4, 1.0]]]]), "block norm", "u", "h",
                               torch.eye(2).expand(1, 2, 2, 2, 2)))],
    "dynamics.state_projection": lambda: [fd.state_projection(
        {12: (np.random.default_rng(0).normal(size=(20, 2)), np.arange(20) % 3),
         40: (np.random.default_rng(1).normal(size=(20, 1)), np.arange(20) % 3)})],
    "sample_efficiency.n_star_vs_length": lambda: [fs.n_star_vs_length(n_star_rows())],
    "sample_efficiency.kappa_bars": lambda: [fs.kappa_bars(kappa_rows())],
    "sample_efficiency.kappa_vs_ood": lambda: [fs.kappa_vs_ood(kappa_rows())],
    "circuits.circuit_figure": lambda: [fc.circuit_figure(small_circuit())],
    "circuits.faithfulness_figure": lambda: [fc.faithfulness_figure(
        [{"method": m, "n_edges": n, "fraction": n / 40, "faithfulness": f} for m, s in (("EAP", 1.0), ("EAP-IG", 0.9))
         for n, f in ((0, 0.0), (4, 0.5 * s), (12, 0.8 * s), (40, 1.0))])],
}


def figure_builders() -> list[str]:
    """Every public function of an interp.report module annotated to return a go.Figure."""
    found = []
    for info in pkgutil.iter_modules(interp.report.__path__):
        module = importlib.import_module(f"interp.report.{info.name}")
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if fn.__module__ == module.__name__ and not name.startswith("_") and \
                    inspect.signature(fn).return_annotation in ("go.Figure", go.Figure):
                found.append(f"{info.name}.{name}")
    return sorted(found)


def test_every_figure_builder_has_synthetic_inputs_here():
    missing = sorted(set(figure_builders()) - set(CASES))
    assert not missing, (f"figure builders without a case in tests/test_figure_ranges.py CASES: {missing}; "
                         "add small synthetic inputs for each (the range test must see every figure)")
    assert not set(CASES) - set(figure_builders()), "CASES names a builder that no longer exists"


@pytest.mark.parametrize("builder", sorted(CASES))
def test_figure_data_lies_inside_the_drawn_axis_range(builder):
    figures = CASES[builder]()
    assert figures and all(isinstance(f, go.Figure) for f in figures)
    problems = [p for i, fig in enumerate(figures) for p in range_problems(fig, f"{builder}[{i}]")]
    assert not problems, "\n".join(problems)


def test_the_range_check_sees_a_vline_label_on_a_log_axis():
    """The check itself (as Chromium draws it, tests/browser.py): on a log axis a vline's shape takes
    the data value, but its annotation the log10, so the label of x = 60 sits at 10^60."""
    fig = go.Figure(go.Scatter(x=[60, 100, 1000], y=[1, 0.5, 0.2]))
    fig.update_xaxes(type="log")
    fig.add_vline(x=60)
    assert not range_problems(fig, "shape only")
    fig.add_vline(x=60, annotation_text="train length")
    lo, hi = axes_of(fig)["xaxis"].drawn()
    assert 60 < hi < 64 and any("more than a decade" in p for p in range_problems(fig, "vline"))
    near = go.Figure(go.Bar(x=["a", "b"], y=[0.7, 3.0]))
    near.update_yaxes(type="log")
    near.add_hline(y=1.0, annotation_text="kappa = 1")         # within a decade, but the label sits at 10
    assert any("drawn at 10^1.0" in p for p in range_problems(near, "hline"))
    clipped = go.Figure(go.Heatmap(z=[[-2.0, 0.5]], zmin=0, zmax=1))
    assert any("clipped" in p for p in range_problems(clipped, "heatmap"))
    fixed = go.Figure(go.Bar(x=["a", "b"], y=[0.5, 1.3]))
    fixed.update_yaxes(range=[0, 1.05])
    assert any("its data span" in p for p in range_problems(fixed, "bars"))


def test_a_single_valued_log_axis_is_drawn_half_a_decade_each_way():
    """plotly.js pads a log axis whose data is one value by a decade each way (seen in Chromium on the
    error-control report: Tcross 47 for both affine S3 runs drawn over 10^0.67..10^2.67)."""
    fig = fd.tcross_vs_mp([{"model": "m", "mp": mp, "tcross": 47.0} for mp in (100, 200)])
    lo, hi = fig.layout.yaxis.range
    assert hi - lo == pytest.approx(1.0) and lo < np.log10(47.0) < hi and fig.layout.xaxis.range is None


def test_log_axes_label_every_tick_with_its_whole_number():
    """plotly.js labels the minor ticks of a short log axis with one digit ("3" above "2" above "10" on the
    error-control report's Tcross axis, seen in Chromium); the ticks are now 1-2-5 values written out,
    each inside the data's range padded by 1.5x, with the extremes added where fewer than 3 fall there."""
    from interp.report.style import log_ticks

    fig = fd.tcross_vs_mp([{"model": "m", "mp": mp, "tcross": tc} for mp, tc in ((125, 2.0), (259, 27.0), (296, 19.0))])
    assert list(fig.layout.yaxis.tickvals) == [2, 5, 10, 20] and list(fig.layout.yaxis.ticktext) == ["2", "5", "10", "20"]
    assert list(fig.layout.xaxis.ticktext) == ["100", "125", "200", "296"]
    assert log_ticks([float("nan"), 0.0, float("inf")]) == {}
    assert log_ticks([0.03, 700.0])["tickvals"] == pytest.approx([0.1, 1, 10, 100, 1000])   # powers of ten past 3 decades
    wide = log_ticks([0.3, 1e13])["tickvals"]   # a state that grows by 1e13 (seen in Chromium: 45 crammed labels)
    assert len(wide) <= 8 and wide[0] == 1 and wide[-1] >= 1e12
