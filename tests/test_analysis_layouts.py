"""interp.analysis on the hybrid block layouts (models.backbone.Block): MLP-only blocks (mixer
None, NemotronH's MLP layers) and a parallel mixer2 are skipped or refused by name, never an
AttributeError on None."""

import pytest
import torch

import models
from interp.analysis import dynamics, effective_attention, heads
from models.config import ModelConfig

VOCAB = 11
LAYOUT = dict(mixer=["deltanet", None, "mamba2"], mixer2=["attention", None, None], mlp=[False, True, True],
              n_layers=3, vocab_size=VOCAB, d_model=16, n_heads=2, d_state=4, norm="rmsnorm", mlp_activation="relu2",
              mixer_options={"mamba2": {"n_heads": 2, "head_dim": 8}})


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return models.SequenceModel(ModelConfig(**LAYOUT)).eval()


def tokens(length=10):
    return torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(1))


def test_kernel_settings_set_and_restore_every_mixer_and_skip_mlp_only_blocks(model):
    mixers = [model.blocks[0].mixer, model.blocks[0].mixer2, model.blocks[2].mixer]
    impl_before = model.blocks[0].mixer.options.get("impl")
    with torch.no_grad():
        auto = model(tokens())
        for path in ("fast", "instrumented"):
            with heads.kernel_settings(model, path, "naive"):
                assert [m.execution_path for m in mixers] == [path] * 3
                assert model.blocks[0].mixer.options["impl"] == "naive"
                torch.testing.assert_close(model(tokens()), auto, atol=1e-5, rtol=0)
    assert [m.execution_path for m in mixers] == ["auto"] * 3 and model.blocks[1].mixer is None
    assert model.blocks[0].mixer.options.get("impl") == impl_before


def test_delta_layers_and_the_no_delta_message_read_the_block_mixers(model):
    assert heads.delta_layers(model) == [0]
    torch.manual_seed(0)
    other = models.SequenceModel(ModelConfig(**{**LAYOUT, "mixer": ["mamba2", None, "mamba2"]})).eval()
    with pytest.raises(ValueError, match=r"no delta-rule layer .*mixers: \['Attention', 'Mamba2'\]"):
        heads.head_activations(other, None)


def test_per_mixer_analyses_refuse_an_mlp_only_block_by_name(model):
    with pytest.raises(ValueError, match=r"layer 1 holds no mixer \(an MLP-only block\), which is not a RecurrentMixer"):
        dynamics.recurrent_mixer(model, 1)
    with pytest.raises(ValueError, match="block 1 has 'no mixer'"):
        effective_attention.mixer_output(model, tokens(), 1)
    assert not effective_attention.supported(model, 1)
