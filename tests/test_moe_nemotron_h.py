"""NemotronH's "moe" layers imported (models.interop.nemotron_h -> models.moe.MoE with sigmoid
routing, the correction bias, grouped top-k, routed_scaling_factor, ungated relu2 experts and an
ungated shared expert): parity with transformers' NemotronHForCausalLM (1e-4, float32), its
router's choices and weights, greedy generate; the routing options' checks."""

import pytest
import torch

import models
from tests.interop_parity import assert_parity
from tests.test_decoding_hf import hf_greedy
from tests.test_interop_hybrid import nemotron_h_source, tokens
from tests.test_moe import moe_model, router_output

LAYERS = ["linear_attention", "moe", "full_attention", "mlp", "moe"]


def nemotron_h_moe_source():
    """8 experts in 4 groups (2 kept), top 3, scaled by 2.5, a correction bias off zero."""
    source = nemotron_h_source(layers_block_type=LAYERS, n_routed_experts=8, num_experts_per_tok=3,
                               moe_intermediate_size=10, moe_shared_expert_intermediate_size=12, n_group=4,
                               topk_group=2, routed_scaling_factor=2.5)
    source.config._experts_implementation = "eager"  # the grouped-matmul experts need 16-byte strides
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for layer in (1, 4):
            bias = source.model.layers[layer].mixer.gate.e_score_correction_bias
            bias.copy_(0.3 * torch.randn(bias.shape, generator=gen))
    return source


@pytest.fixture(scope="module")
def imported():
    source = nemotron_h_moe_source()
    return source, models.from_pretrained(source)


def test_moe_layers_import_with_parity_and_generate(imported):
    source, model = imported
    assert model.cfg.moe["layers"] == [1, 4] and model.blocks[1].mixer is None
    assert not hasattr(model.blocks[1].mlp.experts, "gate")  # ungated relu2 experts
    assert_parity(source, model, tokens(), atol=1e-4)
    prompt = tokens(3, 20)
    assert torch.equal(model.generate(prompt, 24), hf_greedy(source, prompt, None))


def test_routing_equals_the_source_router_and_its_groups_and_bias_matter(imported):
    source, model = imported
    logits, weights, index = router_output(source, source.model.layers[4].mixer.gate, tokens())  # (unsorted slots)
    _, cache = model.run_with_cache(tokens(), names=lambda n: n.startswith("blocks.4.mlp.hook_"))
    torch.testing.assert_close(cache["blocks.4.mlp.hook_router_logits"].flatten(0, 1), logits, atol=1e-5, rtol=0)
    ours_index = cache["blocks.4.mlp.hook_expert_indices"].flatten(0, 1)
    ours_weights = cache["blocks.4.mlp.hook_expert_weights"].flatten(0, 1)
    assert torch.equal(ours_index.sort(-1).values, index.sort(-1).values)
    torch.testing.assert_close(torch.zeros_like(logits).scatter(-1, ours_index, ours_weights),
                               torch.zeros_like(logits).scatter(-1, index, weights), atol=1e-6, rtol=0)
    assert torch.allclose(ours_weights.sum(-1), torch.tensor(2.5))  # normalised, then scaled
    probs = logits.sigmoid()
    plain = probs.topk(3, dim=-1).indices.sort(-1).values
    ungrouped = (probs + model.blocks[4].mlp.score_bias).topk(3, dim=-1).indices.sort(-1).values
    ours_sorted = ours_index.sort(-1).values
    assert (plain != ungrouped).any(-1).any() and (ungrouped != ours_sorted).any(-1).any()


def test_moe_neurons_of_relu2_experts_sum_to_the_layer_output(imported):
    _, model = imported
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens())
    neurons = cache.get_neuron_results(1).sum((-3, -2)) + cache.get_neuron_results(1, shared=True).sum(-2)
    torch.testing.assert_close(neurons, cache["blocks.1.hook_mlp_out"], atol=1e-5, rtol=0)  # (no biases here)


@pytest.mark.parametrize("moe, message", [
    ({"routing": "top"}, r"moe\['routing'\] must be one of \('softmax', 'sigmoid'\); got 'top'"),
    ({"expert_activation": "gelu"}, r"moe\['expert_activation'\] must be one of"),
    ({"routing": "sigmoid", "n_group": 2}, r"moe\['n_group'\] must be a positive int dividing moe\['experts'\]=5"),
    ({"experts": 6, "routing": "sigmoid", "n_group": 2, "topk_group": 3}, r"moe\['topk_group'\] must be .* at most"),
    ({"experts": 6, "n_group": 2}, r"n_group'\]=2 > 1 needs routing 'sigmoid'"),
    ({"routed_scaling_factor": 0}, r"routed_scaling_factor'\] must be a positive number; got 0"),
])
def test_bad_routing_options_raise_naming_the_key(moe, message):
    with pytest.raises(ValueError, match=message):
        moe_model(**moe)
