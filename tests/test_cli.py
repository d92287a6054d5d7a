"""The `interp` command line: help, argument validation, train -> eval, and `demo --quick` end to end."""

import json
import re

import pytest
import torch

import models

from interp.cli import build_parser, main
from tests.browser import assert_renders


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["eval", "--help"], ["demo", "--help"],
                                  ["patch", "--help"]])
def test_help(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: interp")
    if argv[0] == "train":
        for flag in ("--model", "--task", "--train-length", "--steps", "--out", "--format", "--batch-size",
                     "--lr", "--seed", "--curriculum", "--d-model", "--resume"):
            assert flag in out
    if argv[0] == "demo":
        assert "--quick" in out and "--out" in out


TRAIN = ["train", "--model", "tanh_rnn", "--task", "C2", "--steps", "5", "--out", "unused"]


@pytest.mark.parametrize("argv,pattern", [
    ([a if a != "5" else "0" for a in TRAIN], r"argument --steps: must be a positive integer; got '0'"),
    ([a if a != "tanh_rnn" else "tanh_rn" for a in TRAIN], r"argument --model: unknown model 'tanh_rn' \(did you mean tanh_rnn"),
    (TRAIN + ["--lr", "-1"], r"argument --lr: must be a positive finite number; got '-1'"),
    (TRAIN + ["--format", "xyz"], r"argument --format: invalid choice: 'xyz'"),
    (TRAIN + ["--d-model", "abc"], r"argument --d-model: must be a positive integer; got 'abc'"),
    (TRAIN[:-2], r"the following arguments are required: --out"),
    (["eval", "runs/x", "--lengths", "60,abc"], r"argument --lengths: must be comma-separated positive integers"),
    (["eval", "runs/x", "--lengths", "0,10"], r"argument --lengths"),
    (["eval", "runs/x", "--threshold", "2"], r"argument --threshold: must be a number in \[0, 1\]"),
    (["demo", "--bogus"], r"unrecognized arguments: --bogus"),
    (["nope"], r"argument command: invalid choice: 'nope'"),
])
def test_bad_arguments_name_the_argument(argv, pattern, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert re.search(pattern, capsys.readouterr().err)


def test_unknown_task_is_a_clear_error(tmp_path, capsys):
    argv = [a if a != "C2" else "S33" for a in TRAIN]
    argv[argv.index("unused")] = str(tmp_path / "run")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "argument --task: task spec 'S33': symmetric group degree" in err
    assert not (tmp_path / "run").exists()


def test_train_then_eval(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", "--model", "tanh_rnn", "--task", "C2", "--format", "acot", "--train-length", "8",
            "--steps", "12", "--out", str(run), "--batch-size", "8", "--seed", "2", "--curriculum",
            "--d-model", "8", "--eval-every", "4", "--no-progress"]
    assert main(argv) == 0
    config = json.loads((run / "config.json").read_text())
    assert config["model"]["d_model"] == 8 and config["model"]["vocab_size"] == 2
    assert config["task"] == {"name": "C2", "options": {"format": "acot"}}
    assert config["train"]["curriculum"] is True and config["train"]["steps"] == 12 and config["seed"] == 2
    assert "trained tanh_rnn on C2 for 12 steps" in capsys.readouterr().out
    assert main(argv) == 2  # the run exists: refuse without --resume
    assert "--resume" in capsys.readouterr().err
    assert main(argv + ["--resume"]) == 0
    assert main(["eval", str(run), "--lengths", "8,16", "--n", "16"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"mp: ", out) and "acc@16" in out
    result = json.loads((run / "eval.json").read_text())
    assert set(result["final_accuracy"]) == {"8", "16"} and result["n"] == 16


def test_eval_of_a_missing_run_is_a_clear_error(tmp_path, capsys):
    assert main(["eval", str(tmp_path / "nothing")]) == 2
    assert "config.json does not exist" in capsys.readouterr().err


def test_demo_quick_end_to_end(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "tanh_rnn" in printed and "mamba" in printed and "report:" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["models"]) == {"tanh_rnn", "mamba"}
    for row in summary["models"].values():
        assert set(row["accuracy"]) == {str(t) for t in summary["lengths"]}
        assert all(0.0 <= a <= 1.0 for a in row["accuracy"].values())
    html = (out / "report.html").read_text()
    assert html.count("plotly.js v") == 1 and not re.search(r"<script[^>]+src=", html)
    assert "mp and accuracy by length" in html
    assert_renders(out / "report.html")
    for name in ("tanh_rnn", "mamba"):
        assert models.registry.weights_file(out / name).is_file() and (out / name / "eval.json").is_file()
    # a second run reuses the finished runs instead of overwriting them
    before = models.registry.weights_file(out / "mamba").read_bytes()
    assert main(["demo", "--quick", "--out", str(out), "--no-progress"]) == 0
    assert models.registry.weights_file(out / "mamba").read_bytes() == before


def test_parser_has_the_three_commands():
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # noqa: SLF001
    assert {"demo", "train", "eval"} <= set(commands)


def test_unavailable_device_is_one_line_naming_the_available_ones(capsys):
    """Issue 13 item 3: --device cuda on a CPU-only torch was a raw AssertionError traceback."""
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    for command in (TRAIN, ["eval", "runs/x"], ["drift", "runs/x"], ["heads", "runs/x"]):
        with pytest.raises(SystemExit) as exit:
            main([*command, "--device", "cuda"])
        assert exit.value.code == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "argument --device: 'cuda' is not available" in lines[0]
        assert "available: cpu" in lines[0]


def test_train_help_lists_the_choices_and_defaults(capsys):
    """Issue 13 item 9: the models, tasks and formats are listed, and every default shown."""
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in models.list_models():
        assert name in text
    assert "AR, MQAR, ATR, REPL, PFSA" in text and "{outcome,acot,cot}" in text
    for flag, default in (("--batch-size", "64"), ("--lr", "0.003"), ("--seed", "0"), ("--device", "cpu"),
                          ("--checkpoint-every", "500"), ("--train-length", "60")):
        assert re.search(rf"{flag} \S+ .*?\(default: {re.escape(default)}\)", text), flag
    assert "models.list_models()" not in text


def test_resume_with_more_steps_extends_a_finished_run(tmp_path, capsys):
    """Issue 13 item 9: `--resume --steps 30` after 20 steps continues the run (its warmup, 2, kept
    although 30 // 10 = 3) instead of a refusal with a diff."""
    out = tmp_path / "run"
    argv = ["train", "--model", "tanh_rnn", "--task", "C2", "--out", str(out), "--d-model", "8", "--batch-size",
            "4", "--train-length", "4", "--eval-every", "10", "--no-progress"]
    assert main([*argv, "--steps", "20"]) == 0
    longer = [*argv, "--steps", "30"]
    assert main([*longer, "--resume"]) == 0
    # issue 28 item 5: it said "trained tanh_rnn on C2 for 30 steps" although this call ran 10
    printed = capsys.readouterr().out
    assert "resumed tanh_rnn on C2 at step 20 and trained 10 more steps" in printed and "(30 in all)" in printed
    assert main([*longer, "--resume"]) == 0
    assert "already trained for 30 steps; nothing to resume" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["train"]["warmup"] == 2 and config["extensions"][0]["to_steps"] == 30
    assert main([*longer, "--resume", "--lr", "0.01"]) == 2
    assert "train.lr: 0.003 != 0.01" in capsys.readouterr().err
