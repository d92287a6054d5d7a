"""The HookedTransformer surface (models.tl.surface, models.tl.run.tl_forward, Cache.compute_*):
TransformerLens 4.3 habits on the plain model call, the weights under TL's names, the tokenizer
methods and act_name, each against TL's bridge on the same float64 GPT-2 (1e-10; skipped without
TL) and against an invariant computed here."""

import pytest
import torch

import models
from models.tl.names import act_name, get_act_name
from models.tl.surface import NoWeight
from tests import tl_oracle


@pytest.fixture(scope="module")
def setup():
    source = tl_oracle.gpt2_source()
    model = tl_oracle.ours(source)
    model.set_tokenizer(tl_oracle.word_tokenizer())
    return source, model, tl_oracle.tokens()


@pytest.fixture(scope="module")
def bridge(setup):
    return tl_oracle.lens(setup[0], tl_oracle.word_tokenizer())


def close(a, b, atol=1e-10):
    torch.testing.assert_close(a, b.to(a.dtype) if isinstance(b, torch.Tensor) else b, atol=atol, rtol=0)


def nll_by_hand(logits, ids):  # [B, T - 1]: -log softmax(logits[:, t])[ids[:, t + 1]]
    log_probs = logits.log_softmax(-1)
    return -torch.stack([log_probs[b, t, ids[b, t + 1]] for b in range(ids.shape[0])
                         for t in range(ids.shape[1] - 1)]).view(ids.shape[0], -1)


def test_plain_call_takes_return_type_and_loss_per_token(setup):
    _, model, ids = setup
    with torch.no_grad():
        logits = model(ids)
        per_token = nll_by_hand(logits, ids)
        close(model(ids, return_type="loss"), per_token.mean())
        close(model(ids, "loss"), per_token.mean())  # TL's second positional argument
        close(model(ids, return_type="loss", loss_per_token=True), per_token)
        both = model(ids, return_type="both")
        close(both[0], logits)
        close(both[1], per_token.mean())
        assert model(ids, return_type=None) is None
    with pytest.raises(ValueError, match="return_type must be one of"):
        model(ids, return_type="probs")
    with pytest.raises(TypeError, match="attention_mask"):
        model(ids, attention_mask=torch.ones_like(ids))


def test_plain_call_stops_and_starts_at_a_layer(setup):
    _, model, ids = setup
    with torch.no_grad():
        logits, cache = model.run_with_cache(ids)
        close(model(ids, stop_at_layer=0), cache["hook_embed"])
        for k in (1, 2):
            close(model(ids, stop_at_layer=k), cache[f"blocks.{k}.hook_resid_pre"])
            close(model(cache[f"blocks.{k}.hook_resid_pre"], start_at_layer=k), logits)
        close(model(cache["blocks.1.hook_resid_pre"], start_at_layer=1, stop_at_layer=2), cache["blocks.2.hook_resid_pre"])
        close(model(cache["blocks.1.hook_resid_pre"], start_at_layer=1, return_type="loss", labels=ids),
              model(ids, return_type="loss"))
    with pytest.raises(ValueError, match="labels"):
        model(cache["blocks.1.hook_resid_pre"], start_at_layer=1, return_type="loss")
    with pytest.raises(ValueError, match="at="):
        model(ids, at=torch.tensor([1, 2]), stop_at_layer=1)


def test_hooks_context_takes_bwd_hooks(setup):
    """bwd_hooks in model.hooks() see d loss / d activation (run_with_cache's incl_bwd gradient),
    backward() inside or after the context; a returned tensor replaces the gradient."""
    _, model, ids = setup
    names = ["blocks.1.attn.hook_pattern", "blocks.0.hook_resid_mid", "ln_final.hook_scale"]
    _, cache = model.run_with_cache(ids, names=names, incl_bwd=True, return_type="loss")
    for backward_inside in (True, False):
        seen = {}
        with model.hooks(bwd_hooks=[(n, lambda grad, hook: seen.__setitem__(hook.name, grad.clone())) for n in names]):
            loss = model(ids, return_type="loss")
            if backward_inside:
                loss.backward()
        if not backward_inside:
            loss.backward()
        model.zero_grad()
        for name in names:
            close(seen[model.hook_point(name).name], cache[name + "_grad"])
    with model.hooks(bwd_hooks=[("blocks.0.hook_resid_mid", lambda grad, hook: torch.zeros_like(grad))]):
        loss = model(ids, return_type="loss")
    assert float(torch.autograd.grad(loss, model.W_pos)[0].abs().max()) == 0.0
    seen = {}
    with model.hooks([], [("blocks.0.hook_resid_mid", lambda grad, hook: seen.setdefault("grad", grad))]):  # TL's order
        model(ids, return_type="loss").backward()
    model.zero_grad()
    close(seen["grad"], cache["blocks.0.hook_resid_mid_grad"])
    with pytest.raises(TypeError, match="reset_hooks_end=False"):
        with model.hooks(reset_hooks_end=False):
            pass


def test_in_place_edit_of_z_keeps_the_gradient(setup):
    """TL's habit z[:, :, h] = 0 in a hook on hook_z, with gradients: the same loss and parameter
    gradients as an out-of-place edit (SDPA's backward reads its output, so the edit must not
    reach it)."""
    _, model, ids = setup

    def in_place(z, hook):
        z[:, :, 1] = 0.0
        return z

    def out_of_place(z, hook):
        return z * torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=z.dtype)[:, None]

    results = []
    for fn in (in_place, out_of_place):
        loss = model.run_with_hooks(ids, return_type="loss", fwd_hooks=[("blocks.0.attn.hook_z", fn)])
        results.append((loss, torch.autograd.grad(loss, model.W_E)[0]))
    close(results[0][0], results[1][0])
    close(results[0][1], results[1][1])


def test_weights_are_views_of_the_parameters(setup):
    _, model, _ = setup
    shares = lambda view, parameter: view.untyped_storage().data_ptr() == parameter.untyped_storage().data_ptr()  # noqa: E731
    assert model.W_E is model.embed.weight and model.W_pos is model.pos_embed.weight
    assert shares(model.W_U, model.unembed.weight) and model.W_U.shape == (16, 50)
    attn, mlp = model.blocks[1].attn, model.blocks[1].mlp
    assert attn is model.blocks[1].mixer
    for name in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V"):
        assert shares(getattr(attn, name), attn.qkv.weight if name[0] == "W" else attn.qkv.bias), name
    assert shares(attn.W_O, attn.out_proj.weight) and attn.b_O is attn.out_proj.bias
    assert shares(mlp.W_in, mlp.up.weight) and shares(mlp.W_out, mlp.down.weight) and mlp.W_gate is None
    stacked = {"W_Q": (3, 4, 16, 4), "W_O": (3, 4, 4, 16), "b_V": (3, 4, 4), "W_in": (3, 16, 64), "b_out": (3, 16)}
    for name, shape in stacked.items():
        assert getattr(model, name).shape == shape
        close(getattr(model, name)[1], getattr(attn if name in ("W_Q", "W_O", "b_V") else mlp, name))
    assert torch.equal(model.b_U, torch.zeros(50, dtype=torch.float64))
    with torch.no_grad():  # an edit through a view is an edit of the model
        before = model.W_U[3, 7].clone()
        model.W_U[3, 7] = 2.5
        assert model.unembed.weight[7, 3].item() == model.W_E[7, 3].item() == 2.5  # GPT-2 ties them
        model.W_U[3, 7] = before


def test_weights_compute_the_cached_activations(setup):
    """q = normed input W_Q + b_Q, per-head results = z W_O summing with b_O to the attention's
    output, MLP pre = its input W_in + b_in, logits = final residual W_U, each to the run's."""
    _, model, ids = setup
    with torch.no_grad():
        logits, cache = model.run_with_cache(ids)
        for l in range(3):
            x = cache[f"blocks.{l}.mixer.hook_in"]
            close(torch.einsum("btd,hde->bthe", x, model.W_Q[l]) + model.b_Q[l], cache["q", l])
            close(torch.einsum("btd,hde->bthe", x, model.W_V[l]) + model.b_V[l], cache["v", l])
            result = torch.einsum("bthe,hed->bthd", cache["z", l], model.W_O[l])
            close(result.sum(2) + model.b_O[l], cache["attn_out", l])
            normed = model.blocks[l].norm_mlp(cache[f"blocks.{l}.hook_resid_mid"])
            close(normed @ model.W_in[l] + model.b_in[l], cache["pre", l])
            close(cache["post", l] @ model.W_out[l] + model.b_out[l], cache["mlp_out", l])
        close(cache["hook_final"] @ model.W_U + model.b_U, logits)
        directions = model.tokens_to_residual_directions(ids)  # [B, T, D]
        close(torch.einsum("btd,btd->bt", cache["hook_final"], directions), logits.gather(-1, ids[..., None])[..., 0])
        close(model.tokens_to_residual_directions(5), model.W_U[:, 5])
        close(model.tokens_to_residual_directions("w5"), model.W_U[:, 5])


def test_missing_weights_are_refused_naming_the_layers():
    model = models.SequenceModel(models.ModelConfig(mixer=["attention", "mamba"], n_layers=2, vocab_size=11,
                                                    d_model=8, n_heads=2, mlp=[True, False]))
    assert model.blocks[0].attn.W_Q.shape == (2, 8, 4) and model.blocks[1].attn is None
    with pytest.raises(NoWeight, match=r"layers \[1\] have no attention mixer"):
        model.W_Q
    with pytest.raises(NoWeight, match=r"layers \[1\] have no dense MLP"):
        model.W_in
    with pytest.raises(NoWeight, match="positional='none'"):
        model.W_pos


def test_cfg_answers_tl_field_names(setup):
    _, model, _ = setup
    cfg = model.cfg
    assert (cfg.d_vocab, cfg.d_vocab_out, cfg.n_ctx, cfg.n_layers, cfg.d_model, cfg.n_heads) == (50, 50, 64, 3, 16, 4)
    assert (cfg.act_fn, cfg.normalization_type, cfg.positional_embedding_type, cfg.gated_mlp) == \
        ("gelu_new", "LN", "standard", False)
    assert cfg.d_mlp == 64 and cfg.head_dim == 4 and cfg.n_key_value_heads is None


def test_tokenizer_methods_round_trip(setup):
    _, model, _ = setup
    assert model.to_tokens("w3 w4").tolist() == [[0, 3, 4]]
    assert model.to_tokens("w3 w4", prepend_bos=False).tolist() == [[3, 4]]
    assert model.to_tokens(["w3 w4 w5", "w6"]).tolist() == [[0, 3, 4, 5], [0, 6, 0, 0]]  # right padding (EOS)
    assert model.to_str_tokens("w3 w4") == ["<|endoftext|>", "w3", "w4"]
    assert model.to_str_tokens(torch.tensor([[3, 4]])) == ["w3", "w4"]
    assert model.to_string(torch.tensor([3, 4])) == "w3 w4" and model.to_string([[3], [4]]) == ["w3", "w4"]
    assert model.to_single_token("w7") == 7
    with pytest.raises(ValueError, match="not one"):
        model.to_single_token("w7 w8")
    with pytest.raises(ValueError, match="padding_side"):
        model.to_tokens(["w1", "w2 w3"], padding_side="left")
    with torch.no_grad():
        close(model("w3 w4 w5"), model(torch.tensor([[0, 3, 4, 5]])))
        close(model.run_with_hooks("w3 w4", return_type="loss"), model(torch.tensor([[0, 3, 4]]), return_type="loss"))
        logits, cache = model.run_with_cache(["w3 w4 w5", "w6 w7 w8"], names="blocks.0.hook_resid_pre")
        close(logits, model(torch.tensor([[0, 3, 4, 5], [0, 6, 7, 8]])))
        assert cache["resid_pre", 0].shape == (2, 4, 16)
    bare = models.SequenceModel(models.ModelConfig(mixer="attention", vocab_size=11, d_model=8))
    with pytest.raises(ValueError, match="no tokenizer"):
        bare.to_tokens("w1")


def test_from_pretrained_keeps_a_directorys_tokenizer(setup, tmp_path):
    source, model, ids = setup
    source.save_pretrained(tmp_path)
    assert models.from_pretrained(tmp_path).tokenizer is None
    model.tokenizer.save_pretrained(tmp_path)
    loaded = models.from_pretrained(tmp_path)
    assert loaded.to_tokens("w3 w9").tolist() == [[0, 3, 9]]
    assert models.from_pretrained(tmp_path, tokenizer=False).tokenizer is None
    close(loaded(ids), model(ids))


def test_a_directorys_tokenizer_runs_no_code_and_is_bounded(setup, tmp_path, monkeypatch):
    """An auto_map in tokenizer_config.json naming the directory's own Python file is not
    imported (no marker appears); an oversized tokenizer file is refused before it is read."""
    import json

    from models.tl import surface as tl_surface

    source, model, _ = setup
    source.save_pretrained(tmp_path)
    model.tokenizer.save_pretrained(tmp_path)
    marker = tmp_path / "marker"
    (tmp_path / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                                      "from transformers import PreTrainedTokenizerFast as Evil\n")
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "auto_map": {"AutoTokenizer": [None, "evil.Evil"]}}))
    assert models.from_pretrained(tmp_path).to_tokens("w2").tolist() == [[0, 2]]
    assert not marker.exists()
    monkeypatch.setattr(tl_surface, "TOKENIZER_MAX_BYTES", 100)
    with pytest.raises(ValueError, match=r"tokenizer\.json' is \d+ bytes; at most 100"):
        models.from_pretrained(tmp_path)


def test_compute_head_results_as_the_run_computes_them(setup):
    _, model, ids = setup
    with torch.no_grad():
        _, full = model.run_with_cache(ids)
        _, cache = model.run_with_cache(ids, names=lambda n: n.endswith("hook_z"), positions=[2, 5])
    cache.compute_head_results()
    for l in range(3):
        close(cache["result", l], full["result", l][:, [2, 5]])
        assert cache.positions[f"blocks.{l}.mixer.hook_result"] == [2, 5]
    _, without = model.run_with_cache(ids, names="blocks.0.hook_resid_pre")
    with pytest.raises(KeyError, match="hook_z"):
        without.compute_head_results()


def test_act_name_returns_tl_strings_on_request():
    assert act_name("attn_out", 0) == "blocks.0.mixer.hook_out"
    assert act_name("attn_out", 0, tl=True) == get_act_name("attn_out", 0) == "blocks.0.hook_attn_out"
    assert act_name("scale", 4, "ln1", tl=True) == "blocks.4.ln1.hook_scale"
    assert get_act_name("k6") == "blocks.6.attn.hook_k"


@pytest.mark.parametrize("kind", ["mamba", "mamba2"])
def test_compute_ssm_state_is_the_cached_state_in_tl_layout(kind):
    model = models.SequenceModel(models.ModelConfig(mixer=kind, n_layers=2, vocab_size=11, d_model=8, d_state=4,
                                                    n_heads=2))
    ids = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, names=lambda n: n.endswith("hook_state"))
    states = cache.compute_ssm_state()
    for l in range(2):
        mine = cache[f"blocks.{l}.mixer.hook_state"]  # [B, T, *S]
        assert torch.equal(states[l], mine.transpose(1, 2))  # TL: [B, E, T, N] / [B, H, T, P, N]
        assert torch.equal(cache.compute_ssm_state(l, time_step=3), mine[:, 3])
    hybrid = models.SequenceModel(models.ModelConfig(mixer=["attention", kind], n_layers=2, vocab_size=11, d_model=8,
                                                     d_state=4, n_heads=2))
    with torch.no_grad():
        _, cache = hybrid.run_with_cache(ids)
    assert list(cache.compute_ssm_state()) == [1]
    with pytest.raises(ValueError, match="no Mamba"):
        cache.compute_ssm_state(0)


# ------------------------------------------------------------------ against TransformerLens 4.3


def test_plain_call_same_as_transformer_lens(setup, bridge):
    _, model, ids = setup
    with torch.no_grad():
        resid = model(ids, stop_at_layer=1)
        for kwargs in (dict(), dict(return_type="loss"), dict(return_type="loss", loss_per_token=True),
                       dict(stop_at_layer=2), dict(stop_at_layer=-1)):
            close(model(ids, **kwargs), bridge(ids, **kwargs))
        close(model(resid, start_at_layer=1), bridge(resid, start_at_layer=1))
        close(model("w3 w4 w5"), bridge("w3 w4 w5"))


def test_bwd_hooks_in_hooks_context_same_as_transformer_lens(setup, bridge):
    _, model, ids = setup
    names = ["blocks.1.attn.hook_pattern", "blocks.2.hook_resid_pre"]
    grads = []
    for runner in (model, bridge):
        seen = {}
        with runner.hooks(bwd_hooks=[(n, lambda grad, hook, n=n: seen.__setitem__(n, grad.clone())) for n in names]):
            runner(ids, return_type="loss").backward()
        runner.zero_grad()
        grads.append(seen)
    for name in names:
        close(grads[0][name], grads[1][name], atol=1e-12)


def test_weights_same_as_transformer_lens(setup, bridge):
    _, model, _ = setup
    for name in ("W_E", "W_U", "b_U", "W_pos", "W_E_pos", "W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O",
                 "W_in", "W_out", "b_in", "b_out"):
        close(getattr(model, name), getattr(bridge, name), atol=0)
    for name in ("W_Q", "W_O", "b_K"):
        close(getattr(model.blocks[2].attn, name), getattr(bridge.blocks[2].attn, name), atol=0)
    close(model.tokens_to_residual_directions(tl_oracle.tokens()), bridge.tokens_to_residual_directions(tl_oracle.tokens()),
          atol=0)
    for field in ("d_vocab", "d_vocab_out", "n_ctx", "n_layers", "d_model", "n_heads", "d_mlp", "act_fn",
                  "normalization_type", "positional_embedding_type"):
        assert getattr(model.cfg, field) == getattr(bridge.cfg, field), field
    assert model.cfg.head_dim == bridge.cfg.d_head


def test_weights_of_a_gated_grouped_query_model_same_as_transformer_lens():
    """Qwen3: 4 query / 2 key-value heads (W_K, W_V keep 2, as TL 4.3's bridge), a SwiGLU MLP
    (W_gate the gate, W_in the up map), no biases (zeros here; the bridge has none)."""
    from tests.test_interop_qwen3 import qwen3_source

    source = qwen3_source().double().eval()
    bridge = tl_oracle.lens(source)
    model = models.from_pretrained(source)
    for name in ("W_E", "W_U", "b_U", "W_Q", "W_K", "W_V", "W_O", "W_in", "W_gate", "W_out"):
        close(getattr(model, name), getattr(bridge, name), atol=0)
    assert model.W_K.shape[1] == 2 and not model.b_Q.any() and not model.b_out.any()
    for field in ("act_fn", "gated_mlp", "normalization_type", "positional_embedding_type", "n_key_value_heads"):
        assert getattr(model.cfg, field) == getattr(bridge.cfg, field), field


def test_tokenizer_methods_same_as_transformer_lens(setup, bridge):
    _, model, _ = setup
    for text in ("w3 w4", ["w3 w4 w5", "w6"]):
        for prepend_bos in (None, False):
            assert torch.equal(model.to_tokens(text, prepend_bos=prepend_bos), bridge.to_tokens(text, prepend_bos=prepend_bos))
    assert model.to_str_tokens("w3 w4") == bridge.to_str_tokens("w3 w4")
    assert model.to_str_tokens(torch.tensor([5, 6])) == bridge.to_str_tokens(torch.tensor([5, 6]))
    assert model.to_string(torch.tensor([[3, 4], [5, 6]])) == bridge.to_string(torch.tensor([[3, 4], [5, 6]]))
    assert model.to_single_token("w9") == bridge.to_single_token("w9")


def test_compute_head_results_same_as_transformer_lens(setup, bridge):
    _, model, ids = setup
    with torch.no_grad():
        _, theirs = bridge.run_with_cache(ids)
        _, cache = model.run_with_cache(ids, names=lambda n: n.endswith("hook_z"))
    theirs.compute_head_results()
    cache.compute_head_results()
    for l in range(3):
        close(cache[f"blocks.{l}.attn.hook_result"], theirs[f"blocks.{l}.attn.hook_result"])


@pytest.mark.parametrize("kind", ["mamba", "mamba2"])
def test_compute_ssm_state_same_as_transformer_lens(kind):
    """1e-7 (measured 1.5e-9 Mamba, 2.3e-9 Mamba-2, states of size 0.02): TL reconstructs the state
    from its cached hooks in float32 (its S6 / SSD terms)."""
    from tests.test_interop import mamba_source
    from tests.test_interop_mamba2 import mamba2_source
    from tests.test_tl_mamba import bridge_and_ours

    bridge, model, ids = bridge_and_ours(mamba_source if kind == "mamba" else mamba2_source)
    with torch.no_grad():
        _, theirs = bridge.run_with_cache(ids)
        _, cache = model.run_with_cache(ids)
    close(cache.compute_ssm_state(), theirs.compute_ssm_state().detach(), atol=1e-7)
    close(cache.compute_ssm_state(1, time_step=4), theirs.compute_ssm_state(1, time_step=4).detach(), atol=1e-7)
