"""Error-control analysis (interp.analysis.error_control), its figures (interp.report.dynamics), the
`interp drift` command and the examples/error_control.py recipe."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import models
from interp.analysis import dynamics, error_control as ec
from interp.report import dynamics as fd
from interp.cli import main
from interp.training.evaluate import evaluate_lengths, stream_seed
from interp.tasks import make_task
from interp.training.train import TrainConfig, train
from probes import subspace as ps
from probes.fisher import separation
from probes.readability import readability_threshold
from tests.browser import assert_renders

ROOT = Path(__file__).resolve().parents[1]


def _drift(q, tau=0.5, M=2.0):
    q = np.asarray(q, dtype=float)
    return ps.DriftResult(q, q * M, M, tau, "mean", np.arange(1, len(q) + 1), np.zeros((1, len(q))))


def test_drift_curves_mark_measured_and_estimated_crossings():
    crossing = _drift([0.1, 0.3, 0.6, 0.9])
    slow = _drift(0.01 * np.arange(1, 5))
    tc = {"a": ps.tcross(crossing), "b": ps.tcross(slow)}
    assert not tc["a"].estimated and tc["b"].estimated
    fig = fd.drift_curves({"a": crossing, "b": slow}, tc, train_length=2)
    lines = [t for t in fig.data if t.mode == "lines"]
    markers = [t for t in fig.data if t.mode == "markers"]
    assert [t.name for t in lines] == ["a", "b"]
    np.testing.assert_allclose(lines[0].y, crossing.q)
    assert markers[0].x == (3.0,) and markers[0].y == (0.6,) and markers[0].marker.symbol == "circle"
    # estimated: tau * M / eta with eta = 0.02 per step (R = 2 q) -> 0.5 * 2 / 0.02 = 50, at y = tau
    assert markers[1].x[0] == pytest.approx(50.0) and markers[1].y == (0.5,)
    assert markers[1].marker.symbol == "circle-open"
    assert any(s.y0 == 0.5 and s.y1 == 0.5 for s in fig.layout.shapes)        # the tau line
    with pytest.raises(TypeError, match="drifts\\['x'\\] must be a DriftResult"):
        fd.drift_curves({"x": np.zeros(3)})


def test_tcross_vs_mp_loglog_pearson_in_title():
    rows = [{"model": "m1", "mp": 100, "tcross": 120.0}, {"model": "m2", "mp": 200, "tcross": 150.0},
            {"model": "m3", "mp": 500, "tcross": 900.0, "tcross_estimated": True},
            {"model": "m4", "mp": None, "tcross": 3.0}, {"model": "m5", "mp": 60, "tcross": float("inf")}]
    expected = np.corrcoef(np.log([100, 200, 500]), np.log([120, 150, 900]))[0, 1]
    r, count = fd.loglog_pearson([100, 200, 500, np.nan, 60], [120, 150, 900, 3, np.inf])
    assert count == 3 and r == pytest.approx(expected)
    fig = fd.tcross_vs_mp(rows)
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    assert f"r (log-log) = {expected:.2f} over 3 runs" in fig.layout.title.text
    assert "2 left out" in fig.layout.title.text
    placed = sorted(x for t in fig.data for x in t.x)
    assert placed == [100, 200, 500]
    assert {t.marker.symbol for t in fig.data if t.name.startswith("m3")} == {"circle-open"}
    assert np.isnan(fd.loglog_pearson([1, 2], [3, 4])[0])
    with pytest.raises(ValueError, match="needs keys 'tcross' and 'mp'"):
        fd.tcross_vs_mp([{"mp": 3}])


def test_tcross_vs_mp_by_definition_and_readability_curves():
    def row(model, mp, pooled, timed, estimated=False):
        values = {key: float("nan") for key in ec.DEFINITIONS} | {"pooled/fixed": pooled, "time/fixed": timed}
        return {"model": model, "mp": mp, "tcross_by_definition": values,
                "tcross_estimated_by_definition": {key: estimated for key in ec.DEFINITIONS}}
    rows = [row("a", 100, 1.0, 90.0), row("b", 200, 1.0, 230.0), row("c", 500, 2.0, 480.0, True), row("d", None, 1.0, 5.0)]
    table = {r["definition"]: r for r in fd.definition_correlations(rows)}
    expected = np.corrcoef(np.log([100, 200, 500]), np.log([90, 230, 480]))[0, 1]
    assert table["time/fixed"]["pearson_r_loglog"] == pytest.approx(expected)
    assert table["time/fixed"]["placed"] == 3 and table["time/fixed"]["total"] == 4
    assert np.isnan(table["time/calibrated"]["pearson_r_loglog"]) and table["time/calibrated"]["placed"] == 0
    fig = fd.tcross_vs_mp_by_definition(rows, ["pooled/fixed", "time/fixed"])
    titles = [a.text for a in fig.layout.annotations]
    assert titles[1] == f"time/fixed: r = {expected:.2f} (3 runs)"
    timed = [t for t in fig.data if t.xaxis == "x2"]
    assert sorted(x for t in timed for x in t.x) == [100, 200, 500]
    assert {t.marker.symbol for t in timed if 500 in t.x} == {"circle-open"}
    with pytest.raises(ValueError, match="needs 'mp' and 'tcross_by_definition'"):
        fd.definition_correlations([{"mp": 3, "tcross": 4}])
    cal = readability_threshold(lambda h: (h[..., 0] > 0).long(), np.array([[[-1.0], [1.0]]]), np.array([[0, 1]]),
                                ps.state_subspace(ps.centroids(np.array([[[-1.0], [1.0]]]), np.array([[0, 1]]))),
                                direction="nearest")
    fig = fd.readability_curves({"m": cal})
    assert fig.data[1].x[0] == pytest.approx(cal.tau) and cal.tau == pytest.approx(0.5, abs=0.01)
    with pytest.raises(TypeError, match="must be a probes.readability.Calibration"):
        fd.readability_curves({"m": 0.5})


def test_jacobian_spectra_and_state_projection_traces():
    values = torch.tensor([[[0.5 + 0.5j, -0.9 + 0.0j], [1.0j, 0.2 + 0.0j], [0.1 + 0.0j, 0.3 + 0.0j]]])  # [1, 3, 2]
    spec = dynamics.spectra(dynamics.Jacobians(values, True, (2,), "structured"))
    fig = fd.jacobian_spectra(spec)
    circle, eig = fig.data[0], fig.data[1]
    np.testing.assert_allclose(np.hypot(circle.x, circle.y), 1.0, atol=1e-12)
    expected = spec.eigenvalues[0].numpy().ravel()
    np.testing.assert_allclose(eig.x, expected.real)
    np.testing.assert_allclose(eig.y, expected.imag)
    sv = [t for t in fig.data[2:] if t.name.startswith("sigma")]
    assert len(sv) == 2
    np.testing.assert_allclose(sv[0].y, np.abs(values[0]).max(-1).values.numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="example must be an int in \\[0, 1\\)"):
        fd.jacobian_spectra(spec, example=1)

    coords = np.arange(12, dtype=float).reshape(4, 3)
    fig = fd.state_projection({60: (coords, np.array([0, 1, 0, 2])), 1000: (coords[:, :1], np.array([1, 1, 1, 1]))})
    assert len(fig.data) == 6                                                    # 2 steps x 3 states
    first = [t for t in fig.data if t.name == "state 0"][0]
    np.testing.assert_allclose(first.x, [0, 6])
    np.testing.assert_allclose(first.y, [1, 7])
    one_dim = [t for t in fig.data if t.name == "state 1" and len(t.x) == 4][0]
    np.testing.assert_allclose(one_dim.y, 0.0)
    with pytest.raises(ValueError, match="snapshots\\[5\\] must be"):
        fd.state_projection({5: (coords, np.zeros(3))})


def test_excess_tcross_subtracts_the_in_distribution_level():
    steps = np.arange(1, 31)
    q = np.where(steps <= 10, 0.8, 0.8 + 0.1 * (steps - 10))      # flat at 0.8 (above tau), then grows
    assert ps.tcross(_drift(q)).value == 1.0                        # the plain Tcross says nothing
    crossed = ec.excess_tcross(_drift(q), train_length=10)
    assert not crossed.estimated and crossed.value == 16.0         # 0.1 * (t - 10) > 0.5 first at t = 16
    slow = np.where(steps <= 10, 0.8, 0.8 + 0.01 * (steps - 10))
    estimated = ec.excess_tcross(_drift(slow, M=2.0), train_length=10)
    # R_ex = 2 * 0.01 (t - 10) reaches tau * M = 1 at t = 60
    assert estimated.estimated and estimated.value == pytest.approx(60.0)
    assert ec.excess_tcross(_drift(np.full(30, 0.8)), 10).value == float("inf")
    with pytest.raises(ValueError, match="horizon 11 must exceed train_length 10"):
        ec.excess_tcross(_drift(np.ones(11)), 10)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    torch.manual_seed(0)
    task = make_task("C6", format="acot")
    cfg = models.preset_config("token_gated_rnn", vocab_size=task.vocab_size, d_model=8)
    out = tmp_path_factory.mktemp("runs") / "run"
    result = train(cfg, task, TrainConfig(steps=6, batch_size=8, train_length=12, warmup=1, eval_every=3,
                                          eval_size=8, seed=3), out, progress=False)
    return result.model, task, out


def test_analysis_equals_probes_on_the_same_cache(tiny_run):
    model, task, _ = tiny_run
    kw = dict(n_fit=10, n_drift=6, n_eval=8, n_jac=2, seed=5, chunk=4, statistic=90.0)
    result = ec.analyze(model, task, 12, [12, 40], **kw)
    site = "blocks.0.mixer.hook_state"
    assert result.site == site == ec.default_site(model)
    fit = task.sample(10, 12, stream_seed(5, ec.FIT_STREAM, 0))
    _, cache = model.run_with_cache(fit.tokens, names=[site])
    sub = ps.state_subspace(ps.centroids(cache[site], fit.states))
    np.testing.assert_allclose(result.subspace.basis, sub.basis, atol=1e-10)
    assert result.subspace.M == pytest.approx(sub.M)
    long = task.sample(6, 40, stream_seed(5, ec.DRIFT_STREAM, 0))
    _, cache = model.run_with_cache(long.tokens, names=[site])
    drift = ps.drift(cache[site], long.states, sub, statistic=90.0)
    np.testing.assert_allclose(result.drift.q, drift.q, rtol=1e-9)
    expected = ps.tcross(drift)
    assert (result.tcross.value, result.tcross.estimated) == (expected.value, expected.estimated)
    coords, labels = result.snapshots[12]
    np.testing.assert_allclose(coords, sub.coords(cache[site][:, 11]), rtol=1e-9)
    np.testing.assert_array_equal(labels, long.states[:, 11].numpy())
    assert set(result.snapshots) == {12, 40}
    tokens = task.sample(2, 12, stream_seed(5, ec.FIT_STREAM, 1)).tokens
    assert result.contraction.max == pytest.approx(dynamics.contraction(model, tokens, sub.basis, 0).max)
    reference = evaluate_lengths(model, task, [12, 40], n=8, seed=6)
    assert result.evaluation.final_accuracy == reference.final_accuracy
    summary = result.summary()
    assert summary["mp"] == reference.mp and summary["q_end"] == pytest.approx(drift.q[-1])
    json.dumps(summary)


def test_every_definition_and_the_readout_calibration(tiny_run):
    model, task, _ = tiny_run
    kw = dict(n_fit=10, n_drift=6, n_eval=8, n_jac=0, seed=5, chunk=4)
    result = ec.analyze(model, task, 12, [12, 40], **kw)
    site = result.site
    long = task.sample(6, 40, stream_seed(5, ec.DRIFT_STREAM, 0))
    _, cache = model.run_with_cache(long.tokens, names=[site])
    timed = ps.drift(cache[site], long.states, result.subspace, centroids="time")
    np.testing.assert_allclose(result.drift_time.q, timed.q, rtol=1e-9)
    assert result.definition == "pooled/fixed" and result.tcross is result.crossings["pooled/fixed"]
    assert result.crossings["time/fixed"].value == ps.tcross(timed).value
    assert result.crossings["excess/fixed"].value == ec.excess_tcross(result.drift, 12).value
    # the calibration's unmoved read-out is the model's own prediction on those sequences
    cal = result.calibration
    batch = task.sample(64, 12, stream_seed(5, ec.FIT_STREAM, 4))
    correct = (model(batch.tokens).argmax(-1) == batch.targets)[batch.loss_mask]
    assert cal.base_accuracy == pytest.approx(float(correct.double().mean()))
    assert [row["definition"] for row in result.definition_rows()] == list(ec.DEFINITIONS)
    assert set(result.summary()["tcross_by_definition"]) == set(ec.DEFINITIONS)
    json.dumps(result.summary())
    # accuracy by length is the model's, not a site's: an evaluation already measured is reused, not measured again
    again = ec.analyze(model, task, 12, [12, 40], evaluation=result.evaluation, **kw)
    assert again.evaluation is result.evaluation and again.summary()["tcross_by_definition"] == pytest.approx(
        result.summary()["tcross_by_definition"], nan_ok=True)
    with pytest.raises(ValueError, match="evaluation has lengths"):
        ec.analyze(model, task, 12, [12, 30], evaluation=result.evaluation, **kw)
    # a lenient accuracy level makes the read-out "fit": the calibrated crossings exist and carry D
    lenient = ec.calibrate_readout(model, task, result.subspace, 12, site, 16, 7, threshold=0.05, seed=1)
    assert lenient.fits and lenient.base_accuracy >= 0.05
    crossings = ec.definition_crossings(result.drift, result.drift_time, lenient, 12, fisher=result.fisher,
                                        drift_same=result.drift_same, rank=result.subspace.rank, burn_in=1,
                                        readout=result.readout_steps)
    assert list(crossings) == list(ec.DEFINITIONS)
    assert crossings["same/calibrated"].tau == pytest.approx(lenient.displacement / result.drift_same.M)
    assert crossings["time/calibrated"].tau == pytest.approx(lenient.displacement / result.drift_time.M)
    assert crossings["pooled/calibrated"].tau == pytest.approx(lenient.tau)
    headline = ec.analyze(model, task, 12, [12, 40], definition="time", tau="calibrated", **kw)
    expected = headline.crossings.get("time/calibrated")
    assert headline.definition == "time/calibrated"
    assert (np.isnan(headline.tcross.value) if expected is None else headline.tcross is expected)
    with pytest.raises(ValueError, match="definition must be one of"):
        ec.analyze(model, task, 12, [12], definition="pool", **kw)
    with pytest.raises(ValueError, match="tau='calibrated' needs calibrate=True"):
        ec.analyze(model, task, 12, [12], tau="calibrated", calibrate=False, **kw)


def test_calibration_through_complex_and_normalized_states():
    task = make_task("C2", format="acot")
    model = models.build("aussm", vocab_size=task.vocab_size, d_model=8, n_layers=1)
    model.eval()
    site = ec.default_site(model)
    batch = task.sample(6, 8, 3)
    correct = float((model(batch.tokens).argmax(-1) == batch.targets)[batch.loss_mask].double().mean())
    for normalize in (False, True):
        sub = ec.fit_subspace(model, task, 8, site, 8, 0, normalize=normalize)
        cal = ec.calibrate_readout(model, task, sub, 8, site, 6, 3, chunk=4, threshold=0.01, normalize=normalize)
        assert cal.base_accuracy == pytest.approx(correct)           # identity replacement changes nothing


def test_normalized_states_have_unit_norm(tiny_run):
    model, task, _ = tiny_run
    tokens = task.sample(3, 9, 0).tokens
    raw = ec.site_states(model, tokens, "blocks.0.mixer.hook_state")
    unit = ec.site_states(model, tokens, "blocks.0.mixer.hook_state", normalize=True)
    np.testing.assert_allclose(torch.linalg.vector_norm(unit, dim=-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(unit * torch.linalg.vector_norm(raw, dim=-1, keepdim=True), raw, rtol=1e-5, atol=1e-6)


def test_analysis_of_a_residual_site_and_bad_arguments(tiny_run):
    model, task, _ = tiny_run
    result = ec.analyze(model, task, 12, [12, 20], site="blocks.0.hook_resid_post", n_fit=8, n_drift=4, n_eval=4)
    assert result.contraction is None and result.drift.q.shape == (20,)
    with pytest.raises(ValueError, match="longest length 8 must be >= train_length 12"):
        ec.analyze(model, task, 12, [4, 8])
    with pytest.raises(ValueError, match="n_fit must be an int >= 1; got 0"):
        ec.analyze(model, task, 12, [12], n_fit=0)


def test_theorem1_on_an_affine_model(tiny_run):
    model, task, _ = tiny_run
    sub = ec.analyze(model, task, 12, [12], n_fit=10, n_drift=2, n_eval=2, n_jac=0).subspace
    check = ec.theorem1_on_run(model, task, sub, 0, length=12)
    assert check["affine"] and 2 <= check["word_length"] <= 12
    assert check["deviation"] >= 0 and check["premise_max_over_M"] >= 0


def test_drift_cli_writes_the_report(tiny_run, tmp_path, capsys):
    _, _, run_dir = tiny_run
    out = tmp_path / "drift.html"
    assert main(["drift", str(run_dir), "--lengths", "12,30", "--n-fit", "8", "--n-drift", "4", "--n", "8",
                 "--out", str(out)]) == 0
    text = out.read_text()
    assert "Drift ratio q(t)" in text and "states on U" in text and "spectrum of Q^T J_t Q" in text
    summary = json.loads((run_dir / "drift.json").read_text())
    assert summary["horizon"] == 30 and summary["train_length"] == 12
    printed = capsys.readouterr().out
    assert "tcross" in printed
    table = printed[printed.index("reading"):]   # every reading on one line, with the sentence it tests
    for key in ec.DEFINITIONS:
        assert any(line.split()[:1] == [key] and ec.reading_tests(key) in line for line in table.splitlines()), key
    assert main(["drift", str(run_dir), "--lengths", "12,20", "--n-fit", "8", "--n-drift", "4", "--n", "4",
                 "--definition", "same", "--tau", "theory", "--no-calibrate", "--out", str(tmp_path / "s.html")]) == 0
    summary = json.loads((run_dir / "drift.json").read_text())
    assert summary["definition"] == "same/theory" and summary["tau"] == pytest.approx(summary["tau_theory"])
    assert main(["drift", str(run_dir), "--lengths", "12,20", "--n-fit", "8", "--n-drift", "4", "--n", "4",
                 "--normalize", "--statistic", "90", "--out", str(tmp_path / "n.html")]) == 0
    assert json.loads((run_dir / "drift.json").read_text())["normalize"] is True
    assert main(["drift", str(run_dir), "--lengths", "12,20", "--n-fit", "8", "--n-drift", "4", "--n", "4",
                 "--definition", "time", "--tau", "calibrated", "--out", str(tmp_path / "t.html")]) == 0
    summary = json.loads((run_dir / "drift.json").read_text())
    assert summary["definition"] == "time/calibrated" and "Readability of the read-out" in (tmp_path / "t.html").read_text()
    assert_renders(tmp_path / "t.html")
    from interp.cli import drift as drift_cli
    assert drift_cli.DRIFTS == ec.DRIFTS
    assert main(["drift", str(tmp_path / "missing")]) == 2
    assert "interp drift: error" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["drift", str(run_dir), "--statistic", "101"])


def test_recipe_quick_runs_end_to_end(tmp_path):
    spec = importlib.util.spec_from_file_location("error_control_recipe", ROOT / "examples" / "error_control.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    rows, corr, theorem = recipe.main(["--quick", "--steps", "4", "--models", "tanh_rnn,linear_rnn",
                                       "--groups", "S3", "--out", str(tmp_path)])
    assert [(r["model"], r["group"]) for r in rows] == [("tanh_rnn", "S3"), ("linear_rnn", "S3")]
    assert {c["runs"] for c in corr} >= {"all runs", "affine, S3"}
    assert [t["model"] for t in theorem] == ["tanh_rnn", "linear_rnn"] and theorem[1]["affine"]
    assert_renders(tmp_path / "report.html")
    assert len(json.loads((tmp_path / "summary.json").read_text())["runs"]) == 2


def test_centroid_readout_reads_the_sites_states_at_the_training_length():
    torch.manual_seed(0)
    task = make_task("S3", format="acot")
    model = models.build("tanh_rnn", vocab_size=task.vocab_size, d_model=8).eval()
    site = ec.default_site(model)
    subspace = ec.fit_subspace(model, task, 8, site, 64, 5)
    found = ec.centroid_readout(model, task, subspace, 8, site, 48, 7, chunk=16)
    batch = task.sample(48, 8, 7)
    coords = subspace.coords(ec.site_states(model, batch.tokens, site)[:, -1])
    assert found == pytest.approx(separation(coords, batch.states[:, 7].numpy()))
