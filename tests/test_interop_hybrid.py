"""from_pretrained on the Mamba-2 hybrids (tiny random transformers configs, every parameter
jittered): logits, every layer's output and input gradients against the source (<= 1e-4 float32,
fast and instrumented paths), every hook firing, causal state patches (against the source run
step by step from the patched state), decoding against the full forward and against HF generate,
resumed interventions, round trips, checkpoint directories, and refused configs."""

import math

import pytest
import torch

import models
from interp.analysis.interventions import corrupt_ar, interchange, site_grid
from models import StatePatch
from models.decoding import advance
from models.interop import UnsupportedConfig
from models.interop.reference import stepwise_logits
from tests.test_interventions import TASK, ar_batch
from tests.test_interventions import VOCAB as AR_VOCAB
from tests.interop_parity import VOCAB, assert_causal_state_patch, assert_parity, assert_round_trip, jitter

tf = pytest.importorskip("transformers")
T = 40  # > the sources' scan chunk 16
IDS = dict(pad_token_id=0, bos_token_id=0, eos_token_id=0)


def tokens(batch=2, length=T, seed=1):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def nemotron_h_source(**overrides):
    """mamba2, mlp, attention, mlp, mamba2: single-sublayer blocks."""
    torch.manual_seed(0)
    fields = dict(vocab_size=VOCAB, hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                  layers_block_type=["linear_attention", "mlp", "full_attention", "mlp", "linear_attention"],
                  intermediate_size=24, ssm_state_size=4, mamba_num_heads=4, mamba_head_dim=6, n_groups=2,
                  conv_kernel=3, chunk_size=16, **IDS)
    return jitter(tf.NemotronHForCausalLM(tf.NemotronHConfig(**{**fields, **overrides})))


# family -> (source, a Mamba-2 layer, its state shape [H, P, N])
FAMILIES = {"nemotron_h": (nemotron_h_source, 4, (4, 6, 4))}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def imported(request):
    make, layer, shape = FAMILIES[request.param]
    source = make()
    return request.param, source, models.from_pretrained(source), layer, shape


def test_parity_in_float32(imported):
    _, source, model, _, _ = imported
    assert_parity(source, model, tokens(), atol=1e-4)


def test_every_hook_fires_and_states_are_the_source_cache(imported):
    _, source, model, layer, _ = imported
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens())
        out = source(tokens(), use_cache=True)
    assert set(cache) == set(model.hook_names())
    torch.testing.assert_close(cache[f"blocks.{layer}.mixer.hook_state"][:, -1],
                               out.cache.get_recurrent_state(layer, state_idx=0), atol=1e-5, rtol=0)


def test_causal_state_patch_equals_the_source_continued_from_it(imported):
    _, source, model, layer, shape = imported
    t, hook = 9, f"blocks.{layer}.mixer.hook_state"
    assert_causal_state_patch(model, tokens(), hook, t, shape)
    donor = torch.randn(2, *shape, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours = model.run_with_hooks(tokens(), fwd_hooks=[(hook, StatePatch([0, 1], [t, t], values=donor))])
    reference = stepwise_logits(source, tokens(), {(layer, t): donor.clone()}, prefill=t + 1)
    torch.testing.assert_close(ours[:, t + 1:], reference[:, t + 1:], atol=1e-4, rtol=0)


def test_each_decoding_step_equals_the_full_forward(imported):
    _, _, model, _, _ = imported
    prompt = tokens(length=18)
    with torch.no_grad():
        logits, state = advance(model, prompt, all_logits=True)
        torch.testing.assert_close(logits, model(prompt), atol=1e-5, rtol=0)
        seq = prompt
        for _ in range(6):
            new = logits[:, -1].argmax(-1)[:, None] if logits.dim() == 3 else logits.argmax(-1)[:, None]
            seq = torch.cat([seq, new], dim=1)
            logits, state = advance(model, new, state)
            torch.testing.assert_close(logits, model(seq)[:, -1], atol=1e-5, rtol=0)


def test_greedy_tokens_equal_hf_generate(imported):
    _, source, model, _, _ = imported
    prompt = tokens(batch=3, length=20)[:, :] % (VOCAB - 1) + 1
    with torch.no_grad():
        expected = source.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20, do_sample=False,
                                   eos_token_id=None, pad_token_id=0, min_new_tokens=0)
    assert torch.equal(model.generate(prompt, 20, progress=False), expected)


def test_a_state_patch_while_decoding_equals_the_full_forward(imported):
    _, _, model, layer, shape = imported
    prompt = tokens(batch=3, length=12)
    patch = StatePatch([0, 2], [14, 14], deltas=torch.randn(2, *shape, generator=torch.Generator().manual_seed(7)) * 4)
    fwd_hooks = [(f"blocks.{layer}.mixer.hook_state", patch)]
    out, cache = model.generate(prompt, 8, fwd_hooks=fwd_hooks, cache_names=["hook_logits"], progress=False)
    full = model.run_with_hooks(out[:, :-1], fwd_hooks=fwd_hooks)
    torch.testing.assert_close(cache["hook_logits"], full, atol=1e-5, rtol=1e-5)
    assert (full[[0, 2], 14:] - model(out[:, :-1])[[0, 2], 14:]).abs().amax() > 1e-3


def test_interchange_resumed_equals_whole_passes(imported):
    name = imported[0]
    model = models.from_pretrained(FAMILIES[name][0](vocab_size=AR_VOCAB))
    clean = ar_batch(8, 4, seed=0)
    corrupt = corrupt_ar(clean, TASK, seed=1)
    sites = site_grid(model, ["blocks.{l}.hook_resid_pre", "blocks.{l}.hook_resid_mid"], ["key", "value"])
    resumed, whole = (interchange(model, clean, corrupt, sites, min_effect=0.0, resume=r) for r in (True, False))
    torch.testing.assert_close(resumed.p_patched, whole.p_patched, atol=1e-6, rtol=0)
    assert (whole.p_patched - whole.p_corrupt).abs().max() > 1e-4


def test_round_trip_and_checkpoint_directory(imported, tmp_path):
    name, source, model, _, _ = imported
    assert_round_trip(model, tmp_path / "run", tokens())
    source.save_pretrained(tmp_path / "ckpt")
    loaded = models.from_pretrained(tmp_path / "ckpt")
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens()), source(tokens()).logits, atol=1e-4, rtol=0)


def test_nemotron_h_layout_and_hook_names():
    model = models.from_pretrained(nemotron_h_source())
    assert model.cfg.mixers == ["mamba2", None, "attention", None, "mamba2"]
    assert model.cfg.mlps == [False, True, False, True, False]
    assert model.cfg.mixer_options["mamba2"]["dt_limit"] == [0.001, math.inf]
    names = set(model.hook_names())
    assert "blocks.1.mlp.hook_post" in names and "blocks.1.norm_mlp.hook_scale" in names
    assert not any(n.startswith(("blocks.1.mixer", "blocks.0.mlp", "blocks.2.mlp")) for n in names)
    assert {"blocks.1.hook_resid_pre", "blocks.1.hook_resid_mid", "blocks.1.hook_resid_post"} <= names
    _, cache = model.run_with_cache(tokens(), names=["blocks.1.hook_resid_pre", "blocks.1.hook_resid_mid",
                                                     "blocks.1.mlp.hook_pre", "blocks.1.mlp.hook_post"])
    assert torch.equal(cache["blocks.1.hook_resid_mid"], cache["blocks.1.hook_resid_pre"])
    torch.testing.assert_close(cache["blocks.1.mlp.hook_post"], cache["blocks.1.mlp.hook_pre"].relu().square())
    assert model.resume_hooks(0)["carry"] == ["blocks.0.mixer.hook_state", "blocks.4.mixer.hook_state"]


@pytest.mark.parametrize("make, message", [
    (lambda: nemotron_h_source(layers_block_type=["linear_attention", "moe"]), "layers_block_type=.*no 'moe'"),
    (lambda: nemotron_h_source(mlp_hidden_act="gelu"), "mlp_hidden_act='gelu'"),
])
def test_config_we_cannot_represent_raises(make, message):
    with pytest.raises(UnsupportedConfig, match=message):
        models.from_pretrained(make())
