"""Issue 28 item 5: the `interp` command parses its arguments before any heavy import (a mistyped
command fails in a fraction of a second; before, `interp train --bogus` imported torch first and
took 6-13 s under load), and a misspelled flag is named with the closest ones (before: argparse
reported the flag it displaced as missing)."""

import json
import subprocess
import sys

from pathlib import Path

import pytest

from interp.cli import main
from interp.cli.args import GPU_DEVICE_FILES, NAMED_TASKS

PROBE = """
import json, sys
from interp.cli import main
try:
    main(json.loads(sys.argv[1]))
except SystemExit as exit:
    status = exit.code
print(json.dumps({"status": status, "heavy": sorted({"torch", "numpy", "models"} & set(sys.modules))}))
"""


@pytest.mark.parametrize("argv", [
    ["train", "--bogus"],
    ["train", "--model", "tanh_rnn", "--task", "S3", "--stpes", "3", "--out", "x"],   # a deferred flag before the typo
    ["train", "--model", "tanh_rnn", "--task", "S3", "--steps", "3"],                  # --out missing
    ["eval", "runs/x", "--device", "cuda", "--n", "0"],
    ["drift", "runs/x", "--executor", "dask"],   # (a second RUN_DIR is no error: drift takes several runs)
    ["eval", "runs/x", "runs/y", "--workers", "0"],
    ["reproduce", "parity", "--bogus"],
    ["sweep", "--out", "x"],
    ["train", "--model", "tanh_rnn", "--task", "NOPE", "--steps", "3", "--out", "x"],   # an unknown task
    ["train", "--model", "tanh_rnn", "--task", "mqar", "--steps", "3", "--out", "x"],   # its case fixed: 'MQAR'
    pytest.param(["eval", "runs/x", "--device", "cuda:1"], marks=pytest.mark.skipif(
        any(Path("/dev", name).exists() for name in GPU_DEVICE_FILES), reason="a GPU device file: torch checks it")),
])
def test_argument_errors_come_before_heavy_imports(argv):
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], capture_output=True, text=True,
                          timeout=120)
    result = json.loads(done.stdout)
    assert result["status"] == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert result["heavy"] == [], f"{argv} imported {result['heavy']} before its error: {done.stderr}"


@pytest.mark.parametrize("argv,expected", [
    (["train", "--model", "tanh_rnn", "--stpes", "10"], "unrecognized arguments: --stpes; did you mean --steps?"),
    (["eval", "runs/x", "--lenghts", "60"], "unrecognized arguments: --lenghts; did you mean --lengths?"),
    (["drift", "runs/x", "--reference_step=3"], "did you mean --reference-step?"),
    (["train", "--xyzzy"], "unrecognized arguments: --xyzzy; interp train's flags: --help, --model"),
])
def test_misspelled_flag_is_named_with_the_closest(argv, expected, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and expected in err[0], err
    assert "required" not in err[0]


def test_abbreviations_and_values_are_not_taken_for_flags(tmp_path, capsys):
    """A unique prefix stays a flag (argparse's allow_abbrev); what follows `--` is not checked."""
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--thresh", "2", "--", "--not-a-flag"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "argument --threshold: must be a number in [0, 1]" in err


def test_deferred_flags_are_checked_after_parsing(capsys):
    """--model and --device are checked once every flag has parsed, with argparse's one-line error."""
    with pytest.raises(SystemExit):
        main(["train", "--model", "tanh_rn", "--task", "S3", "--steps", "3", "--out", "x"])
    assert "argument --model: unknown model 'tanh_rn' (did you mean tanh_rnn?)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["heads", "runs/x", "--device", "gpu"])
    assert "argument --device: " in capsys.readouterr().err


def test_the_cli_knows_every_named_task():
    """args.NAMED_TASKS (read without importing torch) are interp.tasks' named tasks."""
    from interp.tasks import task_names

    assert NAMED_TASKS == task_names()


@pytest.mark.parametrize("task,expected", [("NOPE", "unknown task 'NOPE': allowed AR, MQAR"),
                                           ("mqar", "did you mean 'MQAR'?"), ("a4xz5", "did you mean 'A4xZ5'?"),
                                           ("Selectivecopy", "did you mean SelectiveCopy?")])
def test_unknown_tasks_are_named_with_the_fix(task, expected, capsys):
    with pytest.raises(SystemExit):
        main(["train", "--model", "tanh_rnn", "--task", task, "--steps", "3", "--out", "x"])
    err = capsys.readouterr().err
    assert f"argument --task: unknown task '{task}'" in err and expected in err
