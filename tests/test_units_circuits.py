"""The circuit and attribution grids as units (interp.analysis.circuits.units, attribution's units):
for each grid the chunked in-process result equals the one on spawned processes (and, for EAP-IG
and the exact re-scoring, on Ray actors) bit for bit; a rerun with the same `out` computes no
unit; the default call (no executor, out or chunk) runs no units. Tiny float64 models, N = 10."""

import importlib
import os
import pickle
import sys
from pathlib import Path

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # before ray is imported (by the Ray executor)

import pytest  # noqa: E402
import torch  # noqa: E402

from interp.analysis.circuits import build_graph, eap, eap_ig, faithfulness_curve, rescore  # noqa: E402
from interp.analysis.circuits.graph import positional_graph
from interp.analysis.interventions import Site, attribute
from interp.analysis.units import digest
from interp.sweep.executors import make_executor

sys.path.insert(0, str(Path(__file__).parent))
from test_circuits import tiny  # noqa: E402
from test_interventions import TASK, VOCAB, ar_batch, corrupt_ar  # noqa: E402

FRACTIONS = (0.05, 0.2, 0.5, 1.0)
# the modules (the package exports functions of the same names)
eap_module, edge_module, circuit_module, attribution_module = (importlib.import_module(name) for name in (
    "interp.analysis.circuits.eap", "interp.analysis.circuits.edge_patching", "interp.analysis.circuits.circuit",
    "interp.analysis.interventions.attribution"))


@pytest.fixture(scope="module")
def model():
    return tiny("attention")


@pytest.fixture(scope="module")
def pair():
    clean = ar_batch(10, 3, seed=0)  # T 9
    return clean, corrupt_ar(clean, TASK, seed=1)


@pytest.fixture(scope="module")
def local():
    executor = make_executor("local", workers=2)
    yield executor
    executor.close()


@pytest.fixture(scope="module")
def ray_cluster():
    pytest.importorskip("ray")
    executor = make_executor("ray", workers=2)
    yield executor
    executor.close()


@pytest.fixture(scope="module")
def ig(model, pair):
    """EAP-IG as units of 4 examples, in this process (the scores the edge grids start from)."""
    return eap_ig(model, *pair, steps=3, chunk=4, progress=False)


def setup_tensors(pair) -> dict:
    """A Setup's tensors, flat."""
    out = {"at": pair.at, "clean_metric": pair.clean_metric, "corrupt_metric": pair.corrupt_metric,
           "answers": pair.answers, "rivals": pair.rivals}
    for which in ("clean_acts", "corrupt_acts"):
        out.update({f"{which}/{hook}": value for hook, value in getattr(pair, which).items()})
    return out


def assert_same_scores(a, b):
    assert torch.equal(a.per_example, b.per_example) and a.method == b.method
    assert (a.per_position is None) == (b.per_position is None)
    if a.per_position is not None:
        assert torch.equal(a.per_position, b.per_position)
    ta, tb = setup_tensors(a.setup), setup_tensors(b.setup)
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


def no_units(*args, **kwargs):
    raise AssertionError("a unit was computed")


def test_setup_pickles_with_a_stable_digest(ig):
    copy = pickle.loads(pickle.dumps(ig.setup))
    assert digest(copy) == digest(ig.setup)
    ig.graph.edge_index(ig.graph.edge_names()[3])  # fills the graph's name index: not a field
    assert digest(copy) == digest(ig.setup)
    logits = torch.randn(4, VOCAB, dtype=torch.float64)
    ex = torch.arange(4)
    assert torch.equal(copy.metric(logits, ex), ig.setup.metric(logits, ex))


def test_attribution_units_on_processes_and_resumed(model, pair, local, tmp_path, monkeypatch):
    sites = [Site(f"blocks.{layer}.{hook}", role) for layer in (0, 1) for hook in ("hook_resid_pre", "mixer.hook_v")
             for role in ("key", "value")]
    here = attribute(model, *pair, sites, metrics=["logit_diff"], chunk=4, progress=False, out=tmp_path / "a")
    there = attribute(model, *pair, sites, metrics=["logit_diff"], chunk=4, progress=False, executor=local)
    for name in attribution_module.RESULT_TENSORS:
        a, b = getattr(here, name), getattr(there, name)
        assert (a is None and b is None) or torch.equal(a.nan_to_num(7.0) if a.is_floating_point() else a,
                                                         b.nan_to_num(7.0) if b.is_floating_point() else b), name
    assert here.p_patched.shape == (len(sites), 10) and here.logit_diff_patched.shape == (len(sites), 10)
    default = attribute(model, *pair, sites, metrics=["logit_diff"], progress=False)
    assert torch.allclose(default.p_patched, here.p_patched, atol=1e-10)
    monkeypatch.setattr(attribution_module, "attribution_unit", no_units)
    again = attribute(model, *pair, sites, metrics=["logit_diff"], chunk=4, progress=False, out=tmp_path / "a")
    assert torch.equal(again.p_patched, here.p_patched) and torch.equal(again.kept, here.kept)


def test_eap_units_positional_on_processes_and_resumed(model, pair, local, tmp_path, monkeypatch):
    graph = positional_graph(build_graph(model), ["key", "value", "query"])
    here = eap(model, *pair, graph=graph, per_position=True, chunk=4, out=tmp_path / "e")
    there = eap(model, *pair, graph=graph, per_position=True, chunk=4, executor=local)
    assert here.graph is graph and here.per_example.shape == (graph.n_edges, 10)
    assert_same_scores(here, there)
    default = eap(model, *pair, graph=graph, per_position=True)
    assert torch.allclose(default.per_example, here.per_example, atol=1e-10)
    monkeypatch.setattr(eap_module, "prompt_unit", no_units)
    assert_same_scores(eap(model, *pair, graph=graph, per_position=True, chunk=4, out=tmp_path / "e"), here)


def test_eap_ig_units_on_processes_and_ray_and_resumed(model, pair, ig, local, ray_cluster, tmp_path, monkeypatch):
    assert_same_scores(eap_ig(model, *pair, steps=3, chunk=4, progress=False, executor=local), ig)
    out = tmp_path / "ig"
    assert_same_scores(eap_ig(model, *pair, steps=3, chunk=4, progress=False, executor=ray_cluster, out=out), ig)
    default = eap_ig(model, *pair, steps=3, progress=False)
    assert torch.allclose(default.per_example, ig.per_example, atol=1e-10)
    monkeypatch.setattr(eap_module, "prompt_unit", no_units)
    assert_same_scores(eap_ig(model, *pair, steps=3, chunk=4, progress=False, out=out), ig)


def test_rescore_units_on_processes_and_ray_and_resumed(model, ig, local, ray_cluster, tmp_path, monkeypatch):
    here = rescore(model, ig, k=7, chunk=3)
    for executor in (local, ray_cluster):
        assert torch.equal(rescore(model, ig, k=7, chunk=3, executor=executor, out=tmp_path / "r").per_example,
                           here.per_example)
    assert here.method == "eap-ig+exact"
    default = rescore(model, ig, k=7)
    assert torch.allclose(default.per_example, here.per_example, atol=1e-10)
    monkeypatch.setattr(edge_module, "effects_unit", no_units)
    assert torch.equal(rescore(model, ig, k=7, chunk=3, out=tmp_path / "r").per_example, here.per_example)
    with pytest.raises(ValueError, match="holds a grid of another"):
        rescore(model, ig, k=6, chunk=3, out=tmp_path / "r")


def test_faithfulness_curve_units_on_processes_and_resumed(model, ig, local, tmp_path, monkeypatch):
    scores = {"eap-ig": ig, "eap-ig+exact": rescore(model, ig, k=7, chunk=3)}
    here = faithfulness_curve(model, scores, FRACTIONS, chunk=3, out=tmp_path / "f")
    assert faithfulness_curve(model, scores, FRACTIONS, chunk=3, executor=local) == here
    assert [(r["method"], r["fraction"]) for r in here] == [(m, f) for m in scores for f in FRACTIONS]
    default = faithfulness_curve(model, scores, FRACTIONS)
    assert [r["n_edges"] for r in default] == [r["n_edges"] for r in here]
    assert all(abs(a["faithfulness"] - b["faithfulness"]) < 1e-10 for a, b in zip(default, here))
    monkeypatch.setattr(circuit_module, "faithfulness_unit", no_units)
    assert faithfulness_curve(model, scores, FRACTIONS, chunk=3, out=tmp_path / "f") == here


def test_default_calls_run_no_units(model, pair, ig, monkeypatch):
    for module in (eap_module, edge_module, circuit_module, attribution_module):
        monkeypatch.setattr(module, "run_units", no_units)
    eap(model, *pair)
    eap_ig(model, *pair, steps=2, progress=False)
    faithfulness_curve(model, {"eap-ig": rescore(model, ig, k=3)}, FRACTIONS)
    attribute(model, *pair, [Site("blocks.1.hook_resid_pre", "key")], progress=False)
    with pytest.raises(ValueError, match="chunk must be a positive int"):
        eap(model, *pair, chunk=0)


def test_circuit_command_scale_out_flags_need_an_executor(tmp_path, capsys):
    from interp.cli import main

    assert main(["circuit", str(tmp_path), "--workers", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--workers: needs --executor local or ray" in err
