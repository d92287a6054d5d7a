"""Finite training sets: exact distinct counts, disjoint validation, epochs, shares, caps; training
on them converges and stops early, resumes bit for bit, and still stops on NaN."""

import math
import warnings

import numpy as np
import pytest
import torch

import models
from interp.tasks import make_task
from interp.training import checkpoint as ckpt
from interp.training import train as train_module
from interp.training.data import FiniteData, capacity, equal_shares, n_distinct
from interp.training.train import TrainConfig, TrainingDiverged, train


def rows(batch):
    return {bytes(r.numpy().tobytes()) for r in batch.tokens}


@pytest.mark.parametrize("fmt", ["outcome", "cot"])
def test_training_set_has_n_distinct_sequences_disjoint_from_validation(fmt):
    data = FiniteData.build(make_task("S3", format=fmt), [5], n_train=300, n_val=120, seed=4)
    assert data.n_train == 300 and data.n_val == 120
    assert len(rows(data.train)) == 300 and len(rows(data.val)) == 120
    assert not rows(data.train) & rows(data.val)
    # the rows are real task sequences: targets are the running products of the inputs
    task = make_task("S3", format="outcome")
    x = data.train.tokens[:, :5].numpy()
    from interp.tasks import running_product
    assert np.array_equal(running_product(task.group.table, x)[:, -1], data.train.targets[:, -1 if fmt == "outcome" else 9].numpy())


def test_training_sets_are_nested_and_validation_does_not_depend_on_n():
    task = make_task("Z5", format="acot")
    small = FiniteData.build(task, [6], 100, 64, seed=1)
    large = FiniteData.build(task, [6], 400, 64, seed=1)
    assert rows(small.train) < rows(large.train)
    assert torch.equal(small.val.tokens, large.val.tokens)
    other = FiniteData.build(task, [6], 100, 64, seed=2)
    assert rows(other.train) != rows(small.train)


@pytest.mark.parametrize("n,batch_size", [(37, 8), (16, 16), (5, 12)])
def test_every_epoch_visits_each_sequence_once(n, batch_size):
    data = FiniteData.build(make_task("S3", format="acot"), [4], n, 20, seed=0)
    steps = math.ceil(3 * n / batch_size) + 1
    stream = np.concatenate([data.indices(s, batch_size, order_seed=7) for s in range(steps)])
    for epoch in range(3):
        assert sorted(stream[epoch * n:(epoch + 1) * n]) == list(range(n))
    assert not np.array_equal(stream[:n], stream[n:2 * n]) or n < 3   # reshuffled per epoch
    batch = data.batch(2, batch_size, order_seed=7)
    assert torch.equal(batch.tokens, data.train.tokens[torch.from_numpy(data.indices(2, batch_size, 7))])


def test_equal_shares_water_fill():
    assert equal_shares(100, [None] * 4) == [25, 25, 25, 25]
    assert equal_shares(10, [None] * 3) == [4, 3, 3]
    assert equal_shares(100, [10, None, None, None]) == [10, 30, 30, 30]
    assert equal_shares(100, [10, 20, None]) == [10, 20, 70]
    assert equal_shares(100, [10, 20, 30]) == [10, 20, 30]   # all capped: less than asked
    for total, caps in [(57, [3, None, 8, None]), (9, [1, 1, 1, 100])]:
        shares = equal_shares(total, caps)
        assert sum(shares) == total and all(c is None or s <= c for s, c in zip(shares, caps))


def test_joint_data_set_has_equal_length_shares():
    task = make_task("Z7", format="acot")            # 49 sequences of length 2: no cap at these sizes
    data = FiniteData.build(task, [2, 3, 4, 5], n_train=80, n_val=40, seed=0)
    assert data.summary()["train_by_length"] == {"2": 20, "3": 20, "4": 20, "5": 20}
    assert data.summary()["val_by_length"] == {"2": 10, "3": 10, "4": 10, "5": 10}
    assert data.train.tokens.shape == (80, 5)
    short = data.train_lengths == 2
    assert not data.train.loss_mask[short][:, 2:].any() and data.train.loss_mask[short][:, :2].all()
    for n in (2, 3, 4, 5):   # distinct within each length, disjoint from validation
        tr = {r[:n].numpy().tobytes() for r in data.train.tokens[data.train_lengths == n]}
        va = {r[:n].numpy().tobytes() for r in data.val.tokens[data.val_lengths == n]}
        assert len(tr) == 20 and not tr & va


def test_a_finite_pool_caps_with_a_warning_and_spreads_the_rest():
    task = make_task("Z5", format="outcome")
    assert n_distinct(task, 2) == 25 and n_distinct(make_task("AR"), 2) is None
    with pytest.warns(UserWarning, match=r"length 2 of task 'Z5' has only 25 distinct sequences"):
        data = FiniteData.build(task, [2, 3], n_train=60, n_val=30, seed=0)
    summary = data.summary()
    assert summary["val_by_length"] == {"2": 12, "3": 18}              # 25 // 2 = 12 at length 2
    assert summary["train_by_length"] == {"2": 13, "3": 47}            # the rest of 25; 60 - 13 at 3
    assert summary["capped"]["2"] == {"train": [30, 13], "val": [15, 12]}
    assert capacity(task, [2, 3], 30) == 13 + (125 - 18)
    with pytest.warns(UserWarning, match="has room for only 13 training sequences"):
        alone = FiniteData.build(task, [2], n_train=100, n_val=30, seed=0)
    assert alone.n_train == 13 and len(rows(alone.train) | rows(alone.val)) == 25


def tiny_cfg(**overrides):
    base = dict(steps=40, batch_size=8, lr=1e-2, warmup=3, train_length=4, eval_every=5, log_every=5,
                checkpoint_every=100, seed=3, dataset_size=24, val_size=16)
    return TrainConfig(**{**base, **overrides})


def lstm():
    return models.preset_config("lstm", vocab_size=3, d_model=8)


def test_finite_training_resumes_bit_identically(tmp_path):
    task = make_task("Z3", format="acot")
    cfg = tiny_cfg(lengths=[2, 3, 4], val_threshold=1e-6)
    whole = train(lstm(), task, cfg, tmp_path / "whole", progress=False)
    train(lstm(), task, cfg, tmp_path / "split", stop_at=13, progress=False)
    resumed = train(lstm(), task, cfg, tmp_path / "split", resume=True, progress=False)
    assert resumed.step == whole.step == 40
    for key, value in whole.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key
    strip = lambda records: [{k: v for k, v in r.items() if k != "time"} for r in records]  # noqa: E731
    assert strip(ckpt.read_metrics(tmp_path / "split")) == strip(ckpt.read_metrics(tmp_path / "whole"))
    assert whole.extra["converged_step"] is None and whole.extra["n_train"] == 24


def test_convergence_stops_early_and_is_recorded(tmp_path):
    """A threshold between the losses of a full run stops a second run at exactly the first
    evaluation below it (runs are deterministic, so the trajectories agree up to there)."""
    task = make_task("Z3", format="acot")
    cfg = tiny_cfg(steps=60, lengths=[4], val_threshold=1e-9)
    full = [r for r in train(lstm(), task, cfg, progress=False).metrics if r["kind"] == "val"]
    losses = [r["loss"] for r in full]
    k = next(i for i in range(len(losses) // 2, len(losses)) if losses[i] < min(losses[:i]))
    threshold = (losses[k] + min(losses[:k])) / 2
    stopped = train(lstm(), task, tiny_cfg(steps=60, lengths=[4], val_threshold=threshold), tmp_path / "run",
                    progress=False)
    step = stopped.extra["converged_step"]
    assert step == full[k]["step"] == stopped.step and step < 60
    val = [r for r in stopped.metrics if r["kind"] == "val"]
    assert [r["converged"] for r in val] == [False] * k + [True]
    again = train(lstm(), task, tiny_cfg(steps=60, lengths=[4], val_threshold=threshold), tmp_path / "run",
                  resume=True, progress=False)   # a converged run resumes as a no-op
    assert again.step == step and again.extra["converged_step"] == step


def test_max_epochs_bounds_the_steps():
    cfg = tiny_cfg(steps=100, dataset_size=20, max_epochs=2, batch_size=8)
    result = train(lstm(), make_task("Z3", format="acot"), cfg, progress=False)
    assert result.step == math.ceil(2 * 20 / 8)


def test_nan_still_stops_finite_training(tmp_path, monkeypatch):
    calls = {"n": 0}
    original = train_module.masked_loss

    def loss_turning_nan(logits, batch):
        calls["n"] += 1
        loss, accuracy = original(logits, batch)
        return (loss * math.nan if calls["n"] == 7 else loss), accuracy

    monkeypatch.setattr(train_module, "masked_loss", loss_turning_nan)
    with pytest.raises(TrainingDiverged, match=r"loss is nan at step 7.*checkpoint \(step 5\) is intact"):
        train(lstm(), make_task("Z3", format="acot"), tiny_cfg(checkpoint_every=5), tmp_path / "run", progress=False)


@pytest.mark.parametrize("field,value,message", [
    ("dataset_size", 0, "TrainConfig.dataset_size"),
    ("val_size", 0, "TrainConfig.val_size"),
    ("val_threshold", 0.0, "TrainConfig.val_threshold"),
    ("val_threshold", -1.0, "TrainConfig.val_threshold"),
    ("max_epochs", 0, "TrainConfig.max_epochs"),
    ("lengths", [], "TrainConfig.lengths"),
    ("curriculum", True, "curriculum cannot be combined"),
])
def test_bad_finite_configs_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        tiny_cfg(**{field: value})
    with pytest.raises(ValueError, match="need finite data"):
        TrainConfig(steps=10, warmup=1, lengths=[2, 3])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert TrainConfig(steps=10, warmup=1, dataset_size=5, lengths=[3, 2, 3]).lengths == [2, 3]
