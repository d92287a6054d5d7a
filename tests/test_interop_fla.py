"""from_pretrained(fla DeltaNetForCausalLM / GatedDeltaNetForCausalLM): parity with fla's own
layers run under TRITON_INTERPRET=1 (tests/fla_interpreter.py), tiny random configs, every
parameter jittered, T beyond our chunk; round trip; features we cannot represent raise."""

import pytest
import torch
import torch.nn.functional as F

import models
from models.interop import UnsupportedConfig
from tests.conftest import triton_interpreter_available
from tests.fla_interpreter import fla_models, single_config_autotune
from tests.interop_parity import VOCAB, assert_causal_state_patch, assert_parity, assert_round_trip, jitter, source_run

pytestmark = [pytest.mark.triton, pytest.mark.skipif(not triton_interpreter_available(),
                                                     reason="triton not importable (or no GPU and no TRITON_INTERPRET)")]
T = 72  # > our chunk 64 (and > 64, where fla's layers leave their short-sequence path)
COMMON = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, attn_mode="fused_recurrent", norm_eps=1e-5,
              fuse_cross_entropy=False, pad_token_id=0, bos_token_id=0, eos_token_id=0, intermediate_size=24)


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch):
    single_config_autotune(monkeypatch)


def tokens(batch=1, length=T, seed=1):  # one row: fla's kernels are slow in the interpreter
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def deltanet_source(**overrides):
    fla = fla_models()
    torch.manual_seed(0)
    return jitter(fla.DeltaNetForCausalLM(fla.DeltaNetConfig(**{**COMMON, "num_heads": 2, **overrides})))


def gated_source(**overrides):
    fla = fla_models()
    torch.manual_seed(0)
    fields = {**COMMON, "num_heads": 2, "head_dim": 8, "expand_v": 1.0, **overrides}
    return jitter(fla.GatedDeltaNetForCausalLM(fla.GatedDeltaNetConfig(**fields)))


# ----------------------------------------------------------------------------- DeltaNet


def test_deltanet_parity():
    """fla's fused recurrent delta rule has a backward: logits, blocks and gradients in one run."""
    source = deltanet_source(use_gate=True, allow_neg_eigval=True)
    model = models.from_pretrained(source)
    assert model.cfg.mixer == "deltanet" and model.cfg.beta_scales == [2.0, 2.0]
    assert_parity(source, model, tokens(), atol=1e-4)


@pytest.mark.parametrize("overrides", [{}, dict(use_short_conv=False, norm_eps=1e-3, tie_word_embeddings=True)])
def test_deltanet_variants_forward(overrides):
    source = deltanet_source(**overrides)
    model = models.from_pretrained(source)
    with torch.no_grad():
        logits = source(tokens(length=24)).logits
        for path in ("fast", "instrumented"):
            torch.testing.assert_close(model.set_execution_path(path)(tokens(length=24)), logits, atol=1e-4, rtol=0)


def test_deltanet_state_is_flas_transposed():
    source = deltanet_source()
    model = models.from_pretrained(source)
    layer = source.model.layers[0]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens(length=9), names=["blocks.0.mixer.hook_state", "blocks.0.mixer.hook_in"])
        from fla.ops.delta_rule import fused_recurrent_delta_rule
        attn = layer.attn
        x = cache["blocks.0.mixer.hook_in"]
        q, k, v = (conv(proj(x))[0] for proj, conv in  # ShortConvolution applies its SiLU
                   ((attn.q_proj, attn.q_conv1d), (attn.k_proj, attn.k_conv1d), (attn.v_proj, attn.v_conv1d)))
        q, k, v = (t.reshape(1, 9, 2, 8) for t in (q, k, v))
        _, final = fused_recurrent_delta_rule(q, k, v, attn.b_proj(x).sigmoid(), output_final_state=True,
                                              use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(cache["blocks.0.mixer.hook_state"][:, -1], final.transpose(-1, -2), atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------- Gated DeltaNet


def reference_chunk_gated_delta_rule(q, k, v, g, beta, initial_state=None, output_final_state=False,
                                     use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                                     allow_neg_eigval=False, state_v_first=False, use_gate_in_kernel=False,
                                     A_log=None, dt_bias=None, cu_seqlens=None, **_):
    """fla's chunk_gated_delta_rule as its layer calls it, in torch (fla's chunked kernels do not
    run in the interpreter and its fused recurrent one has no backward): the in-kernel l2norm,
    beta sigmoid and gate of fla's kernels, GVA, and fla's own reference recurrence
    (fla.ops.gated_delta_rule.naive), so autograd gives the gradients."""
    from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule

    assert initial_state is None and cu_seqlens is None and use_gate_in_kernel  # final state: not returned
    group = v.shape[2] // q.shape[2]
    q, k = (x * torch.rsqrt(x.square().sum(-1, keepdim=True) + 1e-6) if use_qk_l2norm_in_kernel else x
            for x in (q, k))
    q, k = (x.repeat_interleave(group, dim=2) for x in (q, k))
    beta = beta.sigmoid() * (2.0 if allow_neg_eigval else 1.0) if use_beta_sigmoid_in_kernel else beta
    g = -A_log.float().exp() * F.softplus(g.float() + dt_bias)
    o, _ = naive_recurrent_gated_delta_rule(q, k, v, beta, g)
    return o.to(v.dtype), None


@pytest.mark.parametrize("overrides", [
    {},
    dict(num_v_heads=4, allow_neg_eigval=True, output_gate_activation="sigmoid", tie_word_embeddings=True),
    dict(use_gate=False, use_short_conv=False, expand_v=2.0, norm_eps=1e-3),
])
def test_gated_deltanet_parity(overrides, monkeypatch):
    """The forward against fla's fused recurrent Triton kernel (no gradient: it has no backward;
    T = 72 for the first config, 24 for the others, to keep the interpreter's time down), then
    logits, blocks and gradients at T = 72 with the layer's chunk kernel replaced by the torch
    reference above (forced in grad mode), which first reproduces the Triton kernel's logits."""
    source = gated_source(**overrides)
    model = models.from_pretrained(source)
    assert model.cfg.mixer == "gated_deltanet"
    short = tokens(length=T if not overrides else 24)
    with torch.no_grad():
        logits = source(short).logits
        for path in ("fast", "instrumented"):
            torch.testing.assert_close(model.set_execution_path(path)(short), logits, atol=1e-4, rtol=0)
    model.set_execution_path("auto")
    import fla.layers.gated_deltanet as layer_module

    monkeypatch.setattr(layer_module, "chunk_gated_delta_rule", reference_chunk_gated_delta_rule)
    reference = source_run(source, short, torch.zeros(*short.shape, VOCAB))[0]
    torch.testing.assert_close(reference, logits, atol=1e-5, rtol=0)
    assert_parity(source, model, tokens(batch=2), atol=1e-4)


def test_gated_deltanet_state_patch_propagates_causally():
    model = models.from_pretrained(gated_source(num_v_heads=4))
    assert_causal_state_patch(model, tokens(), "blocks.1.mixer.hook_state", 20, (4, 8, 8))  # [HV, V, K]


# ----------------------------------------------------------------------------- both


@pytest.mark.parametrize("make", [deltanet_source, gated_source])
def test_round_trip_is_bit_identical(make, tmp_path):
    assert_round_trip(models.from_pretrained(make()), tmp_path / "run", tokens(length=20))


def test_from_a_checkpoint_directory(tmp_path):
    source = gated_source()
    source.save_pretrained(tmp_path / "ckpt")
    model = models.from_pretrained(tmp_path / "ckpt")
    with torch.no_grad():
        torch.testing.assert_close(model(tokens()), source(tokens()).logits, atol=1e-4, rtol=0)


def with_config(source, **fields):
    for name, value in fields.items():
        setattr(source.config, name, value)
    return source


@pytest.mark.parametrize("make, message", [
    (lambda: deltanet_source(qk_activation="relu"), "qk_activation='relu'"),
    (lambda: deltanet_source(qk_norm="sum"), "qk_norm='sum'"),
    (lambda: deltanet_source(use_beta=False), "use_beta=False"),
    (lambda: deltanet_source(expand_v=2.0), "expand_v=2.0.*expand_k=1.0"),
    (lambda: with_config(gated_source(), attn={"layers": [1], "num_heads": 2}), "attn="),  # (needs flash-attn to build)
    (lambda: with_config(gated_source(), attnres_block_size=2), "attnres_block_size=2"),
])
def test_config_we_cannot_represent_raises(make, message):
    with pytest.raises(UnsupportedConfig, match=message):
        models.from_pretrained(make())
