"""from_pretrained(Mamba2ForCausalLM): parity (tiny random configs, every parameter jittered,
T beyond both scans' chunks), causal state patches on the imported model, round trip, errors."""

import importlib
import math
from pathlib import Path

import pytest
import torch

import models
from models.interop import UnsupportedConfig
from tests.interop_parity import VOCAB, assert_causal_state_patch, assert_parity, assert_round_trip, jitter

tf = pytest.importorskip("transformers")
T = 80  # > our diag_scan chunk 64 and the source's chunk_size 16 below
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def tokens(batch=2, length=T, seed=1):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def mamba2_source(**overrides):
    torch.manual_seed(0)
    fields = dict(vocab_size=VOCAB, hidden_size=16, num_heads=4, head_dim=8, state_size=4, n_groups=2, expand=2,
                  conv_kernel=3, num_hidden_layers=2, chunk_size=16, pad_token_id=0, bos_token_id=0, eos_token_id=0,
                  use_bias=True)
    config = tf.Mamba2Config(**{**fields, **overrides})
    return jitter(tf.Mamba2ForCausalLM(config))


@pytest.mark.parametrize("overrides", [
    {},
    dict(use_bias=False, use_conv_bias=False, n_groups=1, tie_word_embeddings=True, layer_norm_epsilon=1e-3),
    dict(n_groups=4, time_step_limit=(0.05, 0.08)),
])
def test_parity_in_float32(overrides):
    source = mamba2_source(**overrides)
    model = models.from_pretrained(source)
    assert model.cfg.mixer == "mamba2" and model.blocks[0].mixer.groups == source.config.n_groups
    assert_parity(source, model, tokens(), atol=1e-4)


def test_time_step_limit_default_is_no_clamp_and_a_limit_clamps():
    assert models.from_pretrained(mamba2_source()).cfg.mixer_options["dt_limit"] is None
    limited = models.from_pretrained(mamba2_source(time_step_limit=(0.05, 0.08)))
    assert limited.cfg.mixer_options["dt_limit"] == [0.05, 0.08]  # a list: the config round-trips through JSON
    _, cache = limited.run_with_cache(tokens(), names=["blocks.0.mixer.hook_dt"])
    dt = cache["blocks.0.mixer.hook_dt"]  # both bounds bind somewhere for this source
    assert math.isclose(dt.min().item(), 0.05, rel_tol=1e-6) and math.isclose(dt.max().item(), 0.08, rel_tol=1e-6)


def test_state_patch_propagates_causally_on_the_import():
    model = models.from_pretrained(mamba2_source())
    assert_causal_state_patch(model, tokens(), "blocks.0.mixer.hook_state", 30, (4, 8, 4))  # [H, P, N]


@pytest.mark.parametrize("overrides", [{}, dict(time_step_limit=(0.05, 0.08))])
def test_round_trip_is_bit_identical(overrides, tmp_path):
    assert_round_trip(models.from_pretrained(mamba2_source(**overrides)), tmp_path / "run", tokens())


def test_from_a_checkpoint_directory(tmp_path):
    source = mamba2_source()
    source.save_pretrained(tmp_path / "ckpt")
    model = models.from_pretrained(tmp_path / "ckpt")
    with torch.no_grad():
        torch.testing.assert_close(model(tokens()), source(tokens()).logits, atol=1e-4, rtol=0)


def test_config_we_cannot_represent_raises():
    with pytest.raises(UnsupportedConfig, match="hidden_act='gelu'"):
        models.from_pretrained(mamba2_source(hidden_act="gelu"))


def test_float32_error_against_float64_is_no_worse_than_the_sources(monkeypatch):
    """At Mamba-2 130M's widths (2 of its 24 layers): our float64 import is the source's float64
    math (its float32 casts made float64, benchmarks/float32_gap.py), and our float32 logits are
    as close to it as transformers' own float32 run (the 130M gap of ~3e-4 between the two float32
    runs is both sides' rounding: each ~3.5e-5 of the logits' scale, benchmarks/RESULTS.md)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    gap, real_configs = importlib.import_module("float32_gap"), importlib.import_module("real_configs")
    config = real_configs.source_config("mamba2")
    config.num_hidden_layers, config.vocab_size = 2, 512

    def build(dtype):
        torch.manual_seed(0)
        return tf.Mamba2ForCausalLM(config).to(dtype).eval()

    ids = torch.randint(0, 512, (1, 128), generator=torch.Generator().manual_seed(0))  # > our scan chunk 64
    errors = gap.errors(build(torch.float32), build, ids)
    assert errors["reference_agreement"] < 1e-12
    assert 0 < errors["ours"] <= 1.5 * errors["transformers"]
