"""TransformerLens hook names and cache keys, translated to ours.

A TransformerLens (TL) user may write TL's names wherever a hook name is taken
(`run_with_hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", fn)])`, `run_with_cache(names=...)`,
`model.hook_point(...)`) and TL's cache keys on a Cache (`cache["blocks.0.ln1.hook_scale"]`,
`cache["q", 0, "attn"]`, `cache["scale", 0, "ln1"]`, `cache["resid_pre", 0, None]`,
`cache["embed"]`, `cache["k6"]`, `cache["scale4ln1"]`: TL's `utils.get_act_name` shorthand). Each
resolves to our name where the concept exists; a TL name whose concept we lack raises
`NoCounterpart` (a KeyError, also a ValueError), saying so and naming what to read instead.

TL (HookedTransformer / TransformerBridge in compatibility mode)  ->  ours (l: the layer)

    hook_embed                          hook_embed (ours: token + learned position embedding,
                                        TL's: token only; equal when positional != "learned"); TL's
                                        value is our hook_token_embed (learned positions only)
    hook_pos_embed                      the same (learned positions only): [B, T, D]
    blocks.l.hook_resid_pre|mid|post    the same
    blocks.l.hook_attn_out              blocks.l.mixer.hook_out
    blocks.l.hook_mlp_out               blocks.l.mlp.hook_out
    blocks.l.ln1.hook_scale             blocks.l.norm_mixer.hook_scale
    blocks.l.ln2.hook_scale             blocks.l.norm_mlp.hook_scale
    ln_final.hook_scale                 norm_final.hook_scale
    blocks.l.ln1|ln2.hook_normalized,   no hook: TL's is (x - mean) / hook_scale before the gain and
    ln_final.hook_normalized            bias; a Cache computes it from the cached residual
                                        (hook_resid_pre, hook_resid_mid, the last hook_resid_post)
                                        and scale. The norm's output (gain and bias applied) is
                                        blocks.l.mixer.hook_in, hook_final.
    blocks.l.attn.hook_X                blocks.l.mixer.hook_X (q, k, v, z, attn_scores, pattern,
                                        result, in, out; q and k before the rotary map in both; the
                                        attention and mla mixers alike, tests/test_tl_mla.py);
                                        blocks.l.mixer2.hook_X where only the parallel mixer2 has it
                                        (Falcon-H1: TL's attn is our mixer2, its mamba our mixer)
    blocks.l.attn.hook_rot_q|rot_k      none: we rotate inside the mixer
    blocks.l.mlp.hook_pre|post          the same (swiglu: hook_pre is gate(x), as TL's)
    blocks.l.mlp.hook_pre_linear|mid    none
    blocks.l.hook_attn_in|q_input|      blocks.l.mixer.hook_attn_in|q_input|k_input|v_input (mixer2 as
    k_input|v_input (and TL's            for attn): per-head copies of the residual before the norm,
    blocks.l.attn.hook_*)                [B, T, H, D] (k / v: [B, T, G, D], G key/value heads), each
                                        normed per head; opt-in (by name only, as TL's flags),
                                        models.mixers.attention
    blocks.l.hook_mlp_in                the same: the MLP's input before norm_mlp (patching it changes
                                        the MLP's input only, not the residual stream)
    blocks.l.mlp.gate.hook_out          a sparse MLP's blocks.l.mlp.hook_router_logits (TL's [B T, E]:
                                        batch and positions flattened); a gated dense MLP's hook_pre
    blocks.l.mlp.hook_expert_indices    the same name: the k chosen experts, ours [B, T, k], TL's [B T, k]
    blocks.l.mlp.hook_expert_weights    the same name, another layout: ours the k chosen slots' routing
                                        weights [B, T, k]; TL's [B T, E] those weights scattered to their
                                        experts (zeros elsewhere), i.e. ours scattered by the indices

TL 4.3's bridge names, and its Mamba / Mamba-2 (SSM block) names:

    blocks.l.hook_in | blocks.l.hook_out  blocks.l.hook_resid_pre | hook_resid_post
    blocks.l.ln1|norm.hook_in             blocks.l.hook_resid_pre (norm: an SSM block's one norm)
    blocks.l.ln2.hook_in                  blocks.l.hook_mlp_in (its value is hook_resid_mid's, its
                                          gradient the MLP branch's: TL's hook_resid_mid_grad)
    blocks.l.ln1|norm.hook_out,           blocks.l.mixer.hook_in
    blocks.l.hook_mixer_in
    blocks.l.norm.hook_scale|normalized   blocks.l.norm_mixer.hook_scale (normalized: computed, as ln1's)
    blocks.l.hook_mixer_out,              blocks.l.mixer.hook_out
    mixer.hook_ssm_out, out_proj.hook_out
    blocks.l.mixer.hook_ssm_state         blocks.l.mixer.hook_state: Mamba's ours [B, T, E, N], TL's
                                          [B, E, T, N]; Mamba-2's [B, T, H, P, N] both. A patch of ours
                                          propagates to later steps (a causal state patch); TL's changes
                                          only that step's read-out (its propagating edit is hook_ssm_write)
    blocks.l.mixer.hook_inner_norm,       blocks.l.mixer.hook_z (Mamba-2): out_proj's input, ours
    inner_norm.hook_out, out_proj.hook_in  [B, T, H, P], TL's [B, T, E] (E = H P, flattened)
    blocks.l.mixer.hook_conv              the same name, another value: TL's is the conv's raw output
                                          [B, C, T + W - 1] before the SiLU, ours SiLU(conv) [B, T, C]
    mixer.hook_ssm_write, hook_in_proj,   none (NoCounterpart says what to read: hook_state,
    hook_x_proj, hook_dt_proj, hook_ssm_dt hook_conv, hook_gate, hook_dt = softplus(TL's hook_ssm_dt))
    (pre-softplus), conv1d.*, inner_norm.hook_in|gate
    embed.hook_out | unembed.hook_in,     hook_token_embed (else hook_embed) | hook_final |
    ln_final.hook_out | hook_unembed        hook_final | hook_logits

Short names (get_act_name): "embed" -> hook_embed, "q" / "k" / "v" / "z" / "result" / "pattern" /
"attn_scores" (and "attn", "attn_logits", "query", "key", "value") take the "attn" layer type,
"pre" / "post" / "mid" / "pre_linear" (and "mlp_pre", "mlp_post") the "mlp" one; "scale" and
"normalized" without a layer mean ln_final; layer types "a" / "attention" are "attn", "m" is "mlp".
Our own layer types also work in tuples: `cache["scale", 0, "norm_mlp"]`, `cache["state", 1]`.
A "_grad" suffix carries through (`cache["blocks.0.attn.hook_pattern_grad"]`). Where a TL name has
two readings (attn: mixer or mixer2; mlp.gate.hook_out: router logits or hook_pre), the first of
them the model (or the cache) has is taken.
"""

from __future__ import annotations

import re

# TL's get_act_name tables (transformer_lens.utilities.components_utils)
_ACT_ALIASES = {"attn": "pattern", "attn_logits": "attn_scores", "key": "k", "query": "q", "value": "v",
                "mlp_pre": "pre", "mlp_mid": "mid", "mlp_post": "post"}
_LAYER_TYPE_ALIASES = {"a": "attn", "m": "mlp", "b": "", "block": "", "blocks": "", "attention": "attn"}
_ATTN_NAMES = ("k", "v", "q", "z", "rot_k", "rot_q", "result", "pattern", "attn_scores")
_MLP_NAMES = ("pre", "post", "mid", "pre_linear")

# (TL pattern, our name with {l} (or its readings in order of preference) or None, why there is
# none). Tried in order; the first match wins.
_RULES: list[tuple[str, str | tuple[str, ...] | None, str]] = [
    (r"blocks\.(\d+)\.hook_attn_out", "blocks.{l}.mixer.hook_out", ""),
    (r"blocks\.(\d+)\.hook_mlp_out", "blocks.{l}.mlp.hook_out", ""),
    (r"blocks\.(\d+)\.ln1\.hook_scale", "blocks.{l}.norm_mixer.hook_scale", ""),
    (r"blocks\.(\d+)\.ln2\.hook_scale", "blocks.{l}.norm_mlp.hook_scale", ""),
    (r"ln_final\.hook_scale", "norm_final.hook_scale", ""),
    (r"blocks\.(\d+)\.norm\.hook_scale", "blocks.{l}.norm_mixer.hook_scale", ""),
    (r"blocks\.(\d+)\.(?:ln1|norm)\.hook_in|blocks\.(\d+)\.hook_in", "blocks.{l}.hook_resid_pre", ""),
    (r"blocks\.(\d+)\.(?:ln1|norm)\.hook_out|blocks\.(\d+)\.(?:hook_mixer_in|mixer\.hook_in)",
     "blocks.{l}.mixer.hook_in", ""),
    (r"blocks\.(\d+)\.(?:hook_mixer_out|mixer\.hook_ssm_out|mixer\.out_proj\.hook_out)", "blocks.{l}.mixer.hook_out", ""),
    (r"blocks\.(\d+)\.hook_out", "blocks.{l}.hook_resid_post", ""),
    (r"blocks\.(\d+)\.ln2\.hook_in", "blocks.{l}.hook_mlp_in", ""),
    (r"blocks\.(\d+)\.mixer\.hook_ssm_state", "blocks.{l}.mixer.hook_state", ""),
    (r"blocks\.(\d+)\.mixer\.(?:hook_inner_norm|inner_norm\.hook_out|out_proj\.hook_in)", "blocks.{l}.mixer.hook_z", ""),
    (r"blocks\.(\d+)\.mixer\.hook_ssm_write", None,
     "TL's per-step write dt_t x_t B_t (a patch there re-runs its scan); we hook the states themselves: a "
     "blocks.{l}.mixer.hook_state patch at step t propagates to every later step"),
    (r"blocks\.(\d+)\.mixer\.(?:hook_in_proj|in_proj\.hook_\w+|conv1d\.hook_\w+|hook_x_proj|x_proj\.hook_\w+)",
     None, "we do not hook in_proj's raw output, the conv before its SiLU or x_proj's (dt_low, B, C): "
           "blocks.{l}.mixer.hook_conv is SiLU(conv) [B, T, C], hook_gate SiLU(z) [B, T, E]"),
    (r"blocks\.(\d+)\.mixer\.(?:hook_dt_proj|hook_ssm_dt|dt_proj\.hook_\w+)", None,
     "TL's is dt_proj's output before the softplus; ours, blocks.{l}.mixer.hook_dt, is after it (the step size)"),
    (r"blocks\.(\d+)\.mixer\.inner_norm\.hook_(?:in|gate)", None,
     "the gated norm's inputs (y, z): ours are hook_gate = SiLU(z) and, after the norm, hook_z"),
    (r"embed\.hook_out", ("hook_token_embed", "hook_embed"), ""),
    (r"embed\.hook_in", None, "TL's is the token ids, the input; we hook from the embedding on (hook_embed)"),
    (r"ln_final\.hook_in", None, "TL's is the last block's output: read blocks.{{L - 1}}.hook_resid_post"),
    (r"(?:unembed\.hook_in|ln_final\.hook_out)", "hook_final", ""),
    (r"(?:hook_unembed|unembed\.hook_out)", "hook_logits", ""),
    (r"(?:blocks\.(\d+)\.(?:ln[12]|norm)|ln_final)\.hook_normalized", None,
     "TL's hook_normalized is the centred input divided by hook_scale, before the gain and bias; "
     "our norms hook only the scale (a Cache computes hook_normalized from the cached residual and "
     "scale; the norm's output, with them, is what the next module reads: mixer.hook_in after ln1, "
     "hook_final after ln_final)"),
    (r"blocks\.(\d+)\.attn\.hook_rot_[qk]", None,
     "we rotate queries and keys inside the mixer; blocks.{l}.mixer.hook_q / hook_k are before the "
     "rotation, as TL's hook_q / hook_k"),
    (r"blocks\.(\d+)\.attn\.hook_(\w+)", ("blocks.{l}.mixer.hook_{x}", "blocks.{l}.mixer2.hook_{x}"), ""),
    (r"blocks\.(\d+)\.mlp\.gate\.hook_out", ("blocks.{l}.mlp.hook_router_logits", "blocks.{l}.mlp.hook_pre"), ""),
    (r"blocks\.(\d+)\.hook_(attn_in|[qkv]_input)", ("blocks.{l}.mixer.hook_{x}", "blocks.{l}.mixer2.hook_{x}"), ""),
    (r"blocks\.(\d+)\.mlp\.hook_(mid|pre_linear)", None,
     "our MLPs have hook_pre (the pre-activation; gate(x) for swiglu), hook_post and hook_out"),
]
_COMPILED = [(re.compile(pattern), ours, why) for pattern, ours, why in _RULES]


class NoCounterpart(KeyError, ValueError):
    """A TransformerLens name whose concept this toolkit lacks (a KeyError for cache lookups, a
    ValueError for hook names, as our unknown names are)."""

    def __str__(self) -> str:  # KeyError's own str() would quote the message
        return str(self.args[0]) if self.args else ""


def tl_act_name(name: str, layer: int | str | None = None, layer_type: str | None = None) -> str:
    """TransformerLens' utils.get_act_name: shorthand -> a TL hook name ("k6" ->
    "blocks.6.attn.hook_k", ("scale", 4, "ln1") -> "blocks.4.ln1.hook_scale", "embed" ->
    "hook_embed"); a full name is returned as it is."""
    if ("." in name or name.startswith("hook_")) and layer is None and layer_type is None:
        return name
    match = re.match(r"([a-z]+)(\d+)([a-z]?.*)", name)
    if match is not None:
        name, layer, layer_type = match.groups(0)  # type: ignore[assignment]
    name = _ACT_ALIASES.get(name, name)
    full = "" if layer is None else f"blocks.{layer}."
    if name in _ATTN_NAMES:
        layer_type = "attn"
    elif name in _MLP_NAMES:
        layer_type = "mlp"
    elif layer_type in _LAYER_TYPE_ALIASES:
        layer_type = _LAYER_TYPE_ALIASES[layer_type]
    if layer_type:
        full += f"{layer_type}."
    full += f"hook_{name}"
    if name in ("scale", "normalized") and layer is None:
        full = f"ln_final.{full}"
    return full


def to_ours(name: str, known=None) -> str:
    """Our hook name for a TransformerLens one (a "_grad" suffix kept); any other name unchanged.
    known: the names there are (a model's hook_dict, a cache's keys), which pick among a TL name's
    readings (the first otherwise). Raises NoCounterpart for a TL name whose concept we lack."""
    base, grad = (name[: -len("_grad")], "_grad") if name.endswith("_grad") else (name, "")
    for pattern, ours, why in _COMPILED:
        match = pattern.fullmatch(base)
        if match is None:
            continue
        groups = match.groups()
        layer = next((g for g in groups if g is not None and g.isdigit()), "")  # alternatives: one group each
        if ours is None:
            raise NoCounterpart(f"{name!r} is a TransformerLens name with no counterpart here: "
                                f"{why.format(l=layer or 0)}")
        readings = [o.format(l=layer, x=groups[-1] if len(groups) > 1 else "") + grad
                    for o in ((ours,) if isinstance(ours, str) else ours)]
        return next((r for r in readings if known is not None and r in known), readings[0])
    return name


def normalized_inputs(name: str, n_layers: int) -> tuple[str, str] | None:
    """For a TL hook_normalized name (ln1, ln2, an SSM block's norm, ln_final): (our residual it
    normalises, our hook_scale of that norm); else None."""
    match = re.fullmatch(r"(?:blocks\.(\d+)\.(ln[12]|norm)|ln_final)\.hook_normalized", name)
    if match is None:
        return None
    layer, norm = match.groups()
    if norm is None:
        return f"blocks.{n_layers - 1}.hook_resid_post", "norm_final.hook_scale"
    resid, ours = ("resid_mid", "norm_mlp") if norm == "ln2" else ("resid_pre", "norm_mixer")
    return f"blocks.{layer}.hook_{resid}", f"blocks.{layer}.{ours}.hook_scale"


def act_name(name: str, layer: int | str | None = None, layer_type: str | None = None, known=None,
             tl: bool = False) -> str:
    """get_act_name shorthand or a TL name -> our hook name (NoCounterpart where we have none);
    known as in to_ours. tl=True: TL's own string (utils.get_act_name's), which every name-taking
    call here takes as well."""
    full = tl_act_name(name, layer, layer_type)
    return full if tl else to_ours(full, known)


get_act_name = tl_act_name  # TransformerLens' utils.get_act_name: TL's strings
