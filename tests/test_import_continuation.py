"""Each imported family continues its SOURCE model from a patched state at float32 rounding.

A prompt runs through the transformers source (its own cache) and through ours
(models.decoding.step.advance); the same patch goes into both: every recurrent layer's state
replaced, every attention layer's cached keys and values at one position moved; then a few tokens
continue in one call (the source's chunked scan, which applies its dt clamp) and the logits must
agree to a few float32 ulps of their scale. Mamba-2 dt_bias spreads over softplus^-1 of [1e-4, 1.3],
so the dt clamps at time_step_min / time_step_limit bind for some heads and not for others: a
constant read from the wrong config field (NemotronH's time_step_min in place of time_step_limit)
fails here."""

import importlib

import pytest
import torch

import models
from models.decoding.step import advance
from tests.interop_parity import VOCAB
from tests.test_interop import falcon_mamba_source, gpt2_source, jamba_source, llama_source, mamba_source
from tests.test_interop_hybrid import (bamba_source, falcon_h1_source, granite_moe_source, granite_source,
                                       nemotron_h_source, zamba2_source)
from tests.test_interop_kimi import kimi_source
from tests.test_interop_lfm2 import lfm2_source
from tests.test_interop_mamba2 import mamba2_source
from tests.test_interop_qwen import next_source, qwen35_moe_source, qwen35_source
from tests.test_interop_qwen3 import qwen3_moe_source, qwen3_source

tf = pytest.importorskip("transformers")
PROMPT, NEW = 24, 8  # the prompt beyond the sources' scan chunks (16), the tokens continued in one call
# |ours - source| / max |source logits|: a few float32 ulps of the logits' scale (measured 1.4e-7 (GPT-2)
# to 1.3e-6 (Zamba2), 3.1e-6 (Qwen3.5-MoE), 3.3e-6 (Kimi Linear); NemotronH with the old time_step_min
# clamp: 3.9e-5)
REL = 5e-6
GDN_KERNELS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
               "causal_conv1d_update")
KERNELS = {"qwen3_next": GDN_KERNELS, "qwen3_5": GDN_KERNELS, "qwen3_5_moe": GDN_KERNELS,
           "kimi_linear": ("chunk_kda", "fused_recurrent_kda", "fused_kda_gate", "causal_conv1d_fn",
                           "causal_conv1d_update")}
FAMILIES = {"mamba": mamba_source, "falcon_mamba": falcon_mamba_source, "jamba": jamba_source,
            "mamba2": mamba2_source, "nemotron_h": nemotron_h_source, "bamba": bamba_source,
            "granitemoehybrid": granite_source, "granite_moe": granite_moe_source, "falcon_h1": falcon_h1_source,
            "zamba2": zamba2_source, "gpt2": gpt2_source, "llama": llama_source, "qwen3": qwen3_source,
            "qwen3_moe": qwen3_moe_source, "qwen3_next": next_source, "qwen3_5": qwen35_source,
            "qwen3_5_moe": qwen35_moe_source, "kimi_linear": kimi_source,
            "lfm2": lfm2_source,
            # constants away from their defaults: a limit that binds, a norm eps the gated norm must not read
            "nemotron_h_limit": lambda: nemotron_h_source(time_step_limit=(0.01, 0.5)),
            "zamba2_rms_eps": lambda: zamba2_source(rms_norm_eps=1e-3)}
STEPWISE = ("mamba", "falcon_mamba", "jamba")  # transformers' Mamba-1 scan starts a multi-token call from zeros


def recurrent_state(cache, layer: int) -> torch.Tensor:
    return cache.get_recurrent_state(layer, state_idx=0)


def flipped_state(cache, layer: int) -> torch.Tensor:
    return recurrent_state(cache, layer).transpose(-1, -2)  # the source's [H, K, V] as our [H, V, K]


def conv_window(cache, layer: int) -> torch.Tensor:
    return cache.get_conv_state(layer)  # [B, C, W]: LFM2's short-conv window, our hook_state


# family -> the source cache's entry our layer's "state" is (a view, in our layout)
STATES = {"qwen3_next": flipped_state, "qwen3_5": flipped_state, "qwen3_5_moe": flipped_state,
          "kimi_linear": flipped_state, "lfm2": conv_window}


@pytest.fixture(autouse=True)
def torch_kernels(monkeypatch):
    """transformers' torch reference functions in place of fla's Triton kernels (GPU only)."""
    for family, names in KERNELS.items():
        module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        for name in names:
            if hasattr(module, name):
                function = getattr(module, name)
                monkeypatch.setattr(module, name, getattr(function, "__wrapped__", function))


def spread_dt_bias(source: torch.nn.Module) -> torch.nn.Module:
    """Every Mamba-2 dt_bias [H] over softplus^-1 of [1e-4, 1.3] (the clamps bind on some heads)."""
    with torch.no_grad():
        for name, p in source.named_parameters():
            if name.endswith("mamba.dt_bias") or name.endswith("mixer.dt_bias"):
                p.copy_(torch.linspace(-9.0, 1.0, p.numel()))
    return source


def tokens(length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, VOCAB, (2, length), generator=torch.Generator().manual_seed(seed))


def source_cache_of(out):
    return out.cache if hasattr(out, "cache") else out.past_key_values


def patched_pairs(state, cache, family: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(our entry, the source's) views to patch: every recurrent state, every attention layer's
    cached keys and values at position 5 where the source caches them as we do (not Kimi's MLA,
    which caches its latent)."""
    source_state = STATES.get(family, recurrent_state)
    pairs = []
    for layer, entries in enumerate(state.trimmed()):
        for key, ours in entries.items():
            entry = key.rsplit(".", 1)[-1]
            if entry == "state":
                pairs.append((ours, source_state(cache, layer)))
            elif entry in ("keys", "values"):
                pairs.append((ours[:, :, 5], getattr(cache.layers[layer], entry)[:, :, 5]))
    return [(a, b) for a, b in pairs if a.shape == b.shape]


def patch_both(pairs, seed: int = 3) -> None:
    """Add the same random delta, scaled like the entry, to ours and the source's."""
    gen = torch.Generator().manual_seed(seed)
    for ours, theirs in pairs:
        delta = torch.randn(ours.shape, generator=gen) * ours.std()
        ours.add_(delta)
        theirs.add_(delta)


def continue_source(source, cache, rest: torch.Tensor, family: str) -> torch.Tensor:
    """The source's logits [B, n, V] for rest [B, n] from its cache: one call (its chunked scan), or
    one token a call where its multi-token scan cannot start from a cached state (Mamba-1)."""
    calls = rest.split(1, dim=1) if family in STEPWISE else [rest]
    logits = []
    for chunk in calls:
        start = PROMPT + sum(piece.shape[1] for piece in logits)
        positions = torch.arange(start, start + chunk.shape[1])[None].expand(chunk.shape[0], -1)
        out = source(input_ids=chunk, cache=cache, use_cache=True, position_ids=positions)
        cache = source_cache_of(out)
        logits.append(out.logits)
    return torch.cat(logits, dim=1)


def continued(source, model, family):
    """(ours, the source's) logits [B, NEW, V] of the tokens after the prompt, both continued from
    the same patched state, the source's unpatched ones (its full forward) and the number of
    entries patched."""
    sequence = tokens(PROMPT + NEW)
    prompt, rest = sequence[:, :PROMPT], sequence[:, PROMPT:]
    with torch.no_grad():
        _, state = advance(model, prompt)
        cache = source_cache_of(source(input_ids=prompt, use_cache=True))
        pairs = patched_pairs(state, cache, family)
        patch_both(pairs)
        ours, _ = advance(model, rest, state, all_logits=True)
        theirs = continue_source(source, cache, rest, family)
        clean = source(input_ids=sequence).logits[:, PROMPT:]
    return ours, theirs, clean, len(pairs)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_continuing_the_source_from_a_patched_state_agrees_at_float32_rounding(family):
    source = spread_dt_bias(FAMILIES[family]())
    model = models.from_pretrained(source)
    ours, theirs, clean, patched = continued(source, model, family)
    scale = theirs.abs().max()
    assert patched > 0 and (theirs - clean).abs().max() > 1e-3 * scale  # the patch moves what follows
    error = ((ours - theirs).abs().max() / scale).item()
    assert error <= REL, f"{family}: continued logits differ by {error:.2e} of their scale"
