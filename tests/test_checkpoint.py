"""Run directories: atomic writes, exact optimizer round trip, truncated or mixed checkpoints rejected."""

import json
import os
from pathlib import Path

import pytest
import torch

import models
from interp.training import checkpoint as ckpt
from interp.tasks import make_task
from interp.training.train import TrainConfig, make_optimizer, train
from models.storage import writer
from models.storage.paths import LOCK


def make_run(tmp_path, steps=6):
    cfg = TrainConfig(steps=steps, batch_size=4, warmup=2, train_length=6, eval_every=3, eval_size=8,
                      checkpoint_every=3, seed=1)
    model_cfg = models.preset_config("tanh_rnn", vocab_size=2, d_model=8)
    result = train(model_cfg, make_task("C2"), cfg, tmp_path / "run", progress=False)
    return tmp_path / "run", result, model_cfg, cfg


def test_run_directory_layout_and_config(tmp_path):
    run_dir, result, model_cfg, cfg = make_run(tmp_path)
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(
        [ckpt.CONFIG, ckpt.POINTER, ckpt.CHECKPOINTS, ckpt.METRICS, LOCK])
    assert json.loads((run_dir / ckpt.POINTER).read_text()) == {"step": 6, "path": "checkpoints/step-000000006"}
    assert [p.name for p in (run_dir / ckpt.CHECKPOINTS).iterdir()] == ["step-000000006"]  # step 3 removed
    assert sorted(p.name for p in ckpt.checkpoint_dir(run_dir).iterdir()) == sorted(
        [ckpt.MODEL, ckpt.OPTIMIZER, ckpt.STATE])
    assert models.registry.weights_file(run_dir) == ckpt.checkpoint_dir(run_dir) / ckpt.MODEL
    config = json.loads((run_dir / ckpt.CONFIG).read_text())
    assert config["model"] == model_cfg.to_dict()
    assert config["task"] == {"name": "C2", "options": {"format": "acot"}}
    assert config["train"] == cfg.to_dict() and config["seed"] == 1
    assert set(config["versions"]) == {"torch", "numpy", "python", "package"}
    loaded = models.load(run_dir)
    for key, value in result.model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value)
    records = ckpt.read_metrics(run_dir)
    assert {r["kind"] for r in records} == {"train", "eval"} and records[-1]["step"] == 6


def test_optimizer_state_round_trips_exactly(tmp_path):
    run_dir, result, model_cfg, cfg = make_run(tmp_path)
    model = models.build(model_cfg)
    optimizer = make_optimizer(model, cfg)
    state = ckpt.load_checkpoint(run_dir, model, optimizer)
    assert state["step"] == 6
    tensors, _ = ckpt.flatten_optimizer(optimizer)
    saved = ckpt.load_file(str(ckpt.checkpoint_dir(run_dir) / ckpt.OPTIMIZER))
    assert {k for k in saved if k.startswith("state.")} == set(tensors)
    for key, value in tensors.items():
        assert torch.equal(saved[key], value), key
    assert all(k in {"exp_avg", "exp_avg_sq", "step"} for k in {n.split(".", 2)[2] for n in tensors})


def test_atomic_write_leaves_no_temporary_files_and_keeps_old_file_on_failure(tmp_path):
    target = tmp_path / "file.json"
    ckpt.write_json(target, {"a": 1})

    def failing(tmp):
        with open(tmp, "w") as handle:
            handle.write("partial")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        writer.write_file(target, failing)
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["file.json"]


@pytest.mark.parametrize("name", [ckpt.MODEL, ckpt.OPTIMIZER])
def test_truncated_safetensors_raise_clear_errors_and_are_not_overwritten(tmp_path, name):
    run_dir, _, model_cfg, cfg = make_run(tmp_path)
    path = ckpt.checkpoint_dir(run_dir) / name
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    if name == ckpt.MODEL:
        with pytest.raises(ValueError, match="truncated or corrupt"):
            models.load(run_dir)
    with pytest.raises(ckpt.CheckpointError, match=rf"{name}.*truncated"):
        train(model_cfg, make_task("C2"), cfg, run_dir, resume=True, progress=False)
    assert path.read_bytes() == data[: len(data) // 2]


def test_truncated_config_raises_clear_errors(tmp_path):
    run_dir, _, model_cfg, cfg = make_run(tmp_path)
    text = (run_dir / ckpt.CONFIG).read_text()
    (run_dir / ckpt.CONFIG).write_text(text[: len(text) // 2])
    with pytest.raises(ValueError, match="not valid JSON"):
        models.load(run_dir)
    with pytest.raises(ckpt.CheckpointError, match="config.json is not valid JSON"):
        train(model_cfg, make_task("C2"), cfg, run_dir, resume=True, progress=False)
    assert (run_dir / ckpt.CONFIG).read_text() == text[: len(text) // 2]


def test_checkpoint_files_from_different_steps_are_rejected(tmp_path):
    run_dir, _, model_cfg, cfg = make_run(tmp_path)
    model = models.build(model_cfg)
    optimizer = make_optimizer(model, cfg)
    ckpt.load_checkpoint(run_dir, model, optimizer)
    # a checkpoint edited by hand: an optimizer file of step 7 next to the model and state of step 6
    directory = ckpt.checkpoint_dir(run_dir)
    tensors, _ = ckpt.flatten_optimizer(optimizer)
    ckpt.save_file(tensors, str(directory / ckpt.OPTIMIZER), metadata={"step": "7"})
    state = json.loads((directory / ckpt.STATE).read_text())
    state["files"][ckpt.OPTIMIZER] = (directory / ckpt.OPTIMIZER).stat().st_size
    (directory / ckpt.STATE).write_text(json.dumps(state))
    with pytest.raises(ckpt.CheckpointError, match="from step 7 but trainer_state.json is from step 6"):
        ckpt.load_checkpoint(run_dir, models.build(model_cfg), make_optimizer(models.build(model_cfg), cfg))


def test_missing_checkpoint_file_is_reported(tmp_path):
    run_dir, _, model_cfg, cfg = make_run(tmp_path)
    (ckpt.checkpoint_dir(run_dir) / ckpt.OPTIMIZER).unlink()
    with pytest.raises(ckpt.CheckpointError, match="has no optimizer.safetensors"):
        train(model_cfg, make_task("C2"), cfg, run_dir, resume=True, progress=False)


def test_config_differences_lists_changed_entries():
    old = {"model": {"d_model": 8}, "task": {"name": "C2"}, "train": {"lr": 0.1}, "seed": 0,
           "versions": {"torch": "1"}}
    new = {"model": {"d_model": 8}, "task": {"name": "S3"}, "train": {"lr": 0.1}, "seed": 1,
           "versions": {"torch": "2"}}
    assert ckpt.config_differences(old, new) == ["task.name: 'C2' != 'S3'", "seed: 0 != 1"]


def test_a_run_made_before_a_field_existed_resumes_where_the_field_has_its_default(tmp_path):
    """config.json of an older run lacks fields added since (at their defaults): it is reused, while a
    missing field the new config sets to a non-default value is still a difference."""
    run_dir, result, model_cfg, cfg = make_run(tmp_path)
    config = json.loads((run_dir / ckpt.CONFIG).read_text())
    for section, key in (("model", "mlp_activation"), ("train", "val_threshold")):
        del config[section][key]
    (run_dir / ckpt.CONFIG).write_text(json.dumps(config))
    again = train(model_cfg, make_task("C2"), cfg, run_dir, resume=True, progress=False)
    assert again.step == result.step
    assert ckpt.config_differences({"model": {}}, {"model": {"mlp_activation": "relu"}},
                                   {"model": {"mlp_activation": "gelu"}}) == ["model.mlp_activation: '<absent>' != 'relu'"]
    assert ckpt.config_differences({"model": {"mlp_activation": "gelu"}}, {"model": {}},
                                   {"model": {"mlp_activation": "gelu"}})      # removed from the new config
    with pytest.raises(ckpt.CheckpointError, match="val_threshold"):
        train(model_cfg, make_task("C2"), TrainConfig(**{**cfg.to_dict(), "val_threshold": 0.5}), run_dir,
              resume=True, progress=False)


def test_bad_metrics_line_is_reported(tmp_path):
    (tmp_path / ckpt.METRICS).write_text('{"step": 1}\n{"step": 2\n')
    with pytest.raises(ckpt.CheckpointError, match="line 2 is not valid JSON"):
        ckpt.read_metrics(tmp_path)


def test_a_checkpoint_interrupted_midway_leaves_the_previous_one_whole(tmp_path, monkeypatch):
    """Issue 13 items 1 and 2: dying after the optimizer file of step 6 was written (before the
    trainer state) used to leave an unresumable run and lose the interval's metrics; now the
    step-3 checkpoint is whole, and resuming gives the uninterrupted run's weights and records."""
    _, whole, model_cfg, cfg = make_run(tmp_path)
    real = writer.write_file

    def dying(path, fill, durable=True):
        path = Path(path)
        if path.name == ckpt.STATE and path.parent.name == "step-000000006":
            raise KeyboardInterrupt  # the process dies here
        return real(path, fill, durable)

    monkeypatch.setattr(writer, "write_file", dying)
    with pytest.raises(KeyboardInterrupt):
        train(model_cfg, make_task("C2"), cfg, tmp_path / "crashed", progress=False)
    monkeypatch.setattr(writer, "write_file", real)
    assert ckpt.read_pointer(tmp_path / "crashed")["step"] == 3
    resumed = train(model_cfg, make_task("C2"), cfg, tmp_path / "crashed", resume=True, progress=False)
    for key, value in whole.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[key], value), key
    strip = lambda records: [{k: v for k, v in r.items() if k != "time"} for r in records]  # noqa: E731
    assert strip(ckpt.read_metrics(tmp_path / "crashed")) == strip(ckpt.read_metrics(tmp_path / "run"))
    assert len(ckpt.read_metrics(tmp_path / "crashed")) == len(whole.metrics)
    assert sorted(p.name for p in (tmp_path / "crashed" / ckpt.CHECKPOINTS).iterdir()) == ["step-000000006"]


def test_metrics_beyond_the_checkpoint_are_truncated_on_resume(tmp_path):
    run_dir, whole, model_cfg, cfg = make_run(tmp_path)
    with open(run_dir / ckpt.METRICS, "a") as handle:
        handle.write('{"kind": "train", "step": 7}\n{"kind": "tr')  # written after the last checkpoint
    assert len(ckpt.read_metrics(run_dir)) == len(whole.metrics) + 1  # the cut line is no record
    log, records = ckpt.open_metrics(run_dir, keep=json.loads(
        (ckpt.checkpoint_dir(run_dir) / ckpt.STATE).read_text())["metrics"])
    log.close()
    assert records == whole.metrics == ckpt.read_metrics(run_dir)


def test_a_run_of_the_older_flat_layout_is_refused_clearly(tmp_path):
    run_dir, _, model_cfg, cfg = make_run(tmp_path)
    directory = ckpt.checkpoint_dir(run_dir)
    for name in (ckpt.MODEL, ckpt.OPTIMIZER, ckpt.STATE):
        (directory / name).rename(run_dir / name)
    (run_dir / ckpt.POINTER).unlink()
    with pytest.raises(ckpt.CheckpointError, match="older version"):
        train(model_cfg, make_task("C2"), cfg, run_dir, resume=True, progress=False)


def _edit_model_config(run_dir, **changes):
    config = json.loads((run_dir / ckpt.CONFIG).read_text())
    config["model"].update(changes)
    (run_dir / ckpt.CONFIG).write_text(json.dumps(config))


def test_a_config_that_no_longer_matches_the_weights_is_named_as_such(tmp_path):
    """Issue 13 item 6: an edited d_model is a config / weights mismatch naming both files and a
    shape, not 'truncated or corrupt'; an unknown field names the config file."""
    run_dir, *_ = make_run(tmp_path, steps=3)
    _edit_model_config(run_dir, d_model=12)
    with pytest.raises(ValueError) as error:
        models.load(run_dir)
    message = str(error.value)
    assert "does not match the weights" in message and "truncated" not in message
    assert str(run_dir / ckpt.CONFIG) in message and "(the config makes" in message
    _edit_model_config(run_dir, d_model=8, d_modle=8)
    with pytest.raises(ValueError, match=r"config\.json.*unknown ModelConfig fields \['d_modle'\]"):
        models.load(run_dir)
