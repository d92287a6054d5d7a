"""TransformerLens 4.3's weight circuits and cfg widths on our models (models.tl.circuits,
models.config.Derived): model.QK / model.OV as TL's FactoredMatrix, the *_for_attn_layers forms,
all_composition_scores, cfg.d_head / cfg.d_mlp; each against TL's bridge on the same float64 weights
(tests/tl_oracle.py; skipped without TL) and against what is computed here from the weights."""

import builtins
import json

import pytest
import torch

import models
from models.config import ModelConfig
from models.tl.surface import NoWeight
from tests import tl_oracle


@pytest.fixture(scope="module")
def setup():
    source = tl_oracle.gpt2_source()
    return source, tl_oracle.ours(source)


@pytest.fixture(scope="module")
def bridge(setup):
    return tl_oracle.lens(setup[0])


def close(a, b, atol=1e-10):
    torch.testing.assert_close(a, b.to(a.dtype), atol=atol, rtol=0)


def composition_by_hand(model, mode, layers):
    """|left right|_F / (|left|_F |right|_F) of head (l1, h1)'s OV (left) with (l2, h2)'s circuit,
    each [D, D] product formed in full; zero where l2 is not a later layer than l1."""
    H = model.cfg.n_heads
    out = torch.zeros(len(layers), H, len(layers), H, dtype=torch.float64)
    for i, l1 in enumerate(layers):
        for h1 in range(H):
            left = model.W_V[l1, h1] @ model.W_O[l1, h1]
            for j, l2 in enumerate(layers):
                if j <= i:
                    continue
                for h2 in range(H):
                    qk = model.W_Q[l2, h2] @ model.W_K[l2, h2].T
                    right = {"Q": qk, "K": qk.T, "V": model.W_V[l2, h2] @ model.W_O[l2, h2]}[mode]
                    out[i, h1, j, h2] = (left @ right).norm() / left.norm() / right.norm()
    return out


# ------------------------------------------------------------------ cfg.d_head, cfg.d_mlp


def test_derived_widths_read_as_their_values_and_stay_none_where_saved():
    cfg = ModelConfig(mixer="attention", d_model=16, n_heads=4, mlp=True)
    assert (cfg.d_head, cfg.d_mlp, cfg.head_dim, cfg.mlp_width) == (4, 64, 4, 64)
    assert cfg.explicit("d_head") is None and cfg.to_dict()["d_head"] is None and cfg.to_dict()["d_mlp"] is None
    assert ModelConfig.from_json(cfg.to_json()) == cfg and json.loads(cfg.to_json())["d_mlp"] is None
    wider = cfg.replace(d_model=32)              # derived from the new width, not pinned at the old
    assert (wider.d_head, wider.d_mlp, wider.explicit("d_head")) == (8, 128, None)
    assert cfg != cfg.replace(d_head=4)          # == compares the fields as set
    set_ = ModelConfig(mixer="attention", d_model=16, n_heads=4, d_head=8, mlp=True, d_mlp=24)
    assert (set_.d_head, set_.d_mlp, set_.to_dict()["d_head"], set_.to_dict()["d_mlp"]) == (8, 24, 8, 24)
    assert ModelConfig(mixer="attention", d_model=16, n_heads=4).d_mlp is None   # no MLP: TL's attention-only
    assert ModelConfig(mixer="attention", n_layers=2, mlp=[False, True], d_model=16).d_mlp == 64


def test_derived_widths_change_no_model():
    """A Mamba-2 (its own head width: cfg.d_head set would be checked against it) and a Zamba2-style
    shared block (its attention reads 2 d_model: a pinned d_head would halve its heads) build as before."""
    mamba2 = ModelConfig(mixer="mamba2", d_model=16, n_heads=2, mlp=True)
    assert mamba2.d_head == 8 and mamba2.layer_config(0, "mixer").explicit("d_head") is None
    model = models.SequenceModel(mamba2)
    assert model.cfg.to_dict() == mamba2.to_dict()
    shared = models.SequenceModel(ModelConfig(mixer="mamba2", n_layers=2, d_model=16, n_heads=2, shared_block=[0, None],
                                              mlp_activation="geglu", mixer_options={"mamba2": {"n_heads": 2}}))
    attn = shared.blocks[0].shared.attn
    assert (attn.n_heads, attn.d_head) == (2, 16)      # 2 d_model / n_heads


def test_cfg_widths_same_as_transformer_lens(setup, bridge):
    _, model = setup
    assert model.cfg.explicit("d_head") is None        # GPT-2's converter leaves it derived
    assert (model.cfg.d_head, model.cfg.d_mlp) == (bridge.cfg.d_head, bridge.cfg.d_mlp) == (4, 64)


# ------------------------------------------------------------------ QK, OV


def test_qk_and_ov_are_the_weight_products(setup):
    pytest.importorskip("transformer_lens")
    from transformer_lens.FactoredMatrix import FactoredMatrix

    _, model = setup
    QK, OV = model.QK, model.OV
    assert isinstance(QK, FactoredMatrix) and isinstance(OV, FactoredMatrix)
    assert QK.shape == OV.shape == (3, 4, 16, 16) and QK.mdim == 4
    close(QK.AB, torch.einsum("lhde,lhfe->lhdf", model.W_Q, model.W_K), atol=1e-12)
    close(OV.AB, torch.einsum("lhde,lhef->lhdf", model.W_V, model.W_O), atol=1e-12)
    full = model.W_E @ model.OV[1, 2] @ model.W_U                      # TL's full OV circuit [V, V]
    close(full.AB, model.W_E @ model.W_V[1, 2] @ model.W_O[1, 2] @ model.W_U, atol=1e-12)
    close(OV[0, 1].S, torch.linalg.svdvals(OV[0, 1].AB)[:4], atol=1e-12)
    loss = OV.AB.square().sum()                                         # gradients reach the parameters
    assert torch.autograd.grad(loss, model.blocks[0].attn.qkv.weight)[0].abs().max() > 0


def test_qk_and_ov_same_as_transformer_lens(setup, bridge):
    _, model = setup
    for name in ("QK", "OV"):
        ours, theirs = getattr(model, name), getattr(bridge, name)
        close(ours.A, theirs.A, atol=0)
        close(ours.B, theirs.B, atol=0)
        close(ours.AB, theirs.AB)
        close(ours[2, 1].S, theirs[2, 1].S)
        close((model.W_E @ ours[0, 3] @ model.W_U).AB, (bridge.W_E @ theirs[0, 3] @ bridge.W_U).AB)
        layers, factored = getattr(model, f"{name}_for_attn_layers")()
        their_layers, their_factored = getattr(bridge, f"{name}_for_attn_layers")()
        assert layers == their_layers == [0, 1, 2]
        close(factored.AB, their_factored.AB)


def test_grouped_query_qk_and_ov_same_as_transformer_lens():
    """Qwen3: 4 query heads over 2 key/value heads, repeated to 4 as the bridge's _expand_kv_heads."""
    from tests.test_interop_qwen3 import qwen3_source

    source = qwen3_source().double().eval()
    bridge, model = tl_oracle.lens(source), models.from_pretrained(source)
    assert model.W_K.shape[1] == 2 and model.QK.B.shape[1] == 4
    for name in ("QK", "OV"):
        close(getattr(model, name).AB, getattr(bridge, name).AB)
    close(model.QK.AB[:, 3], torch.einsum("lde,lfe->ldf", model.W_Q[:, 3], model.W_K[:, 1]), atol=1e-12)


@pytest.mark.parametrize("mode", ["Q", "K", "V"])
def test_composition_scores_same_as_transformer_lens_and_by_hand(setup, bridge, mode):
    _, model = setup
    ours, theirs = model.all_composition_scores(mode), bridge.all_composition_scores(mode)
    assert ours.layer_indices == theirs.layer_indices == [0, 1, 2] and ours.head_labels == theirs.head_labels
    close(ours.scores, theirs.scores)
    close(ours.scores, composition_by_hand(model, mode, [0, 1, 2]))
    assert ours.scores[1, :, 0].abs().max() == 0 and ours.scores[0, 0, 1, 0] > 0


def test_hybrid_takes_its_attention_layers():
    pytest.importorskip("transformer_lens")
    torch.manual_seed(0)
    model = models.SequenceModel(ModelConfig(mixer=["attention", "mamba", "attention"], n_layers=3, vocab_size=11,
                                             d_model=8, n_heads=2, mlp=True)).double()
    with pytest.raises(NoWeight, match=r"layers \[1\] have no attention mixer"):
        model.OV
    layers, OV = model.OV_for_attn_layers()
    assert layers == [0, 2]
    close(OV.AB[1], model.blocks[2].attn.W_V @ model.blocks[2].attn.W_O, atol=1e-12)
    layers, QK = model.QK_for_attn_layers()
    close(QK.AB[0], model.blocks[0].attn.W_Q @ model.blocks[0].attn.W_K.transpose(-2, -1), atol=1e-12)
    scores = model.all_composition_scores("K")
    assert scores.layer_indices == [0, 2] and scores.head_labels == ["L0H0", "L0H1", "L2H0", "L2H1"]
    by_hand = torch.zeros(2, 2, 2, 2, dtype=torch.float64)
    for h1 in range(2):
        left = model.blocks[0].attn.W_V[h1] @ model.blocks[0].attn.W_O[h1]
        for h2 in range(2):
            right = (model.blocks[2].attn.W_Q[h2] @ model.blocks[2].attn.W_K[h2].T).T
            by_hand[0, h1, 1, h2] = (left @ right).norm() / left.norm() / right.norm()
    close(scores.scores, by_hand)
    with pytest.raises(ValueError, match="mode must be one of"):
        model.all_composition_scores("O")
    rnn = models.SequenceModel(ModelConfig(mixer="tanh_rnn", vocab_size=11, d_model=8))
    with pytest.raises(ValueError, match="No attention layers"):
        rnn.all_composition_scores("Q")


def test_without_transformer_lens_the_error_names_the_extra(setup, monkeypatch):
    _, model = setup
    real_import = builtins.__import__

    def no_transformer_lens(name, *args, **kwargs):
        if name.startswith("transformer_lens"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_transformer_lens)
    for call in (lambda: model.OV, lambda: model.QK, lambda: model.QK_for_attn_layers(),
                 lambda: model.all_composition_scores("Q")):
        with pytest.raises(ImportError, match=r"interp-seq\[tl\].*model\.W_V\[l\] @ model\.W_O\[l\]"):
            call()
