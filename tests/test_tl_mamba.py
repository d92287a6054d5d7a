"""TransformerLens 4.3's Mamba / Mamba-2 names (its SSM bridges: blocks.{l}.norm, mixer.hook_ssm_*,
hook_mixer_in / out, inner_norm, the generic blocks.{l}.hook_in / hook_out, embed / unembed)
resolve to ours (models.tl.names): every value TL's bridge caches under a name we map equals ours
on the same float64 transformers weights, in TL's layout where the table says it differs (skipped
without TL)."""

import copy
import tempfile

import pytest
import torch

import models
from models.tl.names import NoCounterpart, to_ours
from tests.test_interop import mamba_source
from tests.test_interop_mamba2 import mamba2_source

MAPPED = {
    "blocks.1.norm.hook_scale": "blocks.1.norm_mixer.hook_scale",
    "blocks.1.norm.hook_in": "blocks.1.hook_resid_pre", "blocks.1.hook_in": "blocks.1.hook_resid_pre",
    "blocks.1.norm.hook_out": "blocks.1.mixer.hook_in", "blocks.1.hook_mixer_in": "blocks.1.mixer.hook_in",
    "blocks.1.hook_mixer_out": "blocks.1.mixer.hook_out", "blocks.1.mixer.hook_ssm_out": "blocks.1.mixer.hook_out",
    "blocks.1.mixer.out_proj.hook_out": "blocks.1.mixer.hook_out", "blocks.1.hook_out": "blocks.1.hook_resid_post",
    "blocks.1.mixer.hook_ssm_state": "blocks.1.mixer.hook_state",
    "blocks.1.mixer.hook_inner_norm": "blocks.1.mixer.hook_z", "blocks.1.mixer.out_proj.hook_in": "blocks.1.mixer.hook_z",
    "ln_final.hook_out": "hook_final", "unembed.hook_in": "hook_final", "hook_unembed": "hook_logits",
}
NONE_HERE = ["blocks.1.mixer.hook_ssm_write", "blocks.1.mixer.hook_in_proj", "blocks.1.mixer.conv1d.hook_out",
             "blocks.1.mixer.hook_x_proj", "blocks.1.mixer.hook_dt_proj", "blocks.1.mixer.hook_ssm_dt",
             "blocks.1.mixer.inner_norm.hook_gate", "embed.hook_in", "ln_final.hook_in"]
SAME_NAME_OTHER_VALUE = {"hook_conv"}  # TL's: the conv before its SiLU, [B, C, T + W - 1]; ours SiLU(conv) [B, T, C]


def test_tl_ssm_names_translate():
    for tl, ours in MAPPED.items():
        assert to_ours(tl) == ours and to_ours(tl + "_grad") == ours + "_grad"
    for name in NONE_HERE:
        with pytest.raises(NoCounterpart, match="no counterpart here"):
            to_ours(name)
    assert to_ours("embed.hook_out", {"hook_embed"}) == "hook_embed"  # no learned positions: the embedding
    assert to_ours("embed.hook_out", {"hook_token_embed", "hook_embed"}) == "hook_token_embed"


def bridge_and_ours(make):
    bridge_module = pytest.importorskip("transformer_lens.model_bridge")
    source = make().double().eval()
    directory = tempfile.mkdtemp(prefix="tl-mamba-")
    source.save_pretrained(directory)
    bridge = bridge_module.TransformerBridge.boot_transformers(directory, hf_model=copy.deepcopy(source),
                                                               device="cpu", dtype=torch.float64)
    bridge.enable_compatibility_mode(no_processing=True, disable_warnings=True)
    for block in bridge.blocks:
        block.mixer.eager_scan = True  # TL's Python scan: hook_ssm_state fires (in float32)
    ids = torch.randint(0, source.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(1))
    return bridge, models.from_pretrained(source), ids


def in_tl_layout(name: str, mine: torch.Tensor, theirs: torch.Tensor) -> torch.Tensor:
    """Ours in TL's layout where the table says they differ: Mamba's hook_ssm_state [B, T, E, N]
    -> TL's [B, E, T, N]; Mamba-2's hook_z [B, T, H, P] -> TL's inner_norm [B, T, E]."""
    if name.endswith("hook_ssm_state") and mine.dim() == 4:
        return mine.transpose(1, 2)
    if mine.shape != theirs.shape and mine.numel() == theirs.numel():
        return mine.flatten(2)
    return mine


@pytest.mark.parametrize("make", [mamba_source, mamba2_source], ids=["mamba", "mamba2"])
def test_ssm_values_under_tl_names_equal_transformer_lens(make):
    """1e-5: transformers' Mamba RMSNorms compute in float32 even in a float64 model (the first
    norm's output is 1.4e-7 from ours on identical inputs) and TL's eager scan runs in float32."""
    bridge, model, ids = bridge_and_ours(make)
    with torch.no_grad():
        theirs_logits, theirs = bridge.run_with_cache(ids)
        logits, cache = model.run_with_cache(ids)
    torch.testing.assert_close(logits, theirs_logits.double(), atol=1e-5, rtol=0)  # (the eager scan: float32)
    compared = set()
    for name in theirs.keys():
        if name.rsplit(".", 1)[-1] in SAME_NAME_OTHER_VALUE:
            continue
        try:
            mine = cache[name]
        except KeyError:  # NoCounterpart, or ours of a hook this model lacks (Mamba's out_proj.hook_in: no hook_z)
            continue
        torch.testing.assert_close(in_tl_layout(name, mine, theirs[name]), theirs[name].to(mine.dtype), atol=1e-5,
                                   rtol=0, msg=name)
        compared.add(name.split(".", 2)[-1] if name.startswith("blocks.") else name)
    expected = {"hook_resid_pre", "norm.hook_scale", "norm.hook_normalized", "hook_mixer_in", "mixer.hook_ssm_state",
                "mixer.hook_ssm_out", "hook_out", "ln_final.hook_normalized", "hook_unembed"}
    assert expected <= compared
    if make is mamba2_source:
        assert "mixer.hook_inner_norm" in compared


@pytest.mark.parametrize("make", [mamba_source, mamba2_source], ids=["mamba", "mamba2"])
def test_hook_functions_under_tl_ssm_names_patch_as_tl(make):
    bridge, model, ids = bridge_and_ours(make)
    hooks = [("blocks.0.hook_mixer_out", lambda x, hook: 0.5 * x), ("blocks.1.norm.hook_out", lambda x, hook: x + 0.1)]
    with torch.no_grad():
        got = model.run_with_hooks(ids, fwd_hooks=hooks)
        torch.testing.assert_close(got, bridge.run_with_hooks(ids, fwd_hooks=hooks).double(), atol=1e-5, rtol=0)
        assert (got - model(ids)).abs().max() > 1e-2
