"""from_pretrained: parity with the transformers sources (tiny random configs, every parameter
jittered, T beyond the scan chunk), save -> load round trips, and clear errors."""

import json

import pytest
import torch

import models
from models.interop import UnsupportedConfig
from models.interop.load import load_directory
from tests.interop_parity import VOCAB, assert_parity, assert_round_trip, jitter

tf = pytest.importorskip("transformers")
T = 80  # > Mamba's chunk_size 64

IDS = dict(pad_token_id=0, bos_token_id=0, eos_token_id=0)


def tokens(batch=2, length=T, seed=1):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def mamba_source(**overrides):
    torch.manual_seed(0)
    config = tf.MambaConfig(vocab_size=VOCAB, hidden_size=16, state_size=4, num_hidden_layers=2, conv_kernel=3,
                            **{"use_bias": True, **IDS, **overrides})
    return jitter(tf.MambaForCausalLM(config))


def gpt2_source(**overrides):
    torch.manual_seed(0)
    config = tf.GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=4, n_positions=96, **IDS, **overrides)
    return jitter(tf.GPT2LMHeadModel(config))


def llama_source(**overrides):
    torch.manual_seed(0)
    config = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                            num_attention_heads=4, **{"num_key_value_heads": 2, **IDS, **overrides})
    return jitter(tf.LlamaForCausalLM(config))


def falcon_mamba_source(**overrides):
    torch.manual_seed(0)
    config = tf.FalconMambaConfig(vocab_size=VOCAB, hidden_size=16, state_size=4, num_hidden_layers=2,
                                  conv_kernel=3, **{"mixer_rms_eps": 0.3, **IDS, **overrides})  # eps that matters
    return jitter(tf.FalconMambaForCausalLM(config))


def jamba_source(**overrides):
    """mamba, attention, mamba, attention (attn_layer_period 2), a dense SwiGLU MLP in each."""
    torch.manual_seed(0)
    config = tf.JambaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=24, num_hidden_layers=4,
                            num_attention_heads=4, num_key_value_heads=2, attn_layer_period=2, attn_layer_offset=1,
                            mamba_d_state=4, mamba_d_conv=3, **{"num_experts": 1, **IDS, **overrides})
    return jitter(tf.JambaForCausalLM(config))


SOURCES = {"mamba": mamba_source, "gpt2": gpt2_source, "llama": llama_source,
           "falcon_mamba": falcon_mamba_source, "jamba": jamba_source}


def test_jamba_imports_as_a_hybrid():
    model = models.from_pretrained(jamba_source())
    assert model.cfg.mixers == ["mamba", "attention", "mamba", "attention"]
    assert model.cfg.n_kv_heads == 2 and model.cfg.mixer_options["mamba"]["dt_bc_norm_eps"] == 1e-6


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_parity_in_float32(name):
    source = SOURCES[name]()
    assert_parity(source, models.from_pretrained(source), tokens(), atol=1e-4)


def test_gpt2_parity_in_float64_is_tight():
    """transformers' GPT-2 computes in the model's dtype: float64 agrees to 1e-10."""
    source = gpt2_source().double()
    model = models.from_pretrained(source)
    assert model.embed.weight.dtype == torch.float64
    assert_parity(source, model, tokens(), atol=1e-10)


@pytest.mark.parametrize("overrides", [dict(tie_word_embeddings=False, attention_bias=True, mlp_bias=True),
                                       dict(rope_parameters={"rope_type": "default", "rope_theta": 500.0},
                                            head_dim=8, num_key_value_heads=1)])
def test_llama_variants(overrides):
    source = llama_source(**overrides)
    model = models.from_pretrained(source)
    assert model.cfg.tie_embeddings == overrides.get("tie_word_embeddings", False)
    assert_parity(source, model, tokens(length=20), atol=1e-4)


def test_mamba_without_biases_and_untied():
    source = mamba_source(use_bias=False, use_conv_bias=False, tie_word_embeddings=False, time_step_rank=3)
    model = models.from_pretrained(source)
    assert model.blocks[0].mixer.conv.bias is None and model.blocks[0].mixer.dt_rank == 3
    assert_parity(source, model, tokens(length=20), atol=1e-4)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_round_trip_is_bit_identical(name, tmp_path):
    assert_round_trip(models.from_pretrained(SOURCES[name]()), tmp_path / name, tokens())


def test_round_trip_keeps_float64(tmp_path):
    assert_round_trip(models.from_pretrained(mamba_source().double()), tmp_path / "run", tokens())


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_from_a_checkpoint_directory(name, tmp_path):
    """Read straight from the safetensors files into a source on the meta device (tied lm_head
    from the embeddings), logits equal to the source's; dtype converts."""
    source = SOURCES[name]()
    source.save_pretrained(tmp_path / "ckpt")
    meta, checkpoint = load_directory(tmp_path / "ckpt", None)
    assert checkpoint is not None and checkpoint.complete and next(meta.parameters()).is_meta
    model = models.from_pretrained(tmp_path / "ckpt")
    with torch.no_grad():
        torch.testing.assert_close(model(tokens()), source(tokens()).logits, atol=1e-4, rtol=0)
        assert models.from_pretrained(tmp_path / "ckpt", dtype=torch.float64).embed.weight.dtype == torch.float64
        torch.testing.assert_close(models.from_pretrained(tmp_path / "ckpt").state_dict(), model.state_dict(),
                                   atol=0, rtol=0)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_the_result_owns_its_weights_and_keeps_ties_and_flags(name):
    source = SOURCES[name]()
    model = models.from_pretrained(source)
    theirs = {t.untyped_storage().data_ptr() for t in source.state_dict().values()}
    assert not theirs & {t.untyped_storage().data_ptr() for t in model.state_dict().values()}
    built = dict(models.build(model.cfg).named_parameters())   # each laid out as a model built here (models.layout)
    assert all(p.stride() == built[n].stride() for n, p in model.named_parameters())
    assert (model.unembed.weight is model.embed.weight) == model.cfg.tie_embeddings
    before = model(tokens()).detach()
    with torch.no_grad():
        for tensor in source.state_dict().values():
            tensor.zero_()
    torch.testing.assert_close(model(tokens()).detach(), before, atol=0, rtol=0)
    flagged = [n for n, p in model.named_parameters() if getattr(p, "_no_weight_decay", False)]
    assert flagged == [n for n, p in models.build(model.cfg).named_parameters()
                       if getattr(p, "_no_weight_decay", False)]


def test_unsupported_architecture_lists_the_supported_ones(tmp_path):
    config = tf.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=32)
    with pytest.raises(ValueError, match=r"BertModel \(model_type 'bert'\) is not supported.*MambaForCausalLM"):
        models.from_pretrained(tf.BertModel(config))
    gpt2 = tf.GPT2Model(tf.GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2, **IDS))
    with pytest.raises(ValueError, match=r"GPT2Model .*for model_type 'gpt2' convert \['GPT2LMHeadModel'\]"):
        models.from_pretrained(gpt2)
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    with pytest.raises(ValueError, match="is not supported"):
        models.from_pretrained(tmp_path / "bert")


@pytest.mark.parametrize("make, message", [
    (lambda: gpt2_source(activation_function="relu"), "activation_function='relu'"),
    (lambda: gpt2_source(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx=True"),
    (lambda: llama_source(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}),
     "rope_parameters=.*rope_type 'default'"),
    (lambda: llama_source(hidden_act="gelu"), "hidden_act='gelu'"),
    (lambda: mamba_source(hidden_act="gelu"), "hidden_act='gelu'"),
])
def test_config_we_cannot_represent_raises(make, message):
    with pytest.raises(UnsupportedConfig, match=message):
        models.from_pretrained(make())


def test_left_over_weights_raise():
    source = gpt2_source()
    source.register_buffer("extra_scale", torch.ones(3))  # a weight our conversion would drop
    with pytest.raises(UnsupportedConfig, match=r"would drop: \['extra_scale'\]"):
        models.from_pretrained(source)


def test_bad_sources_raise(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        models.from_pretrained(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        models.from_pretrained(tmp_path / "empty")
    gpt2_source().config.save_pretrained(tmp_path / "no_weights")
    with pytest.raises(FileNotFoundError, match=r"has no weights: looked for \['model.safetensors'"):
        models.from_pretrained(tmp_path / "no_weights")
    with pytest.raises(TypeError, match="source must be"):
        models.from_pretrained(42)


def test_save_refuses_to_overwrite_and_load_reads_the_saved_config(tmp_path):
    model = models.from_pretrained(mamba_source())
    model.save(tmp_path / "run", origin="MambaForCausalLM")
    assert json.loads((tmp_path / "run" / "config.json").read_text())["origin"] == "MambaForCausalLM"
    with pytest.raises(FileExistsError, match="overwrite=True"):
        model.save(tmp_path / "run")
    model.save(tmp_path / "run", overwrite=True)
    with pytest.raises(TypeError, match="SequenceModel"):
        models.save(torch.nn.Linear(2, 2), tmp_path / "other")
