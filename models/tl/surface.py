"""TransformerLens' HookedTransformer attributes on our models: weights under TL's names and
layouts, and the tokenizer methods.

Weights (TL's shapes; l a layer, H query heads, G key/value heads, d d_head, D d_model, F the
MLP width, V the vocabulary):

    model.W_E [V, D], model.W_U [D, V], model.W_pos [n_ctx, D]    the embedding's, unembedding's and
                                                                  position embedding's weights
                                                                  themselves (views: W_U is the
                                                                  unembedding's weight transposed)
    model.blocks[l].attn.W_Q [H, D, d], W_K / W_V [G, D, d],     views of the attention's fused q, k, v
    W_O [H, d, D], b_Q [H, d], b_K / b_V [G, d], b_O [D]         map and its output map (attn: the
                                                                  block's attention mixer, mixer2 in
                                                                  Falcon-H1's parallel layout)
    model.blocks[l].mlp.W_in [D, F], W_gate [D, F] (gated MLPs;   views of the MLP's up, gate and down
    None otherwise), W_out [F, D], b_in [F], b_out [D]            maps
    model.W_Q, ..., model.b_out                                   the per-layer ones stacked on a new
                                                                  layer axis (a new tensor, as TL's
                                                                  torch.stack; gradients reach the
                                                                  parameters); every layer must have
                                                                  the component
    model.b_U [V], an absent bias                                 zeros (a new tensor), as TL's
    model.QK, model.OV, QK_for_attn_layers(), OV_for_attn_layers(), all_composition_scores(mode):
    TL's FactoredMatrix / CompositionScores over these weights (models.tl.circuits; TransformerLens
    needed)

The query / key maps are before the rotary map and the per-head q / k norms (Qwen3), as TL's;
an output gate (Qwen3-Next) is outside W_O. Grouped-query attention keeps its G key / value
heads, as TL 4.3's bridge (HookedTransformer repeated them to H).

Tokenizer (`model.tokenizer`, a transformers tokenizer: `model.set_tokenizer(tok)`, or
`models.from_pretrained(directory)` keeps the checkpoint's own): to_tokens, to_string,
to_str_tokens, to_single_token as TL 4.3's bridge computes them (prepend_bos default True:
the BOS token in front unless the tokenizer adds one itself), and a str or list of str wherever
a model takes token ids. Padding is on the right only (there are no padding masks here; the real
tokens never see right padding). tokens_to_residual_directions(tokens) is W_U's column of each
token [..., D].
"""

from __future__ import annotations

import torch
from torch import nn

from models.tl import circuits


class NoWeight(ValueError):
    """A TransformerLens weight this model (or one of its layers) does not have."""


class MLPWeights:
    """TL's W_in / W_gate / W_out and biases on a dense MLP (up, gate, down: nn.Linear), as views."""

    @staticmethod
    def _bias(linear: nn.Linear) -> torch.Tensor:
        return linear.weight.new_zeros(linear.out_features) if linear.bias is None else linear.bias

    @property
    def W_in(self) -> torch.Tensor:  # [D, F]
        return self.up.weight.t()

    @property
    def W_gate(self) -> torch.Tensor | None:  # [D, F]; None for an ungated MLP (TL's)
        return self.gate.weight.t() if hasattr(self, "gate") else None

    @property
    def W_out(self) -> torch.Tensor:  # [F, D]
        return self.down.weight.t()

    @property
    def b_in(self) -> torch.Tensor:
        return self._bias(self.up)

    @property
    def b_out(self) -> torch.Tensor:
        return self._bias(self.down)


ATTENTION_WEIGHTS = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")
MLP_WEIGHTS = ("W_in", "W_gate", "W_out", "b_in", "b_out")


def block_attention(block: nn.Module) -> nn.Module | None:
    """The block's attention mixer (TL's blocks[l].attn, with TL's weights: the attention mixer's
    AttentionWeights, models.mixers.attention): mixer, else mixer2, else None."""
    for mixer in block.mixers.values():
        if getattr(mixer, "tl_weights", False):
            return mixer
    return None


def stacked(model: nn.Module, name: str) -> torch.Tensor | None:
    """TL's model.{name}: every layer's blocks[l].attn.{name} or blocks[l].mlp.{name} stacked on a
    new first axis [L, ...]; NoWeight naming the layers that lack it."""
    attention = name in ATTENTION_WEIGHTS
    owners = [block_attention(b) if attention else getattr(b, "mlp", None) for b in model.blocks]
    lacking = [layer for layer, owner in enumerate(owners)
               if owner is None or not (attention or isinstance(owner, MLPWeights))]
    if lacking:
        what = "attention mixer" if attention else "dense MLP"
        raise NoWeight(f"model.{name} stacks every layer's; layers {lacking} have no {what} (mixers "
                       f"{[model.cfg.mixers[l] for l in lacking][:4]}): read model.blocks[l]."
                       f"{'attn' if attention else 'mlp'}.{name} at the layers that have one")
    values = [getattr(owner, name) for owner in owners]
    return None if values[0] is None else torch.stack(values)


def _stacked_property(name: str) -> property:
    return property(lambda self: stacked(self, name), doc=f"TL's {name}: every layer's, stacked [L, ...]")


class TLSurface:
    """TransformerLens' model attributes (module docstring) for SequenceModel."""

    tokenizer = None

    @property
    def W_E(self) -> torch.Tensor:  # [V, D]
        return self.embed.weight

    @property
    def W_U(self) -> torch.Tensor:  # [D, V]
        return self.unembed.weight.t()

    @property
    def b_U(self) -> torch.Tensor:  # [V]: no unembedding bias here
        return self.unembed.weight.new_zeros(self.unembed.out_features)

    @property
    def W_pos(self) -> torch.Tensor:  # [n_ctx, D]
        if not hasattr(self, "pos_embed"):
            raise NoWeight(f"W_pos is the learned position embedding; this model has positional="
                           f"{self.cfg.positional!r} (allowed for W_pos: 'learned')")
        return self.pos_embed.weight

    @property
    def W_E_pos(self) -> torch.Tensor:  # [V + n_ctx, D]
        return torch.cat([self.W_E, self.W_pos])

    # ------------------------------------------------------------------ weight circuits (models.tl.circuits)

    @property
    def QK(self):
        """TL's FactoredMatrix(W_Q, W_K^T) [L, H, D, D] (needs TransformerLens: the [tl] extra)."""
        return circuits.qk(self)

    @property
    def OV(self):
        """TL's FactoredMatrix(W_V, W_O) [L, H, D, D] (needs TransformerLens: the [tl] extra)."""
        return circuits.ov(self)

    def QK_for_attn_layers(self):
        """(the attention layers, QK over them): TL's, for hybrids."""
        layers = circuits.attention_layers(self)
        return layers, circuits.qk(self, layers)

    def OV_for_attn_layers(self):
        """(the attention layers, OV over them): TL's, for hybrids."""
        layers = circuits.attention_layers(self)
        return layers, circuits.ov(self, layers)

    def all_composition_scores(self, mode: str):
        """TL's CompositionScores of every head pair, mode "Q", "K" or "V" (models.tl.circuits)."""
        return circuits.composition_scores(self, mode)

    # ------------------------------------------------------------------ the tokenizer

    def set_tokenizer(self, tokenizer) -> None:
        """Attach a transformers tokenizer (TL's set_tokenizer); without a pad token it pads with
        its EOS token, as TL does."""
        if not callable(getattr(tokenizer, "batch_decode", None)):
            raise TypeError(f"tokenizer must be a transformers tokenizer; got {type(tokenizer).__name__}")
        if tokenizer.pad_token is None and tokenizer.eos_token is not None:
            tokenizer.pad_token = tokenizer.eos_token
        self.tokenizer = tokenizer

    def _tokenizer(self):
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: model.set_tokenizer(tok) (a transformers tokenizer), or "
                             "pass token ids [B, T]")
        return self.tokenizer

    def as_tokens(self, tokens):
        """Token ids as they are; a str or a list of str through to_tokens (TL's forward does this)."""
        if isinstance(tokens, str) or (isinstance(tokens, list) and tokens and all(isinstance(s, str) for s in tokens)):
            if self.tokenizer is None:
                raise ValueError(f"tokens is text ({tokens!r:.40}) but this model has no tokenizer: model.set_tokenizer(tok) "
                                 "(a transformers tokenizer), or pass token ids [B, T]")
            return self.to_tokens(tokens)
        return tokens

    def to_tokens(self, input, prepend_bos: bool | None = None, padding_side: str | None = None,
                  move_to_device: bool = True, truncate: bool = True) -> torch.Tensor:
        """A str or list of str -> token ids [B, T] (TL 4.3's bridge): BOS in front unless
        prepend_bos=False, padded on the right, truncated to n_ctx (cfg.max_len) where positions
        are learned (no other length bound here)."""
        tokenizer = self._tokenizer()
        if padding_side not in (None, "right"):
            raise ValueError(f"padding_side must be None or 'right' (no padding masks here: right padding never "
                             f"reaches the real tokens); got {padding_side!r}")
        if not (isinstance(input, str) or (isinstance(input, list) and all(isinstance(s, str) for s in input))):
            raise TypeError(f"to_tokens takes a str or a list of str; got {type(input).__name__}")
        prepend_bos = True if prepend_bos is None else prepend_bos
        adds_bos, adds_eos = _adds_bos_eos(tokenizer)
        if prepend_bos and not adds_bos and tokenizer.bos_token is not None:
            input = tokenizer.bos_token + input if isinstance(input, str) else [tokenizer.bos_token + s for s in input]
        truncate = truncate and self.cfg.positional == "learned"  # the one length bound our models have
        tokens = tokenizer([input] if isinstance(input, str) else input, return_tensors="pt", padding=True,
                           padding_side="right", truncation=truncate,
                           max_length=self.cfg.max_len if truncate else None)["input_ids"]
        while adds_eos and tokens.shape[-1] > 1 and bool((tokens[:, -1] == tokenizer.eos_token_id).all()):
            tokens = tokens[:, :-1]
        if not prepend_bos and adds_bos:
            tokens = tokens[:, 1:]
        return tokens.to(self.embed.weight.device) if move_to_device else tokens

    def to_string(self, tokens) -> str | list[str]:
        """Token ids [T] -> a str, [B, T] -> a list of str (TL's to_string)."""
        tokens = torch.as_tensor(tokens)
        if tokens.dim() > 2:
            raise ValueError(f"to_string takes token ids [T] or [B, T]; got shape {tuple(tokens.shape)}")
        if tokens.dim() == 2:
            return self._tokenizer().batch_decode(tokens, clean_up_tokenization_spaces=False)
        return self._tokenizer().decode(tokens, clean_up_tokenization_spaces=False)

    def to_str_tokens(self, input, prepend_bos: bool | None = None, padding_side: str | None = None):
        """Each token as its own string: a str (through to_tokens), token ids (squeezed to [T]) or a
        list of either (a list of lists)."""
        if isinstance(input, list) and not all(isinstance(t, int) for t in input):
            return [self.to_str_tokens(item, prepend_bos, padding_side) for item in input]
        if isinstance(input, str):
            tokens = self.to_tokens(input, prepend_bos=prepend_bos, padding_side=padding_side)[0]
        else:
            tokens = torch.as_tensor(input).squeeze()
            tokens = tokens.reshape(1) if tokens.dim() == 0 else tokens
            if tokens.dim() != 1:
                raise ValueError(f"to_str_tokens takes a str or token ids of one sequence; got shape "
                                 f"{tuple(torch.as_tensor(input).shape)}")
        return self._tokenizer().batch_decode([[int(t)] for t in tokens.tolist()], clean_up_tokenization_spaces=False)

    def to_single_token(self, string: str) -> int:
        """The id of a string that is one token (ValueError otherwise)."""
        token = self.to_tokens(string, prepend_bos=False).squeeze()
        if token.numel() != 1:
            raise ValueError(f"to_single_token: {string!r} is {token.numel()} tokens, not one")
        return int(token.item())

    def tokens_to_residual_directions(self, tokens) -> torch.Tensor:
        """W_U's column of each token: a str, an int or one-element tensor -> [D]; token ids
        [...] -> [..., D] (TL's)."""
        if isinstance(tokens, torch.Tensor) and tokens.numel() > 1:
            return self.W_U[:, tokens].movedim(0, -1)
        if isinstance(tokens, str):
            token = self.to_single_token(tokens)
        elif isinstance(tokens, int) and not isinstance(tokens, bool):
            token = tokens
        elif isinstance(tokens, torch.Tensor) and tokens.numel() == 1 and not tokens.is_floating_point():
            token = int(tokens.item())
        else:
            raise TypeError(f"tokens must be a str, an int or a tensor of token ids; got {tokens!r}")
        if not 0 <= token < self.cfg.vocab_size:
            raise ValueError(f"token must lie in [0, vocab_size={self.cfg.vocab_size}); got {token}")
        return self.W_U[:, token]


for _name in ATTENTION_WEIGHTS + MLP_WEIGHTS:  # model.W_Q, ..., model.b_out
    setattr(TLSurface, _name, _stacked_property(_name))


def _adds_bos_eos(tokenizer) -> tuple[bool, bool]:
    """Whether the tokenizer puts its BOS token in front (Llama's does, GPT-2's not) and its EOS
    token at the end by itself: TL 4.3's test, on "a" (an unknown "a" may be the BOS id itself)."""
    ids = tokenizer.encode("a")
    prepends = len(ids) > 1 and ids[0] in {tokenizer.bos_token_id, getattr(tokenizer, "cls_token_id", None)} - {None}
    appends = len(ids) > 1 and tokenizer.eos_token_id is not None and ids[-1] == tokenizer.eos_token_id
    return prepends, appends


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model",
                   "special_tokens_map.json")
TOKENIZER_MAX_BYTES = 1 << 28  # 256 MiB a file: the largest tokenizers ship ~35 MB (Gemma's tokenizer.json)


def directory_tokenizer(directory):
    """The tokenizer saved in a local checkpoint directory (transformers' AutoTokenizer, local files
    only, no remote code: an auto_map naming the directory's Python files is not imported), or
    None when it has no tokenizer files; each file's size bounded first (TOKENIZER_MAX_BYTES)."""
    found = [directory / name for name in TOKENIZER_FILES if (directory / name).is_file()]
    if not found:
        return None
    for path in found:
        if path.stat().st_size > TOKENIZER_MAX_BYTES:
            raise ValueError(f"tokenizer file {str(path)!r} is {path.stat().st_size} bytes; at most "
                             f"{TOKENIZER_MAX_BYTES} are read (pass tokenizer=False to load the model without it)")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError) as error:
        raise ValueError(f"the tokenizer files in {str(directory)!r} could not be read ({error}); pass "
                         "tokenizer=False to load the model without one, or a tokenizer to attach") from error
