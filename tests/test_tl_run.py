"""TransformerLens' keyword arguments of run_with_hooks / run_with_cache (models.tl.run):
against TL's bridge on the same float64 GPT-2 (1e-10) where TL is installed, hand-written
references otherwise."""

import pytest
import torch

import models
from tests import tl_oracle


@pytest.fixture(scope="module")
def setup():
    source = tl_oracle.gpt2_source()
    return source, tl_oracle.ours(source), tl_oracle.tokens()


@pytest.fixture(scope="module")
def bridge(setup):
    return tl_oracle.lens(setup[0])


def close(a, b):
    torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def test_return_types_by_hand(setup):
    _, model, ids = setup
    with torch.no_grad():
        logits = model(ids)
        log_probs = logits.log_softmax(-1)
        nll = torch.stack([torch.stack([-log_probs[b, t, ids[b, t + 1]] for t in range(ids.shape[1] - 1)])
                           for b in range(ids.shape[0])])  # [B, T - 1]
        close(model.run_with_hooks(ids, return_type="loss"), nll.mean())
        close(model.run_with_hooks(ids, return_type="loss", loss_per_token=True), nll)
        both, cache = model.run_with_cache(ids, return_type="both", names=["ln_final.hook_scale"])
        close(both[0], logits)
        close(both[1], nll.mean())
        assert model.run_with_hooks(ids, return_type=None) is None
        assert model.run_with_cache(ids, return_type=None, names="hook_embed")[0] is None
    with pytest.raises(ValueError, match="return_type must be one of"):
        model.run_with_hooks(ids, return_type="probs")


def test_stop_at_layer_returns_the_residual_there_and_caches_before_it(setup):
    _, model, ids = setup
    with torch.no_grad():
        _, full = model.run_with_cache(ids)
        for stop, name in [(0, "hook_embed"), (1, "blocks.0.hook_resid_post"), (-1, "blocks.1.hook_resid_post"),
                           (3, "blocks.2.hook_resid_post")]:
            close(model.run_with_hooks(ids, stop_at_layer=stop), full[name])
        resid, cache = model.run_with_cache(ids, stop_at_layer=2)
    close(resid, full["blocks.1.hook_resid_post"])
    assert "blocks.1.hook_resid_post" in cache and "blocks.2.hook_resid_pre" not in cache
    assert not any(name.startswith("blocks.2") or name.startswith("norm_final") for name in cache)
    for name in cache:
        close(cache[name], full[name])
    assert not model.hook_dict["blocks.1.hook_resid_post"]._readers  # the stop reader is gone
    for bad in (4, -4, 1.0, True):
        with pytest.raises(ValueError, match="stop_at_layer must be"):
            model.run_with_hooks(ids, stop_at_layer=bad)


def test_names_filter_pos_slice_and_remove_batch_dim(setup):
    _, model, ids = setup
    with torch.no_grad():
        _, full = model.run_with_cache(ids)
        _, some = model.run_with_cache(ids, names_filter=lambda n: n.endswith("hook_pattern"))
        _, listed = model.run_with_cache(ids, names_filter=["blocks.0.attn.hook_q", "ln_final.hook_scale"])
        _, sliced = model.run_with_cache(ids, names_filter="blocks.1.attn.hook_pattern", pos_slice=slice(2, 5))
        _, tupled = model.run_with_cache(ids, names_filter="blocks.1.hook_resid_pre", pos_slice=(1, None, 2))
        _, one = model.run_with_cache(ids[:1], remove_batch_dim=True, names=["blocks.0.attn.hook_pattern"])
    assert sorted(some) == [f"blocks.{l}.mixer.hook_pattern" for l in range(3)]
    assert sorted(listed) == ["blocks.0.mixer.hook_q", "norm_final.hook_scale"]
    close(sliced["blocks.1.attn.hook_pattern"], full["blocks.1.mixer.hook_pattern"][:, :, 2:5])
    close(tupled["blocks.1.hook_resid_pre"], full["blocks.1.hook_resid_pre"][:, 1::2])
    close(one["blocks.0.attn.hook_pattern"], full["blocks.0.mixer.hook_pattern"][0])
    assert not one.has_batch_dim
    _, keyed = model.run_with_cache(ids, names_filter=["blocks.1.attn.hook_pattern", "blocks.1.attn.hook_z"],
                                    positions={"blocks.1.attn.hook_pattern": [2, 3, 4]},
                                    heads={"blocks.1.attn.hook_z": [1]})  # TL names as keys too
    close(keyed["blocks.1.attn.hook_pattern"], sliced["blocks.1.attn.hook_pattern"])
    close(keyed["blocks.1.attn.hook_z"], full["blocks.1.mixer.hook_z"][:, :, [1]])
    with pytest.raises(ValueError, match="not both"):
        model.run_with_cache(ids, names=["hook_embed"], names_filter=["hook_embed"])
    with pytest.raises(ValueError, match=r"positions=\[-1\]"):
        model.run_with_cache(ids, pos_slice=-1)
    with pytest.raises(ValueError, match="batch size 1"):
        model.run_with_cache(ids, remove_batch_dim=True, names="hook_embed")


def test_remove_batch_dim_in_hook_functions(setup):
    _, model, ids = setup
    shapes = []

    def halve(pattern, hook):
        shapes.append(tuple(pattern.shape))
        return pattern * 0.5

    with torch.no_grad():
        unbatched = model.run_with_hooks(ids[:1], fwd_hooks=[("blocks.0.attn.hook_pattern", halve)],
                                         remove_batch_dim=True)
        batched = model.run_with_hooks(ids[:1], fwd_hooks=[("blocks.0.attn.hook_pattern", halve)])
    assert shapes == [(4, 7, 7), (1, 4, 7, 7)]
    assert torch.equal(unbatched, batched)
    with pytest.raises(ValueError, match="batch size 1"):
        model.run_with_hooks(ids, fwd_hooks=[("blocks.0.attn.hook_pattern", halve)], remove_batch_dim=True)


def test_bwd_hooks_see_the_gradient_the_cache_reports(setup):
    """bwd_hooks fire on backward() of what run_with_hooks returned, with the gradient
    run_with_cache(incl_bwd=True) caches; a returned tensor replaces the gradient."""
    _, model, ids = setup
    seen = {}

    def record(grad, hook):
        seen[hook.name] = grad.clone()

    names = ["blocks.1.attn.hook_pattern", "ln_final.hook_scale", "blocks.0.hook_resid_mid"]
    loss = model.run_with_hooks(ids, bwd_hooks=[(n, record) for n in names], return_type="loss")
    assert not seen
    loss.backward()
    model.zero_grad()
    _, cache = model.run_with_cache(ids, names=names, incl_bwd=True, return_type="loss")  # TL's incl_bwd: the loss
    for name in names:
        ours = model.hook_point(name).name
        close(seen[ours], cache[ours + "_grad"])
        close(cache[name + "_grad"], cache[ours + "_grad"])

    def zero(grad, hook):
        return torch.zeros_like(grad)

    loss = model.run_with_hooks(ids, bwd_hooks=[("blocks.0.hook_resid_mid", zero)], return_type="loss")
    embed_grad = torch.autograd.grad(loss, model.pos_embed.weight)[0]
    assert float(embed_grad.abs().max()) == 0.0  # everything reaches the embedding through resid_mid 0


def test_start_at_layer_runs_the_blocks_from_there(setup):
    _, model, ids = setup
    seen = []
    with torch.no_grad():
        logits, full = model.run_with_cache(ids)
        for start in (0, 1, 2, -1):
            resid = full[f"blocks.{start % 3}.hook_resid_pre"]
            close(model.run_with_hooks(resid, start_at_layer=start), logits)
        close(model.run_with_hooks(full["blocks.1.hook_resid_pre"], start_at_layer=1, stop_at_layer=2),
              full["blocks.1.hook_resid_post"])
        model.run_with_hooks(full["blocks.2.hook_resid_pre"], start_at_layer=2,
                             fwd_hooks=[(lambda n: True, lambda x, hook: seen.append(hook.name))])
        doubled = model.run_with_hooks(full["blocks.2.hook_resid_pre"], start_at_layer=2,
                                       fwd_hooks=[("blocks.2.hook_attn_out", lambda x, hook: 2 * x)])
        twice = model.run_with_hooks(ids, fwd_hooks=[("blocks.2.hook_attn_out", lambda x, hook: 2 * x)])
    close(doubled, twice)  # a patch after the start acts as in the whole pass
    assert seen and all(n.startswith("blocks.2.") or n in ("norm_final.hook_scale", "hook_final", "hook_logits")
                        for n in seen)
    for bad, message in [(dict(start_at_layer=3), "start_at_layer must be"), (dict(start_at_layer=True), "start_at_layer"),
                         (dict(start_at_layer=2, stop_at_layer=1), "no block would run"),
                         (dict(start_at_layer=1, return_type="loss"), "pass labels=tokens"),
                         (dict(start_at_layer=1, return_type="loss", labels=ids[:, :3]), "labels must be")]:
        with pytest.raises(ValueError, match=message):
            model.run_with_hooks(full["blocks.1.hook_resid_pre"], **bad)
        with pytest.raises(ValueError, match=message):
            model.run_with_cache(full["blocks.1.hook_resid_pre"], **bad)
    with pytest.raises(ValueError, match="residual stream"):
        model.run_with_hooks(ids, start_at_layer=1)
    with pytest.raises(ValueError, match="residual stream"):
        model.run_with_cache(ids, start_at_layer=1)


def test_run_with_cache_from_a_layer_by_hand(setup):
    """The cache of a run started at block k holds what the whole run's holds from block k on."""
    _, model, ids = setup
    with torch.no_grad():
        logits, full = model.run_with_cache(ids)
        for start in (1, -1):
            got, cache = model.run_with_cache(full[f"blocks.{start % 3}.hook_resid_pre"], start_at_layer=start)
            close(got, logits)
            kept = [n for n in full if n in ("hook_final", "hook_logits") or n.startswith("norm_final.")
                    or n.startswith("blocks.") and int(n.split(".")[1]) >= start % 3]
            assert sorted(cache) == sorted(kept)
            for name in kept:
                close(cache[name], full[name])
        named = ["hook_embed", "blocks.0.hook_resid_post", "blocks.2.attn.hook_pattern"]
        _, cache = model.run_with_cache(full["blocks.2.hook_resid_pre"], start_at_layer=2, names_filter=named)
        assert list(cache) == ["blocks.2.mixer.hook_pattern"]  # names before the start are left out, as TL's
        loss, cache = model.run_with_cache(full["blocks.1.hook_resid_pre"], start_at_layer=1, return_type="loss",
                                           labels=ids, names=["blocks.2.hook_resid_post"], pos_slice=[0, 2])
        close(loss, model.run_with_hooks(ids, return_type="loss"))
        assert cache["blocks.2.hook_resid_post"].shape[1] == 2
        masked = ids.clone()
        masked[:, 3] = -100  # a target left out of the loss
        per_token = model.run_with_hooks(ids, return_type="loss", loss_per_token=True)
        close(model.run_with_hooks(full["blocks.1.hook_resid_pre"], start_at_layer=1, return_type="loss",
                                   labels=masked), (per_token.sum() - per_token[:, 2].sum()) / (per_token.numel() - 2))


def test_start_at_layer_same_as_transformer_lens(setup, bridge):
    _, model, ids = setup
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, names=["blocks.1.hook_resid_pre"])
        resid = cache["blocks.1.hook_resid_pre"]
        close(model.run_with_hooks(resid, start_at_layer=1), bridge.run_with_hooks(resid, start_at_layer=1))
        close(model.run_with_hooks(resid, start_at_layer=1, stop_at_layer=2),
              bridge.run_with_hooks(resid, start_at_layer=1, stop_at_layer=2))
        patch = [("blocks.2.attn.hook_z", lambda x, hook: 0.5 * x)]
        close(model.run_with_hooks(resid, start_at_layer=1, fwd_hooks=patch),
              bridge.run_with_hooks(resid, start_at_layer=1, fwd_hooks=patch))
        for kind in ("loss", "both"):
            mine = model.run_with_hooks(resid, start_at_layer=1, return_type=kind, labels=ids, fwd_hooks=patch)
            theirs = bridge.run_with_hooks(resid, start_at_layer=1, return_type=kind, labels=ids, fwd_hooks=patch)
            for a, b in zip(mine if kind == "both" else [mine], theirs if kind == "both" else [theirs]):
                close(a, b)
        mine, cache = model.run_with_cache(resid, start_at_layer=1)
        theirs, their_cache = bridge.run_with_cache(resid, start_at_layer=1)
        close(mine, theirs)
        ours = {model.hook_point(n).name for n in their_cache.keys() if not n.endswith("hook_normalized")
                and n in model.hook_dict or _has_counterpart(model, n)}
        assert ours <= set(cache)  # ours adds hook_result, hook_mlp_in (TL: behind flags), hook_final, hook_logits
        assert not any(n.startswith(("hook_embed", "hook_pos_embed", "blocks.0.")) for n in cache)
        for name in their_cache.keys():
            if _has_counterpart(model, name) and not name.endswith("hook_normalized"):
                close(cache[name], their_cache[name])
    loss, cache = model.run_with_cache(resid, start_at_layer=1, return_type="loss", labels=ids, incl_bwd=True,
                                       names=["blocks.2.attn.hook_pattern"])
    their_loss, their_cache = bridge.run_with_cache(resid, start_at_layer=1, return_type="loss", labels=ids,
                                                    incl_bwd=True, names_filter=["blocks.2.attn.hook_pattern"])
    close(loss, their_loss)
    close(cache["blocks.2.attn.hook_pattern_grad"], their_cache["blocks.2.attn.hook_pattern_grad"])


def test_mlp_input_gradient_is_the_mlp_branchs(setup, bridge):
    """d loss / d hook_mlp_in is the MLP branch's share of d loss / d hook_resid_mid (the rest goes
    through the skip to hook_resid_post): TL 4.3's bridge caches it under hook_resid_mid (its alias
    of ln2.hook_in, the norm's input), ours under hook_mlp_in; our hook_resid_mid's is the total."""
    _, model, ids = setup
    names = [f"blocks.1.hook_{n}" for n in ("resid_mid", "mlp_in", "resid_post")]
    _, cache = model.run_with_cache(ids, names=names, incl_bwd=True, return_type="loss")
    _, theirs = bridge.run_with_cache(ids, names_filter=["blocks.1.hook_resid_mid"], incl_bwd=True, return_type="loss")
    close(cache["blocks.1.hook_mlp_in_grad"], theirs["blocks.1.hook_resid_mid_grad"])
    assert cache["blocks.1.ln2.hook_in_grad"] is cache["blocks.1.hook_mlp_in_grad"]  # TL's name of it
    close(cache["blocks.1.hook_resid_mid_grad"], cache["blocks.1.hook_mlp_in_grad"] + cache["blocks.1.hook_resid_post_grad"])
    assert (cache["blocks.1.hook_mlp_in_grad"] - cache["blocks.1.hook_resid_mid_grad"]).abs().max() > 1e-3


def test_parallel_mixers_input_gradients_are_each_branchs():
    """Two mixers on one norm (Falcon-H1's layout): d metric / d mixer.hook_in and d / d
    mixer2.hook_in are each that branch's share (before: both the total), and through the norm
    they and the skip add up to d / d hook_resid_pre."""
    from models.config import ModelConfig
    torch.manual_seed(0)
    model = models.SequenceModel(ModelConfig(
        mixer=["mamba2", "attention"], mixer2=["attention", None], mlp=True, n_layers=2, vocab_size=11, d_model=16,
        n_heads=2, d_state=4, mixer_options={"mamba2": {"n_heads": 2, "head_dim": 8}})).double()
    ids = torch.randint(0, 11, (2, 6), generator=torch.Generator().manual_seed(1))
    names = ["blocks.0.mixer.hook_in", "blocks.0.mixer2.hook_in", "blocks.0.hook_resid_pre", "blocks.0.hook_resid_mid"]
    _, cache = model.run_with_cache(ids, names=names, incl_bwd=True, metric=lambda out: out[:, -1].logsumexp(-1).sum())
    first, second = cache["blocks.0.mixer.hook_in_grad"], cache["blocks.0.mixer2.hook_in_grad"]
    assert (first - second).abs().max() > 1e-3
    resid = cache["blocks.0.hook_resid_pre"].clone().requires_grad_()
    through_norm = torch.autograd.grad(model.blocks[0].norm_mixer(resid), resid, first + second)[0]
    close(through_norm + cache["blocks.0.hook_resid_mid_grad"], cache["blocks.0.hook_resid_pre_grad"])


def _has_counterpart(model, tl_name: str) -> bool:
    try:
        model.hook_point(tl_name)
    except ValueError:
        return False
    return True


def test_bwd_hooks_refuse_hook_state():
    model = models.build("mamba", vocab_size=12, d_model=8, n_layers=1)
    with pytest.raises(ValueError, match="incl_bwd"):
        model.run_with_hooks(torch.zeros(1, 4, dtype=torch.long),
                             bwd_hooks=[("blocks.0.mixer.hook_state", lambda g, h: None)])


def test_same_as_transformer_lens(setup, bridge):
    _, model, ids = setup
    with torch.no_grad():
        close(model.run_with_hooks(ids, return_type="loss"), bridge(ids, return_type="loss"))
        close(model.run_with_hooks(ids, return_type="loss", loss_per_token=True),
              bridge(ids, return_type="loss", loss_per_token=True))
        for stop in (0, 1, 2, -1, -3):  # n_layers: the bridge returns the logits, HookedTransformer (and we) the residual
            close(model.run_with_hooks(ids, stop_at_layer=stop), bridge.run_with_hooks(ids, stop_at_layer=stop))
        mine, cache = model.run_with_cache(ids, stop_at_layer=2, names_filter=lambda n: "resid" in n)
        theirs, their_cache = bridge.run_with_cache(ids, stop_at_layer=2, names_filter=lambda n: "resid" in n)
        close(mine, theirs)
        assert sorted(cache) == sorted(n for n in their_cache.keys() if ".ln2." not in n)  # the bridge's alias of resid_mid
        for name in cache:
            close(cache[name], their_cache[name])
        _, cache = model.run_with_cache(ids, pos_slice=slice(1, 4), names_filter=["blocks.2.attn.hook_pattern",
                                                                                 "blocks.2.attn.hook_z"])
        _, their_cache = bridge.run_with_cache(ids, pos_slice=slice(1, 4), names_filter=["blocks.2.attn.hook_pattern",
                                                                                        "blocks.2.attn.hook_z"])
        for name in ("blocks.2.attn.hook_pattern", "blocks.2.attn.hook_z"):
            close(cache[name], their_cache[name])
    grads = {}

    def record(grad, hook):
        grads.setdefault(hook.name, grad.clone())

    names = ["blocks.1.attn.hook_pattern", "blocks.2.hook_resid_pre", "blocks.0.ln2.hook_scale"]
    model.run_with_hooks(ids, bwd_hooks=[(n, record) for n in names], return_type="loss").backward()
    bridge.run_with_hooks(ids, bwd_hooks=[(n, record) for n in names], return_type="loss",
                          reset_hooks_end=False).backward()
    bridge.reset_hooks()
    model.zero_grad()
    for name in names:
        close(grads[model.hook_point(name).name], grads[name])
    _, cache = model.run_with_cache(ids, names_filter=names, incl_bwd=True, return_type="loss")
    _, their_cache = bridge.run_with_cache(ids, names_filter=names, incl_bwd=True, return_type="loss")
    for name in names:
        close(cache[name + "_grad"], their_cache[name + "_grad"])
