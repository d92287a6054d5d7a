"""The smallest faithful circuit (interp.analysis.circuits.search) and `interp circuit`'s default
that uses it: on a 6-edge Mamba graph a share of 5% keeps no edge, the target finds the circuit."""

import pytest
import torch

import models
from interp.analysis.circuits import build_graph, eap, extract, faithfulness
from interp.analysis.circuits.search import size_grid, smallest_faithful
from interp.analysis.interventions import corrupt_ar
from interp.cli import main
from interp.tasks import make_task
from tests.browser import assert_renders


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    task = make_task("AR")
    model = models.build("transformer", vocab_size=task.vocab_size, d_model=16, n_layers=2, n_heads=2).double().eval()
    clean = task.sample(12, 3, seed=1)
    return model, clean, corrupt_ar(clean, task, seed=2)


def every_size(model, scores):
    """{n: faithfulness of extract(n=n)} for every n: the brute force the search must agree with."""
    masks = torch.stack([extract(scores, n=n).kept for n in range(1, scores.graph.n_edges + 1)])
    return dict(zip(range(1, scores.graph.n_edges + 1), faithfulness(model, scores.setup, masks).tolist()))


@pytest.mark.parametrize("target", [0.5, 0.8, 0.95])
def test_all_sizes_tried_on_a_small_graph_and_the_smallest_passing_one_chosen(pair, target):
    model, clean, corrupt = pair
    scores = eap(model, clean, corrupt)
    found = smallest_faithful(model, scores, target=target, grid=scores.graph.n_edges)
    truth = every_size(model, scores)
    smallest = min(n for n, value in truth.items() if value >= target)
    assert [row["n"] for row in found.rows] == list(truth)
    assert torch.equal(found.circuit.kept, extract(scores, n=smallest).kept)
    assert found.faithfulness == pytest.approx(truth[smallest], abs=1e-12) and found.faithfulness >= target


def test_bisection_on_a_coarse_grid_ends_next_to_a_failing_size(pair):
    model, clean, corrupt = pair
    scores = eap(model, clean, corrupt)
    found = smallest_faithful(model, scores, target=0.8, grid=4)
    tried = {row["n"]: row["faithfulness"] for row in found.rows}
    chosen = min(n for n, value in tried.items() if value >= 0.8)
    assert len(tried) < scores.graph.n_edges                        # not every size: a grid, then bisection
    assert chosen == 1 or tried[chosen - 1] < 0.8                   # the size below the one chosen was tried, failed
    assert torch.equal(found.circuit.kept, extract(scores, n=chosen).kept)
    assert size_grid(1000, 8)[0] == 1 and size_grid(1000, 8)[-1] == 1000 and size_grid(5, 8) == [1, 2, 3, 4, 5]


def test_no_effect_means_no_circuit_and_says_why(pair):
    model, clean, _ = pair
    found = smallest_faithful(model, eap(model, clean, clean), target=0.8)
    assert found.circuit is None and found.rows == [] and "do not move the metric" in found.reason
    with pytest.raises(ValueError, match="target must be a faithfulness in"):
        smallest_faithful(model, eap(model, clean, clean), target=0)


@pytest.fixture(scope="module")
def mamba_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("search") / "run"
    assert main(["train", "--model", "mamba", "--task", "AR", "--train-length", "3", "--steps", "3", "--out", str(run),
                 "--batch-size", "8", "--d-model", "8", "--eval-every", "3", "--no-progress"]) == 0
    return run


def test_circuit_command_default_finds_a_circuit_where_five_percent_keeps_none(mamba_run, tmp_path, capsys):
    graph = build_graph(models.load(mamba_run))
    assert graph.n_edges == 6 and round(0.05 * graph.n_edges) == 0      # what the old default kept
    capsys.readouterr()
    assert main(["circuit", str(mamba_run), "--n", "8", "--steps", "2", "--rescore", "6", "--no-progress"]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert "the smallest of the sizes tried reaching 0.8" in line
    kept = int(line.split("circuit of ")[1].split(" of ")[0])
    assert kept >= 1 and float(line.split("faithfulness ")[1].split()[0].rstrip(";")) >= 0.8
    html = (mamba_run / "circuit.html").read_text()
    assert "The circuit: the smallest number of top EAP-IG+exact edges" in html
    assert_renders(mamba_run / "circuit.html")
    out = tmp_path / "fraction.html"
    assert main(["circuit", str(mamba_run), "--n", "8", "--steps", "2", "--rescore", "6", "--fraction", "0.05",
                 "--out", str(out), "--no-progress"]) == 0
    assert "no circuit: --fraction 0.05 of 6 edges keeps no edge" in capsys.readouterr().out
    assert "No circuit: --fraction 0.05" in out.read_text()
    with pytest.raises(SystemExit):
        main(["circuit", str(mamba_run), "--target", "0.9", "--fraction", "0.1"])
    assert "not allowed with argument" in capsys.readouterr().err
