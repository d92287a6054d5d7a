"""The fla-sourced imports (DeltaNet, Gated DeltaNet, RWKV-7) continue their SOURCE model from a
patched state at float32 rounding, fla on its own Triton kernels under TRITON_INTERPRET=1.

As tests/test_import_continuation.py does for the transformers imports: a prompt runs through
fla's model (its own Cache) and through ours (models.decoding.step.advance); the same random delta
goes into both: every layer's recurrent state (fla's layers start their fused recurrent kernel from
cache[l]["recurrent_state"], S [K, V] for DeltaNet and RWKV-7, [V, K] for Gated DeltaNet
(state_v_first), and store the final one there) and every carried window (the ShortConvolutions'
conv_state (q, k, v) [B, C, W], of which ours holds the last W - 1 inputs; RWKV-7's token shifts
conv_state and ffn_state [B, D], the last normed input). Then a few tokens continue in one call
and the logits must agree to a few float32 ulps of their scale. Each family also runs with
norm_eps away from its default, so an eps (the blocks' norms, the output norm, RWKV-7's GroupNorm
at head_dim * norm_eps) that the importer read from the wrong place, or a kernel constant (the
l2 norms' 1e-6: in fla's delta-rule kernels, in its fused l2_norm for RWKV-7's removal key with
fuse_norm, whose keys are made small on one head here so that it binds) it takes wrongly, fails
here."""

import pytest
import torch

import models
from models.decoding.step import advance
from tests.conftest import triton_interpreter_available
from tests.fla_interpreter import single_config_autotune
from tests.test_import_continuation import NEW, PROMPT, REL, patch_both, tokens
from tests.test_interop_fla import deltanet_source, gated_source
from tests.test_rwkv7 import rwkv7_source

pytestmark = [pytest.mark.triton, pytest.mark.skipif(not triton_interpreter_available(),
                                                     reason="triton not importable (or no GPU and no TRITON_INTERPRET)")]

FAMILIES = {
    "delta_net": lambda: deltanet_source(use_gate=True, allow_neg_eigval=True),
    "delta_net_eps": lambda: deltanet_source(norm_eps=1e-3, use_short_conv=False),
    "gated_deltanet": gated_source,
    "gated_deltanet_gva_eps": lambda: gated_source(num_v_heads=4, allow_neg_eigval=True, norm_eps=1e-3,
                                                   output_gate_activation="sigmoid"),
    "rwkv7": lambda: small_removal_keys(rwkv7_source(num_hidden_layers=2)),
    "rwkv7_fused_eps": lambda: small_removal_keys(rwkv7_source(num_hidden_layers=2, fuse_norm=True,
                                                               norm_eps=1e-3)),
}


def small_removal_keys(source: torch.nn.Module) -> torch.nn.Module:
    """Every RWKV-7 layer's k_k on its first head times 1e-3, so that head's removal key k * k_k
    has |.|^2 near 1e-6: the l2 norm's eps (fla's fused l2_norm: 1e-6; F.normalize: none) binds."""
    with torch.no_grad():
        for layer in source.model.layers:
            layer.attn.k_k[: layer.attn.head_dim] *= 1e-3
    return source


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch):
    single_config_autotune(monkeypatch)


def short_conv_pairs(ours: torch.Tensor, conv_state) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Our [q | k | v] conv window [B, C, W - 1] against fla's three conv_state [B, c, W] (their
    last W - 1 inputs); none without short convs."""
    if conv_state is None:
        return []
    pairs, lo = [], 0
    for theirs in conv_state:
        width = theirs.shape[1]
        pairs.append((ours[:, lo:lo + width], theirs[..., 1:]))
        lo += width
    return pairs


def delta_pairs(state, cache, flipped: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(our entry, fla's) views of every DeltaNet / Gated DeltaNet layer (one fla layer per block)."""
    pairs = []
    for layer, entries in enumerate(state.trimmed()):
        theirs = cache[layer]
        recurrent = theirs["recurrent_state"]
        pairs.append((entries["state"], recurrent.transpose(-1, -2) if flipped else recurrent))
        pairs += short_conv_pairs(entries["conv"], theirs["conv_state"])
    return pairs


def rwkv7_pairs(state, cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """fla layer l is our blocks 2l (time mix: S transposed, the token shift [B, D, 1]) and 2l + 1
    (channel mix: its window [B, D, 2] of which the last column is what the next token shifts in)."""
    pairs = []
    for layer in range(len(state.layers) // 2):
        time_mix, channel_mix, theirs = state.layers[2 * layer], state.layers[2 * layer + 1], cache[layer]
        pairs += [(time_mix["state"], theirs["recurrent_state"].transpose(-1, -2)),
                  (time_mix["conv"][..., -1], theirs["conv_state"]),
                  (channel_mix["state"][..., -1], theirs["ffn_state"])]
    return pairs


def patched_pairs(state, cache, family: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if family.startswith("rwkv7"):
        return rwkv7_pairs(state, cache)
    return delta_pairs(state, cache, flipped=family.startswith("delta_net"))


def continued(source, model, family):
    """(ours, fla's) logits [B, NEW, V] after the prompt, both continued from the same patched
    state in one call, fla's unpatched ones (its full forward), and the pairs patched (checked
    equal before the patch: the views are the same entries)."""
    sequence = tokens(PROMPT + NEW)
    prompt, rest = sequence[:, :PROMPT], sequence[:, PROMPT:]
    with torch.no_grad():
        _, state = advance(model, prompt)
        cache = source(input_ids=prompt, use_cache=True).past_key_values
        pairs = patched_pairs(state, cache, family)
        for ours, theirs in pairs:
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
        patch_both(pairs)
        ours, _ = advance(model, rest, state, all_logits=True)
        theirs = source(input_ids=rest, past_key_values=cache, use_cache=True).logits
        clean = source(input_ids=sequence).logits[:, PROMPT:]
    return ours, theirs, clean, pairs


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_continuing_fla_from_a_patched_state_agrees_at_float32_rounding(family):
    source = FAMILIES[family]()
    model = models.from_pretrained(source)
    ours, theirs, clean, pairs = continued(source, model, family)
    scale = theirs.abs().max()
    assert pairs and (theirs - clean).abs().max() > 1e-3 * scale  # the patch moves what follows
    error = ((ours - theirs).abs().max() / scale).item()
    assert error <= REL, f"{family}: continued logits differ by {error:.2e} of their scale"
