"""The size gate counts without building (issue 38): models.size.element_counts adds up formulas
(each mixer's element_counts beside its __init__; models.backbone's Block, MLP and SharedBranch;
models.moe's MoE), so a load pays no meta-device build. The formulas must be exact: for every
preset, every mixer option that shapes a weight, every block layout and the config every importer
makes, the count equals the built model's parameters (tied tensors once) and buffer bytes."""

import importlib
import subprocess
import sys

import pytest

import models
from models import size
from models.backbone import SequenceModel
from models.config import ModelConfig
from models.mixers import MIXERS

# mixer -> mixer_options variants (with config fields) covering every option that changes a weight's
# shape or presence, and every value the importers (models/interop) set
MIXER_VARIANTS: dict[str, list[dict]] = {
    "attention": [{}, dict(mixer_options={"qk_norm": True}), dict(mixer_options={"output_gate": True}),
                  dict(mixer_options={"qk_norm": True, "output_gate": True, "partial_rotary_factor": 0.5},
                       positional="rope", attention_bias=False, n_kv_heads=2, d_head=8)],
    "aussm": [{}],
    "baseconv": [{}],
    "based": [{}, dict(mixer_options={"window": 0, "feature_dim": 3})],
    "deltanet": [{}, dict(mixer_options={"gate": True, "beta_bias": False}, d_head=6)],
    "dense_ssm": [{}, dict(d_hidden=5)],
    "gated_deltanet": [{}, dict(mixer_options={"gate": False, "conv_bias": True}),
                       dict(mixer_options={"num_v_heads": 8, "expand_v": 1.0, "num_heads": 2, "head_dim": 6})],
    "gru": [{}, dict(d_hidden=7)],
    "h3": [{}, dict(d_head=3, d_state=5)],
    "hyena": [{}, dict(mixer_options={"filter_order": 8, "emb_dim": 7}, max_len=40)],
    "kda": [{}, dict(mixer_options={"conv_bias": True, "gate_bias": True}),
            dict(mixer_options={"num_heads": 2, "head_dim": 6, "expand_v": 2.0})],
    "layernorm_rnn": [{}, dict(d_hidden=7)],
    "lfm2_conv": [{}, dict(mixer_options={"bias": True})],
    "linear_rnn": [{}, dict(d_hidden=7)],
    "lstm": [{}, dict(d_hidden=7)],
    "mamba": [{}, dict(mixer_options={"bias": True, "conv_bias": False, "dt_rank": 3}),
              dict(mixer_options={"dt_bc_norm_eps": 1e-6}, d_state=5, expand=3)],
    "mamba2": [{}, dict(mixer_options={"n_groups": 2, "conv_bias": False, "bias": True}),
               dict(mixer_options={"gated_norm": "none", "n_heads": 2, "head_dim": 8})],
    "mamba3": [{}],
    "mla": [{}, dict(mixer_options={"q_lora_rank": 6, "kv_lora_rank": 5, "qk_rope_head_dim": 2, "v_head_dim": 3},
                     attention_bias=True),
            dict(mixer_options={"qk_rope_head_dim": 0, "qk_nope_head_dim": 7}, attention_bias=False)],
    "negative_mamba": [{}],
    "rwkv7": [{}, dict(mixer_options={"value_dim": 32, "decay_low_rank": 3, "a_low_rank": 4, "v_low_rank": 5,
                                      "gate_low_rank": 6})],
    "rwkv7_ffn": [{}, dict(d_mlp=24)],
    "s4d": [{}, dict(d_state=3)],
    "sphere_rnn": [{}, dict(d_hidden=7)],
    "state_gated_rnn": [{}, dict(d_hidden=7)],
    "tanh_rnn": [{}, dict(d_hidden=7)],
    "token_gated_rnn": [{}, dict(d_hidden=7)],
}

# layouts of the blocks around the mixers: norms, MLPs, MoE, shared blocks (Zamba2), parallel mixers
LAYOUTS = {
    "layernorm_gelu": dict(mixer="mamba", mlp=True, norm="layernorm"),
    "no_norm_relu2_no_bias": dict(mixer="mamba", mlp=True, norm="none", mlp_activation="relu2", mlp_bias=False),
    "swiglu_d_mlp": dict(mixer="attention", mlp=True, mlp_activation="swiglu", d_mlp=20, norm="rmsnorm"),
    "geglu_tied_learned": dict(mixer="attention", mlp=True, mlp_activation="geglu", positional="learned",
                               max_len=64, tie_embeddings=True),
    "hybrid_mlp_only": dict(mixer=["attention", "mamba2", None], mlp=[True, False, True]),
    "parallel": dict(mixer=["mamba2", "mamba2", "mamba2"], mixer2=["attention", None, "attention"], mlp=True,
                     mlp_activation="swiglu", mixer_options={"mamba2": {"n_heads": 2}, "attention": {"qk_norm": True}}),
    "moe": dict(mixer="gated_deltanet", n_heads=2, mlp=True, mlp_activation="swiglu", mlp_bias=False,
                moe={"experts": 5, "top_k": 2, "d_expert": 6, "d_shared": 7, "layers": [1]}),
    "moe_sigmoid_relu2_ungated": dict(mixer="mamba", mlp=True, moe={
        "experts": 4, "top_k": 2, "d_expert": 5, "d_shared": 3, "shared_gate": False, "routing": "sigmoid",
        "n_group": 2, "topk_group": 1, "expert_activation": "relu2"}),
    "moe_no_shared": dict(mixer="attention", mlp=True, moe={"experts": 3, "top_k": 1, "d_expert": 4}),
    "zamba2": dict(mixer="mamba2", shared_block=[0, None, 0], shared_adapter_rank=2, mlp=True, n_heads=4,
                   mlp_activation="geglu", norm="rmsnorm", mixer_options={"mamba2": {"n_heads": 2}}),
    "zamba2_two_shared_layernorm": dict(mixer="mamba2", shared_block=[0, 1, 0], mlp=True, norm="layernorm",
                                        mlp_activation="swiglu", attention_bias=False,
                                        mixer_options={"attention": {"qk_norm": True, "output_gate": True}}),
    "zamba2_gqa_adapters": dict(mixer="mamba2", shared_block=[None, 0, 0], shared_adapter_rank=3, mlp=True,
                                n_kv_heads=2, mlp_activation="swiglu", mlp_bias=False, mixer_options={"mamba2": {}}),
    "zamba2_gelu_adapters": dict(mixer="mamba2", shared_block=[0, 0, None], shared_adapter_rank=2, mlp=True, n_heads=4,
                                 mlp_activation="gelu", mixer_options={"mamba2": {"n_heads": 2}}),
    "zamba2_relu2": dict(mixer="mamba2", shared_block=[0, None, 0], mlp=True, n_heads=4, mlp_activation="relu2",
                         mixer_options={"mamba2": {"n_heads": 2}}),
    "rwkv7": dict(mixer=["rwkv7", "rwkv7_ffn", "rwkv7"], n_heads=4),
}


def built_counts(config: ModelConfig) -> tuple[int, int]:
    model = SequenceModel(config)
    return (sum(p.numel() for p in model.parameters()),   # a shared (tied) tensor once
            sum(b.numel() * b.element_size() for b in model.buffers()))


def assert_exact(config: ModelConfig, what: str) -> None:
    counted, built = size.element_counts(config), built_counts(config)
    assert counted == built, (
        f"{what}: models.size counts {counted[0]:,} parameters and {counted[1]:,} buffer bytes, the built model has "
        f"{built[0]:,} and {built[1]:,}: a formula (a mixer's element_counts beside its __init__, or Block / MLP / "
        f"SharedBranch / MoE.element_counts) no longer matches its constructor")


def test_every_registered_mixer_defines_its_own_formula():
    """Inherited formulas would count a subclass's new weights wrong unnoticed: each class says so itself."""
    missing = sorted(name for name, (cls, _) in MIXERS.items() if "element_counts" not in vars(cls))
    assert not missing, (f"mixers {missing} define no element_counts(cfg, layer_idx) of their own: the size gate "
                         f"(models.size) counts parameters from each mixer's formula, beside its __init__; add one "
                         f"(return super().element_counts(...) where the weights are the parent's)")
    unlisted = sorted(set(MIXERS) - set(MIXER_VARIANTS))
    assert not unlisted, f"mixers {unlisted} have no entry in MIXER_VARIANTS: list their options that shape weights"


@pytest.mark.parametrize("name", models.list_models())
@pytest.mark.parametrize("n_layers", [1, 3])
def test_every_preset(name, n_layers):
    assert_exact(models.preset_config(name, vocab_size=11, d_model=16, n_layers=n_layers), name)


@pytest.mark.parametrize("mixer, variant", [(m, v) for m, vs in MIXER_VARIANTS.items() for v in range(len(vs))])
def test_every_mixer_option_that_shapes_a_weight(mixer, variant):
    fields = MIXER_VARIANTS[mixer][variant]
    defaults = MIXERS[mixer][1]
    config = ModelConfig(**{**defaults, "vocab_size": 11, "d_model": 16, "n_layers": 2, "mixer": mixer, **fields})
    assert_exact(config, f"{mixer} {fields}")


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_every_block_layout(name):
    fields = LAYOUTS[name]
    n_layers = len(fields["mixer"]) if isinstance(fields["mixer"], list) else 3
    assert_exact(ModelConfig(vocab_size=11, d_model=16, n_layers=n_layers, **fields), name)


BAD_OPTIONS = [(m, {"no_such_option": 1}) for m in sorted(MIXER_VARIANTS)] + [
    ("s4d", {"dt_min": 0.5, "dt_max": 0.1}), ("lfm2_conv", {"bias": 1}), ("based", {"window": -1}),
    ("hyena", {"emb_dim": 4}), ("mamba2", {"n_groups": 3}), ("rwkv7", {"value_dim": 10}), ("mamba", {"dt_min": 0}),
    ("attention", {"qk_norm": "yes"}), ("mla", {"kv_lora_rank": None}), ("kda", {"expand_v": 0.01}),
    ("gated_deltanet", {"num_v_heads": 3}), ("deltanet", {"beta_bias": 1}), ("linear_rnn", {"chunk": 0}),
]


@pytest.mark.parametrize("mixer, options", BAD_OPTIONS)
def test_the_gate_refuses_what_the_constructor_refuses_in_its_words(mixer, options):
    """The count parses a mixer's options with the constructor's own checks: a run refused at the
    gate (before its directory is made, interp.training.preflight) is refused as the build would."""
    config = ModelConfig(**{**MIXERS[mixer][1], "vocab_size": 11, "d_model": 16, "mixer": mixer,
                            "mixer_options": options})
    with pytest.raises((ValueError, TypeError)) as built:
        SequenceModel(config)
    with pytest.raises(type(built.value)) as counted:
        size.element_counts(config)
    assert str(counted.value) == str(built.value)


def test_a_mixer_without_a_formula_is_named():
    """A mixer registered without element_counts: the gate's error names it and what to add."""
    from models.mixers.base import Mixer

    class Unformulated(Mixer):
        mixer_name = "unformulated"

    with pytest.raises(NotImplementedError, match=r"mixer 'unformulated' \(Unformulated\) defines no element_counts"):
        Unformulated.element_counts(ModelConfig(), 0)


# the importers' tiny sources in their own tests: (test module, source builder) per converter
IMPORTER_SOURCES = {
    "gpt2": ("tests.test_interop", "gpt2_source"),
    "llama": ("tests.test_interop", "llama_source"),
    "mamba": ("tests.test_interop", "mamba_source"),
    "falcon_mamba": ("tests.test_interop", "falcon_mamba_source"),
    "jamba": ("tests.test_interop", "jamba_source"),
    "mamba2": ("tests.test_interop_mamba2", "mamba2_source"),
    "nemotron_h": ("tests.test_interop_hybrid", "nemotron_h_source"),
    "bamba": ("tests.test_interop_hybrid", "bamba_source"),
    "granitemoehybrid": ("tests.test_interop_hybrid", "granite_source"),
    "granitemoehybrid_moe": ("tests.test_interop_hybrid", "granite_moe_source"),
    "falcon_h1": ("tests.test_interop_hybrid", "falcon_h1_source"),
    "zamba2": ("tests.test_interop_hybrid", "zamba2_source"),
    "lfm2": ("tests.test_interop_lfm2", "lfm2_source"),
    "qwen3": ("tests.test_interop_qwen3", "qwen3_source"),
    "qwen3_moe": ("tests.test_interop_qwen3", "qwen3_moe_source"),
    "qwen3_next": ("tests.test_interop_qwen", "next_source"),
    "qwen3_5_text": ("tests.test_interop_qwen", "qwen35_source"),
    "qwen3_5_moe_text": ("tests.test_interop_qwen", "qwen35_moe_source"),
    "kimi_linear": ("tests.test_interop_kimi", "kimi_source"),
    "delta_net": ("tests.test_interop_fla", "deltanet_source"),
    "gated_deltanet": ("tests.test_interop_fla", "gated_source"),
    "rwkv7": ("tests.test_rwkv7", "rwkv7_source"),
}


def test_every_converter_has_an_importer_source():
    from models.interop.registry import CONVERTERS

    multimodal = {"qwen3_5", "qwen3_5_moe"}   # the text model of the qwen3_5_text / qwen3_5_moe_text converters
    assert set(CONVERTERS) - multimodal <= set(IMPORTER_SOURCES), sorted(set(CONVERTERS) - set(IMPORTER_SOURCES))


@pytest.mark.parametrize("name", sorted(IMPORTER_SOURCES))
def test_every_importer_config(name):
    """The config each converter makes of its tiny test source (transformers / fla layouts, options
    and MoE routings as imported)."""
    pytest.importorskip("transformers")
    module_name, builder = IMPORTER_SOURCES[name]
    try:
        source = getattr(importlib.import_module(module_name), builder)()
    except (ImportError, pytest.skip.Exception) as error:   # fla not installed
        pytest.skip(f"{name}: its source cannot be built here ({error})")
    from models.interop.registry import converter_for

    converter = converter_for(type(source).__name__, source.config.model_type)
    config, _ = converter.convert(source)
    assert_exact(config, name)


def test_the_count_builds_nothing():
    """A fresh process counting a Mamba-130m-sized model (the mamba preset, untied): no meta-device
    op ran (the first one imports sympy for torch.fx's symbolic shapes: 0.3-1.6 s and ~140 MB on a
    load), and the count is the built model's (167,750,400: test_every_preset checks the formula)."""
    code = ("import sys, models; from models import size; "
            "c = models.preset_config('mamba', vocab_size=50280, d_model=768, n_layers=24); "
            "print(size.parameter_count(c), 'sympy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["167750400", "False"], out
