"""TransformerLens' per-head attention inputs (blocks.{l}.hook_attn_in / hook_q_input /
hook_k_input / hook_v_input: per-head copies of the residual before the block's norm, normed per
head; models.mixers.attention): opt-in, so nothing changes unless one is requested; a hand-written
reference (an edited q input is an edited hook_q); and TL 4.3's bridge with use_split_qkv_input /
use_attn_in on the same float64 GPT-2 (1e-12) and GQA Qwen3 weights (skipped without TL)."""

import pytest
import torch
from torch.nn import functional as F

import models
from tests import tl_oracle

INPUTS = ["hook_attn_in", "hook_q_input", "hook_k_input", "hook_v_input"]


@pytest.fixture(scope="module")
def setup():
    source = tl_oracle.gpt2_source()
    return source, tl_oracle.ours(source), tl_oracle.tokens(batch=3, length=6)


def edit_head(head: int):
    def edit(x, hook):  # one head's copy [B, T, D] plus a direction (not a constant: the norm removes those)
        x = x.clone()
        x[:, :, head] += torch.linspace(-2, 2, x.shape[-1], dtype=x.dtype) ** 2
        return x

    return edit


def test_per_head_inputs_are_opt_in_and_exact_copies(setup):
    _, model, ids = setup
    assert not any(n.endswith(tuple(INPUTS)) for n in model.hook_names())
    with torch.no_grad():
        plain, everything = model.run_with_cache(ids)
        split, cache = model.run_with_cache(ids, names=[f"blocks.1.{n}" for n in INPUTS] + ["blocks.1.hook_resid_pre"])
    assert not any("input" in n or "attn_in" in n for n in everything)  # names=None leaves them out
    assert sorted(cache) == sorted(["blocks.1.hook_resid_pre"] + [f"blocks.1.mixer.{n}" for n in INPUTS])
    resid = cache["blocks.1.hook_resid_pre"]  # [B, T, D]
    for name in INPUTS:
        value = cache[f"blocks.1.{name}"]  # TL's name; [B, T, H, D]
        assert value.shape == (*resid.shape[:2], tl_oracle.HEADS, resid.shape[-1])
        assert torch.equal(value, resid[:, :, None].expand_as(value))
    torch.testing.assert_close(split, plain, atol=1e-13, rtol=0)  # the per-head path = the fused one
    assert cache["q_input", 1] is cache["blocks.1.mixer.hook_q_input"]  # TL's get_act_name shorthand
    assert cache["blocks.1.attn.hook_attn_in"] is cache["blocks.1.mixer.hook_attn_in"]  # TL 4.3's own place
    _, one = model.run_with_cache(ids, names=["blocks.1.hook_k_input"], heads=[2])
    assert torch.equal(one["blocks.1.hook_k_input"], cache["blocks.1.hook_k_input"][:, :, 2:3])


def test_editing_one_heads_q_input_is_editing_its_query(setup):
    """Hand-written reference: q input r' of head h gives head h the query LN(r') W_q^h + b_q^h."""
    _, model, ids = setup
    block, head = model.blocks[1], 2
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, names=["blocks.1.hook_resid_pre"])
        edited = edit_head(head)(cache["blocks.1.hook_resid_pre"][:, :, None].repeat(1, 1, 4, 1), None)[:, :, head]
        norm, qkv, d = block.norm_mixer, block.mixer.qkv, block.mixer.d_head
        normed = F.layer_norm(edited, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
        query = normed @ qkv.weight[head * d: (head + 1) * d].T + qkv.bias[head * d: (head + 1) * d]  # [B, T, d]

        def put_query(q, hook):
            q = q.clone()
            q[:, :, head] = query
            return q

        expected = model.run_with_hooks(ids, fwd_hooks=[("blocks.1.mixer.hook_q", put_query)])
        got = model.run_with_hooks(ids, fwd_hooks=[("blocks.1.hook_q_input", edit_head(head))])
        plain = model(ids)
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)
    assert (got - plain).abs().max() > 1e-3


def test_conflicts_and_unsupported_runs_are_refused(setup):
    _, model, ids = setup
    with pytest.raises(ValueError, match="would not see the patch"):
        model.run_with_hooks(ids, fwd_hooks=[("blocks.0.mixer.hook_in", lambda x, h: x * 2),
                                             ("blocks.0.hook_q_input", lambda x, h: x)])
    with pytest.raises(ValueError, match="not available in decoding"), model.hooks([("blocks.0.hook_v_input",
                                                                                     lambda x, h: x)]):
        model.generate(ids[:1, :3], 2)
    predicate = model.run_with_cache(ids[:, :3], names=lambda n: n.endswith("input"))[1]
    assert not any("q_input" in n for n in predicate)  # predicates do not request them either
    fired = []
    for point in model.blocks[1].mixer.input_hooks:  # counts its calls without requesting it
        point.forward = lambda x, point=point: fired.append(point.name) or x
    try:
        with models.instrumented(), torch.no_grad():  # the forced instrumented path does not request them
            torch.testing.assert_close(model(ids), model.run_with_hooks(ids), atol=0, rtol=0)
            model.run_with_cache(ids)
        assert not fired
        with torch.no_grad():
            model.run_with_cache(ids, names=["blocks.1.hook_v_input"])
        assert set(fired) == {"blocks.1.mixer.hook_v_input"}  # requested: the per-head path runs, calling it only
    finally:
        for point in model.blocks[1].mixer.input_hooks:
            del point.forward


@pytest.fixture(scope="module")
def bridge(setup):
    return tl_oracle.lens(setup[0])


def test_cached_inputs_and_edits_equal_transformer_lens(setup, bridge):
    _, model, ids = setup
    names = [f"blocks.{l}.{n}" for l in range(tl_oracle.LAYERS) for n in INPUTS[1:]] + ["blocks.1.attn.hook_q"]
    try:
        with torch.no_grad():
            bridge.set_use_split_qkv_input(True)
            theirs_logits, theirs = bridge.run_with_cache(ids)
            mine_logits, mine = model.run_with_cache(ids, names=names)
            torch.testing.assert_close(mine_logits, theirs_logits, atol=1e-12, rtol=0)
            for name in names:
                torch.testing.assert_close(mine[name], theirs[name], atol=1e-12, rtol=0)
            for name in INPUTS[1:]:  # one head's q / k / v input edited in layer 1
                hooks = [(f"blocks.1.{name}", edit_head(1))]
                got = model.run_with_hooks(ids, fwd_hooks=hooks)
                torch.testing.assert_close(got, bridge.run_with_hooks(ids, fwd_hooks=hooks), atol=1e-12, rtol=0)
                assert (got - mine_logits).abs().max() > 1e-3
            bridge.set_use_split_qkv_input(False)
            bridge.set_use_attn_in(True)
            hooks = [("blocks.2.hook_attn_in", edit_head(3))]
            torch.testing.assert_close(model.run_with_hooks(ids, fwd_hooks=hooks),
                                       bridge.run_with_hooks(ids, fwd_hooks=hooks), atol=1e-12, rtol=0)
    finally:
        bridge.set_use_attn_in(False)
        bridge.set_use_split_qkv_input(False)


def test_input_gradients_equal_transformer_lens(setup, bridge):
    """d metric / d q/k/v input: our incl_bwd cache against TL's retained gradients."""
    _, model, ids = setup
    names = [f"blocks.{l}.{n}" for l in (0, 2) for n in INPUTS[1:]]

    def metric(logits):
        return logits[:, -1, 3].sum() - logits[:, -2, 5].sum()

    _, mine = model.run_with_cache(ids, names=names, incl_bwd=True, metric=metric)
    live = {}

    def keep(name):
        def hook_fn(x, hook):
            x = x.clone()
            x.retain_grad()
            live[name] = x
            return x

        return hook_fn

    try:
        bridge.set_use_split_qkv_input(True)
        metric(bridge.run_with_hooks(ids, fwd_hooks=[(n, keep(n)) for n in names])).backward()
    finally:
        bridge.set_use_split_qkv_input(False)
    for name in names:
        torch.testing.assert_close(mine[name + "_grad"], live[name].grad, atol=1e-12, rtol=0)


def test_grouped_query_inputs_equal_transformer_lens():
    """GQA (4 query heads, 2 key/value heads): k / v inputs have G = 2 copies, as TL's. 1e-6:
    transformers' Qwen3 RMSNorm computes in float32 even in a float64 model (tests/test_tl_moe.py)."""
    from tests.test_interop_qwen3 import qwen3_source
    source = qwen3_source().double().eval()
    qwen = tl_oracle.lens(source)
    model = models.from_pretrained(source)
    ids = torch.randint(0, source.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, names=["blocks.1.hook_k_input"])
        assert cache["blocks.1.hook_k_input"].shape == (2, 7, 2, 16)
        qwen.set_use_split_qkv_input(True)
        for name in INPUTS[1:]:
            hooks = [(f"blocks.1.{name}", edit_head(1))]
            got = model.run_with_hooks(ids, fwd_hooks=hooks)
            torch.testing.assert_close(got, qwen.run_with_hooks(ids, fwd_hooks=hooks), atol=1e-6, rtol=0)
            assert (got - model(ids)).abs().max() > 1e-2
        qwen.set_use_split_qkv_input(False)
        qwen.set_use_attn_in(True)  # TL: k and v read the first G copies of attn_in
        hooks = [("blocks.1.hook_attn_in", edit_head(0))]
        torch.testing.assert_close(model.run_with_hooks(ids, fwd_hooks=hooks),
                                   qwen.run_with_hooks(ids, fwd_hooks=hooks), atol=1e-6, rtol=0)
