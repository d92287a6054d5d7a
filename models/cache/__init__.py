"""Cache: activations by hook name, with TransformerLens' ActivationCache analyses.

`model.run_with_cache(tokens)` returns a Cache: `cache[name]` ([B, T, ...]), `cache[name, layer]`
(TransformerLens' shorthand: `cache["resid_pre", 0]` is `blocks.0.hook_resid_pre`,
`cache["pattern", 1]` is `blocks.1.mixer.hook_pattern`, `cache["post", 0]` is
`blocks.0.mlp.hook_post`, `cache["scale", 0, "norm_mlp"]` is `blocks.0.norm_mlp.hook_scale`),
TransformerLens' names and keys (models.tl.names: `cache["blocks.0.attn.hook_pattern"]`,
`cache["q", 0, "attn"]`, `cache["scale", 0, "ln1"]`, `cache["k6"]`; TL's hook_normalized is
computed from the cached residual and scale), and `cache[name + "_grad"]` after `run_with_cache(incl_bwd=True, metric=...)`. A cache may live on disk
(`run_with_cache(to_disk=dir)`, `Cache.open(dir, model)`, `cache.save(dir)`: each tensor read from its
file on access) and may hold some positions only (`cache.positions[name]`: the steps an entry keeps on
its time axis) and some heads only (`cache.heads[name]`: the heads or channels it keeps on its head
axis); docs/caches.md.

The analyses (accumulated_resid, decompose_resid, get_full_resid_decomposition,
stack_head_results, stack_neuron_results, apply_ln_to_stack, logit_attrs, logit_lens) are
models.cache.analyses: TransformerLens' signatures, argument orders and numbers on the same
weights, ours one explicit argument away (gain=True, layout="ours", split_embed=False,
apply_ln=False). They need the model (`cache.model`, set by run_with_cache). Also
remove_batch_dim(), apply_slice_to_batch_dim(batch_slice), to(device), stack(pattern).
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Iterator, Mapping, Sequence

import torch
from torch import nn

from models.cache.analyses import ResidualAnalyses, take
from models.cache.store import DiskStore, create_store, open_store
from models.tl.names import NoCounterpart, act_name, normalized_inputs, tl_act_name
from models.tl.surface import block_attention

SSM_MIXERS = ("mamba", "mamba2")  # whose hook_state compute_ssm_state returns in TransformerLens' layout



def unknown_name_message(what: str, name: str, valid: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, valid, n=5, cutoff=0.5)
    hint = f"closest valid names: {close}" if close else f"valid names include: {sorted(valid)[:12]}"
    return f"unknown {what} {name!r}; {hint}"


def _natural_key(name: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


class Cache(ResidualAnalyses, Mapping):
    """Activations by hook name (see the module docstring for the analyses).

    store: {name: tensor} (copied), or a models.cache.store.DiskStore (kept: a disk-backed cache,
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
        models.tl.names) or a (name, layer[, layer type]) key, ours or TL's (layer None: no block).
        NoCounterpart (a KeyError) for a TL name whose concept we lack."""
        if isinstance(key, str):
            return key if key in self._store else act_name(key, known=self._store)
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
            candidates, missing = [act_name(short, layer, layer_type, known=self._store)], None
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

    def apply_slice_to_batch_dim(self, batch_slice) -> "Cache":
        """A Cache of some examples (TL's): batch_slice an int (drops the batch axis), a slice, a
        (start, stop[, step]) tuple or a list of indices."""
        if not self.has_batch_dim:
            raise ValueError("this cache has no batch axis any more")
        drops = isinstance(batch_slice, int) and not isinstance(batch_slice, bool)
        return Cache({n: take(v, 0, batch_slice, "batch_slice") if v.dim() else v for n, v in self._store.items()},
                     self.model, has_batch_dim=not drops, positions=self.positions, heads=self.heads)

    def compute_head_results(self) -> None:
        """TransformerLens': cache each attention layer's per-head outputs hook_result [B, T, H, D],
        hook_z [B, T, H, d_head] times each head's W_O [d_head, D], where not cached already
        (from the cached hook_z; its heads and positions kept)."""
        model = self._model()
        for block in model.blocks:
            attention = block_attention(block)
            if attention is None or attention.hook_result.name in self._store:
                continue
            z_name, result_name = attention.hook_z.name, attention.hook_result.name
            if z_name not in self._store:
                raise KeyError(f"compute_head_results needs {z_name!r} in the cache: run_with_cache with it named "
                               f"(or cache {result_name!r} itself)")
            z, W_O = self._store[z_name], attention.W_O  # [B, T, H, d_head], [H, d_head, D]
            if z_name in self.heads:
                W_O = W_O[self.heads[z_name]]
                self.heads[result_name] = self.heads[z_name]
            if z_name in self.positions:
                self.positions[result_name] = self.positions[z_name]
            with torch.set_grad_enabled(z.requires_grad):
                self._store[result_name] = torch.einsum("...hd,hdm->...hm", z, W_O.to(z.dtype))

    def compute_ssm_state(self, layer: int | None = None, time_step: int | None = None):
        """TransformerLens' compute_ssm_state on Mamba / Mamba-2 layers, read from the cached
        hook_state in TL's layout: Mamba [B, E, T, N], Mamba-2 [B, H, T, P, N] (time_step t:
        [B, E, N], [B, H, P, N]). layer None: every such layer, stacked on a new first axis when
        every layer is one, else {layer: state}."""
        model = self._model()
        layers = [j for j, mixer in enumerate(model.cfg.mixers) if mixer in SSM_MIXERS]
        if layer is None:
            if not layers:
                raise ValueError(f"compute_ssm_state reads Mamba / Mamba-2 layers; this model has none (mixers "
                                 f"{sorted(set(map(str, model.cfg.mixers)))}): read cache['blocks.l.mixer.hook_state']")
            states = {j: self._ssm_state(j, time_step) for j in layers}
            return torch.stack(list(states.values())) if len(layers) == self.n_layers else states
        if layer not in layers:
            raise ValueError(f"compute_ssm_state: block {layer!r} has no Mamba / Mamba-2 mixer (mixers {model.cfg.mixers}); "
                             f"another recurrent state is cache['blocks.{layer}.mixer.hook_state'] in our layout "
                             "(docs/caches.md)")
        return self._ssm_state(layer, time_step)

    def _ssm_state(self, layer: int, time_step: int | None) -> torch.Tensor:
        name = f"blocks.{layer}.mixer.hook_state"
        if name not in self._store:
            raise KeyError(f"compute_ssm_state needs {name!r} in the cache: run_with_cache with it named")
        state, time_axis = self._store[name], 1 if self.has_batch_dim else 0  # [B, T, *S]
        if time_step is None:
            return state.movedim(time_axis, time_axis + 1)
        kept = self.positions.get(name)
        if kept is not None and time_step not in kept:
            raise KeyError(f"time_step={time_step!r}: {name!r} is cached at positions {kept} only")
        return state.select(time_axis, time_step if kept is None else kept.index(time_step))

    def to(self, device) -> "Cache":
        """Move every tensor to `device` (in place; a disk-backed cache is read into memory); returns self."""
        self._store = {n: v.to(device) for n, v in self._store.items()}
        return self

    def __repr__(self) -> str:
        where = f" on disk in {str(self.directory)!r}" if self.directory is not None else ""
        return f"Cache({len(self)} entries{where}: {list(self._store)[:6]}{'...' if len(self) > 6 else ''})"


def _our_candidates(short: str, layer: int | None, layer_type: str | None) -> list[str]:
    """Our names a (short, layer[, layer type]) key may mean, most likely first: our layer types
    ("norm_mlp", "mixer"), "mixer_out", or the short name at the block, its mixer or its MLP."""
    block = "" if layer is None else f"blocks.{layer}."
    if layer_type:
        return [f"{block}{layer_type}.hook_{short}"]
    if short == "mixer_out":
        return [f"{block}mixer.hook_out"]
    return [f"{block}hook_{short}", f"{block}mixer.hook_{short}", f"{block}mlp.hook_{short}", f"{block}{short}"]
