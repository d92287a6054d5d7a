"""Training: the loop learns, resuming is bit-identical, divergence stops cleanly, configs are checked."""

import math

import pytest
import torch

import models
from interp.training import checkpoint as ckpt
from interp.training import train as train_module
from interp.training.evaluate import evaluate_lengths
from interp.tasks import make_task
from interp.training.train import TrainConfig, TrainingDiverged, learning_rate, train


def parity():
    return make_task("C2", format="acot")


def tiny(name="tanh_rnn", **overrides):
    return models.preset_config(name, vocab_size=2, **{"d_model": 8, **overrides})


def small_cfg(**overrides):
    base = dict(steps=20, batch_size=8, lr=1e-2, warmup=3, train_length=12, eval_every=5, eval_size=16,
                log_every=3, checkpoint_every=100, seed=3)
    return TrainConfig(**{**base, **overrides})


def assert_same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def test_tiny_rnn_learns_parity_acot():
    task = parity()
    cfg = TrainConfig(steps=200, batch_size=32, lr=1e-2, warmup=10, train_length=20, curriculum=True,
                      eval_every=10, eval_size=64, seed=0)
    result = train(models.preset_config("tanh_rnn", vocab_size=2, d_model=16), task, cfg, progress=False)
    accuracy = evaluate_lengths(result.model, task, [20], n=512, seed=7).final_accuracy[20]
    assert accuracy >= 0.99
    train_records = [r for r in result.metrics if r["kind"] == "train"]
    assert train_records[-1]["loss"] < train_records[0]["loss"] / 10


@pytest.mark.parametrize("name,curriculum", [("tanh_rnn", True), ("mamba", False)])
def test_resume_is_bit_identical_to_uninterrupted(tmp_path, name, curriculum):
    task = parity()
    cfg = small_cfg(curriculum=curriculum, curriculum_patience=1, curriculum_threshold=0.5,
                    train_length=8 if name == "mamba" else 12)
    model_cfg = tiny(name, d_state=2, n_layers=1) if name == "mamba" else tiny(name)
    whole = train(model_cfg, task, cfg, tmp_path / "whole", progress=False)
    half = train(model_cfg, task, cfg, tmp_path / "split", stop_at=9, progress=False)
    assert half.step == 9
    resumed = train(model_cfg, task, cfg, tmp_path / "split", resume=True, progress=False)
    assert resumed.step == whole.step == 20
    assert_same_state(resumed.model, whole.model)
    assert_same_state(models.load(tmp_path / "split"), models.load(tmp_path / "whole"))
    opt_whole = ckpt.load_file(str(ckpt.checkpoint_dir(tmp_path / "whole") / ckpt.OPTIMIZER))
    opt_split = ckpt.load_file(str(ckpt.checkpoint_dir(tmp_path / "split") / ckpt.OPTIMIZER))
    assert opt_whole.keys() == opt_split.keys()
    for key in opt_whole:
        assert torch.equal(opt_whole[key], opt_split[key]), key
    strip = lambda records: [{k: v for k, v in r.items() if k != "time"} for r in records]  # noqa: E731
    assert strip(ckpt.read_metrics(tmp_path / "split")) == strip(ckpt.read_metrics(tmp_path / "whole"))
    if curriculum:
        lengths = [r["length"] for r in whole.metrics if r["kind"] == "train"]
        assert lengths[0] == 2 and max(lengths) > 2


def test_finished_run_resumes_as_a_no_op(tmp_path):
    task, cfg = parity(), small_cfg(steps=6)
    first = train(tiny(), task, cfg, tmp_path / "run", progress=False)
    again = train(tiny(), task, cfg, tmp_path / "run", resume=True, progress=False)
    assert again.step == 6
    assert_same_state(again.model, first.model)


def test_existing_run_is_never_overwritten(tmp_path):
    task, cfg = parity(), small_cfg(steps=6)
    train(tiny(), task, cfg, tmp_path / "run", progress=False)
    weights = models.registry.weights_file(tmp_path / "run")
    before = weights.read_bytes()
    with pytest.raises(FileExistsError, match="resume"):
        train(tiny(), task, cfg, tmp_path / "run", progress=False)
    with pytest.raises(ckpt.CheckpointError, match=r"train\.lr: 0\.01 != 0\.02"):
        train(tiny(), task, small_cfg(steps=6, lr=2e-2), tmp_path / "run", resume=True, progress=False)
    with pytest.raises(ckpt.CheckpointError, match=r"model\.d_model: 8 != 16"):
        train(tiny(d_model=16), task, cfg, tmp_path / "run", resume=True, progress=False)
    assert weights.read_bytes() == before
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="non-empty directory"):
        train(tiny(), task, cfg, tmp_path / "other", progress=False)


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    task, cfg = parity(), small_cfg(steps=20, checkpoint_every=5)
    reference = train(tiny(), task, cfg, tmp_path / "reference", stop_at=10, progress=False)
    real_loss, calls = train_module.masked_loss, {"n": 0}

    def loss_turning_nan(logits, batch):
        calls["n"] += 1
        loss, accuracy = real_loss(logits, batch)
        return (loss * math.nan if calls["n"] == 13 else loss), accuracy

    monkeypatch.setattr(train_module, "masked_loss", loss_turning_nan)
    with pytest.raises(TrainingDiverged, match=r"loss is nan at step 13.*checkpoint \(step 10\) is intact"):
        train(tiny(), task, cfg, tmp_path / "run", progress=False)
    assert_same_state(models.load(tmp_path / "run"), reference.model)
    monkeypatch.setattr(train_module, "masked_loss", real_loss)
    resumed = train(tiny(), task, cfg, tmp_path / "run", resume=True, progress=False)
    assert resumed.step == 20


def test_learning_rate_schedule():
    cfg = TrainConfig(steps=110, warmup=10, lr=1.0)
    assert learning_rate(0, cfg) == pytest.approx(0.1)
    assert learning_rate(9, cfg) == pytest.approx(1.0)
    assert learning_rate(10, cfg) == pytest.approx(1.0)
    assert learning_rate(60, cfg) == pytest.approx(0.5)
    assert learning_rate(110, cfg) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("field,value,pattern", [
    ("steps", 0, "TrainConfig.steps must be a positive int; got 0"),
    ("lr", -1.0, "TrainConfig.lr must be a positive finite number; got -1.0"),
    ("lr", math.nan, "TrainConfig.lr"),
    ("warmup", 50, r"warmup \(50\) must be smaller than steps \(20\)"),
    ("curriculum_threshold", 1.5, "curriculum_threshold must be in"),
    ("curriculum_threshold", "0.9", "curriculum_threshold must be in .*; got '0.9'"),
    ("weight_decay", True, "weight_decay must be a non-negative number; got True"),
    ("device", "gpu0", "TrainConfig.device 'gpu0'"),
])
def test_train_config_validation(field, value, pattern):
    with pytest.raises(ValueError, match=pattern):
        TrainConfig(**{"steps": 20, "warmup": 5, field: value})


def test_train_config_round_trips_through_dict():
    cfg = small_cfg(curriculum=True)
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown TrainConfig fields"):
        TrainConfig.from_dict({"stepz": 3})


def test_vocab_too_small_for_task_is_rejected():
    with pytest.raises(ValueError, match="vocab_size"):
        train(models.preset_config("tanh_rnn", vocab_size=1, d_model=8), make_task("C2"), small_cfg(),
              progress=False)


@pytest.mark.parametrize("name, rates", [("mamba", ["A_log"]), ("s4d", ["log_neg_re", "im"]), ("h3", ["log_neg_a"])])
def test_ssm_decay_rates_get_no_weight_decay(name, rates):
    model = models.build(name, vocab_size=5, d_model=8, n_layers=1)
    optimizer = train_module.make_optimizer(model, TrainConfig(weight_decay=0.1))
    decay_of = {id(p): group["weight_decay"] for group in optimizer.param_groups for p in group["params"]}
    mixer = model.blocks[0].mixer
    for rate in rates:
        assert decay_of[id(getattr(mixer, rate))] == 0.0, rate
    assert decay_of[id(model.embed.weight)] == 0.1  # matrices are still decayed
    assert len(decay_of) == len(list(model.parameters()))


def test_finished_run_is_extended_by_resuming_with_more_steps(tmp_path):
    """Issue 13 item 9: --resume --steps N (larger) continues a finished run; the rest must match."""
    task, cfg = parity(), small_cfg(steps=12, log_every=4, eval_every=4, checkpoint_every=4)
    first = train(tiny(), task, cfg, tmp_path / "run", progress=False)
    longer = small_cfg(steps=20, log_every=4, eval_every=4, checkpoint_every=4)
    with pytest.raises(ckpt.CheckpointError, match=r"train\.lr: 0\.01 != 0\.02"):
        train(tiny(), task, small_cfg(steps=20, lr=2e-2, log_every=4, eval_every=4, checkpoint_every=4),
              tmp_path / "run", resume=True, progress=False)
    with pytest.raises(FileExistsError, match="more steps to extend"):
        train(tiny(), task, longer, tmp_path / "run", progress=False)
    extended = train(tiny(), task, longer, tmp_path / "run", resume=True, progress=False)
    assert extended.step == 20
    config = ckpt.read_config(tmp_path / "run")
    assert config["train"]["steps"] == 20
    assert config["extensions"] == [{"at_step": 12, "from_steps": 12, "to_steps": 20}]
    records = ckpt.read_metrics(tmp_path / "run")
    assert records[: len(first.metrics)] == first.metrics  # history kept
    assert [r["step"] for r in records if r["kind"] == "train"] == [4, 8, 12, 16, 20]
    # the documented schedule: steps past the old end follow the cosine of the new total
    lrs = {r["step"]: r["lr"] for r in records if r["kind"] == "train"}
    assert lrs[16] == pytest.approx(learning_rate(15, longer)) and lrs[12] == pytest.approx(learning_rate(11, cfg))
    # an extension interrupted and resumed equals one run straight through (bit for bit)
    train(tiny(), task, cfg, tmp_path / "split", progress=False)
    train(tiny(), task, longer, tmp_path / "split", resume=True, stop_at=17, progress=False)
    resumed = train(tiny(), task, longer, tmp_path / "split", resume=True, progress=False)
    assert_same_state(resumed.model, extended.model)
    with pytest.raises(ckpt.CheckpointError, match=r"extended but not shortened \(steps 12 < 20\)"):
        train(tiny(), task, cfg, tmp_path / "run", resume=True, progress=False)


def test_unavailable_device_is_one_line_naming_the_available_ones():
    """Issue 13 item 3: CUDA on a CPU-only torch (or a bad string) names the available devices."""
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(ValueError, match=r"TrainConfig.device 'cuda' is not available .*; available: cpu$"):
        TrainConfig(device="cuda")
    with pytest.raises(ValueError, match=r"TrainConfig.device 'gpu' is not a torch device; available: cpu$"):
        TrainConfig(device="gpu")
    with pytest.raises(ValueError, match=r"device 'cuda:0' is not available"):
        models.load("/nonexistent", device="cuda:0")
