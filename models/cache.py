"""Cache: activations by hook name, with TransformerLens' ActivationCache analyses.

`model.run_with_cache(tokens)` returns a Cache: `cache[name]` ([B, T, ...]), `cache[name, layer]`
(TransformerLens' shorthand: `cache["resid_pre", 0]` is `blocks.0.hook_resid_pre`,
`cache["pattern", 1]` is `blocks.1.mixer.hook_pattern`, `cache["post", 0]` is
`blocks.0.mlp.hook_post`, `cache["scale", 0, "norm_mlp"]` is `blocks.0.norm_mlp.hook_scale`),
TransformerLens' names and keys (models.tl_names: `cache["blocks.0.attn.hook_pattern"]`,
`cache["q", 0, "attn"]`, `cache["scale", 0, "ln1"]`, `cache["k6"]`; TL's hook_normalized is
computed from the cached residual and scale), and `cache[name + "_grad"]` after `run_with_cache(incl_bwd=True, metric=...)`. A cache may live on disk
(`run_with_cache(to_disk=dir)`, `Cache.open(dir, model)`, `cache.save(dir)`: each tensor read from its
file on access) and may hold some positions only (`cache.positions[name]`: the steps an entry keeps on
its time axis) and some heads only (`cache.heads[name]`: the heads or channels it keeps on its head
axis); docs/caches.md.

The analyses have TransformerLens' names and meaning; they need the model (`cache.model`, set by
run_with_cache), and the decompositions (decompose_resid, get_full_resid_decomposition, a
remainder) a residual model (cfg.residual). In a model without residual connections (the
stacked RNNs) the stream before a block is the previous block's output: accumulated_resid,
logit_lens, logit_attrs and apply_ln_to_stack read it the same way.

    accumulated_resid(layer, incl_mid, apply_ln, pos_slice)   [L + 1, B, T, D] the residual before
                                                  each block (and the final one): the logit lens
    decompose_resid(layer, mode, ...)             [C, B, T, D] embed + each mixer / MLP output;
                                                  sums to the residual before `layer`
    get_full_resid_decomposition(layer, ...)      embed, per-head results, neurons and the biases
    stack_head_results(layer, ...)                [L H, B, T, D] every head's hook_result
    stack_neuron_results(layer, ...)              [L F, B, T, D] every neuron's post * W_out[:, n]
    apply_ln_to_stack(stack, layer, mlp_input)    each component through the norm that reads the
                                                  residual there, with the model's own scale
    logit_attrs(stack, tokens, incorrect_tokens)  [C, B, T] direct logit attribution
    logit_lens(layer)                             [L + 1, B, T, V] each accumulated residual
                                                  through the final norm and the unembedding
    remove_batch_dim(), to(device), stack(pattern)

Difference from TransformerLens: its models fold each norm's gain into the next weights, so its
apply_ln_to_stack only centres and divides by the scale. Ours are not folded: apply_ln_to_stack
centres (LayerNorm), divides by the cached hook_scale and multiplies by the gain; the norm's bias
is a constant, not a component, so the direct logit attributions of a decomposition sum to the
logit minus the bias's logit (the unembedding of norm_final.bias; zero for RMSNorm). The
embedding here is one component (`hook_embed`, token plus learned position embedding).
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Iterator, Mapping, Sequence

import torch
from torch import nn

from models.cache_store import DiskStore, create_store, open_store
from models.tl_names import NoCounterpart, act_name, normalized_inputs, tl_act_name

MODES = ("all", "mixer", "attn", "mlp")


def unknown_name_message(what: str, name: str, valid: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, valid, n=5, cutoff=0.5)
    hint = f"closest valid names: {close}" if close else f"valid names include: {sorted(valid)[:12]}"
    return f"unknown {what} {name!r}; {hint}"


def _natural_key(name: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


class Cache(Mapping):
    """Activations by hook name (see the module docstring for the analyses).

    store: {name: tensor} (copied), or a models.cache_store.DiskStore (kept: a disk-backed cache,
    tensors read on access). positions: {name: [t, ...]} for entries that keep only those
    positions on their time axis (run_with_cache(positions=...)); heads: {name: [h, ...]} for
    entries that keep only those heads (or channels) on their head axis (run_with_cache(heads=...));
    entries not named keep all."""

    def __init__(self, store: Mapping[str, torch.Tensor] | None = None, model: nn.Module | None = None,
                 has_batch_dim: bool = True, positions: Mapping[str, Sequence[int]] | None = None,
                 heads: Mapping[str, Sequence[int]] | None = None) -> None:
        self._store = store if isinstance(store, DiskStore) else dict(store or {})
        self.model = model
        self.has_batch_dim = has_batch_dim
        self.positions: dict[str, list[int]] = {n: list(p) for n, p in (positions or {}).items()}
        self.heads: dict[str, list[int]] = {n: list(h) for n, h in (heads or {}).items()}

    @classmethod
    def open(cls, directory, model: nn.Module | None = None) -> "Cache":
        """Reopen a cache written by run_with_cache(to_disk=directory) (or Cache.save): read-only,
        each tensor read from its file on access. model: the model it was run on (the analyses
        need it); its config must equal the one recorded."""
        store, index = open_store(directory)
        recorded = index.get("model")
        config = getattr(getattr(model, "cfg", None), "to_dict", None)
        if model is not None and recorded is not None and config is not None and config() != recorded:
            differ = sorted(k for k in set(recorded) | set(config()) if recorded.get(k) != config().get(k))
            raise ValueError(f"the cache in {str(directory)!r} was written by a model whose config differs from "
                             f"this one's in {differ[:6]}")
        return cls(store, model, index.get("has_batch_dim", True), index.get("positions"), index.get("heads"))

    def save(self, directory, overwrite: bool = False) -> "Cache":
        """Write every entry to `directory` (the run_with_cache(to_disk=...) layout, docs/caches.md;
        the same checks on the target) and return the disk-backed Cache reopened from it."""
        store = create_store(directory, overwrite, argument="directory")
        try:
            for name, value in self.items():
                store[name] = value
        except BaseException:
            store.abandon()
            raise
        store.finish(**self.index_info())
        return Cache.open(directory, self.model)

    def index_info(self) -> dict:
        """What a disk cache's index records beside its entries (positions, heads, batch axis, model config)."""
        config = getattr(getattr(self.model, "cfg", None), "to_dict", None)
        return {"positions": self.positions, "heads": self.heads, "has_batch_dim": self.has_batch_dim,
                "model": config() if config is not None else None}

    @property
    def directory(self):
        """The directory of a disk-backed cache (None: in memory)."""
        return self._store.directory if isinstance(self._store, DiskStore) else None

    # ------------------------------------------------------------------ the mapping

    def __getitem__(self, key) -> torch.Tensor:
        try:
            name = self.resolve(key)
        except NoCounterpart:
            inputs = self._normalized_inputs(key)
            if inputs is None:
                raise
            return self._normalized(*inputs)
        if name not in self._store:
            raise KeyError(unknown_name_message("cache key", name, list(self._store)))
        return self._store[name]

    def __contains__(self, key) -> bool:  # without reading a disk-backed entry
        try:
            return self.resolve(key) in self._store
        except NoCounterpart:
            return self._normalized_inputs(key) is not None
        except (TypeError, KeyError):
            return False

    def _normalized_inputs(self, key) -> tuple[str, str] | None:
        """TransformerLens' hook_normalized keys (ln1, ln2, ln_final): (cached residual, cached
        scale) it is computed from, when both are cached and the model is known; else None."""
        if isinstance(key, tuple):
            layer = key[1] + self.n_layers if isinstance(key[1], int) and key[1] < 0 else key[1]
            key = tl_act_name(key[0], layer, key[2] if len(key) == 3 else None)
        found = normalized_inputs(tl_act_name(key), self.n_layers)
        if self.model is None or found is None or not all(n in self._store for n in found):
            return None
        return found

    def _normalized(self, resid: str, scale: str) -> torch.Tensor:
        """TL's hook_normalized [B, T, D]: the residual, centred for a LayerNorm, over the scale."""
        x = self._store[resid]
        if getattr(self.model.get_submodule(scale.rsplit(".", 1)[0]), "centred", False):
            x = x - x.mean(-1, keepdim=True)
        return x / self._store[scale]

    def __iter__(self) -> Iterator[str]:
        return iter(self._store)

    def __len__(self) -> int:
        return len(self._store)

    def __setitem__(self, name: str, value: torch.Tensor) -> None:
        self._store[name] = value

    def resolve(self, key) -> str:
        """A hook name from a name (ours, or TransformerLens' full name or get_act_name shorthand:
        models.tl_names) or a (name, layer[, layer type]) key, ours or TL's (layer None: no block).
        NoCounterpart (a KeyError) for a TL name whose concept we lack."""
        if isinstance(key, str):
            return key if key in self._store else act_name(key)
        if not isinstance(key, tuple) or len(key) not in (2, 3) or not isinstance(key[0], str) \
                or not (key[1] is None or isinstance(key[1], int)) or isinstance(key[1], bool) \
                or not (len(key) == 2 or key[2] is None or isinstance(key[2], str)):
            raise TypeError(f"a cache key is a hook name or (name, layer[, layer type]); got {key!r}")
        short, layer = key[0], key[1]
        layer_type = key[2] if len(key) == 3 else None
        grad = short.endswith("_grad")
        short = short[: -len("_grad")] if grad else short
        suffix = "_grad" if grad else ""
        if layer is not None and layer < 0:
            layer += self.n_layers
        try:
            candidates, missing = [act_name(short, layer, layer_type)], None
        except NoCounterpart as error:
            candidates, missing = [], error
        candidates += _our_candidates(short, layer, layer_type)
        for name in candidates:
            if name + suffix in self._store:
                return name + suffix
        if missing is not None:
            raise missing
        return candidates[0] + suffix

    @property
    def n_layers(self) -> int:
        if self.model is not None:
            return len(self.model.blocks)
        layers = [int(m.group(1)) for n in self._store if (m := re.match(r"blocks\.(\d+)\.", n))]
        return max(layers) + 1 if layers else 0

    def stack(self, pattern: str) -> torch.Tensor:
        """Stack every entry matching a glob pattern along a new first axis, ordered by layer.

        `cache.stack("blocks.*.hook_resid_post")` -> [L, B, T, d_model].
        """
        names = sorted((n for n in self._store if fnmatch.fnmatchcase(n, pattern)), key=_natural_key)
        if not names:
            raise KeyError(
                f"pattern {pattern!r} matches no cached name; cached: {sorted(self._store)[:20]}"
            )
        return torch.stack([self._store[n] for n in names])

    def remove_batch_dim(self) -> "Cache":
        """A Cache of the single example's tensors without their batch axis (B must be 1)."""
        if not self.has_batch_dim:
            raise ValueError("this cache has no batch axis any more")
        sizes = {n: v.shape[0] for n, v in self._store.items() if v.dim()}
        wrong = {n: s for n, s in sizes.items() if s != 1}
        if wrong:
            raise ValueError(f"remove_batch_dim needs batch size 1; got sizes {dict(list(wrong.items())[:4])}")
        return Cache({n: v[0] if v.dim() else v for n, v in self._store.items()}, self.model, has_batch_dim=False,
                     positions=self.positions, heads=self.heads)

    def to(self, device) -> "Cache":
        """Move every tensor to `device` (in place; a disk-backed cache is read into memory); returns self."""
        self._store = {n: v.to(device) for n, v in self._store.items()}
        return self

    def __repr__(self) -> str:
        where = f" on disk in {str(self.directory)!r}" if self.directory is not None else ""
        return f"Cache({len(self)} entries{where}: {list(self._store)[:6]}{'...' if len(self) > 6 else ''})"

    # ------------------------------------------------------------------ residual analyses

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

    def _resid(self, layer: int) -> torch.Tensor:
        """The residual entering block `layer` (layer = n_layers: the final one)."""
        return self[f"blocks.{layer - 1}.hook_resid_post"] if layer == self.n_layers else self[f"blocks.{layer}.hook_resid_pre"]

    def accumulated_resid(self, layer: int | None = None, incl_mid: bool = False, apply_ln: bool = False,
                          pos_slice=None, mlp_input: bool = False, return_labels: bool = False):
        """The residual stream before each block up to `layer` (None / -1: every block and the
        final residual) -> [C, B, T, D]; incl_mid adds each block's hook_resid_mid, mlp_input the
        mid of block `layer` itself. Labels "{l}_pre", "{l}_mid", "final_post"."""
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
        return self._finish(components, labels, layer, pos_slice, apply_ln, return_labels, mlp_input=mlp_input)

    def decompose_resid(self, layer: int | None = None, mode: str = "all", mlp_input: bool = False,
                        incl_embeds: bool = True, apply_ln: bool = False, pos_slice=None,
                        return_labels: bool = False):
        """The residual before block `layer` (None: the final residual) as its components
        [C, B, T, D]: "embed" (hook_embed), then per block "{l}_mixer_out" and "{l}_mlp_out"
        (mode "mixer" (TransformerLens' "attn") or "mlp" keeps one kind); mlp_input adds block
        `layer`'s mixer output. With mode "all" and incl_embeds the components sum to the residual."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}; got {mode!r}")
        model = self._model(additive=True)
        layer = self._layer(layer)
        components, labels = [], []
        if incl_embeds:
            components.append(self["hook_embed"])
            labels.append("embed")
        for l in range(min(layer + 1, len(model.blocks))):
            if (l < layer or mlp_input) and mode != "mlp":
                components.append(self[f"blocks.{l}.mixer.hook_out"])
                labels.append(f"{l}_mixer_out")
            if l < layer and mode in ("all", "mlp") and hasattr(model.blocks[l], "mlp"):
                components.append(self[f"blocks.{l}.mlp.hook_out"])
                labels.append(f"{l}_mlp_out")
        if not components:
            raise ValueError(f"no components for layer={layer}, mode={mode!r}, incl_embeds={incl_embeds}")
        return self._finish(components, labels, layer, pos_slice, apply_ln, return_labels, mlp_input=mlp_input)

    def stack_head_results(self, layer: int | None = None, return_labels: bool = False,
                           incl_remainder: bool = False, pos_slice=None, apply_ln: bool = False):
        """Every head's output (hook_result) at the blocks before `layer` (None / -1: all)
        -> [C, B, T, D], labels "L{l}H{h}" (h: the model's head index, also when the cache keeps
        some heads only, cache.heads); a block whose mixer has no heads contributes its whole
        output ("L{l}"). incl_remainder adds the residual minus their sum ("remainder")."""
        model = self._model()
        layer = self._layer(layer)
        components, labels = [], []
        for l in range(layer):
            name = f"blocks.{l}.mixer.hook_result"
            if name in model.hook_dict:
                heads = self[name].movedim(-2, 0)  # [H, B, T, D]
                components.extend(heads.unbind(0))
                labels.extend(f"L{l}H{h}" for h in self.heads.get(name, range(heads.shape[0])))
            else:
                components.append(self[f"blocks.{l}.mixer.hook_out"])
                labels.append(f"L{l}")
        return self._finish(components, labels, layer, pos_slice, apply_ln, return_labels, incl_remainder)

    def stack_neuron_results(self, layer: int | None = None, neuron_slice=None, pos_slice=None,
                             return_labels: bool = False, incl_remainder: bool = False, apply_ln: bool = False):
        """Every MLP neuron's contribution hook_post[..., n] * W_out[:, n] at the blocks before
        `layer` -> [C, B, T, D], labels "L{l}N{n}" (neuron_slice: a slice or index list)."""
        model = self._model()
        layer = self._layer(layer)
        components, labels = [], []
        for l in range(layer):
            if not hasattr(model.blocks[l], "mlp"):
                continue
            post = self[f"blocks.{l}.mlp.hook_post"]  # [B, T, F]
            w_out = model.blocks[l].mlp.down.weight  # [D, F]
            neurons = torch.arange(post.shape[-1])[neuron_slice if neuron_slice is not None else slice(None)]
            neurons = neurons.reshape(-1).tolist()
            contrib = post[..., neurons, None] * w_out.T[neurons].to(post)  # [B, T, n, D]
            components.extend(contrib.movedim(-2, 0).unbind(0))
            labels.extend(f"L{l}N{n}" for n in neurons)
        if not components:
            raise ValueError(f"no MLP before layer {layer}: the model has mlp={model.cfg.mlp}")
        return self._finish(components, labels, layer, pos_slice, apply_ln, return_labels, incl_remainder)

    def get_full_resid_decomposition(self, layer: int | None = None, mlp_input: bool = False,
                                     expand_neurons: bool = True, apply_ln: bool = False, pos_slice=None,
                                     return_labels: bool = False):
        """The residual before `layer` as embed, every head's result ("L{l}H{h}") and the rest of
        each mixer output (its output bias: "{l}_mixer_bias"; "{l}_mixer_rest", the bias and every
        head not cached, where the cache keeps some heads of hook_result), every neuron ("L{l}N{n}", or
        "{l}_mlp_out" without expand_neurons) and each MLP's output bias ("{l}_mlp_bias"): the
        components sum to the residual (mlp_input: before block `layer`'s MLP)."""
        model = self._model(additive=True)
        layer = self._layer(layer)
        components, labels = [self["hook_embed"]], ["embed"]
        for l in range(min(layer + 1, len(model.blocks))):
            if l == layer and not mlp_input:
                break
            heads, head_labels = self.stack_head_results(l + 1, return_labels=True)
            mine = [i for i, lab in enumerate(head_labels) if lab.startswith(f"L{l}H") or lab == f"L{l}"]
            components.extend(heads[mine].unbind(0))
            labels.extend(head_labels[i] for i in mine)
            result = f"blocks.{l}.mixer.hook_result"
            if result in model.hook_dict:
                components.append(self[f"blocks.{l}.mixer.hook_out"] - heads[mine].sum(0))
                labels.append(f"{l}_mixer_rest" if result in self.heads else f"{l}_mixer_bias")
            if l == layer or not hasattr(model.blocks[l], "mlp"):
                continue
            if expand_neurons:
                neurons, neuron_labels = self.stack_neuron_results(l + 1, return_labels=True)
                mine = [i for i, lab in enumerate(neuron_labels) if lab.startswith(f"L{l}N")]
                components.extend(neurons[mine].unbind(0))
                labels.extend(neuron_labels[i] for i in mine)
                bias = model.blocks[l].mlp.down.bias
                components.append(torch.zeros_like(components[0]) + bias.to(components[0]))
                labels.append(f"{l}_mlp_bias")
            else:
                components.append(self[f"blocks.{l}.mlp.hook_out"])
                labels.append(f"{l}_mlp_out")
        return self._finish(components, labels, layer, pos_slice, apply_ln, return_labels, mlp_input=mlp_input)

    def _finish(self, components, labels, layer, pos_slice, apply_ln, return_labels, incl_remainder=False,
                mlp_input=False):
        """Stack the components [C, B, T, D] (+ the residual minus their sum), select positions,
        apply the norm before `layer`; with their labels when return_labels."""
        stack = torch.stack(components)
        if incl_remainder:
            self._model(additive=True)
            stack = torch.cat([stack, (self._resid(layer) - stack.sum(0))[None]])
            labels = labels + ["remainder"]
        stack = _pos(stack, pos_slice)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, mlp_input, pos_slice=pos_slice)
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
                          pos_slice=None, batch_slice=None, has_batch_dim: bool = True) -> torch.Tensor:
        """Each component [..., B, T, D] as the norm before `layer` sees it, with the scale the
        model computed for the whole residual (cached `hook_scale`, [B, T, 1]): centred (LayerNorm),
        divided by the scale, times the gain; no bias (see the module docstring)."""
        norm, scale_name = self.norm_at(layer, mlp_input)
        if isinstance(norm, nn.Identity):
            return residual_stack
        scale = _pos(self[scale_name], pos_slice)
        if batch_slice is not None:
            scale = scale[batch_slice]
        if not has_batch_dim:
            scale = scale[0] if scale.shape[0] == 1 else scale
        if isinstance(norm, nn.LayerNorm):
            residual_stack = residual_stack - residual_stack.mean(-1, keepdim=True)
        out = residual_stack / scale.to(residual_stack)
        return out * norm.weight.to(out) if norm.weight is not None else out

    def logit_attrs(self, residual_stack: torch.Tensor, tokens, incorrect_tokens=None,
                    pos_slice=None, batch_slice=None, has_batch_dim: bool = True) -> torch.Tensor:
        """Direct logit attribution: each component [C, B, T, D] (already through
        apply_ln_to_stack) dotted with the unembedding of `tokens` -> [C, B, T]. tokens: an int,
        or ids [B] (one per example, every position) or [B, T]; incorrect_tokens likewise gives
        the logit difference."""
        model = self._model()
        directions = _directions(model.unembed.weight, tokens, residual_stack)
        if incorrect_tokens is not None:
            directions = directions - _directions(model.unembed.weight, incorrect_tokens, residual_stack)
        return (residual_stack * directions.to(residual_stack)).sum(-1)

    def logit_lens(self, layer: int | None = None, pos_slice=None) -> torch.Tensor:
        """Each accumulated residual (accumulated_resid(layer)) through the model's final norm
        (its own statistics) and unembedding -> logits [C, B, T, V]."""
        model = self._model()
        stack = self.accumulated_resid(layer, pos_slice=pos_slice)
        return model.unembed(model.norm_final(stack.to(model.unembed.weight)))


def _pos(x: torch.Tensor, pos_slice) -> torch.Tensor:
    """Select positions on the T axis of [..., T, D]: None (all), an int, a slice or a list."""
    if pos_slice is None:
        return x
    if isinstance(pos_slice, (int, slice)) and not isinstance(pos_slice, bool):
        return x[..., pos_slice, :]
    if isinstance(pos_slice, (list, tuple, torch.Tensor)):
        return x[..., torch.as_tensor(pos_slice, dtype=torch.long), :]
    raise TypeError(f"pos_slice must be None, an int, a slice or a list of positions; got {pos_slice!r}")


def _our_candidates(short: str, layer: int | None, layer_type: str | None) -> list[str]:
    """Our names a (short, layer[, layer type]) key may mean, most likely first: our layer types
    ("norm_mlp", "mixer"), "mixer_out", or the short name at the block, its mixer or its MLP."""
    block = "" if layer is None else f"blocks.{layer}."
    if layer_type:
        return [f"{block}{layer_type}.hook_{short}"]
    if short == "mixer_out":
        return [f"{block}mixer.hook_out"]
    return [f"{block}hook_{short}", f"{block}mixer.hook_{short}", f"{block}mlp.hook_{short}", f"{block}{short}"]


def _directions(w_u: torch.Tensor, tokens, stack: torch.Tensor) -> torch.Tensor:
    """Unembedding rows [..., D] for tokens, shaped to broadcast against stack [C, B, T, D]."""
    if isinstance(tokens, int) and not isinstance(tokens, bool):
        return w_u[tokens]
    if not isinstance(tokens, torch.Tensor) or tokens.dtype.is_floating_point:
        raise TypeError(f"tokens must be an int or an integer tensor [B] or [B, T]; got {tokens!r}")
    rows = w_u[tokens.to(w_u.device)]  # [B, D] or [B, T, D]
    if tokens.dim() == 1 and stack.dim() == 4:
        rows = rows[:, None, :]
    return rows
