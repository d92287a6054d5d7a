"""`interp patch RUN_DIR`: the interchange grid of a retrieval run from the command line."""

import pandas as pd
import pytest

from interp.analysis.interventions import corrupt_ar, interchange, site_grid
from interp.cli import main
from interp.tasks import make_task
import models
from tests.browser import assert_renders


def trained(tmp_path, task="AR", model="mamba", name="run"):
    run = tmp_path / name
    assert main(["train", "--model", model, "--task", task, "--train-length", "3", "--steps", "3", "--out", str(run),
                 "--batch-size", "8", "--d-model", "8", "--eval-every", "3", "--no-progress"]) == 0
    return run


@pytest.fixture(scope="module")
def ar_run(tmp_path_factory):
    return trained(tmp_path_factory.mktemp("patch"))


def test_both_methods_report_and_csv(ar_run, capsys):
    capsys.readouterr()
    assert main(["patch", str(ar_run), "--n", "16", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "mamba on AR (3 pairs, T 10): 60 sites x 16 pairs" in out   # 10 positions x 3 hooks x 2 layers
    assert "exact: largest" in out and "attribution: largest" in out
    table = pd.read_csv(ar_run / "patch.csv")
    assert sorted(table.method.unique()) == ["attribution", "exact"] and len(table) == 2 * 60
    assert set(table.component) == {"hook_resid_pre", "mixer.hook_out", "mixer.hook_state"}
    assert_renders(ar_run / "patch.html")


def test_exact_matches_the_python_api(ar_run, tmp_path):
    report = tmp_path / "roles.html"
    assert main(["patch", str(ar_run), "--method", "exact", "--hooks", "mixer.hook_out,blocks.1.hook_resid_pre",
                 "--positions", "key,value,query", "--n", "16", "--top", "2", "--min-effect", "0", "--out", str(report)]) == 0
    table = pd.read_csv(tmp_path / "roles.csv")
    task = make_task("AR")
    model = models.load(ar_run).eval()
    clean = task.sample(16, 3, seed=2)
    sites = site_grid(model, ["blocks.{l}.mixer.hook_out", "blocks.1.hook_resid_pre"], ["key", "value", "query"])
    expected = interchange(model, clean, corrupt_ar(clean, task, seed=3), sites, min_effect=0.0).to_dataframe()
    assert table.site.tolist() == expected.site.tolist() and table.n_kept[0] == expected.n_kept[0] > 0
    pd.testing.assert_series_equal(table["mean"], expected["mean"], check_names=False)


@pytest.mark.parametrize("argv, message", [
    (["--corrupt", "value", "--hooks", "mixer.hook_nothing"], "mixer.hook_nothing"),
    (["--top", "999"], "--top must be at most the number of sites (60); got 999"),
    (["--positions", "keys,3"], "--positions: unknown role(s) ['keys']; the task's roles are ['answer', 'bos'"),
    (["--max-memory", "2kB", "--no-progress"], "interchange at hooks blocks.{l}.hook_resid_pre, blocks.{l}.mixer.hook_out, "
                                               "blocks.{l}.mixer.hook_state (layers 0-1) over N=4, T=10"),
    (["--max-memory", "lots"], "max_memory must be a number of bytes or a size"),
])
def test_bad_arguments_are_one_line_errors(ar_run, argv, message, capsys):
    assert main(["patch", str(ar_run), "--n", "4", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("interp patch: error:") and message in err


def test_a_task_without_a_corruption_is_a_clear_error(tmp_path, capsys):
    run = trained(tmp_path, task="C2", model="tanh_rnn")
    assert main(["patch", str(run)]) == 2
    assert "the run's task 'C2' has no '--corrupt key'; interp patch supports AR with --corrupt key" in \
        capsys.readouterr().err
