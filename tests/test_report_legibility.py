"""Report figures and tables say what they show: every panel of every figure builder (the synthetic cases of
tests/test_figure_ranges.py) has a title on each axis that carries data; the training curves' loss and
accuracy differ in the legend, not only by panel; heatmap cells and table cells never read "-0.00"; patch
positions carry their roles; the demo's config table lists only the fields a model reads."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest
import torch

import models
from interp.analysis.interventions import InterchangeResult, Site
from interp.report import evaluation as fe
from interp.report import interventions as fi
from interp.report.demo import config_rows, used_config_fields
from interp.report.html import render_table
from interp.tasks import make_task
from tests.test_figure_ranges import CASES, training_records


def untitled_axes(fig: go.Figure) -> list[str]:
    """The cartesian axes that some trace draws on but that have no title text."""
    layout = fig.layout
    used = set()
    for trace in fig.data:
        if trace.type in ("table", "pie", "sankey"):
            continue
        for letter in "xy":
            ref = getattr(trace, f"{letter}axis", None) or letter
            used.add(f"{ref[0]}axis{ref[1:]}")
    return sorted(name for name in used if not (layout[name].title and layout[name].title.text))


@pytest.mark.parametrize("builder", sorted(CASES))
def test_every_panel_has_axis_titles(builder):
    for index, fig in enumerate(CASES[builder]()):
        missing = untitled_axes(fig)
        assert not missing, f"{builder}[{index}]: axes without a title: {missing}"


def test_the_axis_check_sees_a_missing_title():
    fig = go.Figure(go.Scatter(x=[1, 2], y=[3, 4]))
    fig.update_xaxes(title="step")
    assert untitled_axes(fig) == ["yaxis"]


def test_training_curves_loss_and_accuracy_have_distinct_swatches():
    fig = fe.training_curves({"m": training_records(), "n": training_records()})
    key, runs = fig.data[:3], fig.data[3:]
    swatch = lambda t: (t.mode, t.line.dash, t.marker.symbol)                 # what the legend draws
    assert len({swatch(t) for t in key}) == 3 and all(t.showlegend is not False for t in key)
    for run in (runs[:3], runs[3:]):                                          # loss, train acc, eval acc
        assert run[0].line.color == run[1].line.color == run[2].marker.color  # one colour per model
        assert [swatch(t) for t in run] == [swatch(t) for t in key]          # drawn as the key says
        assert [t.showlegend is not False for t in run] == [True, False, False]  # one legend entry per model
    assert runs[0].line.color != runs[3].line.color
    assert fig.layout.yaxis.title.text and fig.layout.yaxis2.title.text
    assert fig.layout.yaxis.title.text != fig.layout.yaxis2.title.text


def test_training_curves_legend_fits_twenty_runs():
    """20 runs: 23 legend entries (not 60), under the panels, the figure tall enough to hold them."""
    fig = fe.training_curves({f"run{i}": training_records() for i in range(20)})
    assert sum(t.showlegend is not False for t in fig.data) == 23
    assert fig.layout.legend.orientation == "h" and fig.layout.height >= 450 + 24 * 6


@pytest.mark.parametrize("value, text", [(-0.001, "0.00"), (-0.0, "0.00"), (-0.0049, "0.00"), (-0.006, "-0.01"),
                                         (0.004, "0.00"), (1.234, "1.23"), (float("nan"), "")])
def test_heatmap_cells_never_read_minus_zero(value, text):
    assert fi.cell_text(value) == text


def test_tables_never_read_minus_zero():
    html = render_table([{"a": -0.0, "b": -1e-300 * 1e-300, "c": -0.5, "d": -1e-5}])
    assert "-0<" not in html and ">-0.5<" in html and ">-1e-05<" in html


def test_restoration_heatmap_labels_positions_by_role():
    batch = make_task("AR").sample(64, 3, seed=0)                            # BOS k v k v k v EOS q a
    labels = fi.position_labels(batch)
    assert labels["0"] == "0 bos" and labels["7"] == "7 eos" and labels["8"] == "8 query" and labels["9"] == "9 answer"
    keys = [labels[str(p)] for p in (1, 3, 5)]
    shares = [int(label.split()[-1].rstrip("%")) for label in keys]
    assert all(label.split()[1] == "key" for label in keys) and sum(shares) in (99, 100, 101)
    assert all(labels[str(p)].split()[1] == "value" for p in (2, 4, 6))
    sites = [Site(f"blocks.{layer}.hook_resid_pre", p) for layer in (0, 1) for p in range(10)]
    values = torch.linspace(-0.004, 1.0, 20, dtype=torch.float64).reshape(-1, 1)
    one = torch.ones(1, dtype=torch.float64)
    result = InterchangeResult(sites, values, values.clone(), one, one * 0, torch.tensor([True]), 0.01)
    fig = fi.restoration_heatmap(result, labels=labels)
    assert list(fig.data[0].x) == [labels[str(p)] for p in range(10)]
    assert "role" in fig.layout.xaxis.title.text and fig.layout.yaxis.title.text == "layer"
    assert not any(cell.startswith("-0.00") for row in fig.data[0].text for cell in row)


def test_patch_report_colour_scale_is_set_by_exact_not_an_attribution_outlier(tmp_path, monkeypatch):
    """One attribution site estimated at 20 (a linearisation far off) must not wash out the other
    cells: both heatmaps use the exact result's scale, and the attribution's title says a cell is past it."""
    from interp.report import patch as report_patch
    sites = [Site(f"blocks.{layer}.hook_resid_pre", p) for layer in (0, 1) for p in range(3)]
    one = torch.ones(1, dtype=torch.float64)

    def result(means):
        values = torch.tensor(means, dtype=torch.float64).reshape(-1, 1)
        return InterchangeResult(sites, values, values.clone(), one, one * 0, torch.tensor([True]), 0.01)

    exact, estimate = result([1.0, 0.1, 0.0, 0.3, 0.9, 0.0]), result([0.9, 20.0, 0.0, 0.2, 0.8, 0.1])
    figures = []
    monkeypatch.setattr(report_patch, "write_report", lambda path, title, sections: figures.extend(
        s for s in sections if isinstance(s, go.Figure) and s.data and s.data[0].type == "heatmap"))
    monkeypatch.setattr(report_patch, "agreement_rows", lambda *a: [])      # (their own tests: the recipe's)
    monkeypatch.setattr(report_patch, "attribution_scatter", lambda *a: go.Figure())
    batch = make_task("AR").sample(4, 3, seed=0)
    setup = dict(top=3, corrupt="key", mixer="mamba", run_dir="RUN", task="AR", pairs=3, n=4, seed=0, min_effect=0.01)
    report_patch.write_patch_report(tmp_path / "r.html", setup, {"exact": exact, "attribution": estimate},
                                    batch, "t")
    assert [fig.data[0].zmax for fig in figures] == [1.0, 1.0]
    assert "cells beyond" not in figures[0].layout.title.text and "1 cells beyond" in figures[1].layout.title.text


def test_config_table_lists_only_the_fields_a_model_reads():
    tanh = models.preset_config("tanh_rnn", d_model=16, d_hidden=24)
    mamba = models.preset_config("mamba", d_model=8, d_state=4)
    tanh_fields, mamba_fields = set(used_config_fields(tanh)), set(used_config_fields(mamba))
    assert {"d_state", "expand", "d_conv", "n_heads", "max_len", "beta_scale"}.isdisjoint(tanh_fields)
    assert {"d_hidden", "d_model", "vocab_size"} <= tanh_fields
    assert {"d_state", "expand", "d_conv", "d_model"} <= mamba_fields and "d_hidden" not in mamba_fields
    learned = models.preset_config("transformer", positional="learned")
    assert "max_len" in used_config_fields(learned)
    assert "max_len" not in used_config_fields(models.preset_config("transformer", positional="none"))
    rows = {row["field"]: row for row in config_rows({"tanh_rnn": tanh, "mamba": mamba})}
    assert rows["d_state"]["tanh_rnn"] == "" and rows["d_state"]["mamba"] == 4
    assert rows["d_hidden"]["mamba"] == "" and rows["d_hidden"]["tanh_rnn"] == 24
    assert "n_kv_heads" not in rows and "mixer_options" not in rows              # neither model reads them
    assert "norm_eps" not in rows                                                # None wherever it is read
    plain = {row["field"] for row in config_rows({"tanh_rnn": models.preset_config("tanh_rnn")})}
    assert "d_hidden" not in plain and {"d_model", "mixer"} <= plain
    with pytest.raises(TypeError, match="cfg must be"):
        used_config_fields({"mixer": "mamba"})


def test_demo_report_states_the_expected_outcome():
    from types import SimpleNamespace

    from interp.report.demo import intro_text

    demo = SimpleNamespace(eval_n=16, lengths=[60, 1000], label="full", models={})
    runs = {"tanh_rnn": SimpleNamespace(final_length=60), "mamba": SimpleNamespace(final_length=60)}
    text = intro_text(demo, runs, "S3", "acot", 60, 0.9)
    assert "Mamba is expected to fail S3, by design" in text and "near chance (1/6 on S3)" in text
    assert "stay above 90% at every length up to 1000" in text and "smoke run" not in text


def test_circuit_figure_of_250_edges_gives_every_label_its_room():
    """A GPT-2-shaped graph (12 layers x 12 heads + MLPs), 250 edges kept: the figure grows with the
    tallest column and the layers so that labels in one column sit >= 14 px apart (10 px font) and a
    head's label ("h11", about 25 px) ends before the MLP node half a layer to its right."""
    from interp.analysis.circuits import Circuit, build_graph
    from interp.report.circuits import circuit_figure, node_label

    torch.manual_seed(0)
    graph = build_graph(models.build("transformer", vocab_size=5, d_model=24, n_heads=12, n_layers=12))
    scores = torch.randn(graph.n_edges) ** 3
    kept = torch.zeros(graph.n_edges, dtype=torch.bool)
    kept[scores.abs().argsort(descending=True)[:250]] = True
    fig = circuit_figure(Circuit(graph, kept, scores))
    nodes = [t for t in fig.data if t.mode == "markers+text" and t.name != "edges (hover; label: the input read)"]
    xs = [x for t in nodes for x in t.x]
    ys = [y for t in nodes for y in t.y]
    plot_height = fig.layout.height - 200                              # title, margins and axis title
    plot_width = fig.layout.width - 300                                # legend and margins
    assert plot_height / (max(ys) - min(ys) + 1) >= 14
    assert plot_width / (max(xs) - min(xs) + 1) * 0.5 >= 8 + 6 * len("h11")
    assert {label for t in nodes for label in t.text} >= {"h11", "mlp", "embed"}
    assert node_label("a3.h11@key") == "h11" and node_label("m2") == "m2"


def test_a_table_prints_its_console_columns_as_aligned_text():
    from interp.report.html import Table, text_table

    table = Table([{"reading": "time/fixed", "r": 0.912345, "interval": None, "hidden": 1},
                   {"reading": "fisher/fixed", "r": float("nan"), "interval": [0.1, 0.2]}],
                  heading="Tcross vs mp at a site. More words.", console=("reading", "r", "interval"))
    lines = text_table(table).split("\n")
    assert lines[0] == "Tcross vs mp at a site"
    assert lines[1].split() == ["reading", "r", "interval"] and "hidden" not in text_table(table)
    assert lines[2].split() == ["time/fixed", "0.9123", "-"] and lines[3].split() == ["fisher/fixed", "nan", "[0.1,", "0.2]"]
    column = lines[1].index("  r ") + 2                                      # columns aligned
    assert lines[2].index("0.9123") == lines[3].index("nan") == column
