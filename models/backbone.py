"""SequenceModel: embed -> blocks(norm -> mixer -> residual [-> norm -> mlp -> residual]) -> norm -> unembed."""

from __future__ import annotations


import torch
from torch import nn
from torch.nn import functional as F

from models.config import ModelConfig
from models.gated_product import ACTIVATIONS, gated_product
from models.hooks import HookedMixin, HookPoint, only_read, unknown_name_message
from models.layout import input_major_
from models.mixers import MIXERS
from models.mixers.base import linear_size
from models.moe import MoE, uses_moe
from models.tl import run as tl_run
from models.tl.surface import MLPWeights, TLSurface, block_attention


class ScaleHooked:
    """A norm with hook_scale [B, T, 1], its divisor (TransformerLens' hook_scale): sqrt(var + eps)
    for LayerNorm, sqrt(mean(x^2) + eps) for RMSNorm (eps None: the dtype's); the normalisation
    is computed explicitly (through hook_scale) only while hook_scale is patched or probed for a
    gradient. While it is only read, the scale is formed for the readers without autograd and
    the output is torch's fused norm."""

    centred = True

    def __init__(self, d_model: int, **options) -> None:
        super().__init__(d_model, **options)  # type: ignore[call-arg]
        self.hook_scale = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D]
        if not self.hook_scale.is_active:
            return super().forward(x)  # type: ignore[misc]
        if only_read(self.hook_scale):
            with torch.no_grad():
                self.hook_scale(self.scale(x))  # for the readers
            return super().forward(x)  # type: ignore[misc]
        if self.centred:
            x = x - x.mean(-1, keepdim=True)
        out = x / self.hook_scale(self.scale(x, centred=True)) * self.weight
        return out if getattr(self, "bias", None) is None else out + self.bias

    def scale(self, x: torch.Tensor, centred: bool = False) -> torch.Tensor:
        """The divisor [B, T, 1] of x [B, T, D] (centred: x's mean is already subtracted)."""
        if self.centred and not centred:
            x = x - x.mean(-1, keepdim=True)
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
        return (x.square().mean(-1, keepdim=True) + eps).sqrt()


class LayerNorm(ScaleHooked, nn.LayerNorm):
    pass


class RMSNorm(ScaleHooked, nn.RMSNorm):
    centred = False


def make_norm(cfg: ModelConfig) -> nn.Module:
    """cfg.norm over d_model with cfg.norm_eps (None: torch's default eps), with hook_scale."""
    if cfg.norm == "layernorm":
        return LayerNorm(cfg.d_model) if cfg.norm_eps is None else LayerNorm(cfg.d_model, eps=cfg.norm_eps)
    if cfg.norm == "rmsnorm":
        return RMSNorm(cfg.d_model, eps=cfg.norm_eps)
    return nn.Identity()


def norm_size(cfg: ModelConfig) -> int:
    """Parameters of make_norm(cfg): LayerNorm's weight and bias, RMSNorm's weight."""
    return {"layernorm": 2, "rmsnorm": 1, "none": 0}[cfg.norm] * cfg.d_model


class MLP(MLPWeights, nn.Module):
    """down(act(up(x))), act erf GELU ("gelu"), its tanh approximation ("gelu_tanh") or squared
    ReLU ("relu2"), or down(act(gate(x)) * up(x)) with act SiLU ("swiglu") or erf GELU ("geglu");
    width cfg.mlp_width, biases if cfg.mlp_bias.

    Hooks: hook_pre [B, T, F] the pre-activation (up(x); gate(x) when gated), hook_post [B, T, F]
    the neurons down() reads, hook_out [B, T, d_model]. TransformerLens' W_in, W_gate, W_out,
    b_in, b_out (models.tl.surface.MLPWeights)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        width, bias = cfg.mlp_width, cfg.mlp_bias
        self.activation = cfg.mlp_activation
        if self.activation in ACTIVATIONS:
            self.gate = nn.Linear(cfg.d_model, width, bias=bias)
        self.up = nn.Linear(cfg.d_model, width, bias=bias)
        self.down = nn.Linear(width, cfg.d_model, bias=bias)
        self.hook_pre, self.hook_post, self.hook_out = HookPoint(), HookPoint(), HookPoint()

    @staticmethod
    def element_counts(cfg: ModelConfig) -> tuple[int, int]:
        """(parameters, buffer bytes) of MLP(cfg) (models.size)."""
        maps = 2 if cfg.mlp_activation in ACTIVATIONS else 1   # gate and up, or up
        d, width, bias = cfg.d_model, cfg.mlp_width, cfg.mlp_bias
        return maps * linear_size(d, width, bias) + linear_size(width, d, bias), 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D]
        if self.activation in ACTIVATIONS:  # keeps gate and up only for the backward (models/gated_product.py)
            hidden = gated_product(self.hook_pre(self.gate(x)), self.up(x), self.activation)
        elif self.activation == "relu2":
            hidden = F.relu(self.hook_pre(self.up(x))).square()
        else:
            hidden = F.gelu(self.hook_pre(self.up(x)), approximate="tanh" if self.activation == "gelu_tanh" else "none")
        return self.hook_out(self.down(self.hook_post(hidden)))


MIXER_SLOTS = ("mixer", "mixer2")


class Adapted(nn.Module):
    """A linear map with a low-rank adapter: x W^T + b + (x A^T) B^T, W [out, in] (weight, shared
    across depths by a SharedBranch), A [r, in] (lora_a), B [out, r] (lora_b), per depth."""

    def __init__(self, d_in: int, d_out: int, rank: int, bias: bool) -> None:
        super().__init__()
        base = nn.Linear(d_in, d_out, bias=bias)
        self.weight, self.bias = base.weight, base.bias
        self.lora_a = nn.Parameter(torch.zeros(rank, d_in))
        self.lora_b = nn.Parameter(torch.zeros(d_out, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        return F.linear(x, self.weight, self.bias) + F.linear(F.linear(x, self.lora_a), self.lora_b)


class SharedBranch(nn.Module):
    """Zamba2's shared transformer at one depth (cfg.shared_blocks): from the block input x and
    the embedding e [B, T, D],

        t = proj(mlp(norm_mlp(attn(norm_attn([x | e])))))    [B, T, D]   (hook_out)

    which the block adds to its mixer's input (not to the residual). attn is our attention over
    width 2 D (cfg's heads, positions and mixer_options["attention"]) writing width D; no residual
    around it. Hooks at layer l: blocks.{l}.shared.norm_attn.hook_scale, shared.attn.hook_*
    (hook_in [B, T, 2 D]), shared.norm_mlp.hook_scale, shared.mlp.hook_*, shared.hook_out: one
    set per depth. The layers naming one shared block share its weights (SHARED_WEIGHTS: the
    norms, attention and MLP maps; SequenceModel ties them); proj [D, D] and, with
    cfg.shared_adapter_rank r > 0, the low-rank adapters of attn.qkv (q, k, v each their own A
    [r, 2 D] and B: lora_a [3 r, 2 D], lora_b block-diagonal) and of mlp.gate / mlp.up (one A) are
    each depth's own."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        wide = cfg.layer_config(layer_idx, "shared").replace(d_model=2 * cfg.d_model)
        self.norm_attn = make_norm(wide)
        self.attn = MIXERS["attention"][0](wide, layer_idx)
        self.attn.out_proj = nn.Linear(self.attn.out_proj.in_features, cfg.d_model, bias=cfg.attention_bias)
        self.norm_mlp = make_norm(cfg)
        self.mlp = MLP(cfg)
        rank = cfg.shared_adapter_rank
        if rank:
            qkv = self.attn.qkv
            self.attn.qkv = Adapted(qkv.in_features, qkv.out_features, 3 * rank, qkv.bias is not None)
            for name in ("gate", "up") if hasattr(self.mlp, "gate") else ("up",):
                setattr(self.mlp, name, Adapted(cfg.d_model, cfg.mlp_width, rank, cfg.mlp_bias))
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.hook_out = HookPoint()

    @staticmethod
    def element_counts(cfg: ModelConfig, layer_idx: int) -> tuple[int, int, int]:
        """(parameters, buffer bytes, tied parameters) of SharedBranch(cfg, layer_idx): the tied
        ones (SHARED_WEIGHTS) are counted once per shared index by models.size, the rest per depth."""
        wide = cfg.layer_config(layer_idx, "shared").replace(d_model=2 * cfg.d_model)
        d, bias, rank = cfg.d_model, cfg.attention_bias, cfg.shared_adapter_rank
        inner, qkv = wide.n_heads * wide.head_dim, (wide.n_heads + 2 * wide.kv_heads) * wide.head_dim
        attention, buffers = MIXERS["attention"][0].element_counts(wide, layer_idx)
        attention_tied = linear_size(2 * d, qkv, bias) + linear_size(inner, d, bias)   # qkv, out_proj (to width D)
        mlp_tied = MLP.element_counts(cfg)[0]
        norms_tied = 3 * d if cfg.norm != "none" else 0   # norm_attn's and norm_mlp's weights; a bias is per depth
        own = (attention - linear_size(2 * d, qkv, bias) - linear_size(inner, 2 * d, bias)   # qk norms, output gate
               + norm_size(wide) + norm_size(cfg) - norms_tied + d * d)   # ... and proj
        if rank:   # lora_a [r, in], lora_b [out, r] of qkv (3 r) and of the MLP's gate and up (or up)
            adapted = 2 if cfg.mlp_activation in ACTIVATIONS else 1
            own += 3 * rank * (2 * d + qkv) + adapted * rank * (d + cfg.mlp_width)
        return own, buffers, attention_tied + mlp_tied + norms_tied

    def forward(self, x: torch.Tensor, embed: torch.Tensor, run=None) -> torch.Tensor:  # [B, T, D] each
        normed = self.norm_attn(torch.cat([x, embed], dim=-1))  # [B, T, 2 D]
        attended = self.attn(normed) if run is None else run("shared.attn", self.attn, normed)
        return self.hook_out(self.proj(self.mlp(self.norm_mlp(attended))))

    def tie_to(self, owner: "SharedBranch") -> None:
        """Use owner's shared weights (SHARED_WEIGHTS) in place of this depth's own."""
        for path in SHARED_WEIGHTS:
            module_path, _, name = path.rpartition(".")
            try:   # an MLP without a gate (gelu, relu2) has no mlp.gate
                mine, theirs = self.get_submodule(module_path), owner.get_submodule(module_path)
            except AttributeError:
                continue
            if getattr(theirs, name, None) is not None:
                setattr(mine, name, getattr(theirs, name))


# the weights of a SharedBranch its depths share (those present)
SHARED_WEIGHTS = tuple(f"{m}.{p}" for m in ("attn.qkv", "attn.out_proj", "mlp.gate", "mlp.up", "mlp.down")
                       for p in ("weight", "bias")) + ("norm_attn.weight", "norm_mlp.weight")


class Block(nn.Module):
    """One layer, in one of these layouts (cfg.mixers / cfg.mixer2s / cfg.mlps at the layer):

        mixer [+ MLP]            x + mixer(norm_mixer(x)) [-> x + mlp(norm_mlp(x))]
        mixer + mixer2 [+ MLP]   x + mixer(n) + mixer2(n), n = norm_mixer(x): two mixers in
                                 parallel on one norm (Falcon-H1), then the MLP as above
        MLP only                 x + mlp(norm_mlp(x)) (NemotronH's MLP layers); `mixer` is None
        shared + mixer           x + mixer(norm_mixer(x + shared(x, e))), e the embedding: Zamba2's
                                 hybrid layers (SharedBranch)

    Hooks: hook_resid_pre, hook_resid_mid (the residual after the mixers: what the MLP reads; equal
    to hook_resid_pre in an MLP-only block), hook_resid_post, and the sublayers' own under
    norm_mixer / mixer / mixer2 / norm_mlp / mlp."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        layer = cfg.layer_config(layer_idx)
        self.residual = cfg.residual
        self.hook_resid_pre = HookPoint()
        self.mixer = None
        if cfg.shared_blocks[layer_idx] is not None:
            self.shared = SharedBranch(cfg, layer_idx)
        if layer.mixer is not None:
            self.norm_mixer = make_norm(layer)
            self.mixer = MIXERS[layer.mixer][0](layer, layer_idx)
            if cfg.mixer2s[layer_idx] is not None:
                mixer2 = cfg.layer_config(layer_idx, "mixer2")
                self.mixer2 = MIXERS[mixer2.mixer][0](mixer2, layer_idx)
        self.hook_resid_mid = HookPoint()
        if layer.mlp:
            self.hook_mlp_in = HookPoint()      # the MLP's own copy of hook_resid_mid (TL's hook_mlp_in)
            self.norm_mlp = make_norm(layer)
            self.mlp = MoE(layer, MLP) if uses_moe(layer, layer_idx) else MLP(layer)
        self.hook_resid_post = HookPoint()

    @staticmethod
    def element_counts(cfg: ModelConfig, layer_idx: int) -> tuple[int, int, int]:
        """(parameters, buffer bytes, tied parameters of a shared branch) of Block(cfg, layer_idx),
        from each part's formula (models.size: nothing is built)."""
        layer = cfg.layer_config(layer_idx)
        parameters = buffers = tied = 0
        parts = []
        if cfg.shared_blocks[layer_idx] is not None:
            parameters, buffers, tied = SharedBranch.element_counts(cfg, layer_idx)
        if layer.mixer is not None:
            parameters += norm_size(layer)
            parts.append(MIXERS[layer.mixer][0].element_counts(layer, layer_idx))
            if cfg.mixer2s[layer_idx] is not None:
                mixer2 = cfg.layer_config(layer_idx, "mixer2")
                parts.append(MIXERS[mixer2.mixer][0].element_counts(mixer2, layer_idx))
        if layer.mlp:
            parameters += norm_size(layer)
            parts.append(MoE.element_counts(layer, MLP) if uses_moe(layer, layer_idx) else MLP.element_counts(layer))
        return parameters + sum(p for p, _ in parts), buffers + sum(b for _, b in parts), tied

    @property
    def mixers(self) -> dict[str, nn.Module]:
        """{slot: mixer} of this block's mixers ("mixer", "mixer2"), empty for an MLP-only block."""
        return {slot: getattr(self, slot) for slot in MIXER_SLOTS if getattr(self, slot, None) is not None}

    @property
    def attn(self) -> nn.Module | None:
        """TransformerLens' blocks[l].attn: the block's attention mixer (mixer, or mixer2 in a
        parallel layout) with TL's W_Q, ..., b_O; None without one."""
        return block_attention(self)

    @property
    def resume_context(self) -> int | None:
        """The block inputs before a resume point it reads (None: all; 0 without mixers)."""
        contexts = [mixer.resume_context for mixer in self.mixers.values()]
        return None if None in contexts or hasattr(self, "shared") else max(contexts, default=0)

    def forward(self, x: torch.Tensor, run=None, embed: torch.Tensor | None = None) -> torch.Tensor:  # [B, T, D]
        """run(slot, mixer, normed) -> [B, T, D]: how each mixer runs (default: mixer(normed));
        models.decoding passes its decoder. embed [B, T, D]: the embedding (hook_embed's output),
        which a shared branch reads."""
        x = self.hook_resid_pre(x)
        if not self.mixers:
            return self.after_mixer(x, None)
        if hasattr(self, "shared") and embed is None:
            raise ValueError("this block has a shared branch (Zamba2) that reads the embedding: pass "
                             "embed=[B, T, D] (the model's hook_embed output)")
        inputs = x if not hasattr(self, "shared") else x + self.shared(x, embed, run)
        normed = self.norm_mixer(inputs)
        if len(self.mixers) > 1:  # parallel mixers: each reads its own view, so each hook_in's gradient is its own
            normed = [normed.view_as(normed) for _ in self.mixers]
        else:
            normed = [normed]
        outs = [run(slot, mixer, x) if run is not None else mixer(x, inputs, self.norm_mixer)
                if mixer.reads_residual() else mixer(x) for x, (slot, mixer) in zip(normed, self.mixers.items())]
        return self.after_mixer(x, outs[0] if len(outs) == 1 else outs[0] + outs[1])

    def resume(self, x: torch.Tensor, before: torch.Tensor, carry: dict | None = None,
               embed: torch.Tensor | None = None) -> torch.Tensor:
        """forward() at positions start, ... only: x [B, n, D] the block input there, before
        [B, w, D] the block input at the positions just before (at least the block's
        resume_context of them, all when that is None), carry {slot: the mixer's state after
        start - 1} (a slot left out: its initial state), embed [B, w + n, D] the embedding at
        before's and x's positions (a shared branch reads it; it runs over all of them)."""
        x = self.hook_resid_pre(x)
        if not self.mixers:
            return self.after_mixer(x, None)
        inputs = torch.cat([before, x], dim=1)
        if hasattr(self, "shared"):
            inputs = inputs + self.shared(inputs, embed)
        normed = self.norm_mixer(inputs)  # one call: hook_scale holds the last positions
        skip, carry = before.shape[1], carry or {}
        outs = []
        for slot, mixer in self.mixers.items():
            context = skip if mixer.resume_context is None else min(mixer.resume_context, skip)
            outs.append(mixer.resume(normed[:, skip:], normed[:, skip - context : skip], carry.get(slot)))
        return self.after_mixer(x, outs[0] if len(outs) == 1 else outs[0] + outs[1])

    def after_mixer(self, x: torch.Tensor, mixed: torch.Tensor | None) -> torch.Tensor:  # [B, T, D] each
        """The residual after the mixers' output `mixed` (None: no mixer), then the MLP."""
        if mixed is not None:
            x = x + mixed if self.residual else mixed
        x = self.hook_resid_mid(x)
        if hasattr(self, "mlp"):
            out = self.mlp(self.norm_mlp(self.hook_mlp_in(x.view_as(x))))  # a view: its own gradient (the MLP's)
            x = x + out if self.residual else out
        return self.hook_resid_post(x)


class StatesAt:
    """A run's recurrent states [N, T, *S] kept at some positions only: values [N, P, *S] at the
    sorted int positions [P]. Indexed like the full tensor at one position: states[examples, t]
    -> [R, *S] (KeyError for a position not kept), which is how `resume_from` reads a carry."""

    def __init__(self, values: torch.Tensor, positions: list[int]) -> None:
        if values.shape[1] != len(positions):
            raise ValueError(f"values must have one entry per position on axis 1; got shape {tuple(values.shape)} "
                             f"for {len(positions)} positions")
        self.values, self.positions = values, list(positions)
        self._index = {t: i for i, t in enumerate(self.positions)}

    def __getitem__(self, key: tuple) -> torch.Tensor:
        examples, t = key
        if t not in self._index:
            raise KeyError(f"states kept at positions {self.positions}, not at {t}")
        return self.values[examples, self._index[t]]

    @property
    def nbytes(self) -> int:
        return self.values.numel() * self.values.element_size()


def check_mixers(cfg: ModelConfig) -> None:
    """ValueError for a mixer name that is not registered, or rope positions without a mixer that
    rotates (checked before any layer is built)."""
    names = [name for name in cfg.mixers + cfg.mixer2s if name is not None] + ["attention"] * cfg.has_shared
    for name in names:
        if name not in MIXERS:
            raise ValueError(unknown_name_message("mixer", name, list(MIXERS)))
    if cfg.positional == "rope" and not any(MIXERS[name][0].rotary_positions for name in names):
        raise ValueError(f"positional='rope' rotates attention queries and keys; the {cfg.mixer!r} mixer has "
                         f"none (allowed for it: 'none', 'learned')")


class SequenceModel(TLSurface, HookedMixin, nn.Module):
    """A stack of mixer blocks over a token embedding, with named hook points everywhere.

    forward(tokens [B, T] int) -> logits [B, T, vocab_size]; forward(tokens, at=positions [B])
    -> logits [B, vocab_size] at one position per row (`read_out`). TransformerLens' forward
    arguments and model attributes (W_E, W_U, W_Q, ..., to_tokens, tokens_to_residual_directions)
    work as in TL: models.tl.run, models.tl.surface.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        check_mixers(cfg)
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if cfg.positional == "learned":
            self.pos_embed = nn.Embedding(cfg.max_len, cfg.d_model)
            self.hook_token_embed, self.hook_pos_embed = HookPoint(), HookPoint()  # TL's hook_embed, hook_pos_embed
        self.hook_embed = HookPoint()
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        owners: dict[int, SharedBranch] = {}
        for block, index in zip(self.blocks, cfg.shared_blocks):
            if index is not None:  # the first layer naming a shared block holds its weights
                block.shared.tie_to(owners.setdefault(index, block.shared))
        for block in self.blocks:  # a mixer that reads another layer's values (RWKV-7's v_first) finds them
            if hasattr(block.mixer, "link_layers"):
                block.mixer.link_layers([b.mixer for b in self.blocks])
        self.norm_final = make_norm(cfg)
        self.hook_final = HookPoint()
        self.unembed = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.unembed.weight = self.embed.weight
        self.hook_logits = HookPoint()
        self.setup_hooks()
        input_major_(self)   # widening maps (the unembedding, MLP in, q / k / v) store W input-major

    def forward(self, tokens: torch.Tensor, at: torch.Tensor | None = None, return_type="logits",
                loss_per_token: bool = False, stop_at_layer: int | None = None, start_at_layer: int | None = None,
                labels=None, **kwargs):
        """The logits [B, T, V] (with `at`: [B, V], read_out). TransformerLens' forward: tokens
        may be text (with a tokenizer); return_type ("logits", "loss", "both", None; a str in
        the place of `at` is return_type, TL's second argument), loss_per_token, stop_at_layer,
        start_at_layer (tokens: the residual stream [B, T, D] entering that block), labels
        (models.tl.run)."""
        if isinstance(at, str):
            return_type, at = at, None
        tokens = self.as_tokens(tokens)
        if return_type == "logits" and not loss_per_token and stop_at_layer is None and start_at_layer is None \
                and labels is None and not kwargs:
            self.check_tokens(tokens)
            return self.read_out(self._blocks(self.embedding(tokens)), at)
        if at is not None:
            raise ValueError(f"at={at!r} reads the logits at one position per row; with return_type={return_type!r}, "
                             "stop_at_layer, start_at_layer or labels leave it out")
        return tl_run.tl_forward(self, tokens, kwargs, return_type, loss_per_token, stop_at_layer, start_at_layer,
                                 labels)

    def _blocks(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D] hook_embed's value -> the last block's output
        # the embedding stays alive only for blocks with a shared branch, which read it (Zamba2)
        embedding = x if any(hasattr(block, "shared") for block in self.blocks) else None
        for block in self.blocks:
            x = block(x, embed=embedding)
        return x

    def embedding(self, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        """hook_embed's value [B, T, D] for tokens [B, T] at positions start, start + 1, ...: the
        token embedding, plus with learned positions the position embedding [B, T, D], each through
        its own hook first (hook_token_embed, hook_pos_embed: TransformerLens' hook_embed and
        hook_pos_embed)."""
        x = self.embed(tokens)
        if hasattr(self, "pos_embed"):
            positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
            pos = self.pos_embed(positions)[None].repeat(tokens.shape[0], 1, 1)  # its own memory: hooks may write it
            x = self.hook_token_embed(x) + self.hook_pos_embed(pos)
        return self.hook_embed(x)

    def read_out(self, x: torch.Tensor, at: torch.Tensor | None = None, offset: int = 0) -> torch.Tensor:
        """The logits of the last block's output x [B, n, D] (positions offset, ..., offset + n - 1):
        [B, n, V], or with `at` [B] (absolute positions) [B, V] at one position per row, the final
        norm and unembedding applied there only, so no [B, n, V] tensor is formed (hook_final and
        hook_logits then see [B, 1, D] and [B, 1, V])."""
        if at is not None:
            at = torch.as_tensor(at, device=x.device)
            if at.shape != (x.shape[0],) or bool(((at < offset) | (at >= offset + x.shape[1])).any()):
                raise ValueError(f"at must hold one position per row, shape ({x.shape[0]},), each within "
                                 f"[{offset}, {offset + x.shape[1]}); got {at.tolist()}")
            x = x[torch.arange(x.shape[0], device=x.device), at - offset][:, None]  # [B, 1, D]
        x = self.hook_final(self.norm_final(x))  # rebound: a caller's temporary x is freed before the unembedding
        logits = self.hook_logits(self.unembed(x))
        return logits if at is None else logits[:, 0]

    def resume_hooks(self, layer: int = 0) -> dict[str, list[str]]:
        """The cached activations `resume_from` reads for runs resumed at block >= layer:
        {"resid": block inputs (and hook_embed, which shared branches read), "carry": recurrent
        states (mixers that resume from a state)}."""
        blocks = range(self.resume_start(layer), len(self.blocks))
        shared = any(hasattr(self.blocks[j], "shared") for j in blocks)
        return {
            "resid": ["hook_embed"] * shared + [f"blocks.{j}.hook_resid_pre" for j in blocks],
            "carry": [f"blocks.{j}.{slot}.hook_state" for j in blocks for slot in self._carrying(j)],
        }

    def _carrying(self, layer: int) -> list[str]:
        """The slots of block `layer` whose mixers resume from a carried state."""
        return [slot for slot, mixer in self.blocks[layer].mixers.items()
                if hasattr(mixer, "hook_state") and mixer.resume_context is not None]

    def resume_start(self, layer: int) -> int:
        """The block a run resumed at block `layer` recomputes from: `layer`, or an earlier block
        whose values a mixer at or after `layer` reads (`mixer.reads_layer`: RWKV-7's v_first, 0)."""
        return min([layer] + [getattr(block.mixer, "reads_layer", layer) for block in self.blocks[layer:]])

    def resume_from(self, cache, examples: torch.Tensor, layer: int, start: int, end: int,
                    at: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [R, end - start, V] at positions start, ..., end - 1 (with `at` [R], absolute
        positions in [start, end): logits [R, V] at those only, see read_out) of the cached run's
        examples [R], recomputed from block `layer` on. `cache` ({hook name: [N, T, ...]}, with
        the `resume_hooks(layer)`) is of a run that agrees with this one at every position before
        `start` and at blocks before `layer` (by causality, a run patched only at positions >=
        start in blocks >= layer): hooks patched during this call change the result as in a full
        run, with positions counted from the end (see Mixer.resume). The block inputs before
        `start` and the recurrent states after start - 1 come from the cache: cache[state hook] may
        be a `StatesAt` holding the states at the resume positions only."""
        if not 0 <= layer < len(self.blocks) or not 0 <= start < end:
            raise ValueError(f"resume_from needs 0 <= layer < {len(self.blocks)} and 0 <= start < end; "
                             f"got layer={layer}, start={start}, end={end}")
        layer = self.resume_start(layer)  # by causality the blocks before it give the cached values again
        needed = self.resume_hooks(layer)
        missing = [name for name in needed["resid"] + needed["carry"] if name not in cache]
        if missing:
            raise ValueError(f"cache lacks {missing}: cache every name in model.resume_hooks({layer}) "
                             f"(run_with_cache(tokens, names=hooks['resid'] + hooks['carry']))")
        x = cache[f"blocks.{layer}.hook_resid_pre"][examples, start:end]  # [R, n, D]
        for j in range(layer, len(self.blocks)):
            context = self.blocks[j].resume_context
            lo = 0 if context is None else max(start - context, 0)
            before = cache[f"blocks.{j}.hook_resid_pre"][examples, lo:start]  # [R, w, D]
            carry = {slot: cache[f"blocks.{j}.{slot}.hook_state"][examples, start - 1]
                     for slot in (self._carrying(j) if start else ())}
            embed = cache["hook_embed"][examples, lo:end] if hasattr(self.blocks[j], "shared") else None
            x = self.blocks[j].resume(x, before, carry, embed)
        return self.read_out(x, at, offset=start)

    def generate(self, tokens: torch.Tensor, max_new_tokens: int, **options):
        """Continue tokens [B, T] by up to max_new_tokens tokens, greedy or sampled, each new token
        one step from the carried decoding state (recurrent state, conv window, KV cache), hooks
        firing per token: models.decoding.generation.generate (its docstring lists the options)."""
        from models.decoding.generation import generate

        return generate(self, tokens, max_new_tokens, **options)

    def check_tokens(self, tokens: torch.Tensor) -> None:
        if not isinstance(tokens, torch.Tensor):
            raise TypeError(f"tokens must be a torch.Tensor of int ids [B, T]; got {type(tokens).__name__}")
        if tokens.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"tokens must have dtype torch.int64 or torch.int32 (token ids); got {tokens.dtype}"
                            + (" (convert with tokens.long())" if tokens.dtype in (torch.uint8, torch.int8, torch.int16) else ""))
        if tokens.dim() != 2:
            raise ValueError(f"tokens must have rank 2 [B, T]; got shape {tuple(tokens.shape)}")
        if tokens.shape[0] == 0:
            raise ValueError("tokens must hold at least one sequence (B >= 1); got B = 0")
        if tokens.shape[1] == 0:
            raise ValueError("tokens must have at least one position (T >= 1); got T = 0")
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= self.cfg.vocab_size:
            raise ValueError(
                f"tokens must lie in [0, vocab_size={self.cfg.vocab_size}); got values in [{low}, {high}]"
            )
        if hasattr(self, "pos_embed") and tokens.shape[1] > self.cfg.max_len:
            raise ValueError(
                f"tokens has length {tokens.shape[1]} but learned positions allow max_len={self.cfg.max_len}"
            )

    def save(self, run_dir, overwrite: bool = False, **info):
        """Write this model as a run directory that `models.load` rebuilds bit for bit (see
        models.storage.saving.save)."""
        from models.storage.saving import save

        return save(self, run_dir, overwrite=overwrite, **info)

    def set_execution_path(self, path: str) -> "SequenceModel":
        """'auto' (fast unless a hook needs per-step values), 'fast' or 'instrumented'."""
        if path not in ("auto", "fast", "instrumented"):
            raise ValueError(f"path must be 'auto', 'fast' or 'instrumented'; got {path!r}")
        for block in self.blocks:
            for mixer in [*block.mixers.values(), *([block.shared.attn] if hasattr(block, "shared") else [])]:
                mixer.execution_path = path
        return self
