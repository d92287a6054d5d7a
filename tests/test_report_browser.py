"""tests/browser.py itself: headless Chromium sees a good report as good and a broken one as broken
(skipped where no Chromium is installed). The reports the suite writes are opened where they are
written (test_cli, test_error_control, test_heads, test_retrieval_recipe, test_train_evaluate)."""

import plotly.graph_objects as go
import pytest

from interp.report.evaluation import accuracy_vs_length
from interp.report.html import Text, write_report
from tests.browser import assert_renders, problems, render


def test_a_good_report_renders_every_graph(tmp_path):
    good = write_report(tmp_path / "good.html", "good", [
        Text("two figures"), accuracy_vs_length({"m": {60: 1.0, 100: 0.9, 1000: 0.2}}, train_length=60),
        go.Figure(go.Bar(x=["a", "b"], y=[0.5, 1.0]))])
    summary = assert_renders(good)
    assert summary["expected_figures"] == 2 and all(f["rendered"] for f in summary["figures"])
    x = summary["figures"][0]["axes"]["xaxis"]
    assert x["type"] == "log" and x["range"][0] <= x["data"]["lo"] and x["data"]["hi"] <= x["range"][1]


def test_a_broken_report_is_reported(tmp_path):
    stretched = go.Figure(go.Scatter(x=[60, 100, 1000], y=[1.0, 0.5, 0.2]))
    stretched.update_xaxes(type="log")
    stretched.add_vline(x=60, annotation_text="train length 60")     # the label sits at 10^60
    path = write_report(tmp_path / "bad.html", "bad", [stretched])
    text = path.read_text()
    path.write_text(text.replace("</body>", "<script>undefinedFunction();</script>"
                                 '<div id="ghost" class="plotly-graph-div"></div></body>'))
    found = problems(render(path))
    assert any("undefinedFunction" in p for p in found), found
    assert any("ghost: not rendered" in p for p in found), found
    assert any("log axis drawn" in p and "..10^6" in p for p in found), found   # 10^60 and beyond
    with pytest.raises(AssertionError, match="in Chromium"):
        assert_renders(path)


def test_a_text_label_cut_off_at_the_plot_edge_is_reported(tmp_path):
    """A marker label at the left edge of the plot area runs past it (plotly clips it there)."""
    edge = go.Figure(go.Scatter(x=[1.0, 2.0], y=[0.5, 0.6], mode="markers+text", textposition="middle left",
                                text=["a rather long label at the left edge", "fits"]))
    edge.update_xaxes(range=[1.0, 2.0])
    found = problems(render(write_report(tmp_path / "cut.html", "cut", [edge])))
    assert any("a rather long label at the left edge" in p and "cut off" in p for p in found), found
    assert not any("'fits'" in p for p in found), found
