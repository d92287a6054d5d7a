"""models.moe: the sparse MLP against a token-by-token re-computation of its docstring, its hooks
(read and patched), gradients, the config's checks, save -> load and decoding; Jamba's MoE
layers imported (parity with transformers, its router's outputs, greedy generate)."""

import pytest
import torch
from torch.nn import functional as F

import models
from models.moe import MoE
from tests.interop_parity import assert_parity
from tests.test_decoding import decode_and_compare
from tests.test_decoding_hf import hf_greedy
from tests.test_interop import jamba_source, tokens as interop_tokens

MOE = {"experts": 5, "top_k": 2, "d_expert": 6, "d_shared": 7}
NAMES = ["hook_router_logits", "hook_expert_indices", "hook_expert_weights", "hook_expert_post",
         "hook_expert_out", "hook_shared_gate", "shared_expert.hook_out", "hook_out"]


def moe_model(**moe):
    torch.manual_seed(0)
    return models.build("gated_deltanet", vocab_size=7, d_model=16, n_heads=2, n_layers=2, mlp_activation="swiglu",
                        mlp_bias=False, moe={**MOE, "layers": [1], **moe}).eval()


def tokens(batch=2, length=9, seed=1):
    return torch.randint(0, 7, (batch, length), generator=torch.Generator().manual_seed(seed))


def reference(moe: MoE, x: torch.Tensor, index: torch.Tensor | None = None) -> dict:
    """The docstring's math one token at a time: x [B, T, D] -> {hook suffix: value}; index
    [B, T, k] forces the chosen experts (a rerouting patch)."""
    logits = x @ moe.router.weight.T
    probs = logits.softmax(-1)
    index = probs.topk(moe.top_k, dim=-1).indices if index is None else index
    weights = probs.gather(-1, index)
    if moe.options["norm_topk_prob"]:
        weights = weights / weights.sum(-1, keepdim=True)
    posts = []
    for b, t, j in torch.cartesian_prod(*(torch.arange(n) for n in index.shape)).tolist():
        e, token = index[b, t, j], x[b, t]
        posts.append(F.silu(moe.experts.gate[e] @ token) * (moe.experts.up[e] @ token))
    post = torch.stack(posts).view(*index.shape, -1)  # [B, T, k, F]
    out = torch.stack([moe.experts.down[e] @ h for e, h in zip(index.flatten().tolist(), posts)]).view(*index.shape, -1)
    shared = moe.shared_expert
    shared_out = shared.down(F.silu(shared.gate(x)) * shared.up(x))
    shared_gate = torch.sigmoid(x @ moe.shared_gate.weight.T)
    return {"hook_router_logits": logits, "hook_expert_indices": index, "hook_expert_weights": weights,
            "hook_expert_post": post, "hook_expert_out": out, "hook_shared_gate": shared_gate,
            "shared_expert.hook_out": shared_out, "hook_out": (weights[..., None] * out).sum(-2) + shared_gate * shared_out}


def cached(model, toks, fwd_hooks=()):
    names = [f"blocks.1.mlp.{n}" for n in NAMES] + ["blocks.1.hook_resid_mid", "blocks.1.norm_mlp.hook_scale"]
    with torch.no_grad():
        logits, cache = model.run_with_cache(toks, names=names, fwd_hooks=list(fwd_hooks))
    mlp_in = model.blocks[1].norm_mlp(cache["blocks.1.hook_resid_mid"])
    return logits, {n: cache[f"blocks.1.mlp.{n}"] for n in NAMES}, mlp_in


def test_only_the_listed_layers_are_sparse_and_their_hooks_are_named():
    model = moe_model()
    assert type(model.blocks[0].mlp).__name__ == "MLP" and isinstance(model.blocks[1].mlp, MoE)
    assert {f"blocks.1.mlp.{n}" for n in NAMES} <= set(model.hook_names())


def test_every_hook_reads_the_documented_value():
    model = moe_model()
    _, values, mlp_in = cached(model, tokens())
    with torch.no_grad():
        expected = reference(model.blocks[1].mlp, mlp_in)
    assert values["hook_expert_indices"].dtype == torch.int64
    assert len(set(values["hook_expert_indices"].flatten().tolist())) > 2  # the routing varies
    for name in NAMES:
        torch.testing.assert_close(values[name], expected[name], atol=1e-6, rtol=0, msg=name)


@pytest.mark.parametrize("moe", [{"norm_topk_prob": False}, {"d_shared": None}, {"shared_gate": False}])
def test_variants_follow_the_documented_math(moe):
    model = moe_model(**moe)
    mlp = model.blocks[1].mlp
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        probs = mlp.router(x).softmax(-1)
        top = probs.topk(2, dim=-1)
        weights = top.values / top.values.sum(-1, keepdim=True) if mlp.options["norm_topk_prob"] else top.values
        out = torch.zeros_like(x)
        for j in range(2):
            for e in range(5):
                chosen = (top.indices[..., j] == e)[..., None]
                h = F.silu(x @ mlp.experts.gate[e].T) * (x @ mlp.experts.up[e].T)
                out += chosen * weights[..., j : j + 1] * (h @ mlp.experts.down[e].T)
        if moe.get("d_shared", 7):
            shared = mlp.shared_expert(x)
            out += shared * torch.sigmoid(mlp.shared_gate(x)) if moe.get("shared_gate", True) else shared
        torch.testing.assert_close(mlp(x), out, atol=1e-6, rtol=0)


def test_rerouting_and_weight_patches_change_exactly_what_they_name():
    model = moe_model()
    toks = tokens()
    clean, values, mlp_in = cached(model, toks)
    forced = (values["hook_expert_indices"] + 1) % 5
    _, patched, _ = cached(model, toks, [("blocks.1.mlp.hook_expert_indices", lambda i, hook: forced)])
    with torch.no_grad():
        expected = reference(model.blocks[1].mlp, mlp_in, forced)
    for name in NAMES:
        torch.testing.assert_close(patched[name], expected[name], atol=1e-6, rtol=0, msg=name)
    logits, zeroed, _ = cached(model, toks, [("blocks.1.mlp.hook_expert_weights", lambda w, hook: w * 0)])
    torch.testing.assert_close(zeroed["hook_out"], values["hook_shared_gate"] * values["shared_expert.hook_out"],
                               atol=1e-6, rtol=0)
    assert not torch.equal(logits, clean)
    with pytest.raises(ValueError, match=r"experts in \[0, 5\)"):
        cached(model, toks, [("blocks.1.mlp.hook_expert_indices", lambda i, hook: i + 5)])


def test_an_expert_neuron_patch_reaches_only_that_slot():
    model = moe_model()
    toks = tokens()
    _, values, _ = cached(model, toks)

    def kill(h, hook):
        h = h.clone()
        h[0, 3, 1] = 0
        return h

    _, patched, _ = cached(model, toks, [("blocks.1.mlp.hook_expert_post", kill)])
    changed = (patched["hook_expert_out"] - values["hook_expert_out"]).abs().amax(-1) > 0  # [B, T, k]
    assert changed.nonzero().tolist() == [[0, 3, 1]]
    assert torch.equal(patched["hook_expert_out"][0, 3, 1], torch.zeros(16))


def test_gradients_equal_the_reference():
    model = moe_model()
    mlp = model.blocks[1].mlp
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(4), requires_grad=True)
    params = [mlp.router.weight, *mlp.experts.parameters(), mlp.shared_gate.weight]
    ours = torch.autograd.grad(mlp(x).square().sum(), [x, *params])
    theirs = torch.autograd.grad(reference(mlp, x)["hook_out"].square().sum(), [x, *params])
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_decoding_equals_the_full_forward_and_save_load_round_trips(tmp_path):
    model = moe_model()
    worst, _ = decode_and_compare(model, tokens(3, 5))
    assert worst < 1e-5, worst
    model.save(tmp_path / "run")
    loaded = models.load(tmp_path / "run")
    assert loaded.cfg == model.cfg and isinstance(loaded.blocks[1].mlp, MoE)
    with torch.no_grad():
        assert torch.equal(loaded(tokens()), model(tokens()))


@pytest.mark.parametrize("moe, error, message", [
    ({"experts": 0}, ValueError, "moe\\['experts'\\]"),
    ({"top_k": 6}, ValueError, "top_k"),
    ({"d_shared": -1}, ValueError, "d_shared"),
    ({"norm_topk_prob": 1}, TypeError, "norm_topk_prob"),
    ({"layers": [2]}, ValueError, "layers"),
    ({"router": "sigmoid"}, ValueError, "unknown keys \\['router'\\]"),
])
def test_bad_moe_configs_raise_naming_the_key(moe, error, message):
    with pytest.raises(error, match=message):
        moe_model(**moe)



def router_output(source, router, toks):
    """What a transformers router returns as source runs on toks: (logits [B T, E], weights
    [B T, k], index [B T, k])."""
    routed = {}
    handle = router.register_forward_hook(lambda m, i, o: routed.update(out=o))
    try:
        with torch.no_grad():
            source(toks)
    finally:
        handle.remove()
    return routed["out"]


def jamba_moe_source():
    """Jamba with 3 experts (top 2, unnormalised weights) in layers 1 and 3."""
    return jamba_source(num_experts=3, num_experts_per_tok=2, expert_layer_period=2, expert_layer_offset=1,
                        experts_implementation="eager")


def test_jamba_moe_layers_import_with_parity_router_outputs_and_generate():
    source = jamba_moe_source()
    model = models.from_pretrained(source)
    assert model.cfg.moe == {"experts": 3, "top_k": 2, "d_expert": 24, "norm_topk_prob": False, "layers": [1, 3]}
    assert_parity(source, model, interop_tokens(), atol=1e-4)
    logits, weights, index = router_output(source, source.model.layers[3].feed_forward.router, interop_tokens())
    _, cache = model.run_with_cache(interop_tokens(), names=lambda n: n.startswith("blocks.3.mlp.hook_"))
    torch.testing.assert_close(cache["blocks.3.mlp.hook_router_logits"].flatten(0, 1), logits, atol=1e-5, rtol=0)
    assert torch.equal(cache["blocks.3.mlp.hook_expert_indices"].flatten(0, 1), index)
    torch.testing.assert_close(cache["blocks.3.mlp.hook_expert_weights"].flatten(0, 1), weights, atol=1e-6, rtol=0)
    prompt = interop_tokens(3, 20)
    assert torch.equal(model.generate(prompt, 24), hf_greedy(source, prompt, None))


def test_half_precision_routes_in_float32_as_transformers():
    """softmax, top-k and the renormalisation in float32, the weights cast back (transformers'
    routers): in bfloat16 the chosen experts and weights are those of the float32 routing."""
    model = moe_model().to(torch.bfloat16)
    names = ["blocks.1.mlp.hook_router_logits", "blocks.1.mlp.hook_expert_indices", "blocks.1.mlp.hook_expert_weights"]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens(4, 20), names=names)
    probs = cache[names[0]].float().softmax(-1)
    top = probs.topk(2, dim=-1)
    assert torch.equal(cache[names[1]], top.indices)
    assert torch.equal(cache[names[2]], (top.values / top.values.sum(-1, keepdim=True)).to(torch.bfloat16))
