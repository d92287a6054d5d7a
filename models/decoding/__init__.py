"""Decoding: `generate` continues prompts one token a call, each call continuing from the
`DecodingState` (here) that every layer carried out of the call before.

The rooms: step (advance: one decoding call through the blocks and hook points from the carried
state, what each mixer kind carries, hook.position), readers (what readers on hook_state are
handed while decoding; the recorder of generate's cache_names), sampling (the next token from
the logits), generation (generate: the loop, its bounds, prompts of different lengths,
StatePatches across calls). SequenceModel.generate runs models.decoding.generation.generate;
docs/generation.md is the guide.
"""

from __future__ import annotations

import torch

BUFFER_AXES = {"keys": 2, "values": 2, "history": 1}  # DecodingState entries grown ahead, their time axis


class DecodingState:
    """What a model carries from one decoding call to the next, one dict per layer:

        recurrent   {"state": [B, *S] after the last step, and "conv": [B, C, W - 1] the
                     short conv's last inputs (carries_conv) or "window": [B, w, D] mixer inputs
                     (after hook_in) at the last w = resume_context positions; Based also
                     "swa_keys", "swa_values" [B, H, <= window - 1, d_head]}
        attention   {"keys", "values": [B, G, >= position, d_head]} (buffers; positions
                     < `position` are valid; keys rotated for positional="rope")
        history     {"conv": [B, C, W - 1], "history": [B, >= position, C]} the long convolution's
                     inputs (a buffer like the keys)
        recompute   {"inputs": [B, position, D]} mixer inputs (before hook_in) at every position

    A block with a parallel second mixer (Block.mixer2) keeps that mixer's entries in the same
    layer dict under "mixer2." ("mixer2.keys", ...), a shared branch's attention under
    "shared.attn."; an MLP-only block's dict stays empty.
    position: the number of positions consumed (the absolute position of the next token).
    Edit a layer's tensors in place or replace them (same shapes) to change what comes next;
    copy() and select(rows) give independent states; save(path) / load(path) use safetensors."""

    def __init__(self, layers: list[dict[str, torch.Tensor]], position: int) -> None:
        self.layers, self.position = layers, position

    def trimmed(self) -> list[dict[str, torch.Tensor]]:
        """The layers with the KV and history buffers cut to the valid positions (views)."""
        return [{k: v.narrow(BUFFER_AXES[k.rsplit(".", 1)[-1]], 0, self.position)
                 if k.rsplit(".", 1)[-1] in BUFFER_AXES else v for k, v in layer.items()}
                for layer in self.layers]

    def copy(self) -> "DecodingState":
        return DecodingState([{k: v.clone() for k, v in layer.items()} for layer in self.trimmed()], self.position)

    def select(self, rows) -> "DecodingState":
        """The state of the batch rows `rows` (an index or [R] int tensor) only, as a copy."""
        rows = torch.as_tensor(rows)
        return DecodingState([{k: v[rows].clone() for k, v in layer.items()} for layer in self.trimmed()],
                             self.position)

    @property
    def batch(self) -> int:
        return next(v for layer in self.layers for v in layer.values()).shape[0]  # MLP-only layers hold none

    @property
    def nbytes(self) -> int:
        """The bytes of the valid entries (KV buffers' spare room not counted)."""
        return sum(v.numel() * v.element_size() for layer in self.trimmed() for v in layer.values())

    def save(self, path) -> None:
        """Write the state to one safetensors file (tensors by "layers.{l}.{key}", the position
        in the metadata), atomically (models.storage.writer)."""
        from safetensors.torch import save_file

        from models.storage.writer import write_file

        tensors = {f"layers.{i}.{k}": v.contiguous() for i, layer in enumerate(self.trimmed()) for k, v in layer.items()}
        metadata = {"position": str(self.position), "n_layers": str(len(self.layers))}
        write_file(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))

    @classmethod
    def load(cls, path) -> "DecodingState":
        from safetensors import safe_open

        with safe_open(str(path), "pt") as f:
            meta = f.metadata()
            layers: list[dict[str, torch.Tensor]] = [{} for _ in range(int(meta["n_layers"]))]
            for name in f.keys():
                _, layer, key = name.split(".", 2)
                layers[int(layer)][key] = f.get_tensor(name)
        return cls(layers, int(meta["position"]))


def grown(buffer: torch.Tensor | None, axis: int, needed: int, room: int, like: torch.Tensor) -> torch.Tensor:
    """buffer with space for `needed` entries on `axis`: itself, or a new one (uninitialised past
    the old entries, which are copied) with space for max(room, needed, twice the old size);
    shaped like `like` when None."""
    if buffer is not None and buffer.shape[axis] >= needed:
        return buffer
    shape = list(like.shape if buffer is None else buffer.shape)
    shape[axis] = max(room, needed, 0 if buffer is None else 2 * buffer.shape[axis])
    bigger = like.new_empty(shape)
    if buffer is not None:
        bigger.narrow(axis, 0, buffer.shape[axis]).copy_(buffer)
    return bigger
