"""Residual-stream analyses of a Cache, with TransformerLens' ActivationCache signatures, argument
orders and numbers: on the same (unfolded) weights the same call gives TL 4.3's values
(tests/test_tl_cache.py, against its TransformerBridge, 1e-10 in float64). Our own readings are
one explicit argument away.

    accumulated_resid(layer, incl_mid, apply_ln, pos_slice, mlp_input, return_labels)
        [C, B, T, D] the residual before each block (and the final one); apply_ln at the final
        layer applies the final norm itself to each component (recompute_ln, TL's logit lens),
        elsewhere the cached scale of the norm there
    decompose_resid(layer, mlp_input, mode, apply_ln, pos_slice, incl_embeds, return_labels)
        "embed", "pos_embed" (learned positions), then per block "{l}_attn_out" ("{l}_mixer_out"
        for a mixer that is not attention) and "{l}_mlp_out"; they sum to the residual.
        split_embed=False: one "embed", our hook_embed (token + position)
    stack_head_results(layer, return_labels, incl_remainder, pos_slice, apply_ln)
        [L H, B, T, D] every head's hook_result ("L{l}H{h}"; a mixer without heads: its whole
        output "L{l}"); layer 0: an empty [0, B, T, D]
    stack_neuron_results(layer, pos_slice, neuron_slice, return_labels, incl_remainder, apply_ln,
        mlp_input)   [L F, B, T, D] every neuron's hook_post * W_out ("L{l}N{n}"); layer 0: empty.
        A sparse (MoE) layer: per routed slot j the chosen expert's neurons times the routing
        weight ("L{l}slot{j}N{n}"), the shared expert's times its gate ("L{l}sharedN{n}")
    get_full_resid_decomposition(layer, mlp_input, expand_neurons, apply_ln, pos_slice,
        return_labels)   TL's order: every head, every neuron (or "{l}_mlp_out"), "embed",
        "pos_embed", "bias" (the mixers' output biases and the MLPs'); they sum to the residual.
        layout="ours": embed, then per block its heads, "{l}_mixer_bias", its neurons, "{l}_mlp_bias"
    apply_ln_to_stack(stack, layer, mlp_input, pos_slice, batch_slice, has_batch_dim, recompute_ln)
        centred (LayerNorm) and divided by the cached scale, as TL: no gain (TL's models fold the
        gain into the next weights); gain=True multiplies by the norm's gain, the model's own
        norm then minus its bias. recompute_ln at the final layer: the final norm itself
    logit_attrs(stack, tokens, incorrect_tokens, pos_slice, batch_slice, has_batch_dim)
        [C, B, T]: the stack through apply_ln_to_stack at the final layer (as TL) dotted with the
        unembedding of tokens. apply_ln=False: the stack is already normalised; gain=True: with
        the final norm's gain, so the attributions of a decomposition sum to the logit minus the
        unembedding of the final norm's bias (the direct logit attribution of our unfolded model)
    get_neuron_results(layer, neuron_slice, pos_slice)   [B, T, n, D] one block's neurons
    stack_activation(name, layer, sublayer_type)   [L, ...] cache[name, l, sublayer_type] stacked
    logit_lens(layer, pos_slice)   [C, B, T, V] each accumulated residual through the final norm
        and the unembedding (TL 4.3's logit_lens is a different, keyword-driven tool)

Slices (pos_slice, batch_slice, neuron_slice) are TL's: None, an int (drops the axis; a neuron
int keeps it), a slice, a (start, stop[, step]) tuple or a list of indices.

Where we differ from TL on purpose: a remainder (incl_remainder) at layer 0 is the residual
before block 0 (TL reads the last block's output there); the bias of get_full_resid_decomposition
is read from the cache (each mixer output minus its heads), so a cache that keeps some heads only
(cache.heads) reports "rest" (bias and the heads not kept) instead. In a model without residual
connections (the stacked RNNs) the stream before a block is the previous block's output:
accumulated_resid, logit_lens, logit_attrs and apply_ln_to_stack read it the same way, and the
decompositions refuse.
"""

from __future__ import annotations

import torch
from torch import nn

MODES = ("all", "mixer", "attn", "mlp")


class ResidualAnalyses:
    """The residual analyses of models.cache.Cache (which supplies the mapping, model, n_layers,
    heads, positions and has_batch_dim)."""

    def _model(self, additive: bool = False) -> nn.Module:
        """The model; additive: the analysis sums components to the stream, so it needs a residual one."""
        if self.model is None:
            raise ValueError("this analysis needs the model: use the Cache from model.run_with_cache "
                             "(or Cache(store, model=model))")
        if additive and not self.model.cfg.residual:
            raise ValueError("residual decompositions need a residual model (cfg.residual=True); this one has "
                             "residual=False, so a block's output replaces its input and no components sum to it "
                             "(accumulated_resid, logit_lens and logit_attrs still apply)")
        return self.model

    def _layer(self, layer: int | None) -> int:
        n = self.n_layers
        if layer is None or layer == -1:
            return n
        if not isinstance(layer, int) or isinstance(layer, bool) or not 0 <= layer <= n:
            raise ValueError(f"layer must be None, -1 or an int in [0, n_layers={n}]; got {layer!r}")
        return layer

    def _resid(self, layer: int, mlp_input: bool = False) -> torch.Tensor:
        """The residual entering block `layer` (its MLP with mlp_input; layer = n_layers: the final one)."""
        if mlp_input:
            return self[f"blocks.{layer}.hook_resid_mid"]
        return self[f"blocks.{layer - 1}.hook_resid_post"] if layer == self.n_layers else self[f"blocks.{layer}.hook_resid_pre"]

    def accumulated_resid(self, layer: int | None = None, incl_mid: bool = False, apply_ln: bool = False,
                          pos_slice=None, mlp_input: bool = False, return_labels: bool = False,
                          recompute_ln: bool | None = None, gain: bool = False):
        """The residual stream before each block up to `layer` (None / -1: every block and the
        final residual) -> [C, B, T, D]; incl_mid adds each block's hook_resid_mid, mlp_input the
        mid of block `layer` itself. Labels "{l}_pre", "{l}_mid", "final_post". apply_ln: through
        the norm before `layer`, recomputed per component at the final layer (recompute_ln None:
        TL's choice; False: the cached scale there too)."""
        model = self._model()
        layer = self._layer(layer)
        components, labels = [], []
        for l in range(layer + 1):
            if l == len(model.blocks):
                components.append(self[f"blocks.{l - 1}.hook_resid_post"])
                labels.append("final_post")
                continue
            components.append(self[f"blocks.{l}.hook_resid_pre"])
            labels.append(f"{l}_pre")
            if (incl_mid and l < layer) or (mlp_input and l == layer):
                components.append(self[f"blocks.{l}.hook_resid_mid"])
                labels.append(f"{l}_mid")
        stack = take(torch.stack(components), -2, pos_slice, "pos_slice")
        if apply_ln:
            recompute = layer == len(model.blocks) if recompute_ln is None else recompute_ln
            stack = self.apply_ln_to_stack(stack, layer, mlp_input, pos_slice=pos_slice,
                                           has_batch_dim=self.has_batch_dim, recompute_ln=recompute, gain=gain)
        return (stack, labels) if return_labels else stack

    def decompose_resid(self, layer: int | None = None, mlp_input: bool = False, mode: str = "all",
                        apply_ln: bool = False, pos_slice=None, incl_embeds: bool = True,
                        return_labels: bool = False, split_embed: bool = True, gain: bool = False):
        """The residual before block `layer` (None: the final residual) as its components
        [C, B, T, D] (module docstring); mode "attn" (or "mixer") or "mlp" keeps one kind;
        mlp_input adds block `layer`'s mixer output."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}; got {mode!r}")
        model = self._model(additive=True)
        layer = self._layer(layer)
        if mlp_input and layer == len(model.blocks):
            raise ValueError(f"mlp_input=True needs a block's MLP: layer < n_layers={layer}; got layer={layer}")
        components, labels = self._embeds(split_embed) if incl_embeds else ([], [])
        for l in range(layer + (1 if mlp_input else 0)):
            if mode != "mlp":  # every mixer of the block: none (MLP-only), one, or two in parallel
                for slot, mixer in model.blocks[l].mixers.items():
                    components.append(self[f"blocks.{l}.{slot}.hook_out"])
                    labels.append(f"{l}_{_mixer_kind(mixer)}{slot[len('mixer'):]}_out")  # mixer2: "..2_out"
            if l < layer and mode in ("all", "mlp") and hasattr(model.blocks[l], "mlp"):
                components.append(self[f"blocks.{l}.mlp.hook_out"])
                labels.append(f"{l}_mlp_out")
        if not components:
            raise ValueError(f"no components for layer={layer}, mode={mode!r}, incl_embeds={incl_embeds}")
        return self._finish(components, labels, layer, pos_slice, apply_ln, return_labels, mlp_input=mlp_input,
                            gain=gain)

    def _embeds(self, split: bool) -> tuple[list[torch.Tensor], list[str]]:
        """["embed"] (our hook_embed), or with learned positions and split TL's ["embed",
        "pos_embed"]: the token part and model.pos_embed at the cached positions."""
        embed = self["hook_embed"]
        if not split or not hasattr(self.model, "pos_embed"):
            return [embed], ["embed"]
        kept = self.positions.get("hook_embed", range(embed.shape[-2]))
        index = torch.as_tensor(list(kept), dtype=torch.long, device=embed.device)
        pos = self.model.pos_embed.weight.to(embed)[index].expand_as(embed)  # [(B,) T, D]
        return [embed - pos, pos], ["embed", "pos_embed"]

    def stack_head_results(self, layer: int | None = -1, return_labels: bool = False,
                           incl_remainder: bool = False, pos_slice=None, apply_ln: bool = False, gain: bool = False):
        """Every head's output (hook_result) at the blocks before `layer` (None / -1: all)
        -> [C, B, T, D], labels "L{l}H{h}" (h: the model's head index, also when the cache keeps
        some heads only, cache.heads); a block whose mixer has no heads contributes its whole
        output ("L{l}"); a parallel mixer2's are "L{l}bH{h}" / "L{l}b", an MLP-only block has none.
        incl_remainder adds the residual minus their sum ("remainder")."""
        model = self._model()
        layer = self._layer(layer)
        components, labels = [], []
        for l in range(layer):
            for slot in model.blocks[l].mixers:
                tag, name = _tag(l, slot), f"blocks.{l}.{slot}.hook_result"
                if name in model.hook_dict:
                    heads = self[name].movedim(-2, 0)  # [H, B, T, D]
                    components.extend(heads.unbind(0))
                    labels.extend(f"{tag}H{h}" for h in self.heads.get(name, range(heads.shape[0])))
                else:
                    components.append(self[f"blocks.{l}.{slot}.hook_out"])
                    labels.append(tag)
        return self._finish(components, labels, layer, pos_slice, apply_ln, return_labels, incl_remainder, gain=gain)

    def stack_neuron_results(self, layer: int | None = -1, pos_slice=None, neuron_slice=None,
                             return_labels: bool = False, incl_remainder: bool = False, apply_ln: bool = False,
                             mlp_input: bool = False, gain: bool = False):
        """Every MLP neuron's contribution hook_post[..., n] * W_out[:, n] at the blocks before
        `layer` -> [C, B, T, D], labels "L{l}N{n}" (TL's argument order: pos_slice before
        neuron_slice). A sparse (MoE) layer contributes per routed slot j its chosen expert's
        neurons weighted as the layer weights them ("L{l}slot{j}N{n}") and its shared expert's
        gated ones ("L{l}sharedN{n}"); neuron_slice selects within each. mlp_input: the remainder
        and the norm are those before block `layer`'s MLP."""
        model = self._model()
        layer = self._layer(layer)
        if layer and not any(hasattr(model.blocks[l], "mlp") for l in range(layer)):
            raise ValueError(f"no MLP before layer {layer}: the model has mlp={model.cfg.mlp}")
        if isinstance(neuron_slice, int) and not isinstance(neuron_slice, bool):
            neuron_slice = [neuron_slice]  # TL: an int neuron_slice keeps the neuron axis
        components, labels = [], []
        for l in range(layer):
            if not hasattr(model.blocks[l], "mlp"):
                continue
            mine, their_labels = self._layer_neurons(l, neuron_slice)
            components += mine
            labels += their_labels
        return self._finish(components, labels, layer, pos_slice, apply_ln, return_labels, incl_remainder,
                            mlp_input=mlp_input, gain=gain)

    def _layer_neurons(self, layer: int, neuron_slice=None) -> tuple[list[torch.Tensor], list[str]]:
        """Block `layer`'s neuron components [B, T, D] each and their labels, group by group (a
        sparse MLP: its routed slots, then its shared expert)."""
        components, labels = [], []
        for tag, width, part in _neuron_groups(self.model.blocks[layer].mlp):
            neurons = take(torch.arange(width), 0, neuron_slice, "neuron_slice").tolist()
            result = self._group_neurons(layer, part, neurons)  # [B, T, n, D] ("routed": [B, T, k, n, D])
            slots = result.movedim(-3, 0).unbind(0) if part == "routed" else [result]
            for j, slot in enumerate(slots):
                components.extend(slot.movedim(-2, 0).unbind(0))
                labels.extend(f"L{layer}{tag}{j if part == 'routed' else ''}N{n}" for n in neurons)
        return components, labels

    def get_neuron_results(self, layer: int, neuron_slice=None, pos_slice=None, shared: bool = False) -> torch.Tensor:
        """Block `layer`'s neurons' contributions hook_post[..., n] * W_out[:, n] -> [B, T, n, D]
        (TL's: an int neuron_slice or pos_slice drops that axis). A sparse (MoE) layer: each
        routed slot's chosen expert's neurons times the slot's routing weight -> [B, T, k, n, D]
        (they sum over n to hook_expert_weights * hook_expert_out); shared=True: its shared
        expert's neurons times the shared gate -> [B, T, n, D]."""
        mlp = self._model().blocks[layer].mlp
        sparse = hasattr(mlp, "experts")
        if shared and not hasattr(mlp, "shared_expert"):
            raise ValueError(f"shared=True needs a sparse MLP with a shared expert; block {layer}'s MLP "
                             f"({type(mlp).__name__}) has none")
        part = "shared" if shared else ("routed" if sparse else "dense")
        drop = isinstance(neuron_slice, int) and not isinstance(neuron_slice, bool)
        result = self._group_neurons(layer, part, [neuron_slice] if drop else neuron_slice, pos_slice)
        return result.squeeze(-2) if drop else result

    def _group_neurons(self, layer: int, part: str, neuron_slice=None, pos_slice=None) -> torch.Tensor:
        """One group of block `layer`'s neurons (part "dense", "shared" or "routed"; neuron_slice a
        list, slice or None) -> [B, T, n, D] ("routed": [B, T, k, n, D])."""
        mlp, prefix = self._model().blocks[layer].mlp, f"blocks.{layer}.mlp"
        if part == "routed":
            post = take(self[f"{prefix}.hook_expert_post"], -3, pos_slice, "pos_slice")  # [B, T, k, F]
            weights = take(self[f"{prefix}.hook_expert_weights"], -2, pos_slice, "pos_slice")  # [B, T, k]
            index = take(self[f"{prefix}.hook_expert_indices"], -2, pos_slice, "pos_slice")  # [B, T, k]
            down = take(mlp.experts.down.to(post), -1, neuron_slice, "neuron_slice")  # [E, D, n]
            post = take(post, -1, neuron_slice, "neuron_slice") * weights[..., None].to(post)  # [B, T, k, n]
            return post[..., None] * down[index].transpose(-1, -2)  # [B, T, k, n, D]
        if part == "shared":
            post = self[f"{prefix}.shared_expert.hook_post"]
            if hasattr(mlp, "shared_gate"):
                post = post * self[f"{prefix}.hook_shared_gate"].to(post)  # [B, T, F] * [B, T, 1]
            mlp = mlp.shared_expert
        else:
            post = self[f"{prefix}.hook_post"]
        post = take(post, -2, pos_slice, "pos_slice")  # [B, T, F]
        w_out = mlp.down.weight.T.to(post)  # [F, D]
        post, w_out = take(post, -1, neuron_slice, "neuron_slice"), take(w_out, 0, neuron_slice, "neuron_slice")
        return post[..., None] * w_out

    def stack_activation(self, activation_name: str, layer: int | None = -1, sublayer_type: str | None = None):
        """cache[activation_name, l, sublayer_type] of every block before `layer` stacked -> [L, ...]."""
        layer = self._layer(layer)
        return torch.stack([self[activation_name, l, sublayer_type] for l in range(layer)])

    def get_full_resid_decomposition(self, layer: int | None = None, mlp_input: bool = False,
                                     expand_neurons: bool = True, apply_ln: bool = False, pos_slice=None,
                                     return_labels: bool = False, layout: str = "tl", gain: bool = False):
        """The residual before `layer` (mlp_input: before its MLP) as every head, every neuron (or
        MLP output), the embeddings and the biases, in TL's order (layout "tl") or block by block
        (layout "ours"); the components sum to the residual (module docstring)."""
        if layout not in ("tl", "ours"):
            raise ValueError(f"layout must be 'tl' or 'ours'; got {layout!r}")
        model = self._model(additive=True)
        layer = self._layer(layer)
        if mlp_input and layer == len(model.blocks):
            raise ValueError(f"mlp_input=True needs a block's MLP: layer < n_layers={layer}; got layer={layer}")
        parts = self._full_tl if layout == "tl" else self._full_ours
        components, labels = parts(model, layer, mlp_input, expand_neurons)
        return self._finish(components, labels, layer, pos_slice, apply_ln, return_labels, mlp_input=mlp_input,
                            gain=gain)

    def _full_tl(self, model, layer: int, mlp_input: bool, expand_neurons: bool):
        heads, labels = self.stack_head_results(layer + (1 if mlp_input else 0), return_labels=True)
        components = list(heads.unbind(0))
        bias = sum((self._mixer_rest(l, slot) for l in range(layer + (1 if mlp_input else 0))
                    for slot in model.blocks[l].mixers), torch.zeros_like(self["hook_embed"]))
        mlps = [l for l in range(layer) if hasattr(model.blocks[l], "mlp")]
        if mlps and expand_neurons:
            neurons, neuron_labels = self.stack_neuron_results(layer, return_labels=True)
            components += list(neurons.unbind(0))
            labels += neuron_labels
            bias = bias + sum(self._mlp_bias(l, bias) for l in mlps)
        elif mlps:
            components += [self[f"blocks.{l}.mlp.hook_out"] for l in mlps]
            labels += [f"{l}_mlp_out" for l in mlps]
        embeds, embed_labels = self._embeds(split=True)
        partial = any(f"blocks.{l}.{slot}.hook_result" in self.heads for l in range(layer + 1)
                      for slot in ("mixer", "mixer2"))
        return components + embeds + [bias], labels + embed_labels + ["rest" if partial else "bias"]

    def _full_ours(self, model, layer: int, mlp_input: bool, expand_neurons: bool):
        components, labels = [self["hook_embed"]], ["embed"]
        for l in range(layer + (1 if mlp_input else 0)):
            heads, head_labels = self.stack_head_results(l + 1, return_labels=True)
            for slot in model.blocks[l].mixers:
                tag = _tag(l, slot)
                mine = [i for i, lab in enumerate(head_labels) if lab.startswith(f"{tag}H") or lab == tag]
                components.extend(heads[mine].unbind(0))
                labels.extend(head_labels[i] for i in mine)
                result, kind = f"blocks.{l}.{slot}.hook_result", f"{l}_{slot}"
                if result in model.hook_dict:
                    components.append(self._mixer_rest(l, slot))
                    labels.append(f"{kind}_rest" if result in self.heads else f"{kind}_bias")
            if l == layer or not hasattr(model.blocks[l], "mlp"):
                continue
            if expand_neurons:
                neurons, neuron_labels = self._layer_neurons(l)
                components += neurons
                labels += neuron_labels
                components.append(self._mlp_bias(l, components[0]))
                labels.append(f"{l}_mlp_bias")
            else:
                components.append(self[f"blocks.{l}.mlp.hook_out"])
                labels.append(f"{l}_mlp_out")
        return components, labels

    def _mixer_rest(self, layer: int, slot: str = "mixer") -> torch.Tensor:
        """Block `layer`'s mixer (in `slot`) output minus its cached heads [B, T, D]: the output
        bias (and the heads not kept); zero for a mixer without heads (its whole output is one
        component)."""
        out = self[f"blocks.{layer}.{slot}.hook_out"]
        if f"blocks.{layer}.{slot}.hook_result" not in self.model.hook_dict:
            return torch.zeros_like(out)
        return out - self[f"blocks.{layer}.{slot}.hook_result"].sum(-2)

    def _mlp_bias(self, layer: int, like: torch.Tensor) -> torch.Tensor:
        """Block `layer`'s MLP output bias broadcast to like's shape (zero without one): a sparse
        MLP's is its shared expert's (times the cached shared gate); its experts have none."""
        mlp, zero = self.model.blocks[layer].mlp, torch.zeros_like(like)
        if hasattr(mlp, "experts"):
            if not hasattr(mlp, "shared_expert") or mlp.shared_expert.down.bias is None:
                return zero
            bias = mlp.shared_expert.down.bias.to(like)
            if hasattr(mlp, "shared_gate"):
                return zero + self[f"blocks.{layer}.mlp.hook_shared_gate"].to(like) * bias
            return zero + bias
        return zero if mlp.down.bias is None else zero + mlp.down.bias.to(like)

    def _finish(self, components, labels, layer, pos_slice, apply_ln, return_labels, incl_remainder=False,
                mlp_input=False, gain=False):
        """Stack the components [C, B, T, D] (none: [0, B, T, D]; + the residual minus their sum),
        select positions, apply the norm before `layer`; with their labels when return_labels."""
        if components:
            stack = torch.stack(components)
        else:
            like = self["hook_embed"]
            stack = like.new_zeros((0, *like.shape))
        if incl_remainder:
            self._model(additive=True)
            stack = torch.cat([stack, (self._resid(layer, mlp_input) - stack.sum(0))[None]])
            labels = labels + ["remainder"]
        stack = take(stack, -2, pos_slice, "pos_slice")
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, mlp_input, pos_slice=pos_slice, gain=gain)
        return (stack, labels) if return_labels else stack

    def norm_at(self, layer: int | None = None, mlp_input: bool = False) -> tuple[nn.Module, str]:
        """(norm module, its hook_scale name) that reads the residual before block `layer`
        (its MLP with mlp_input; None / n_layers: the final norm)."""
        model = self._model()
        layer = self._layer(layer)
        if layer == len(model.blocks):
            return model.norm_final, "norm_final.hook_scale"
        part = "norm_mlp" if mlp_input else "norm_mixer"
        return getattr(model.blocks[layer], part), f"blocks.{layer}.{part}.hook_scale"

    def apply_ln_to_stack(self, residual_stack: torch.Tensor, layer: int | None = None, mlp_input: bool = False,
                          pos_slice=None, batch_slice=None, has_batch_dim: bool = True, recompute_ln: bool = False,
                          gain: bool = False) -> torch.Tensor:
        """Each component [C, B, T, D] as the norm before `layer` sees it (module docstring):
        batch_slice selects examples of the stack (axis 1, when has_batch_dim) and of the cached
        scale; pos_slice (already applied to the stack) selects the scale's positions."""
        norm, scale_name = self.norm_at(layer, mlp_input)
        if has_batch_dim:
            residual_stack = take(residual_stack, 1, batch_slice, "batch_slice")
        if isinstance(norm, nn.Identity):
            return residual_stack
        if recompute_ln and scale_name == "norm_final.hook_scale":
            return norm(residual_stack.to(norm.weight)).to(residual_stack)
        if isinstance(norm, nn.LayerNorm):
            residual_stack = residual_stack - residual_stack.mean(-1, keepdim=True)
        scale = take(self[scale_name], -2, pos_slice, "pos_slice")
        if self.has_batch_dim:
            scale = take(scale, 0, batch_slice, "batch_slice")
        out = residual_stack / scale.to(residual_stack)
        return out * norm.weight.to(out) if gain and norm.weight is not None else out

    def logit_attrs(self, residual_stack: torch.Tensor, tokens, incorrect_tokens=None, pos_slice=None,
                    batch_slice=None, has_batch_dim: bool = True, apply_ln: bool = True,
                    gain: bool = False) -> torch.Tensor:
        """Direct logit attribution -> [C, B, T]: each component [C, B, T, D] through the final
        norm's cached scale (apply_ln; gain: and its gain) dotted with the unembedding of `tokens`
        (an int, ids [B] (one per example) or [T] (one per position, when T != B), or [B, T]);
        incorrect_tokens (the same shape, or an int) gives the logit difference."""
        model = self._model()
        directions = _directions(model.unembed.weight, tokens, "tokens")
        if incorrect_tokens is not None:
            wrong = _directions(model.unembed.weight, incorrect_tokens, "incorrect_tokens")
            if isinstance(tokens, torch.Tensor) and isinstance(incorrect_tokens, torch.Tensor) \
                    and tokens.shape != incorrect_tokens.shape:
                raise ValueError(f"tokens and incorrect_tokens must have the same shape; got {_shape(tokens)} and "
                                 f"{_shape(incorrect_tokens)}")
            directions = directions - wrong
        if apply_ln:
            scaled = self.apply_ln_to_stack(residual_stack, None, pos_slice=pos_slice, batch_slice=batch_slice,
                                            has_batch_dim=has_batch_dim, gain=gain)
        else:
            scaled = take(residual_stack, 1, batch_slice, "batch_slice") if has_batch_dim else residual_stack
        dropped = isinstance(batch_slice, int) and not isinstance(batch_slice, bool)
        if has_batch_dim and not dropped and scaled.dim() == 4 and directions.dim() == 2 \
                and directions.shape[0] == scaled.shape[1]:
            directions = directions[:, None]  # per example: broadcast over positions
        return (scaled * directions.to(scaled)).sum(-1)

    def logit_lens(self, layer: int | None = None, pos_slice=None) -> torch.Tensor:
        """Each accumulated residual (accumulated_resid(layer)) through the model's final norm
        (its own statistics) and unembedding -> logits [C, B, T, V]."""
        model = self._model()
        stack = self.accumulated_resid(layer, pos_slice=pos_slice)
        return model.unembed(model.norm_final(stack.to(model.unembed.weight)))


def _tag(layer: int, slot: str) -> str:
    """A mixer's head-label prefix: "L{l}" for a block's mixer, "L{l}b" for its parallel mixer2."""
    return f"L{layer}" + ("b" if slot == "mixer2" else "")


def _mixer_kind(mixer) -> str:
    """"attn" for an attention mixer (TL's label), "mixer" for any other."""
    return "attn" if mixer.mixer_name == "attention" else "mixer"


def _neuron_groups(mlp) -> list[tuple[str, int, str]]:
    """A block MLP's neuron groups (label infix, width, part for _group_neurons): the dense MLP's
    one; a sparse one's routed slots ("slot{j}") and its shared expert."""
    if not hasattr(mlp, "experts"):
        return [("", mlp.down.weight.shape[1], "dense")]
    groups = [("slot", mlp.experts.down.shape[-1], "routed")]
    if hasattr(mlp, "shared_expert"):
        groups.append(("shared", mlp.shared_expert.down.weight.shape[1], "shared"))
    return groups


def take(x: torch.Tensor, dim: int, index, argument: str) -> torch.Tensor:
    """TL's Slice on axis dim of x: None (all), an int (drops the axis), a slice, a (start, stop[,
    step]) tuple, or a list / 1-D tensor of indices."""
    if index is None:
        return x
    if isinstance(index, tuple):
        index = slice(*index)
    where = [slice(None)] * x.dim()
    if isinstance(index, (int, slice)) and not isinstance(index, bool):
        where[dim] = index
        return x[tuple(where)]
    if isinstance(index, (list, torch.Tensor)):
        where[dim] = torch.as_tensor(index, dtype=torch.long, device=x.device)
        return x[tuple(where)]
    raise TypeError(f"{argument} must be None, an int, a slice, a (start, stop[, step]) tuple or a list of "
                    f"indices; got {index!r}")


def _shape(tokens) -> tuple:
    return tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else ()


def _directions(w_u: torch.Tensor, tokens, argument: str) -> torch.Tensor:
    """Unembedding rows for tokens: [D] for an int, [..., D] for ids [...] (TL's
    tokens_to_residual_directions)."""
    if isinstance(tokens, int) and not isinstance(tokens, bool):
        return w_u[tokens]
    if not isinstance(tokens, torch.Tensor) or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise TypeError(f"{argument} must be an int or an integer tensor [B], [T] or [B, T]; got {tokens!r}")
    return w_u[tokens.to(w_u.device)]
