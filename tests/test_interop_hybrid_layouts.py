"""Block layouts the hybrid imports need (models.backbone.Block): MLP-only blocks (mixer None),
per-layer MLPs, a parallel mixer2 beside the mixer; their configs, hooks, decoding state and
resumed runs."""

import pytest
import torch

import models
from models.config import ModelConfig
from models.decoding import DecodingState
from models.decoding.step import advance

VOCAB = 11
LAYOUT = dict(mixer=["mamba2", None, "attention"], mixer2=["attention", None, None], mlp=[True, True, False],
              n_layers=3, vocab_size=VOCAB, d_model=16, n_heads=4, d_state=4, norm="rmsnorm", mlp_activation="relu2",
              mixer_options={"mamba2": {"n_heads": 2, "head_dim": 12}})


def model(**overrides):
    torch.manual_seed(0)
    return models.SequenceModel(ModelConfig(**{**LAYOUT, **overrides})).eval()


def tokens(length=12, seed=1):
    return torch.randint(0, VOCAB, (3, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("fields, error, message", [
    (dict(mixer=["mamba2", None], mlp=False, n_layers=2), ValueError, "layer 1 has neither a mixer nor an MLP"),
    (dict(mixer=["mamba2", None], mixer2=[None, "attention"], mlp=True, n_layers=2), ValueError, "no mixer"),
    (dict(mixer="mamba2", mlp=[True], n_layers=2), TypeError, "mlp must be a bool or a list of n_layers=2"),
    (dict(mixer="mamba2", mixer2=3, n_layers=2), TypeError, "mixer2 must be a name"),
    (dict(mixer="mamba2", mixer2="attention", mixer_options={"mamba": {}}), ValueError, "mixer_options of a hybrid"),
    (dict(mixer=["mamba2", None], mlp=True, shared_block=[None, 0], n_layers=2), ValueError, "a shared_block"),
    (dict(mixer="mamba2", shared_block=[True, None], n_layers=2), TypeError, "shared_block must be None or a list"),
    (dict(mixer="mamba2", shared_adapter_rank=-1), ValueError, "shared_adapter_rank must be an int >= 0"),
])
def test_bad_layouts_raise(fields, error, message):
    with pytest.raises(error, match=message):
        ModelConfig(**fields)


def test_layout_config_round_trips_and_builds_each_block():
    cfg = ModelConfig(**LAYOUT)
    assert ModelConfig.from_json(cfg.to_json()) == cfg
    m = model()
    assert [list(b.mixers) for b in m.blocks] == [["mixer", "mixer2"], [], ["mixer"]]
    assert m.blocks[0].mixer.heads == 2 and m.blocks[0].mixer.d_inner == 24  # mixer_options over cfg.n_heads
    assert [hasattr(b, "mlp") for b in m.blocks] == [True, True, False]
    names = set(m.hook_names())
    assert {"blocks.0.mixer2.hook_pattern", "blocks.0.mixer.hook_state", "blocks.1.mlp.hook_out"} <= names
    assert not any(n.startswith(("blocks.1.mixer", "blocks.1.norm_mixer", "blocks.2.mlp")) for n in names)


def test_parallel_mixers_sum_into_the_residual():
    m = model()
    _, cache = m.run_with_cache(tokens())
    torch.testing.assert_close(cache["blocks.0.hook_resid_mid"], cache["blocks.0.hook_resid_pre"]
                               + cache["blocks.0.mixer.hook_out"] + cache["blocks.0.mixer2.hook_out"])
    assert torch.equal(cache["blocks.1.hook_resid_mid"], cache["blocks.1.hook_resid_pre"])
    assert set(cache) == set(m.hook_names())


def test_decoding_carries_both_mixers_and_saves(tmp_path):
    m = model()
    seq = tokens()
    with torch.no_grad():
        logits, state = advance(m, seq[:, :7])
        assert {"state", "conv", "mixer2.keys", "mixer2.values"} <= set(state.layers[0]) and not state.layers[1]
        state.save(tmp_path / "state.safetensors")
        loaded = DecodingState.load(tmp_path / "state.safetensors")
        for t in range(7, seq.shape[1]):
            torch.testing.assert_close(logits, m(seq[:, :t])[:, -1], atol=1e-5, rtol=0)
            logits, state = advance(m, seq[:, t : t + 1], state)
        torch.testing.assert_close(advance(m, seq[:, 7:], loaded)[0], m(seq)[:, -1], atol=1e-5, rtol=0)
        assert loaded.batch == 3


def test_resume_from_a_parallel_block_equals_the_full_forward():
    m = model()
    seq = tokens()
    hooks = m.resume_hooks(0)
    assert hooks["carry"] == ["blocks.0.mixer.hook_state"]
    with torch.no_grad():
        full, cache = m.run_with_cache(seq, names=hooks["resid"] + hooks["carry"])
        for layer in range(3):
            resumed = m.resume_from(cache, torch.arange(3), layer, 5, seq.shape[1])
            torch.testing.assert_close(resumed, full[:, 5:], atol=1e-5, rtol=0)


SHARED = dict(mixer="mamba2", shared_block=[None, 0, 0], shared_adapter_rank=2, n_layers=3, vocab_size=VOCAB, d_model=16, n_heads=4,
              d_state=4, norm="rmsnorm", positional="rope", d_mlp=24, mlp_activation="geglu",
              mixer_options={"mamba2": {"n_heads": 2}, "attention": {"rope_base": 100.0}})


def test_a_shared_branch_feeds_the_mixer_input_only():
    m = model(**SHARED)
    assert not hasattr(m.blocks[0], "shared") and m.blocks[1].shared.attn.qkv.weight.shape[1] == 32
    _, cache = m.run_with_cache(tokens())
    assert set(cache) == set(m.hook_names())
    x, t = cache["blocks.1.hook_resid_pre"], cache["blocks.1.shared.hook_out"]
    assert t.shape == x.shape
    normed = (x + t) * (x + t).square().mean(-1, keepdim=True).add(torch.finfo(x.dtype).eps).rsqrt()
    torch.testing.assert_close(cache["blocks.1.mixer.hook_in"], normed * m.blocks[1].norm_mixer.weight)
    torch.testing.assert_close(cache["blocks.1.hook_resid_mid"], x + cache["blocks.1.mixer.hook_out"])
    with pytest.raises(ValueError, match="embed="):
        m.blocks[1](x)


def test_shared_branches_decode_and_resume_like_the_full_forward():
    m = model(**SHARED)
    seq = tokens()
    with torch.no_grad():
        full = m(seq)
        logits, state = advance(m, seq[:, :6])
        assert {"shared.attn.keys", "shared.attn.values", "state", "conv"} <= set(state.layers[1])
        for t in range(6, seq.shape[1]):
            torch.testing.assert_close(logits, full[:, t - 1], atol=1e-5, rtol=0)
            logits, state = advance(m, seq[:, t : t + 1], state)
        hooks = m.resume_hooks(1)
        assert hooks["resid"][0] == "hook_embed"
        _, cache = m.run_with_cache(seq, names=hooks["resid"] + hooks["carry"])
        for layer in (1, 2):
            torch.testing.assert_close(m.resume_from(cache, torch.arange(3), layer, 5, seq.shape[1]), full[:, 5:],
                                       atol=1e-5, rtol=0)


def test_depths_of_one_shared_block_share_its_weights_and_round_trip(tmp_path):
    m = model(**SHARED)
    one, two = m.blocks[1].shared, m.blocks[2].shared
    assert one.attn.qkv.weight is two.attn.qkv.weight and one.norm_attn.weight is two.norm_attn.weight
    assert one.mlp.gate.lora_a is not two.mlp.gate.lora_a and one.proj.weight is not two.proj.weight
    names = {n for n, _ in m.named_parameters()}
    assert "blocks.1.shared.attn.qkv.weight" in names and "blocks.2.shared.attn.qkv.weight" not in names
    seq = tokens()
    _, before = m.run_with_cache(seq, names=["blocks.2.shared.hook_out"])
    with torch.no_grad():
        one.mlp.down.weight.mul_(2.0)  # an edit of the shared block reaches its other depth
    _, after = m.run_with_cache(seq, names=["blocks.2.shared.hook_out"])
    assert not torch.allclose(before["blocks.2.shared.hook_out"], after["blocks.2.shared.hook_out"])
    m.save(tmp_path / "run")
    loaded = models.load(tmp_path / "run")
    assert loaded.blocks[1].shared.attn.qkv.weight is loaded.blocks[2].shared.attn.qkv.weight
    with torch.no_grad():
        assert torch.equal(loaded(seq), m(seq))


def test_interventions_resume_a_recurrent_mixer2_from_its_own_state():
    """A recurrent mixer2 (beside attention) carries its state through resumed interventions."""
    from interp.analysis.interventions import corrupt_ar, interchange, site_grid
    from tests.test_interventions import TASK, ar_batch
    from tests.test_interventions import VOCAB as AR_VOCAB

    m = model(mixer=["attention", "mamba2", "attention"], mixer2=["mamba2", None, "mamba2"], vocab_size=AR_VOCAB)
    assert m.resume_hooks(0)["carry"] == ["blocks.0.mixer2.hook_state", "blocks.1.mixer.hook_state",
                                          "blocks.2.mixer2.hook_state"]
    clean = ar_batch(8, 4, seed=0)
    corrupt = corrupt_ar(clean, TASK, seed=1)
    sites = site_grid(m, ["blocks.{l}.hook_resid_pre", "blocks.0.mixer2.hook_state"], ["key", "value"])
    resumed, whole = (interchange(m, clean, corrupt, sites, min_effect=0.0, resume=r) for r in (True, False))
    torch.testing.assert_close(resumed.p_patched, whole.p_patched, atol=1e-6, rtol=0)
    assert (whole.p_patched - whole.p_corrupt).abs().max() > 1e-4
