"""Weights are checked against the sha256 recorded when they were written: a flipped bit inside
the tensor data of a run's checkpoint or of a saved model directory is one clear error from
models.load and from a resume (before: loaded silently). from_pretrained on a bad checkpoint
directory is a ValueError / FileNotFoundError naming the file (before: struct.error, MemoryError,
JSONDecodeError, KeyError, AttributeError)."""

import json
import os
import shutil

import pytest
import torch

import models
from interp.tasks import make_task
from interp.training import checkpoint as ckpt
from interp.training.train import TrainConfig, train

MODEL = models.preset_config("tanh_rnn", vocab_size=2, d_model=8)
CFG = TrainConfig(steps=2, batch_size=4, lr=1e-2, warmup=1, train_length=6, eval_every=2, eval_size=8, seed=5)


def flip_a_data_bit(path):
    """Flip one bit in the last tensor bytes of a safetensors file (the header stays valid)."""
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x04
    path.write_bytes(bytes(data))


def test_a_flipped_bit_in_a_run_checkpoint_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    train(MODEL, make_task("C2"), CFG, run_dir, progress=False)
    weights = ckpt.checkpoint_dir(run_dir) / ckpt.MODEL
    flip_a_data_bit(weights)
    with pytest.raises(ValueError, match=r"model.safetensors does not match the sha256 recorded in .*trainer_state.json"):
        models.load(run_dir)
    with pytest.raises(ckpt.CheckpointError, match="model.safetensors does not match the sha256"):
        train(MODEL, make_task("C2"), TrainConfig(**{**CFG.to_dict(), "steps": 3}), run_dir, resume=True,
              progress=False)
    flip_a_data_bit(weights)                                  # flipped back: loads again
    assert isinstance(models.load(run_dir), torch.nn.Module)


def test_a_flipped_bit_in_a_saved_model_directory_is_refused(tmp_path):
    model = models.build(MODEL)
    models.save(model, tmp_path / "saved")
    assert torch.equal(models.load(tmp_path / "saved").embed.weight, model.embed.weight)
    flip_a_data_bit(tmp_path / "saved" / "model.safetensors")
    with pytest.raises(ValueError, match=r"does not match the sha256 recorded in .*config.json"):
        models.load(tmp_path / "saved")


@pytest.fixture(scope="module")
def hf_directory(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    config = transformers.MambaConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1, state_size=4)
    path = tmp_path_factory.mktemp("hf") / "good"
    transformers.MambaForCausalLM(config).save_pretrained(path)
    return path


def _weights(d):
    return d / "model.safetensors"


def _shard(d, index):
    _weights(d).rename(d / "model-00001.safetensors")
    (d / "model.safetensors.index.json").write_text(json.dumps(index))


BAD = {
    "empty weights": (lambda d: _weights(d).write_bytes(b""), ValueError, "too short for a header"),
    "random weights": (lambda d: _weights(d).write_bytes(os.urandom(1000)), ValueError, "its header claims"),
    "cut header": (lambda d: _weights(d).write_bytes(_weights(d).read_bytes()[:100]), ValueError, "header claims"),
    "truncated data": (lambda d: _weights(d).write_bytes(_weights(d).read_bytes()[:-50]), ValueError,
                       "truncated or corrupt"),
    "config a list": (lambda d: (d / "config.json").write_text("[1]"), ValueError, "must hold a JSON object"),
    "index without weight_map": (lambda d: _shard(d, {}), ValueError, "is not a safetensors index"),
    "index naming a missing shard": (lambda d: _shard(d, {"weight_map": {"a": "model-00002.safetensors"}}),
                                     FileNotFoundError, "names the shard 'model-00002.safetensors'"),
    "index climbing out": (lambda d: _shard(d, {"weight_map": {"a": "../x.safetensors"}}), ValueError,
                           "only files inside"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_from_pretrained_on_a_bad_directory_names_the_problem(hf_directory, tmp_path, case):
    mutate, error, words = BAD[case]
    directory = tmp_path / "bad"
    shutil.copytree(hf_directory, directory)
    mutate(directory)
    with pytest.raises(error, match=words) as raised:
        models.from_pretrained(directory)
    assert str(directory) in str(raised.value)
