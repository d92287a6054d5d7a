"""The Cache analyses give TransformerLens' numbers for TL's calls (models.cache.analyses): against
TL 4.3's ActivationCache on the same float64 GPT-2 weights (1e-10) where TL is installed;
hand-written references for the former bugs and TL's conventions otherwise."""

import pytest
import torch

from tests import tl_oracle

L, H, D = tl_oracle.LAYERS, tl_oracle.HEADS, tl_oracle.D_MODEL


@pytest.fixture(scope="module")
def setup():
    source = tl_oracle.gpt2_source()
    model = tl_oracle.ours(source)
    ids = tl_oracle.tokens(batch=3, length=6)
    with torch.no_grad():
        logits, cache = model.run_with_cache(ids)
    return source, model, ids, logits, cache


def close(a, b):
    torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def test_empty_stacks_at_layer_0(setup):
    _, _, ids, _, cache = setup
    B, T = ids.shape
    assert cache.stack_head_results(0).shape == (0, B, T, D)
    assert cache.stack_neuron_results(0, pos_slice=-1).shape == (0, B, D)
    stack, labels = cache.stack_head_results(0, incl_remainder=True, return_labels=True)
    assert labels == ["remainder"]
    close(stack[0], cache["blocks.0.hook_resid_pre"])
    full, labels = cache.get_full_resid_decomposition(0, return_labels=True)
    assert labels == ["embed", "pos_embed", "bias"]
    close(full.sum(0), cache["blocks.0.hook_resid_pre"])


def test_apply_ln_to_stack_slices_stack_and_scale_alike(setup):
    _, model, _, _, cache = setup
    stack = cache.decompose_resid()  # [C, B, T, D]
    scale = cache["ln_final.hook_scale"]
    centred = stack - stack.mean(-1, keepdim=True)
    close(cache.apply_ln_to_stack(stack, None, batch_slice=slice(1, 2)), (centred / scale)[:, 1:2])
    close(cache.apply_ln_to_stack(stack, None, batch_slice=2), (centred / scale)[:, 2])
    close(cache.apply_ln_to_stack(stack[:, :, -1], None, pos_slice=-1), centred[:, :, -1] / scale[:, -1])
    close(cache.apply_ln_to_stack(stack, None, gain=True), centred / scale * model.norm_final.weight)
    close(cache.apply_ln_to_stack(stack, None, recompute_ln=True), model.norm_final(stack))  # each on its own


def test_logit_attrs_applies_the_final_norm_and_its_slices(setup):
    _, model, ids, logits, cache = setup
    stack = cache.decompose_resid()
    w_u, scale, norm = model.unembed.weight, cache["ln_final.hook_scale"], model.norm_final
    target = ids[:, -1]
    normed = (stack - stack.mean(-1, keepdim=True)) / scale
    close(cache.logit_attrs(stack, target), (normed * w_u[target][:, None]).sum(-1))
    close(cache.logit_attrs(stack, target[1:], batch_slice=slice(1, None)),  # slices the stack and the scale
          (normed[:, 1:] * w_u[target[1:]][:, None]).sum(-1))
    close(cache.logit_attrs(stack[:, :, 2], target, pos_slice=2), (normed[:, :, 2] * w_u[target]).sum(-1))
    per_position = ids[0, :5]  # [T'] with T' != B: one token per position
    close(cache.logit_attrs(stack[:, :, :5], per_position, pos_slice=slice(0, 5)),
          (normed[:, :, :5] * w_u[per_position]).sum(-1))
    dla = cache.logit_attrs(stack, target, gain=True)  # ours: sums to the logit minus the bias's
    close(dla.sum(0), logits.gather(-1, target[:, None, None].expand(*ids.shape, 1))[..., 0]
          - model.unembed(norm.bias)[target][:, None])
    close(cache.logit_attrs(cache.apply_ln_to_stack(stack, gain=True), target, apply_ln=False), dla)


def test_accumulated_resid_recomputes_the_final_norm(setup):
    _, model, _, _, cache = setup
    stack = cache.accumulated_resid(apply_ln=True)
    raw = cache.accumulated_resid()
    close(stack, model.norm_final(raw))
    close(cache.accumulated_resid(apply_ln=True, recompute_ln=False, gain=True),
          (raw - raw.mean(-1, keepdim=True)) / cache["ln_final.hook_scale"] * model.norm_final.weight)
    mid = cache.accumulated_resid(1, apply_ln=True, mlp_input=True)  # 0_pre, 1_pre, 1_mid: ln2's scale
    raw = cache.accumulated_resid(1, mlp_input=True)
    close(mid, (raw - raw.mean(-1, keepdim=True)) / cache["scale", 1, "ln2"])


def test_neuron_results_take_tl_argument_order(setup):
    _, model, _, _, cache = setup
    stack, labels = cache.stack_neuron_results(2, -1, [3, 5], return_labels=True)  # layer, pos_slice, neuron_slice
    assert labels == ["L0N3", "L0N5", "L1N3", "L1N5"]
    w = model.blocks[1].mlp.down.weight  # [D, F]
    close(stack[3], cache["post", 1][:, -1, 5, None] * w[:, 5])
    assert cache.stack_neuron_results(1, neuron_slice=7).shape[0] == 1  # an int keeps the neuron axis


@pytest.fixture(scope="module")
def theirs(setup):
    source, _, ids, _, _ = setup
    bridge = tl_oracle.lens(source)
    with torch.no_grad():
        _, cache = bridge.run_with_cache(ids)
    return cache


CALLS = [
    ("accumulated_resid", dict(apply_ln=True, return_labels=True)),
    ("accumulated_resid", dict(layer=2, incl_mid=True, apply_ln=True, pos_slice=-1)),
    ("accumulated_resid", dict(layer=1, mlp_input=True, apply_ln=True, return_labels=True)),
    ("decompose_resid", dict(apply_ln=True, return_labels=True)),
    ("decompose_resid", dict(layer=1, mlp_input=True, mode="attn", apply_ln=True, pos_slice=[0, 2],
                             return_labels=True)),
    ("decompose_resid", dict(layer=2, mode="mlp", incl_embeds=False, return_labels=True)),
    ("stack_head_results", dict(apply_ln=True, return_labels=True)),
    ("stack_head_results", dict(layer=2, incl_remainder=True, pos_slice=slice(1, 4), return_labels=True)),
    ("stack_head_results", dict(layer=0, return_labels=True)),
    ("stack_neuron_results", dict(layer=2, pos_slice=-1, neuron_slice=slice(0, 6), apply_ln=True,
                                  return_labels=True)),
    ("stack_neuron_results", dict(layer=1, incl_remainder=True, mlp_input=True, apply_ln=True)),
    ("stack_neuron_results", dict(layer=0)),
    ("get_full_resid_decomposition", dict(apply_ln=True, return_labels=True)),
    ("get_full_resid_decomposition", dict(layer=1, mlp_input=True, pos_slice=-2, return_labels=True)),
    ("get_full_resid_decomposition", dict(layer=2, expand_neurons=False, apply_ln=True, return_labels=True)),
    ("get_full_resid_decomposition", dict(layer=0, return_labels=True)),
]


@pytest.mark.parametrize("method, kwargs", CALLS, ids=[f"{m}-{i}" for i, (m, _) in enumerate(CALLS)])
def test_same_call_same_numbers_as_transformer_lens(setup, theirs, method, kwargs):
    cache = setup[4]
    mine, other = getattr(cache, method)(**kwargs), getattr(theirs, method)(**kwargs)
    if kwargs.get("return_labels"):
        assert mine[1] == other[1]
        mine, other = mine[0], other[0]
    assert mine.shape == other.shape
    close(mine, other)


def test_apply_ln_and_logit_attrs_as_transformer_lens(setup, theirs):
    _, _, ids, _, cache = setup
    stack = cache.decompose_resid()
    target, wrong = ids[:, -1], ids[:, 0]
    for kwargs in (dict(), dict(batch_slice=slice(1, 2)), dict(layer=1, mlp_input=True), dict(recompute_ln=True)):
        close(cache.apply_ln_to_stack(stack, **kwargs), theirs.apply_ln_to_stack(stack, **kwargs))
    close(cache.logit_attrs(stack, target), theirs.logit_attrs(stack, target))
    close(cache.logit_attrs(stack, target, incorrect_tokens=wrong), theirs.logit_attrs(stack, target,
                                                                                      incorrect_tokens=wrong))
    sliced = stack[:, :, -1]
    close(cache.logit_attrs(sliced, target[1:], pos_slice=-1, batch_slice=slice(1, None)),
          theirs.logit_attrs(sliced, target[1:], pos_slice=-1, batch_slice=slice(1, None)))
    close(cache.logit_attrs(stack, 7), theirs.logit_attrs(stack, 7))


def test_neuron_results_stacked_activations_and_batch_slices(setup):
    _, model, ids, _, cache = setup
    w = model.blocks[1].mlp.down.weight  # [D, F]
    close(cache.get_neuron_results(1, [2, 4], -1), cache["post", 1][:, -1, [2, 4], None] * w[:, [2, 4]].T)
    assert cache.get_neuron_results(1, 3).shape == (*ids.shape, D)  # an int drops the neuron axis, as TL
    close(cache.stack_activation("scale", sublayer_type="ln1"),
          torch.stack([cache[f"blocks.{l}.norm_mixer.hook_scale"] for l in range(L)]))
    assert cache.stack_activation("pattern", 2).shape == (2, ids.shape[0], H, ids.shape[1], ids.shape[1])
    some = cache.apply_slice_to_batch_dim([0, 2])
    close(some["resid_post", 1], cache["resid_post", 1][[0, 2]])
    close(some.decompose_resid(apply_ln=True), cache.decompose_resid(apply_ln=True)[:, [0, 2]])
    one = cache.apply_slice_to_batch_dim(1)
    assert not one.has_batch_dim and one["hook_embed"].shape == (ids.shape[1], D)
    with torch.no_grad():
        model.run_with_cache(ids, reset_hooks_end=True, return_cache_object=True, names="hook_embed")
    for bad in (dict(reset_hooks_end=False), dict(attention_mask=torch.ones_like(ids))):
        with pytest.raises(TypeError, match="TransformerLens argument"):
            model.run_with_cache(ids, **bad)
        with pytest.raises(TypeError, match="TransformerLens argument"):
            model.run_with_hooks(ids, **bad)


def test_neuron_results_stacked_activations_and_batch_slices_as_transformer_lens(setup, theirs):
    cache = setup[4]
    close(cache.get_neuron_results(1, [2, 4], -1), theirs.get_neuron_results(1, [2, 4], -1))
    close(cache.get_neuron_results(2, 3), theirs.get_neuron_results(2, 3))
    close(cache.stack_activation("scale", sublayer_type="ln2"), theirs.stack_activation("scale", sublayer_type="ln2"))
    close(cache.stack_activation("z", 2), theirs.stack_activation("z", 2))
    mine, other = cache.apply_slice_to_batch_dim(slice(1, 3)), theirs.apply_slice_to_batch_dim(slice(1, 3))
    close(mine.get_full_resid_decomposition(apply_ln=True), other.get_full_resid_decomposition(apply_ln=True))
    close(mine.accumulated_resid(apply_ln=True), other.accumulated_resid(apply_ln=True))
