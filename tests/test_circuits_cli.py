"""`interp circuit RUN_DIR`, the circuit report (interp.report.circuits) and the CSV of edge scores."""

import pandas as pd
import pytest
import torch

import models
from interp.analysis.circuits import build_graph, eap
from interp.analysis.interventions import corrupt_ar
from interp.cli import main
from interp.tasks import make_task
from tests.browser import assert_renders


@pytest.fixture(scope="module")
def ar_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("circuit") / "run"
    assert main(["train", "--model", "transformer", "--task", "AR", "--train-length", "3", "--steps", "3", "--out",
                 str(run), "--batch-size", "8", "--d-model", "8", "--eval-every", "3", "--no-progress"]) == 0
    return run


def test_circuit_command_report_and_csv(ar_run, capsys):
    capsys.readouterr()
    assert main(["circuit", str(ar_run), "--n", "8", "--steps", "2", "--rescore", "5", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "on AR (3 pairs, T 10)" in out and "faithfulness" in out
    table = pd.read_csv(ar_run / "circuit.csv")
    assert list(table.columns) == ["edge", "eap", "eap-ig", "eap-ig+exact", "in_circuit"]
    task = make_task("AR")
    model = models.load(ar_run).eval()
    clean = task.sample(8, 3, seed=2)
    expected = eap(model, clean, corrupt_ar(clean, task, seed=3))
    assert table.edge.tolist() == expected.graph.edge_names()
    assert torch.allclose(torch.tensor(table.eap.values), expected.scores, atol=1e-6)
    assert_renders(ar_run / "circuit.html")


def test_circuit_bad_arguments_are_one_line_errors(ar_run, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["circuit", str(ar_run), "--n", "4", "--metric", "accuracy"])
    assert exit_info.value.code == 2 and "invalid choice: 'accuracy'" in capsys.readouterr().err


def test_circuit_command_with_positional_nodes(ar_run, tmp_path, capsys):
    out = tmp_path / "positional.html"
    assert main(["circuit", str(ar_run), "--n", "8", "--steps", "2", "--rescore", "3", "--positions", "key,value,query",
                 "--out", str(out), "--no-progress"]) == 0
    table = pd.read_csv(out.with_suffix(".csv"))
    model = models.load(ar_run).eval()
    task = make_task("AR")
    clean = task.sample(8, 3, seed=2)
    graph = build_graph(model, positions=["key", "value", "query"])
    expected = eap(model, clean, corrupt_ar(clean, task, seed=3), graph=graph)
    assert table.edge.tolist() == graph.edge_names() and "embed@key->a0.h0.v@key" in set(table.edge)
    assert torch.allclose(torch.tensor(table.eap.values), expected.scores, atol=1e-6)
    assert_renders(out)
    with pytest.raises(SystemExit):
        main(["circuit", str(ar_run), "--positions", ","])
    assert main(["circuit", str(ar_run), "--n", "4", "--positions", "keys", "--out", str(tmp_path / "x.html"),
                 "--no-progress"]) == 2
    assert "keys" in capsys.readouterr().err
    assert main(["circuit", str(ar_run), "--n", "4", "--channel-groups", "2", "--out", str(tmp_path / "y.html"),
                 "--no-progress"]) == 2
    assert "channel_groups must be an int >= 1 for a model with Mamba layers" in capsys.readouterr().err
