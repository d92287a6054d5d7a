"""Cache analyses with TransformerLens' names: decompositions sum to the residual, direct logit
attributions sum to the logit, per-head results to the mixer output, the shorthand, the lens."""

import pytest
import torch

import models
from models import Cache

VOCAB, B, T = 9, 3, 8


def model64(name: str, **overrides) -> models.SequenceModel:
    torch.manual_seed(0)
    cfg = dict(vocab_size=VOCAB, d_model=16, n_heads=2, d_state=4, n_layers=2)
    return models.build(name, **{**cfg, **overrides}).double()


@pytest.fixture
def tokens():
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize("name", ["transformer", "mamba", "deltanet", "mamba2"])
def test_decomposition_sums_to_the_residual_and_dla_to_the_logit(name, tokens):
    model = model64(name, mlp=True)
    logits, cache = model.run_with_cache(tokens)
    final = cache["blocks.1.hook_resid_post"]
    parts, labels = cache.decompose_resid(return_labels=True)
    kind, embeds = ("attn", ["embed", "pos_embed"]) if name == "transformer" else ("mixer", ["embed"])
    assert labels == embeds + [f"0_{kind}_out", "0_mlp_out", f"1_{kind}_out", "1_mlp_out"]
    torch.testing.assert_close(parts.sum(0), final, atol=1e-12, rtol=0)
    torch.testing.assert_close(cache.decompose_resid(layer=1).sum(0), cache["resid_pre", 1], atol=1e-12, rtol=0)
    full, full_labels = cache.get_full_resid_decomposition(return_labels=True)
    torch.testing.assert_close(full.sum(0), final, atol=1e-12, rtol=0)
    assert len(full_labels) == full.shape[0]
    # direct logit attribution: the components through the final norm (its cached scale and, with
    # gain=True, its gain) sum to the logit minus the norm bias's logit
    target = tokens[:, -1]
    dla = cache.logit_attrs(cache.decompose_resid(), target, gain=True)  # [C, B, T]
    norm = model.norm_final
    bias_logit = model.unembed(norm.bias)[target] if getattr(norm, "bias", None) is not None else 0.0
    expected = logits.gather(-1, target[:, None, None].expand(B, T, 1))[..., 0] - (bias_logit[:, None] if torch.is_tensor(bias_logit) else 0.0)
    torch.testing.assert_close(dla.sum(0), expected, atol=1e-10, rtol=0)
    diff = cache.logit_attrs(cache.decompose_resid(), target, incorrect_tokens=0, gain=True)
    torch.testing.assert_close(diff, dla - cache.logit_attrs(cache.decompose_resid(), 0, gain=True))
    torch.testing.assert_close(dla, cache.logit_attrs(cache.decompose_resid(apply_ln=True, gain=True), target,
                                                      apply_ln=False))


@pytest.mark.parametrize("name, options, heads", [
    ("transformer", {}, 2), ("deltanet", {}, 2), ("mamba2", {}, 2), ("gated_deltanet", {}, 2),
    ("gated_deltanet", {"num_v_heads": 4}, 4)])  # GVA: a result per value head
def test_per_head_results_sum_to_the_mixer_output(name, options, heads, tokens):
    model = model64(name, mixer_options=options)
    _, cache = model.run_with_cache(tokens)
    for layer in range(2):
        mixer = model.blocks[layer].mixer
        result = cache["result", layer]  # [B, T, H, D]
        assert result.shape == (B, T, heads, 16)
        proj = mixer.o_proj if name == "gated_deltanet" else mixer.out_proj
        bias = proj.bias if proj.bias is not None else 0.0
        torch.testing.assert_close(result.sum(2) + bias, cache[f"blocks.{layer}.mixer.hook_out"],
                                   atol=1e-12, rtol=0)
    stack, labels = cache.stack_head_results(return_labels=True, incl_remainder=True)
    assert labels[:heads] == [f"L0H{h}" for h in range(heads)] and labels[-1] == "remainder"
    torch.testing.assert_close(stack.sum(0), cache["blocks.1.hook_resid_post"], atol=1e-12, rtol=0)
    # reading hook_result leaves the outputs as they were without it
    with torch.no_grad():
        torch.testing.assert_close(model.run_with_cache(tokens, names=["hook_logits"])[0], model(tokens), atol=1e-12, rtol=0)


def test_attention_scores_pattern_and_z(tokens):
    model = model64("transformer")
    _, cache = model.run_with_cache(tokens)
    scores, pattern, z, v = cache["attn_scores", 0], cache["pattern", 0], cache["z", 0], cache["v", 0]
    torch.testing.assert_close(scores.softmax(-1), pattern)
    assert torch.isinf(scores[0, 0, 0, 1]) and scores[0, 0, 1, 0].isfinite()
    torch.testing.assert_close(z, torch.einsum("bhst,bthd->bshd", pattern, v))


def test_neurons_and_norm_scales(tokens):
    model = model64("transformer")
    _, cache = model.run_with_cache(tokens)
    mlp = model.blocks[0].mlp
    torch.testing.assert_close(cache["post", 0], torch.nn.functional.gelu(cache["pre", 0]))
    neurons = cache.stack_neuron_results(1)
    torch.testing.assert_close(neurons.sum(0) + mlp.down.bias, cache["mlp_out", 0], atol=1e-12, rtol=0)
    x = cache["resid_pre", 0]
    scale = cache["scale", 0, "norm_mixer"]
    torch.testing.assert_close(scale, (x.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt())
    torch.testing.assert_close(cache.apply_ln_to_stack(x[None], 0, gain=True)[0] + model.blocks[0].norm_mixer.bias,
                               model.blocks[0].norm_mixer(x))
    rms = model64("mamba")
    _, c2 = rms.run_with_cache(tokens)
    torch.testing.assert_close(c2.apply_ln_to_stack(c2["resid_pre", 1][None], 1, gain=True)[0],
                               rms.blocks[1].norm_mixer(c2["resid_pre", 1]))


def test_accumulated_resid_and_logit_lens(tokens):
    model = model64("mamba")
    logits, cache = model.run_with_cache(tokens)
    stack, labels = cache.accumulated_resid(return_labels=True)
    assert labels == ["0_pre", "1_pre", "final_post"] and stack.shape == (3, B, T, 16)
    lens = cache.logit_lens()
    torch.testing.assert_close(lens[-1], logits)  # the last layer's lens is the model
    torch.testing.assert_close(lens[0], model.unembed(model.norm_final(cache["hook_embed"])))
    assert cache.accumulated_resid(1, incl_mid=True, pos_slice=-1).shape == (3, B, 16)  # 0_pre, 0_mid, 1_pre
    assert cache.accumulated_resid(pos_slice=[0, 2]).shape == (3, B, 2, 16)


def test_shorthand_batch_dim_and_errors(tokens):
    model = model64("transformer")
    _, cache = model.run_with_cache(tokens)
    assert cache["resid_pre", 0] is cache["blocks.0.hook_resid_pre"]
    assert cache["pattern", -1] is cache["blocks.1.mixer.hook_pattern"]
    assert cache["attn_out", 1] is cache["blocks.1.mixer.hook_out"]
    with pytest.raises(KeyError, match="blocks.0.mixer.hook_nope"):
        cache["blocks.0.mixer.hook_nope"]
    with pytest.raises(TypeError, match="name, layer"):
        cache[0]
    one = model.run_with_cache(tokens[:1])[1].remove_batch_dim()
    assert one["resid_pre", 0].shape == (T, 16) and not one.has_batch_dim
    with pytest.raises(ValueError, match="batch size 1"):
        cache.remove_batch_dim()
    assert cache.to("cpu") is cache
    with pytest.raises(ValueError, match="needs the model"):
        Cache({"hook_embed": torch.zeros(1, 2, 3)}).decompose_resid()
    with pytest.raises(ValueError, match="mode"):
        cache.decompose_resid(mode="heads")
    plain = model64("tanh_rnn", residual=False)
    with pytest.raises(ValueError, match="residual"):
        plain.run_with_cache(tokens)[1].decompose_resid()


@pytest.mark.parametrize("name", models.list_models())
def test_every_model_of_the_zoo_decomposes_and_lenses(name, tokens):
    """Residual models: the decompositions sum to the final residual and their direct logit
    attributions to the logit; every model: the last logit-lens layer is the model's logits and
    each lens layer decodes the stream entering that block."""
    model = model64(name)
    logits, cache = model.run_with_cache(tokens)
    lens = cache.logit_lens()
    assert lens.shape == (3, B, T, VOCAB)
    torch.testing.assert_close(lens[-1], logits, atol=1e-12, rtol=0)
    torch.testing.assert_close(lens[1], model.unembed(model.norm_final(cache["blocks.1.hook_resid_pre"])))
    if not model.cfg.residual:
        with pytest.raises(ValueError, match="residual=False, so a block's output replaces its input"):
            cache.decompose_resid()
        with pytest.raises(ValueError, match="need a residual model"):
            cache.stack_head_results(incl_remainder=True)
        return
    final = cache["blocks.1.hook_resid_post"]
    for stack in (cache.decompose_resid(), cache.get_full_resid_decomposition(),
                  cache.stack_head_results(incl_remainder=True)):
        torch.testing.assert_close(stack.sum(0), final, atol=1e-12, rtol=0)
    target = tokens[:, -1]
    dla = cache.logit_attrs(cache.decompose_resid(), target, gain=True)  # [C, B, T]
    bias = getattr(model.norm_final, "bias", None)
    bias_logit = model.unembed(bias)[target][:, None] if bias is not None else 0.0
    torch.testing.assert_close(dla.sum(0), logits.gather(-1, target[:, None, None].expand(B, T, 1))[..., 0] - bias_logit,
                               atol=1e-10, rtol=0)
