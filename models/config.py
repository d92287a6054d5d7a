"""ModelConfig: every architecture's hyperparameters in one JSON-round-trippable dataclass."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

NORMS = ("layernorm", "rmsnorm", "none")
POSITIONALS = ("none", "learned", "rope")
MLP_ACTIVATIONS = ("gelu", "gelu_tanh", "swiglu", "geglu", "relu2")
# field -> the largest value a config may hold: far past any real model (Llama-3 405B: d_model 16384,
# 126 layers, d_mlp 53248, vocab 128256; Llama 4's 10M-token context), so a value past one is a typo
# or a hostile file (an extra zero, a 1e8) that would hang while layers are built or fail inside the
# allocator; whether a model within them fits is the memory check's (models.size.check_fits)
FIELD_BOUNDS = {
    "n_layers": 4096, "d_model": 1 << 16, "d_hidden": 1 << 16, "d_head": 1 << 14, "d_state": 1 << 14,
    "n_heads": 1 << 12, "n_kv_heads": 1 << 12, "expand": 64, "d_conv": 1 << 12, "mlp_ratio": 64,
    "d_mlp": 1 << 18, "vocab_size": 1 << 22, "max_len": 1 << 24, "shared_adapter_rank": 1 << 14,
}
MOE_BOUNDS = {"experts": 1 << 14, "top_k": 1 << 14, "d_expert": 1 << 18, "d_shared": 1 << 18}   # models/moe.py's keys
_TL_ACT_FN = {"gelu": "gelu", "gelu_tanh": "gelu_new", "swiglu": "silu", "geglu": "gelu", "relu2": "relu2"}


class Derived:
    """A field whose None means "derived from the others" (d_head, d_mlp). Reading it gives the
    value in effect, as TransformerLens' cfg.d_head / cfg.d_mlp do; the field as set (None where
    derived) is cfg.explicit(name), and it is what to_dict, replace, layer_config and == use, so a
    saved config keeps its None and a replaced d_model still derives its own d_head."""

    def __init__(self, derive) -> None:
        self.derive = derive

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return None   # the dataclass default
        value = obj.__dict__[self.name]
        return self.derive(obj) if value is None else value

    def __set__(self, obj, value) -> None:
        obj.__dict__[self.name] = value


DERIVED = ("d_head", "d_mlp")


@dataclass(eq=False)
class ModelConfig:
    """Hyperparameters of a SequenceModel.

    mixer: registered mixer name (see `models.mixers.MIXERS`), or one per layer (a list of
        n_layers names) for a hybrid stack; then mixer_options maps each listed mixer name to its
        options ({"mamba": {...}, "attention": {...}}, names left out get none). A None in the
        list: that layer has no mixer (an MLP-only block, hooks blocks.{l}.norm_mlp / mlp only).
    mixer2: None, a mixer name or one per layer (None where a layer has none): a second mixer
        in parallel with the first (Falcon-H1), reading the same norm_mixer output; the two
        outputs are summed into the residual. Its hooks are blocks.{l}.mixer2.*; mixer_options
        are then per mixer name (as for a hybrid). Block layouts per layer: mixer [+ mixer2]
        [+ MLP], or MLP only (models.backbone.Block).
    shared_block: None, or per layer the index of the shared transformer that layer runs (None:
        none there; a layer with a mixer): Zamba2's t = proj(mlp(norm(attention(norm([x |
        embedding]))))), added to the mixer's input, not to the residual; the attention
        (n_heads, n_kv_heads, d_head, positional, mixer_options["attention"]) reads width
        2 d_model, the MLP is d_mlp / mlp_activation / mlp_bias wide. Layers naming the same
        index share its weights (proj and the adapters are per layer). Hooks blocks.{l}.shared.*
        at each layer that has one. shared_adapter_rank: per-layer low-rank adapters (LoRA) of
        that rank on the shared attention's qkv and the MLP's gate and up (0: none).
    d_hidden: recurrent width of RNN-style mixers (default d_model).
    d_head: per-head width (default d_model // n_heads; cfg.d_head reads the value in effect,
        cfg.explicit("d_head") the field as set: Derived).
    d_state: SSM state size per channel (Mamba N).
    expand: inner width factor of gated mixers (Mamba d_inner = expand * d_model).
    d_conv: short causal convolution width (1 = no mixing across time).
    beta_scale: delta-rule step-size scale s (beta = s * sigmoid); a float or one per head.
    positional: positions for attention ("none", "learned", "rope"); max_len bounds "learned".
    norm_eps: epsilon of every norm (None: torch's default, 1e-5 for layernorm, finfo.eps for rmsnorm).
    residual: wrap mixer and MLP in residual connections (off gives a plain RNN stack).
    mlp: an MLP after each mixer (a bool, or one per layer); d_mlp its width (default mlp_ratio *
        d_model; cfg.d_mlp reads the value in effect, None without an MLP, as TransformerLens'
        attention-only models); mlp_activation "gelu" (erf), "gelu_tanh" (the tanh approximation, GPT-2's
        gelu_new), "swiglu" (down(silu(gate(x)) * up(x)), Llama's), "geglu" (the same with erf
        GELU, Zamba2's) or "relu2" (down(relu(up(x))^2), NemotronH's); mlp_bias: biases in its
        linear maps.
    n_kv_heads: key/value heads of attention (grouped-query attention; default n_heads; it must
        divide n_heads, query head h reads key/value head h // (n_heads / n_kv_heads)).
    attention_bias: biases in attention's input and output projections.
    tie_embeddings: the unembedding shares the embedding's weight.
    mixer_options: extra keyword options passed to the mixer, documented in the mixer's file.
    moe: a sparse mixture-of-experts MLP in place of the dense one ({"experts", "top_k",
        "d_expert", ...}: the keys are documented and checked in models/moe.py); None: dense.
    """

    mixer: str | list[str | None] = "tanh_rnn"
    mixer2: str | list[str | None] | None = None
    vocab_size: int = 16
    d_model: int = 64
    n_layers: int = 1
    d_hidden: int | None = None
    n_heads: int = 4
    d_head: int | None = Derived(lambda cfg: cfg.d_model // cfg.n_heads)  # type: ignore[assignment]
    d_state: int = 16
    expand: int = 2
    d_conv: int = 4
    beta_scale: float | list[float] = 1.0
    positional: str = "none"
    max_len: int = 2048
    norm: str = "layernorm"
    norm_eps: float | None = None
    residual: bool = True
    mlp: bool | list[bool] = False
    shared_block: list[int | None] | None = None
    shared_adapter_rank: int = 0
    mlp_ratio: int = 4
    d_mlp: int | None = Derived(lambda cfg: cfg.mlp_width if any(cfg.mlps) else None)  # type: ignore[assignment]
    mlp_activation: str = "gelu"
    mlp_bias: bool = True
    n_kv_heads: int | None = None
    attention_bias: bool = True
    tie_embeddings: bool = False
    mixer_options: dict[str, Any] = field(default_factory=dict)
    moe: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_state", "expand",
                     "d_conv", "max_len", "mlp_ratio"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int; got {value!r}")
        for name in ("d_hidden", "d_head", "d_mlp", "n_kv_heads"):
            value = self.explicit(name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} must be None or a positive int; got {value!r}")
        self._check_bounds()
        self._check_mixers()
        if self.moe is not None:
            from models.moe import moe_options  # the keys are documented and checked there

            opts = moe_options(self)
            for key, bound in MOE_BOUNDS.items():
                check_bound(f"moe[{key!r}]", opts[key], bound)
        for name in ("residual", "mlp_bias", "attention_bias", "tie_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool; got {getattr(self, name)!r}")
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}; got {self.norm!r}")
        eps = self.norm_eps
        if eps is not None and (not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps > 0):
            raise ValueError(f"norm_eps must be None or a positive float; got {eps!r}")
        if eps is not None and self.norm == "none":
            raise ValueError(f"norm_eps={eps!r} needs norm 'layernorm' or 'rmsnorm'; got norm='none'")
        if self.mlp_activation not in MLP_ACTIVATIONS:
            raise ValueError(f"mlp_activation must be one of {MLP_ACTIVATIONS}; got {self.mlp_activation!r}")
        if self.n_kv_heads is not None and self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads})")
        if self.positional not in POSITIONALS:
            raise ValueError(f"positional must be one of {POSITIONALS}; got {self.positional!r}")
        if self.explicit("d_head") is None and self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}) "
                "unless d_head is given"
            )
        scale = self.beta_scale
        is_number = lambda s: isinstance(s, (int, float)) and not isinstance(s, bool)  # noqa: E731
        if not (is_number(scale) or (isinstance(scale, (list, tuple)) and all(is_number(s) for s in scale))):
            raise ValueError(
                f"beta_scale must be a float in [0, 2] or a list of n_heads={self.n_heads} such "
                f"floats; got {scale!r}"
            )
        scales = self.beta_scales
        if len(scales) != self.n_heads or any(not 0.0 <= s <= 2.0 for s in scales):
            raise ValueError(
                f"beta_scale must be a float in [0, 2] or a list of n_heads={self.n_heads} such "
                f"floats; got {self.beta_scale!r}"
            )

    def _check_bounds(self) -> None:
        """ValueError naming the first field past FIELD_BOUNDS (checked before anything is sized by it:
        a list of n_layers mixers, the layers themselves)."""
        for name, bound in FIELD_BOUNDS.items():
            check_bound(name, self.explicit(name), bound)

    def _check_mixers(self) -> None:
        """mixer a name or a list of n_layers names (None: no mixer); mixer2 likewise; mlp
        a bool or one per layer; every layer has a mixer or an MLP, a mixer2 only beside a mixer;
        mixer_options a dict (per mixer name for a hybrid)."""
        self.mixer = self._per_layer("mixer", self.mixer)
        self.mixer2 = self._per_layer("mixer2", self.mixer2)
        self.mlp = self._flags("mlp", self.mlp)
        self._check_shared()
        for layer, (mixer, mixer2, mlp, shared) in enumerate(zip(self.mixers, self.mixer2s, self.mlps,
                                                                 self.shared_blocks)):
            if mixer is None and not mlp:
                raise ValueError(f"layer {layer} has neither a mixer nor an MLP (mixer None needs mlp True there)")
            if mixer is None and (mixer2 is not None or shared is not None):
                raise ValueError(f"layer {layer} has {'mixer2=' + repr(mixer2) if mixer2 else 'a shared_block'} "
                                 f"but no mixer: it goes beside one")
        if not isinstance(self.mixer_options, dict):
            raise TypeError(f"mixer_options must be a dict; got {type(self.mixer_options).__name__}")
        if self.hybrid:
            names = {n for n in self.mixers + self.mixer2s if n is not None} | ({"attention"} if self.has_shared else set())
            unknown = set(self.mixer_options) - names
            wrong = [name for name, opts in self.mixer_options.items() if not isinstance(opts, dict)]
            if unknown or wrong:
                raise ValueError(f"mixer_options of a hybrid map mixer names in {sorted(names)} to "
                                 f"dicts of their options; got {self.mixer_options!r}")

    def _flags(self, field_name: str, value: Any) -> bool | list[bool]:
        """A per-layer flag: a bool or a list of n_layers bools (a tuple becomes a list)."""
        value = list(value) if isinstance(value, tuple) else value
        if isinstance(value, bool) or (isinstance(value, list) and len(value) == self.n_layers
                                       and all(isinstance(v, bool) for v in value)):
            return value
        raise TypeError(f"{field_name} must be a bool or a list of n_layers={self.n_layers} bools; got {value!r}")

    def _per_layer(self, field_name: str, value: Any) -> str | list[str | None] | None:
        """A mixer field: None, a name, or a list of n_layers names / None (a tuple becomes a list)."""
        if isinstance(value, tuple):
            value = list(value)
        if isinstance(value, list):
            if not value or not all(m is None or isinstance(m, str) for m in value):
                raise TypeError(f"{field_name} must be a name or a non-empty list of names (None: no mixer in "
                                f"that layer); got {value!r}")
            if len(value) != self.n_layers:
                raise ValueError(f"{field_name} lists {len(value)} mixers {value}, one per layer, but "
                                 f"n_layers={self.n_layers}; give as many as n_layers")
        elif value is not None and not isinstance(value, str):
            raise TypeError(f"{field_name} must be a name (str) or a list of names; got {type(value).__name__}")
        return value

    @property
    def hybrid(self) -> bool:
        """Whether mixer_options are per mixer name: a list of mixers, a parallel mixer2, or shared
        blocks (their attention's options under "attention")."""
        return isinstance(self.mixer, list) or self.mixer2 is not None or self.has_shared

    @property
    def mixers(self) -> list[str | None]:
        """The mixer name of every layer (None: no mixer there)."""
        return list(self.mixer) if isinstance(self.mixer, list) else [self.mixer] * self.n_layers

    @property
    def mixer2s(self) -> list[str | None]:
        """The parallel mixer2 name of every layer (None: none there)."""
        return list(self.mixer2) if isinstance(self.mixer2, list) else [self.mixer2] * self.n_layers

    @property
    def mlps(self) -> list[bool]:
        """Whether each layer has an MLP."""
        return list(self.mlp) if isinstance(self.mlp, list) else [self.mlp] * self.n_layers

    @property
    def shared_blocks(self) -> list[int | None]:
        """The shared transformer each layer runs (None: none there; Zamba2)."""
        return [None] * self.n_layers if self.shared_block is None else list(self.shared_block)

    @property
    def has_shared(self) -> bool:
        return any(index is not None for index in self.shared_blocks)

    def _check_shared(self) -> None:
        """shared_block None or n_layers ints >= 0 / None; shared_adapter_rank an int >= 0."""
        value = list(self.shared_block) if isinstance(self.shared_block, tuple) else self.shared_block
        ok = lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0)  # noqa: E731
        if value is not None and not (isinstance(value, list) and len(value) == self.n_layers and all(map(ok, value))):
            raise TypeError(f"shared_block must be None or a list of n_layers={self.n_layers} shared block indices "
                            f"(ints >= 0) or None; got {self.shared_block!r}")
        self.shared_block = value
        rank = self.shared_adapter_rank
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
            raise ValueError(f"shared_adapter_rank must be an int >= 0; got {rank!r}")

    def layer_config(self, layer: int, slot: str = "mixer") -> "ModelConfig":
        """The config layer `layer`'s mixer in `slot` ("mixer", "mixer2" or "shared": the shared
        branch's attention) is built from: this one with that mixer as `mixer` (None: none
        there), that layer's mlp, and that mixer's mixer_options for a hybrid."""
        if slot not in ("mixer", "mixer2", "shared"):
            raise ValueError(f"slot must be 'mixer', 'mixer2' or 'shared'; got {slot!r}")
        if not self.hybrid and not isinstance(self.mlp, list):
            return self
        name = {"mixer": self.mixers, "mixer2": self.mixer2s, "shared": ["attention"] * self.n_layers}[slot][layer]
        options = dict(self.mixer_options.get(name, {})) if self.hybrid else self.mixer_options
        return self._replace(mixer=name, mixer2=None, mlp=self.mlps[layer], shared_block=None, mixer_options=options)

    @property
    def hidden(self) -> int:
        return self.d_hidden or self.d_model

    @property
    def head_dim(self) -> int:
        return self.d_head   # Derived: d_model // n_heads unless set

    @property
    def mlp_width(self) -> int:   # what an MLP is built with (also where no layer has one)
        return self.explicit("d_mlp") or self.mlp_ratio * self.d_model

    def explicit(self, name: str) -> Any:
        """The field `name` as set: None where d_head / d_mlp are derived (Derived); any other
        field's value."""
        return self.__dict__[name]

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @property
    def beta_scales(self) -> list[float]:
        if isinstance(self.beta_scale, (int, float)):
            return [float(self.beta_scale)] * self.n_heads
        return [float(s) for s in self.beta_scale]

    # TransformerLens' HookedTransformerConfig names for what we call otherwise (d_head and d_mlp
    # are our fields, read as TL's values: Derived)
    @property
    def d_vocab(self) -> int:
        return self.vocab_size

    @property
    def d_vocab_out(self) -> int:
        return self.vocab_size

    @property
    def n_ctx(self) -> int:  # the learned positions' bound (a default without them)
        return self.max_len

    @property
    def n_key_value_heads(self) -> int | None:
        return self.n_kv_heads

    @property
    def act_fn(self) -> str:
        return _TL_ACT_FN[self.mlp_activation]

    @property
    def gated_mlp(self) -> bool:
        return self.mlp_activation in ("swiglu", "geglu")

    @property
    def normalization_type(self) -> str | None:
        return {"layernorm": "LN", "rmsnorm": "RMS", "none": None}[self.norm]

    @property
    def positional_embedding_type(self) -> str:
        return {"learned": "standard", "rope": "rotary", "none": "none"}[self.positional]

    def replace(self, **overrides: Any) -> "ModelConfig":
        unknown = set(overrides) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown ModelConfig fields {sorted(unknown)}; valid: {self.field_names()}")
        return self._replace(**overrides)

    def _replace(self, **overrides: Any) -> "ModelConfig":
        """dataclasses.replace keeping a derived d_head / d_mlp derived (that reads them as set)."""
        return dataclasses.replace(self, **{**{name: self.explicit(name) for name in DERIVED}, **overrides})

    def __eq__(self, other: object) -> bool:   # the fields as set (Derived), as a dataclass's == compares
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self.to_dict() == other.to_dict()

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def to_dict(self) -> dict[str, Any]:
        """Every field as set (a derived d_head / d_mlp stays None: Derived)."""
        return {**dataclasses.asdict(self), **{name: self.explicit(name) for name in DERIVED}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        if not isinstance(data, dict):
            raise TypeError(f"a model config must be a dict; got {type(data).__name__}")
        unknown = set(data) - set(cls.field_names())
        if unknown:
            raise ValueError(f"unknown ModelConfig fields {sorted(unknown)}; valid: {cls.field_names()}")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ModelConfig":
        return cls.from_dict(json.loads(text))


def check_bound(name: str, value: Any, bound: int) -> None:
    """ValueError naming `name`, its value and the bound when an int value is past the bound."""
    if isinstance(value, int) and not isinstance(value, bool) and value > bound:
        raise ValueError(f"{name} {value} is past the sanity bound {bound} (a typo?); a model that large would "
                         "exhaust memory or hang while it is built")
