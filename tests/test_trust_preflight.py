"""Preflight: a training run or sweep that cannot work is refused before anything is created, in
one line naming the flag (before: raw tracebacks for a file / empty / overlong --out, numpy's
MemoryError after the run directory was made, a hang while 10,000,000 layers were built)."""

import json
import os

import pytest

import models
from interp.cli import main
from interp.training import preflight
from interp.training.train import TrainConfig
from models.backbone import SequenceModel

TRAIN = ["train", "--model", "tanh_rnn", "--task", "C2", "--steps", "2", "--no-progress", "--train-length", "4",
         "--batch-size", "2"]


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("flag, value, words", [
    ("--train-length", "100000000", "train_length 100000000 is past the sanity bound"),
    ("--batch-size", "1000000000", "batch_size 1000000000 is past the sanity bound"),
    ("--n-layers", "10000000", "n_layers 10000000 is past the sanity bound"),
    ("--d-model", "1000000", "d_model 1000000 is past the sanity bound"),
])
def test_sizes_past_the_sanity_bounds_are_one_line_and_create_nothing(tmp_path, capsys, flag, value, words):
    out = tmp_path / "run"
    try:   # refused while parsing (the flag's bound) or by the preflight (the config's)
        status = main([*TRAIN, "--out", str(out), flag, value])
    except SystemExit as exit:
        status = exit.code
    assert status == 2
    line = one_line(capsys)
    assert line.startswith(f"interp train: error: argument {flag}: ") and words in line, line
    assert not out.exists()


def test_memory_estimate_refuses_naming_the_flag_the_estimate_and_the_memory(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(preflight, "_available", lambda device: 10_000_000)
    out = tmp_path / "run"
    assert main([*TRAIN[:-1], "8000", "--out", str(out)]) == 2   # 8000 x 4 tokens: ~18 MB of batch
    line = one_line(capsys)
    assert line.startswith("interp train: error: argument --batch-size: training needs at least ")
    assert "a batch of 8000 x 4 tokens" in line and "more than the 10 MB of memory available on cpu" in line
    assert not out.exists()
    assert main([*TRAIN, "--d-model", "512", "--n-layers", "8", "--out", str(out)]) == 2  # ~8.4 M parameters
    line = one_line(capsys)
    assert line.startswith("interp train: error: argument --d-model: ") and "parameters" in line, line


def test_the_memory_estimate_is_a_lower_bound_of_a_real_step(tmp_path):
    """The refusal must never turn away a run that fits: the estimate of a small run is below what
    one of its training steps really allocates (parameters, AdamW state, autograd's saved tensors)."""
    import torch

    from interp.training.train import make_optimizer, masked_loss
    from interp.tasks import make_task

    config = models.preset_config("mamba", vocab_size=8, d_model=32, n_layers=2)
    cfg = TrainConfig(steps=2, batch_size=16, train_length=32, warmup=0)
    estimate = (16 * preflight.parameter_count(config)
                + cfg.batch_size * cfg.train_length * (8 * config.d_model * config.n_layers + 12 * config.vocab_size))
    model = SequenceModel(config)
    optimizer = make_optimizer(model, cfg)
    batch = make_task("Z5", format="acot").sample(cfg.batch_size, cfg.train_length, 0)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel() * t.element_size()) or t,
                                                  lambda t: t):
        loss, _ = masked_loss(model(batch.tokens), batch)
    loss.backward()
    optimizer.step()
    params = sum(p.numel() for p in model.parameters())
    real = 4 * params * 4 + sum(saved)   # weights, gradients, two moments; the saved activations
    assert estimate <= real, (estimate, real)


def test_parameter_count_matches_the_built_model_for_every_preset():
    for name in models.list_models():
        config = models.preset_config(name, vocab_size=11, n_layers=3)
        assert preflight.parameter_count(config) == sum(p.numel() for p in SequenceModel(config).parameters()), name


@pytest.mark.parametrize("case", ["file", "under a file", "overlong", "empty"])
def test_bad_out_paths_are_one_line(tmp_path, capsys, case, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    out = {"file": "afile", "under a file": "afile/run", "overlong": "x" * 300, "empty": ""}[case]
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"trial": "sweep_trials:square", "grid": {"x": [1]}}))
    before = sorted(os.listdir(tmp_path))
    for argv in ([*TRAIN, "--out", out], ["sweep", str(spec), "--out", out, "--no-progress"]):
        try:
            status = main(argv)
        except SystemExit as exit:   # argparse's own refusal (the empty path)
            status = exit.code
        assert status == 2
        line = one_line(capsys)
        assert "argument --out: " in line and "Errno" not in line, line
    assert sorted(os.listdir(tmp_path)) == before and (tmp_path / "afile").read_text() == "x"


def test_an_unwritable_out_is_one_line(tmp_path, capsys, monkeypatch):
    locked = tmp_path / "ro"
    locked.mkdir(mode=0o555)
    if os.geteuid() == 0:   # root writes anywhere: let the check see what another user would
        real = os.access
        monkeypatch.setattr(preflight.os, "access", lambda path, mode: False if str(path) == str(locked)
                            else real(path, mode))
    for argv in ([*TRAIN, "--out", str(locked / "run")], ["demo", "--quick", "--out", str(locked / "demo")]):
        assert main(argv) == 2
        line = one_line(capsys)
        assert "argument --out: " in line and f"{str(locked)!r} is not writable" in line, line
    assert not any(locked.iterdir())


@pytest.mark.parametrize("case", ["under a file", "overlong", "a directory"])
def test_bad_report_paths_are_one_line_before_the_analysis(tmp_path, capsys, case, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([*TRAIN, "--out", "run"]) == 0
    (tmp_path / "afile").write_text("x")
    (tmp_path / "drift.html").write_text("an old report")   # a file of the report's name here is no obstacle
    capsys.readouterr()
    out = {"under a file": "afile/drift.html", "overlong": "y" * 300 + ".html", "a directory": "run"}[case]
    for command in (["drift", "run", "--lengths", "6,8", "--n", "4", "--n-fit", "8", "--n-drift", "4"],
                    ["heads", "run", "--n", "4"]):
        assert main([*command, "--out", out]) == 2
        line = one_line(capsys)
        assert line.startswith(f"interp {command[0]}: error: argument --out: ") and "Errno" not in line, line
    assert main(["drift", "run", "--lengths", "6,8", "--n", "4", "--n-fit", "8", "--n-drift", "4",
                 "--out", "reports/drift.html"]) == 0
    assert (tmp_path / "reports" / "drift.html").is_file()
