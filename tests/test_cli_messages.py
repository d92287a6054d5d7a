"""Issue 28 item 5: `interp drift` and `interp heads` say what they need when the run's task does
not fit (before: "length (pairs in context) must be <= ... got 1000" for drift on an AR run, "two
classes have the same centroid at reference_step 1" on a REPL run, and heads named only the
mixer). The resume message is in tests/test_cli.py."""

import pytest

import models
from interp.cli import main
from interp.cli.drift import determined_from
from interp.tasks import make_task
from interp.training.train import TrainConfig, train

CFG = TrainConfig(steps=1, batch_size=2, warmup=0, train_length=4, eval_size=2)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{task: run directory} of 1-step tanh RNN runs (what is reported does not depend on training)."""
    root = tmp_path_factory.mktemp("misfit")
    out = {}
    for name in ("AR", "S3", "REPL"):
        task = make_task(name)
        out[name] = root / name
        train(models.preset_config("tanh_rnn", vocab_size=task.vocab_size, d_model=8), task, CFG, out[name],
              progress=False)
    return out


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_drift_on_a_retrieval_run_says_what_drift_needs(runs, capsys):
    assert main(["drift", str(runs["AR"])]) == 2
    line = one_line(capsys)
    assert "trained on 'AR', which has no group-valued state at every step" in line
    assert "a group word problem such as S3" in line and "interp patch" in line and "pairs in context" not in line


def test_drift_with_an_unreadable_reference_step_names_one_that_works(runs, capsys):
    argv = ["drift", str(runs["REPL"]), "--lengths", "4,6", "--n", "4", "--n-fit", "16", "--n-drift", "64",
            "--no-calibrate"]
    assert main(argv) == 2
    line = one_line(capsys)
    step = determined_from(make_task("REPL"), 4)
    assert line.startswith("interp drift: error: argument --reference-step: two classes have the same centroid")
    assert f"the tokens determine the state from step {step} on: pass --reference-step {step} or later" in line
    assert main([*argv, "--reference-step", str(step)]) == 0, capsys.readouterr().err


def test_determined_from_agrees_with_a_brute_force_reading():
    """A word problem's state is readable from its first token; REPL's only later (its initial
    values are hidden): the step is the first from which equal token prefixes mean equal states."""
    for name in ("S3", "Z5", "A4xZ5"):
        assert determined_from(make_task(name), 8) == 1
    for name in ("REPL", "PFSA"):
        task = make_task(name)
        batch = task.sample(64, 4, 3)
        tokens, states = batch.tokens.tolist(), batch.states.reshape(64, batch.tokens.shape[1], -1).tolist()
        readable = []
        for t in range(len(tokens[0])):
            seen = {}
            readable.append(all(seen.setdefault(tuple(row[:t + 1]), tuple(state[t])) == tuple(state[t])
                                for row, state in zip(tokens, states)))
        expected = next((t + 1 for t in range(len(readable)) if all(readable[t:])), None)
        assert determined_from(task, 4, seed=3, n=64) == expected
    assert determined_from(make_task("REPL"), 4) > 1


@pytest.mark.parametrize("task", ["AR", "S3"])
def test_heads_on_a_run_without_reveals_says_what_heads_needs(runs, task, capsys):
    assert main(["heads", str(runs[task]), "--n", "4"]) == 2
    line = one_line(capsys)
    assert f"is a tanh_rnn run on '{task}'; interp heads needs a DeltaNet run" in line
    assert "trained on REPL or PFSA" in line


@pytest.mark.parametrize("flag,value", [("--resolution", "nan"), ("--lrs", "nan"), ("--seeds", "-1"),
                                        ("--models", "lstmm"), ("--tasks", "Q9"), ("--formats", "x"),
                                        ("--max-length", "100000000"), ("--max-length", str(2 ** 66))])
def test_sample_efficiency_names_the_flag_of_a_bad_spec_entry(flag, value, tmp_path, capsys):
    """Its errors named the spec entry ("spec.search: resolution ...") but not the flag that set it;
    --max-length 100000000 ran on (a hundred million conditions) and 2**66 was an OverflowError (found
    by tests/test_fuzz_cli.py)."""
    argv = ["sample-efficiency", "--models", "lstm", "--tasks", "Z5", "--formats", "acot", "--max-length", "2",
            "--out", str(tmp_path / "se"), flag, value]
    try:   # numbers past their bounds are refused while parsing, the rest by the spec's check
        status = main(argv)
    except SystemExit as exit:
        status = exit.code
    line = one_line(capsys)
    assert status == 2 and line.startswith(f"interp sample-efficiency: error: argument {flag}: "), line
    assert not (tmp_path / "se").exists()
