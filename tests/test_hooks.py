"""The hook interface: caching, stacking, patching, errors, and a hand-checked state patch."""

import json

import pytest
import torch

import models
from models import ModelConfig


def tanh_model(**overrides):
    torch.manual_seed(0)
    return models.build("tanh_rnn", vocab_size=5, d_model=8, **overrides)


def test_state_patch_equals_running_the_recurrence_by_hand():
    model = tanh_model()
    mixer = model.blocks[0].mixer
    tokens = torch.randint(0, 5, (2, 9))
    t, new_state = 4, torch.full((2, 8), 0.3)

    def patch(state, hook):
        state[:, t] = new_state
        return state

    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, fwd_hooks=[("blocks.0.mixer.hook_state", patch)])
        x = model.embed(tokens)
        w_ih, w_hh = mixer.rnn.weight_ih_l0, mixer.rnn.weight_hh_l0
        bias = mixer.rnn.bias_ih_l0 + mixer.rnn.bias_hh_l0
        h, expected = torch.zeros(2, 8), []
        for step in range(9):
            h = new_state if step == t else torch.tanh(x[:, step] @ w_ih.T + h @ w_hh.T + bias)
            expected.append(h)
        expected = torch.stack(expected, 1)
    torch.testing.assert_close(cache["blocks.0.mixer.hook_state"], expected)
    torch.testing.assert_close(logits, model.unembed(mixer.out_proj(expected)))


def test_cache_stack_orders_layers_numerically():
    model = models.build("tanh_rnn", vocab_size=5, d_model=8, n_layers=11)
    _, cache = model.run_with_cache(torch.zeros(2, 3, dtype=torch.long), names=lambda n: "resid_post" in n)
    stacked = cache.stack("blocks.*.hook_resid_post")
    assert stacked.shape == (11, 2, 3, 8)
    torch.testing.assert_close(stacked[10], cache["blocks.10.hook_resid_post"])


def test_unknown_names_suggest_close_matches():
    model = tanh_model()
    with pytest.raises(ValueError, match="blocks.0.mixer.hook_state"):
        model.run_with_cache(torch.zeros(1, 2, dtype=torch.long), names=["blocks.0.mixer.hook_stat"])
    with pytest.raises(ValueError, match="tanh_rnn"):
        models.build("tanh_rn")
    with pytest.raises(KeyError, match="pattern"):
        models.Cache({"a": torch.zeros(1)}).stack("b*")


@pytest.mark.parametrize(
    "tokens, error, match",
    [
        (torch.tensor([[0, 5]]), ValueError, "vocab_size"),
        (torch.tensor([[0, -1]]), ValueError, "vocab_size"),
        (torch.zeros(1, 3), TypeError, "dtype torch.int64 or torch.int32"),
        (torch.zeros(1, 3, dtype=torch.uint8), TypeError, r"got torch.uint8 \(convert with tokens.long\(\)\)"),
        (torch.zeros(0, 3, dtype=torch.long), ValueError, r"at least one sequence \(B >= 1\); got B = 0"),
        (torch.zeros(3, dtype=torch.long), ValueError, "rank 2"),
        ([[0, 1]], TypeError, "torch.Tensor"),
    ],
)
def test_bad_tokens_raise_clear_errors(tokens, error, match):
    with pytest.raises(error, match=match):
        tanh_model()(tokens)


def test_bad_config_values_raise_clear_errors():
    with pytest.raises(ValueError, match="d_model"):
        ModelConfig(d_model=0)
    with pytest.raises(ValueError, match="norm"):
        ModelConfig(norm="batchnorm")
    with pytest.raises(ValueError, match="beta_scale"):
        ModelConfig(beta_scale=2.5)
    with pytest.raises(ValueError, match="unknown"):
        models.build("tanh_rnn", d_modl=3)
    # values Python would coerce: a string scale iterates as characters, True is 1, "no" is truthy
    with pytest.raises(ValueError, match=r"beta_scale must be a float .*; got '2'"):
        ModelConfig(n_heads=1, beta_scale="2")
    with pytest.raises(ValueError, match="beta_scale"):
        ModelConfig(n_heads=2, beta_scale=[1.0, True])
    with pytest.raises(ValueError, match="d_hidden must be None or a positive int; got True"):
        ModelConfig(d_hidden=True)
    with pytest.raises(TypeError, match="residual must be a bool; got 'no'"):
        ModelConfig(residual="no")
    assert ModelConfig(n_heads=2, beta_scale=(1, 2.0)).beta_scales == [1.0, 2.0]


def test_hook_returning_non_tensor_raises():
    model = tanh_model()
    with pytest.raises(TypeError, match="must return a tensor"):
        model.run_with_hooks(torch.zeros(1, 2, dtype=torch.long), fwd_hooks=[("hook_embed", lambda x, hook: 3)])


def test_hooks_are_removed_after_the_run():
    model = tanh_model()
    tokens = torch.zeros(1, 4, dtype=torch.long)
    clean = model(tokens)
    model.run_with_hooks(tokens, fwd_hooks=[("hook_embed", lambda x, hook: x * 0)])
    torch.testing.assert_close(model(tokens), clean)
    assert all(not point._forward_hooks and not point._readers for point in model.hook_dict.values())


@pytest.mark.parametrize("name", models.list_models())
def test_config_round_trips_through_json(name):
    cfg = models.preset_config(name, vocab_size=9)
    assert ModelConfig.from_json(cfg.to_json()) == cfg
    assert json.loads(cfg.to_json())["mixer"] == cfg.mixer


def test_hook_misuse_raises_errors_naming_the_hook():
    """Issue 13 item 7: NaN patches, predicates matching nothing, a bare pair, a non-callable."""
    model, tokens = tanh_model(), torch.zeros(2, 4, dtype=torch.long)
    name = "blocks.0.mixer.hook_state"

    def to_nan(x, hook):
        return x * float("nan")

    def in_place_inf(x, hook):
        x[:, 1] = float("inf")

    for fn in (to_nan, in_place_inf):
        with pytest.raises(ValueError, match=rf"hook '{fn.__name__}' on '{name}' made \d+ values NaN or Inf.*allow_nonfinite"):
            model.run_with_hooks(tokens, fwd_hooks=[(name, fn)])
    logits = model.run_with_hooks(tokens, fwd_hooks=[(name, to_nan)], allow_nonfinite=True)
    assert torch.isnan(logits).all()
    _, cache = model.run_with_cache(tokens, names=[name], fwd_hooks=[(name, to_nan)], allow_nonfinite=True)
    assert torch.isnan(cache[name]).all()
    with pytest.raises(ValueError, match="predicate .* matches no hook name; names look like"):
        model.run_with_hooks(tokens, fwd_hooks=[(lambda n: n.endswith("hook_nothing"), to_nan)])
    with pytest.raises(TypeError, match=r"one bare pair .*fwd_hooks=\[\(name, fn\)\]"):
        model.run_with_hooks(tokens, fwd_hooks=(name, to_nan))
    with pytest.raises(TypeError, match=rf"entry for '{name}': fn must be callable .*got int 3"):
        model.run_with_hooks(tokens, fwd_hooks=[(name, 3)])
    with pytest.raises(TypeError, match="entries must be \\(name, fn\\) pairs"):
        model.run_with_hooks(tokens, fwd_hooks=[(name,)])
    assert not any(point._forward_hooks for point in model.hook_dict.values())  # nothing left attached


def test_state_patch_misuse_raises_errors_naming_the_argument():
    model = tanh_model()
    tokens = torch.randint(0, 5, (2, 9))
    name = "blocks.0.mixer.hook_state"
    with pytest.raises(ValueError, match="exactly one of values, deltas or fn"):
        models.StatePatch([0], [1], values=torch.zeros(1, 8), deltas=torch.zeros(1, 8))
    with pytest.raises(ValueError, match="exactly one"):
        models.StatePatch([0], [1])
    with pytest.raises(ValueError, match="M = 2 entries"):
        models.StatePatch([0, 1], [1, 1], values=torch.zeros(1, 8))
    with pytest.raises(TypeError, match="rows must be"):
        models.StatePatch([0.5], [1], values=torch.zeros(1, 8))
    with pytest.raises(TypeError, match="fn must be callable"):
        models.StatePatch([0], [1], fn=3)
    with pytest.raises(TypeError, match="time must be an int"):
        models.StatePatch.at(1.0, values=torch.zeros(2, 8))
    bad = {
        "times must lie in": models.StatePatch.at(9, values=torch.zeros(2, 8)),
        "rows must lie in": models.StatePatch([2], [1], values=torch.zeros(1, 8)),
        "at most once": models.StatePatch([0, 0], [1, -8], deltas=torch.zeros(2, 8)),
        "state has shape": models.StatePatch.at(1, values=torch.zeros(2, 7)),
        "NaN or Inf": models.StatePatch.at(1, values=torch.full((2, 8), float("nan"))),
    }
    with torch.no_grad():
        for match, patch in bad.items():
            with pytest.raises(ValueError, match=match):
                model.run_with_hooks(tokens, fwd_hooks=[(name, patch)])
        model.run_with_hooks(tokens, fwd_hooks=[(name, bad["NaN or Inf"])], allow_nonfinite=True)
