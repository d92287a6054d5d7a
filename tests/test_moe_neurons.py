"""The neuron-level cache analyses on sparse (MoE) layers: each routed slot's chosen expert's
neurons weighted as the layer weights them and the shared expert's gated ones, which with the
shared expert's bias sum to the layer's output (float64, 1e-12), slot by slot to
hook_expert_weights * hook_expert_out; the full decompositions sum to the residual."""

import pytest
import torch

import models
from tests.test_moe import MOE, tokens


def moe_model64(**moe):
    torch.manual_seed(0)
    return models.build("gated_deltanet", vocab_size=7, d_model=16, n_heads=2, n_layers=3, mlp_activation="swiglu",
                        mlp_bias=True, moe={**MOE, "layers": [1, 2], **moe}).double().eval()


def shared_bias(model, cache, layer):
    """The shared expert's output bias as the layer adds it (times the gate), zero without one."""
    mlp, out = model.blocks[layer].mlp, cache[f"blocks.{layer}.mlp.hook_out"]
    if not hasattr(mlp, "shared_expert"):
        return torch.zeros_like(out)
    gate = cache[f"blocks.{layer}.mlp.hook_shared_gate"] if hasattr(mlp, "shared_gate") else 1.0
    return gate * mlp.shared_expert.down.bias


@pytest.mark.parametrize("moe", [{}, {"shared_gate": False}, {"d_shared": None}, {"norm_topk_prob": False}])
def test_moe_neurons_sum_to_the_layer_output(moe):
    model = moe_model64(**moe)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens())
    k, width = MOE["top_k"], MOE["d_expert"]
    shared = [] if moe.get("d_shared", MOE["d_shared"]) is None else [f"L1sharedN{n}" for n in range(MOE["d_shared"])]
    stack, labels = cache.stack_neuron_results(2, return_labels=True)
    mine = [i for i, lab in enumerate(labels) if lab.startswith("L1")]
    assert [labels[i] for i in mine] == [f"L1slot{j}N{n}" for j in range(k) for n in range(width)] + shared
    assert len(labels) == len(set(labels)) == 16 * 4 + len(mine)  # layer 0: the dense MLP's 4 * d_model
    torch.testing.assert_close(stack[mine].sum(0) + shared_bias(model, cache, 1), cache["blocks.1.hook_mlp_out"],
                               atol=1e-12, rtol=0)
    routed = cache.get_neuron_results(1)  # [B, T, k, F, D]
    assert routed.shape == (*tokens().shape, k, width, 16)
    expected = cache["blocks.1.mlp.hook_expert_weights"][..., None] * cache["blocks.1.mlp.hook_expert_out"]
    torch.testing.assert_close(routed.sum(-2), expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(cache.get_neuron_results(1, 3, -1), routed[:, -1, :, 3])  # ints drop their axes
    if shared:
        gate = cache["blocks.1.mlp.hook_shared_gate"] if "shared_gate" not in moe else 1.0
        torch.testing.assert_close(cache.get_neuron_results(1, shared=True).sum(-2) + shared_bias(model, cache, 1),
                                   gate * cache["blocks.1.mlp.shared_expert.hook_out"], atol=1e-12, rtol=0)
    else:
        with pytest.raises(ValueError, match="shared=True needs a sparse MLP with a shared expert; block 1"):
            cache.get_neuron_results(1, shared=True)


def test_full_decompositions_of_a_moe_model_sum_to_the_residual():
    model = moe_model64()
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens())
    final = cache["blocks.2.hook_resid_post"]
    for layout in ("tl", "ours"):
        full, labels = cache.get_full_resid_decomposition(layout=layout, return_labels=True)
        torch.testing.assert_close(full.sum(0), final, atol=1e-12, rtol=0)
        assert len(labels) == len(set(labels)) == full.shape[0]
    mid, labels = cache.get_full_resid_decomposition(2, mlp_input=True, layout="ours", return_labels=True)
    torch.testing.assert_close(mid.sum(0), cache["blocks.2.hook_resid_mid"], atol=1e-12, rtol=0)
    assert "1_mlp_bias" in labels and "L1slot1N5" in labels
    neurons = cache.stack_neuron_results(3, neuron_slice=[0, 2], incl_remainder=True)
    assert neurons.shape[0] == 2 + 2 * (2 * 2 + 2) + 1  # dense layer 0; two MoE layers: 2 slots and the shared expert; remainder
    torch.testing.assert_close(neurons.sum(0), final, atol=1e-12, rtol=0)
