"""The sample-efficiency figures show the rows they are given, and the report is one offline file."""

import math

import pytest

from interp.report.sample_efficiency import kappa_bars, kappa_vs_ood, n_star_vs_length, write_sample_efficiency_report
from tests.browser import assert_renders


def n_star_rows():
    rows = []
    for model, values in (("lstm", {2: 40, 3: 60, 4: 80, "joint": 30}), ("transformer", {2: 50, 3: None, 4: 900, "joint": 2000})):
        for length, n_star in values.items():
            rows.append({"model": model, "task": "Z5", "format": "acot", "length": length, "n_star": n_star,
                         "n_max": 4096, "last_failure": 0, "max_length": 4, "trials": 9})
    return rows


KAPPA = [{"model": "lstm", "task": "Z5", "format": "acot", "max_length": 4, "kappa": 6.0, "n_star_joint": 30,
          "sum_n_star": 180, "ood_acc_8": 0.97, "ood_acc_16": 0.9},
         {"model": "transformer", "task": "Z5", "format": "acot", "max_length": 4, "kappa": math.nan,
          "kappa_low": 1.5, "kappa_high": math.inf, "n_star_joint": 2000, "sum_n_star": None, "ood_acc_8": 0.3, "ood_acc_16": 0.2},
         {"model": "transformer", "task": "Z5", "format": "outcome", "max_length": 4, "kappa": 0.5,
          "n_star_joint": 200, "sum_n_star": 100, "ood_acc_8": 0.25, "ood_acc_16": math.nan}]


def test_n_star_figure_has_found_missing_and_joint_traces():
    fig = n_star_vs_length(n_star_rows())
    assert fig.layout.yaxis.type == "log"
    lines = {t.name: t for t in fig.data}
    assert list(lines["lstm (Z5) acot"].y) == [40, 60, 80]
    assert list(lines["transformer (Z5) acot"].x) == [2, 4]                   # length 3 never converged
    assert list(lines["transformer (Z5) acot: not converged"].y) == [4096]     # drawn at the bound
    assert 2.9 < lines["transformer (Z5) acot: not converged"].x[0] < 3.1
    assert list(lines["lstm (Z5) acot: joint"].y) == [30, 30]


def test_kappa_figures_leave_out_nan_and_pair_kappa_with_ood():
    bars = kappa_bars(KAPPA)
    by_format = {t.name: t for t in bars.data}
    assert list(by_format["acot"].customdata) == [6.0] and list(by_format["outcome"].customdata) == [0.5]
    assert list(by_format["outcome"].y) == [-0.5] and by_format["outcome"].base == 1   # drawn from 1 down to 0.5
    assert list(by_format["acot: lower bound"].customdata) == [1.5]
    scatter = kappa_vs_ood(KAPPA)
    points = {t.name: (list(t.x), list(t.y)) for t in scatter.data}
    assert points["at 2L"] == ([6.0, 1.5, 0.5], [0.97, 0.3, 0.25])       # the bound 1.5 stands in for NaN
    assert points["at 4L"] == ([6.0, 1.5], [0.9, 0.2])
    assert "(kappa >=)" in scatter.data[0].text[1] and "(kappa >=)" not in scatter.data[0].text[0]
    # a condition is labelled once (its 4L label overlapped its 2L one where the accuracies were close)
    assert [t.mode for t in scatter.data] == ["markers+text", "markers"] and list(scatter.data[1].text) == ["lstm acot",
                                                                                                          "transformer acot (kappa >=)"]


def test_report_is_one_offline_file(tmp_path):
    path = write_sample_efficiency_report(tmp_path / "r.html", n_star_rows(), KAPPA,
                                          [{"converged": True}, {"converged": False}])
    text = path.read_text()
    assert text.count('class="plotly-graph-div"') == 3 and "<script src=" not in text
    assert "2 trials, 1 converged" in text and "N* per condition" in text
    assert_renders(path)


def test_kappa_labels_at_both_ends_of_the_axis_stay_inside_the_plot(tmp_path):
    """The left-most and right-most points' labels (kappa 0.4 and 8.0, long model names) are drawn in
    full in Chromium (the kappa_vs_ood label clipping)."""
    rows = [{"model": m, "task": "Z5", "format": f, "max_length": 6, "kappa": k, "ood_acc_12": a, "ood_acc_24": a / 2}
            for (m, f, k, a) in (("lstm", "outcome", 0.4, 0.3), ("lstm", "acot", 2.5, 0.9),
                                 ("transformer", "outcome", 8.0, 0.1), ("transformer", "acot", 0.05, 0.95))]
    assert_renders(write_sample_efficiency_report(tmp_path / "edges.html", n_star_rows(), rows))


def test_bad_rows_are_named():
    with pytest.raises(ValueError, match=r"rows\[0\] lacks \['n_max'\]"):
        n_star_vs_length([{"model": "lstm", "task": "Z5", "format": "acot", "length": 2, "n_star": 3}])
    with pytest.raises(ValueError, match="non-empty list"):
        kappa_bars([])
