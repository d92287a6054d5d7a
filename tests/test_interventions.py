"""Interchange interventions, ablations, short-conv ablation and corruptions (interp.analysis.interventions)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import models
from interp.analysis import interventions
from interp.analysis.interventions import (
    Site, ablate, ablate_short_conv, answer_positions, corrupt_ar, corrupt_key, interchange,
    patched_probs, restoration, short_convs, site_grid, site_means,
)
from interp.analysis.interventions import site_positions
from interp.analysis.interventions import patching
from interp.analysis.interventions.patching import _patch_hooks, _source_from_cache
from interp.tasks.base import Batch
from models.hooks import HookedMixin, HookPoint
from models.kernels.short_conv import short_conv

# ----------------------------------------------------------------------------------------------
# Hand-built AR batches: BOS k1 v1 ... kL vL EOS q  (loss at q, target the paired value)
# ----------------------------------------------------------------------------------------------

BOS, EOS, N_KEYS, N_VALUES = 0, 1, 6, 6
KEY_IDS = range(2, 2 + N_KEYS)
VALUE_IDS = range(2 + N_KEYS, 2 + N_KEYS + N_VALUES)
VOCAB = 2 + N_KEYS + N_VALUES


def ar_batch(n: int, pairs: int, seed: int) -> Batch:
    rng = np.random.default_rng(seed)
    length = 2 * pairs + 3
    tokens = np.zeros((n, length), dtype=np.int64)
    targets = np.zeros_like(tokens)
    roles = {"key": np.zeros(n, np.int64), "value": np.zeros(n, np.int64), "query": np.zeros(n, np.int64)}
    for b in range(n):
        keys = rng.choice(list(KEY_IDS), pairs, replace=False)
        values = rng.choice(list(VALUE_IDS), pairs, replace=False)
        i = rng.integers(pairs)
        tokens[b, 1:2 * pairs + 1:2], tokens[b, 2:2 * pairs + 2:2] = keys, values
        tokens[b, 2 * pairs + 1], tokens[b, -1] = EOS, keys[i]
        targets[b, :-1] = tokens[b, 1:]
        targets[b, -1] = values[i]
        roles["key"][b], roles["value"][b], roles["query"][b] = 1 + 2 * i, 2 + 2 * i, length - 1
    loss_mask = np.zeros_like(tokens, dtype=bool)
    loss_mask[:, -1] = True
    return Batch(torch.from_numpy(tokens), torch.from_numpy(targets), torch.from_numpy(loss_mask),
                 torch.zeros(n, length, dtype=torch.long), {k: torch.from_numpy(v) for k, v in roles.items()})


TASK = SimpleNamespace(key_ids=KEY_IDS)


@pytest.fixture(scope="module")
def pair():
    clean = ar_batch(24, 4, seed=0)
    return clean, corrupt_ar(clean, TASK, seed=1)


def rnn_model():
    torch.manual_seed(0)
    return models.build("tanh_rnn", vocab_size=VOCAB, d_model=16, n_layers=2, residual=True, norm="layernorm")


HOOKS = ["blocks.{l}.hook_resid_pre", "blocks.{l}.mixer.hook_out", "blocks.{l}.mixer.hook_state"]
ROLES = ["key", "value", "query"]

# ----------------------------------------------------------------------------------------------
# An analytic 1-layer attention model: the query attends to the position whose previous token
# equals it (the value after the matching key) and copies that position's token if it is a value.
# ----------------------------------------------------------------------------------------------


class Mixer(nn.Module):
    def __init__(self, sharpness: float) -> None:
        super().__init__()
        self.hook_in, self.hook_out = HookPoint(), HookPoint()
        self.sharpness = sharpness
        is_value = torch.zeros(VOCAB)
        is_value[list(VALUE_IDS)] = 1.0
        self.register_buffer("is_value", is_value)

    def forward(self, x):  # [B, T, 2V] = [one-hot token, one-hot previous token]
        x = self.hook_in(x)
        q, k, v = x[..., :VOCAB], x[..., VOCAB:], x[..., :VOCAB] * self.is_value
        scores = self.sharpness * q @ k.transpose(1, 2)  # [B, T, T]
        future = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1)
        return self.hook_out(scores.masked_fill(future, float("-inf")).softmax(-1) @ v)  # [B, T, V]


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hook_resid_pre = HookPoint()
        self.mixer = Mixer(sharpness=12.0)


class CopyModel(HookedMixin, nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cfg = SimpleNamespace(n_layers=1)
        self.hook_embed = HookPoint()
        self.blocks = nn.ModuleList([Block()])
        self.hook_logits = HookPoint()
        self.setup_hooks()

    def forward(self, tokens):
        current = F.one_hot(tokens, VOCAB).float()
        previous = F.pad(current, (0, 0, 1, 0))[:, :-1]
        x = self.blocks[0].hook_resid_pre(self.hook_embed(torch.cat([current, previous], -1)))
        return self.hook_logits(10.0 * self.blocks[0].mixer(x))


def test_analytic_copy_model_restores_at_the_value_before_attention_and_at_the_query_after(pair):
    clean, corrupt = pair
    model = CopyModel()
    sites = site_grid(model, ["blocks.{l}.hook_resid_pre", "blocks.{l}.mixer.hook_out"], ROLES)
    result = interchange(model, clean, corrupt, sites)
    assert result.n_kept == len(clean)  # the copy model answers clean pairs and fails corrupt ones
    expected = {"hook_resid_pre@key": 0.0, "hook_resid_pre@value": 1.0, "hook_resid_pre@query": 0.0,
                "hook_out@key": 0.0, "hook_out@value": 0.0, "hook_out@query": 1.0}
    for label, value in expected.items():
        row = result[f"blocks.0.{'mixer.' if 'out' in label else ''}{label}"]
        torch.testing.assert_close(row, torch.full_like(row, value), atol=1e-12, rtol=0)


# ----------------------------------------------------------------------------------------------
# Exact identities
# ----------------------------------------------------------------------------------------------


def test_patching_a_run_with_its_own_values_restores_exactly(pair):
    clean, corrupt = pair
    model = rnn_model()
    sites = site_grid(model, HOOKS, ROLES) + [Site("hook_embed", None), Site("blocks.1.mixer.hook_state", None)]
    result = interchange(model, clean, corrupt, sites, min_effect=0.0, resume=False)
    assert result.n_kept > 0
    # every pair runs (skip_noops=False); with skipping every pair is a no-op and is not run
    clean_into_clean = patched_probs(model, clean, clean, sites, skip_noops=False, resume=False)
    corrupt_into_corrupt = patched_probs(model, corrupt, corrupt, sites, answer_tokens=clean.targets[:, -1],
                                         skip_noops=False, resume=False)
    assert torch.equal(patched_probs(model, clean, clean, sites), clean_into_clean)  # skipped: exact
    # bit-identical probabilities, so restoration is exactly 1 and exactly 0 where defined
    assert torch.equal(clean_into_clean, result.p_clean.expand_as(clean_into_clean))
    assert torch.equal(corrupt_into_corrupt, result.p_corrupt.expand_as(corrupt_into_corrupt))
    ones, kept = restoration(clean_into_clean, result.p_clean, result.p_corrupt, 0.0)
    zeros, _ = restoration(corrupt_into_corrupt, result.p_clean, result.p_corrupt, 0.0)
    assert torch.equal(ones[:, kept], torch.ones_like(ones[:, kept]))
    assert torch.equal(zeros[:, kept], torch.zeros_like(zeros[:, kept]))
    # patching the embedding at every position from clean reproduces the clean run
    assert torch.equal(result["hook_embed@all"][kept], torch.ones(int(kept.sum()), dtype=torch.float64))
    # resumed passes (the default) give the same up to float rounding
    resumed = patched_probs(model, clean, clean, sites, skip_noops=False)
    torch.testing.assert_close(resumed, clean_into_clean, atol=1e-6, rtol=0)


def test_batched_interchange_equals_one_site_at_a_time(pair):
    clean, corrupt = pair
    model = rnn_model()
    sites = site_grid(model, HOOKS, ROLES)
    batched = interchange(model, clean, corrupt, sites, batch_size=10 * len(clean), min_effect=0.0, resume=False)
    every_pair = interchange(model, clean, corrupt, sites, batch_size=10 * len(clean), min_effect=0.0,
                             skip_noops=False, resume=False)
    assert torch.equal(batched.p_patched, every_pair.p_patched)  # skipped pairs are exact no-ops
    # reading the answer at the value position: patches at the (later) query are skipped, exactly
    early = [interchange(model, clean, corrupt, sites, answer="value", min_effect=0.0, skip_noops=skip, resume=False)
             for skip in (True, False)]
    assert torch.equal(early[0].p_patched, early[1].p_patched)
    query_site = early[0].labels.index("blocks.1.mixer.hook_out@query")
    assert torch.equal(early[1].p_patched[query_site], early[1].p_corrupt)
    # passes of 240 rows (no-op pairs skipped) against one pass of the 24 examples per site
    for i, site in enumerate(sites):
        alone = interchange(model, clean, corrupt, [site], batch_size=len(clean), min_effect=0.0,
                            skip_noops=False, resume=False)
        assert torch.equal(alone.p_patched[0], batched.p_patched[i]), site
    # passes of 7 rows: the same values up to float32 rounding (a matmul over 7 rows may take
    # another BLAS kernel than one over 240 rows, so the last bits may differ)
    small = interchange(model, clean, corrupt, sites, batch_size=7, min_effect=0.0, resume=False)
    torch.testing.assert_close(small.p_patched, batched.p_patched, atol=1e-7, rtol=0)
    assert torch.equal(alone.p_clean, batched.p_clean) and torch.equal(alone.p_corrupt, batched.p_corrupt)


def test_state_site_is_a_causal_state_patch(pair):
    """A hook_state site equals a hand-written run_with_hooks state patch (pinned, re-scanned)."""
    clean, corrupt = pair
    model = rnn_model()
    site = Site("blocks.0.mixer.hook_state", "key")
    result = interchange(model, clean, corrupt, [site], min_effect=0.0, resume=False)
    rows, key = torch.arange(len(clean)), clean.roles["key"]
    with models.instrumented(), torch.no_grad():
        _, cache = model.run_with_cache(clean.tokens, names=[site.hook])

        def patch(states, hook):
            states = states.clone()
            states[rows, key] = cache[site.hook][rows, key]
            return states

        logits, patched_cache = model.run_with_cache(corrupt.tokens, names=[site.hook], fwd_hooks=[(site.hook, patch)])
    p = logits[rows, -1].double().softmax(-1)[rows, clean.targets[:, -1]]
    assert torch.equal(p, result.p_patched[0])
    # the patch propagated: states after the key differ from the unpatched corrupt run's
    with torch.no_grad():
        _, corrupt_cache = model.run_with_cache(corrupt.tokens, names=[site.hook])
    assert (patched_cache[site.hook][:, -1] - corrupt_cache[site.hook][:, -1]).abs().max() > 1e-4


def count_rows_and_positions(model):
    """A forward hook on the last block's output adding up rows x positions of every pass."""
    counted = [0]
    model.blocks[-1].hook_resid_post.register_forward_hook(lambda mod, args, out: counted.__setitem__(0, counted[0] + out.shape[0] * out.shape[1]))
    return counted


@pytest.mark.parametrize("name", ["tanh_rnn", "lstm", "mamba", "deltanet", "transformer", "based"])
def test_resumed_interchange_agrees_with_whole_passes_and_computes_less(name, pair, monkeypatch):
    """The default (resume=True) starts each pair at its site's block and first position."""
    monkeypatch.setattr(patching, "MERGE_ROW_POSITIONS", 0)  # no merging: every start its own pass
    clean, corrupt = pair
    torch.manual_seed(0)
    model = models.build(name, vocab_size=VOCAB, d_model=16, n_heads=2, d_state=4, n_layers=2)
    hooks = ["blocks.{l}.hook_resid_pre", "blocks.{l}.mixer.hook_out", "blocks.{l}.hook_resid_post"]
    hooks += [h for h in ("blocks.{l}.mixer.hook_state", "blocks.{l}.mixer.hook_conv", "blocks.{l}.mixer.hook_k")
              if h.format(l=0) in model.hook_names()]
    sites = site_grid(model, hooks, ["key", "value", "query"]) + [Site("hook_embed", "key")]
    counted = count_rows_and_positions(model)
    whole = interchange(model, clean, corrupt, sites, min_effect=0.0, resume=False)
    whole_work, counted[0] = counted[0], 0
    resumed = interchange(model, clean, corrupt, sites, min_effect=0.0)
    torch.testing.assert_close(resumed.p_patched, whole.p_patched, atol=1e-6, rtol=0)
    assert torch.equal(resumed.p_clean, whole.p_clean) and torch.equal(resumed.p_corrupt, whole.p_corrupt)
    assert counted[0] < 0.8 * whole_work, (counted[0], whole_work)
    monkeypatch.setattr(patching, "MERGE_ROW_POSITIONS", 10**9)  # every start merged: the same values
    merged = interchange(model, clean, corrupt, sites, min_effect=0.0)
    torch.testing.assert_close(merged.p_patched, whole.p_patched, atol=1e-6, rtol=0)
    # answer read at the value position: query sites lie after it and keep p_corrupt, exactly
    early = [interchange(model, clean, corrupt, sites, answer="value", min_effect=0.0, resume=r) for r in (True, False)]
    torch.testing.assert_close(early[0].p_patched, early[1].p_patched, atol=1e-6, rtol=0)
    query_sites = [i for i, label in enumerate(early[0].labels) if label.endswith("@query")]
    assert torch.equal(early[0].p_patched[query_sites], early[0].p_corrupt.expand(len(query_sites), -1))


def test_subspace_identity_equals_full_patch_and_partial_patch_moves_only_the_subspace(pair):
    clean, corrupt = pair
    model = rnn_model()
    full = interchange(model, clean, corrupt, [Site("blocks.0.mixer.hook_out", "value")], min_effect=0.0)
    eye = Site("blocks.0.mixer.hook_out", "value", subspace=torch.eye(16))
    torch.testing.assert_close(interchange(model, clean, corrupt, [eye], min_effect=0.0).p_patched,
                               full.p_patched, atol=1e-7, rtol=0)
    basis = torch.linalg.qr(torch.randn(16, 3, generator=torch.Generator().manual_seed(0))).Q
    site = Site("blocks.0.mixer.hook_out", "value", subspace=basis)
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(clean.tokens, names=[site.hook])
        _, corrupt_cache = model.run_with_cache(corrupt.tokens, names=[site.hook])
    pos = [site_positions(clean, "value")]
    source = _source_from_cache([site], clean_cache, pos)
    rows = torch.arange(len(clean))
    patch = _patch_hooks([site], torch.zeros_like(rows), rows, pos, source, clean.tokens.shape[1])[0][1]
    patched = patch(corrupt_cache[site.hook], SimpleNamespace(name=site.hook))  # [N, T, D]
    rows, value = torch.arange(len(clean)), clean.roles["value"]
    got, was, want = (t[rows, value] for t in (patched, corrupt_cache[site.hook], clean_cache[site.hook]))
    projector = basis @ basis.T
    torch.testing.assert_close(got @ projector, want @ projector, atol=1e-6, rtol=0)  # clean in span(P)
    torch.testing.assert_close(got - got @ projector, was - was @ projector, atol=1e-6, rtol=0)  # corrupt outside
    elsewhere = torch.ones(patched.shape[:2], dtype=torch.bool)
    elsewhere[rows, value] = False
    assert torch.equal(patched[elsewhere], corrupt_cache[site.hook][elsewhere])


def test_head_and_pattern_layout():
    """head selects axis 2 of [B, T, H, d]; hook_pattern [B, H, T, T] is indexed (query t, head h)."""
    act = torch.randn(4, 5, 3, 2)
    source = torch.randn(4, 5, 3, 2)
    site = Site("blocks.0.mixer.hook_v", 2, head=1)
    pos = [torch.full((4, 1), 2)]

    def from_source(s, examples, current):
        return source[examples, 2, 1][:, None]

    one_site, rows = torch.zeros(4, dtype=torch.long), torch.arange(4)
    out = _patch_hooks([site], one_site, rows, pos, from_source, 5)[0][1](act, SimpleNamespace(name=site.hook))
    expected = act.clone()
    expected[:, 2, 1] = source[:, 2, 1]
    assert torch.equal(out, expected) and not torch.equal(act, expected)

    pattern, new = torch.rand(4, 3, 5, 5), torch.rand(4, 3, 5, 5)
    site = Site("blocks.0.mixer.hook_pattern", 3, head=2)
    out = _patch_hooks([site], one_site, rows, [torch.full((4, 1), 3)],
                       lambda s, e, cur: new[e, 2, 3][:, None], 5)[0][1](pattern, SimpleNamespace(name=site.hook))
    expected = pattern.clone()
    expected[:, 2, 3, :] = new[:, 2, 3, :]
    assert torch.equal(out, expected)
    # in a resumed pass over positions [2, 5) a [B, H, 3, 5] pattern's query axis starts at 2
    out = _patch_hooks([site], one_site, rows, [torch.full((4, 1), 3)],
                       lambda s, e, cur: new[e, 2, 3][:, None], 5)[0][1](pattern[:, :, 2:], SimpleNamespace(name=site.hook))
    assert torch.equal(out, expected[:, :, 2:])
    bad = Site("blocks.0.mixer.hook_v", 2, head=7)
    with pytest.raises(ValueError, match="head 7"):
        _patch_hooks([bad], one_site, rows, pos, from_source, 5)[0][1](act, SimpleNamespace(name=bad.hook))


# ----------------------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------------------


def test_filter_counts_and_dataframes(pair):
    clean, corrupt = pair
    model = rnn_model()
    sites = site_grid(model, HOOKS[:2], ROLES)
    result = interchange(model, clean, corrupt, sites, min_effect=1e-4)  # an untrained model: small effects
    effect = result.p_clean - result.p_corrupt
    assert torch.equal(result.kept, effect > 1e-4) and 0 < result.n_kept < len(clean)
    assert torch.isnan(result.restoration[:, ~result.kept]).all()
    manual = (result.p_patched - result.p_corrupt) / effect
    torch.testing.assert_close(result.restoration[:, result.kept], manual[:, result.kept], atol=0, rtol=0)
    frame = result.to_dataframe()
    assert list(frame["site"]) == result.labels and (frame["n_kept"] == result.n_kept).all()
    np.testing.assert_allclose(frame["mean"], manual[:, result.kept].mean(1).numpy())
    assert set(frame["position"]) == set(ROLES) and set(frame["layer"]) == {0, 1}
    rows = result.to_dataframe("example")
    assert len(rows) == len(sites) * len(clean)
    kept_means = rows[rows.kept].groupby("site", sort=False)["restoration"].mean()
    np.testing.assert_allclose(kept_means[result.labels].to_numpy(), frame["mean"].to_numpy())


def test_answer_positions_default_to_the_last_loss_position(pair):
    clean, _ = pair
    assert torch.equal(answer_positions(clean), clean.roles["query"])
    assert torch.equal(answer_positions(clean, "query"), clean.roles["query"])


# ----------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------


def test_unknown_hook_missing_role_and_shape_mismatch_raise(pair):
    clean, corrupt = pair
    model = rnn_model()
    with pytest.raises(ValueError, match=r"unknown hook name 'blocks.0.mixer.hook_outt'.*hook_out"):
        interchange(model, clean, corrupt, [Site("blocks.0.mixer.hook_outt", "value")])
    with pytest.raises(ValueError, match=r"role 'answer' is not in the clean batch's roles; available: \['key', 'query', 'value'\]"):
        interchange(model, clean, corrupt, [Site("blocks.0.mixer.hook_out", "answer")])
    with pytest.raises(ValueError, match=r"same shape.*\(24, 11\).*\(24, 9\)"):
        interchange(model, clean, ar_batch(24, 3, seed=2), [Site("blocks.0.mixer.hook_out", "value")])
    with pytest.raises(ValueError, match="out of range"):
        interchange(model, clean, corrupt, [Site("blocks.0.mixer.hook_out", 11)])
    with pytest.raises(ValueError, match="orthonormal"):
        Site("blocks.0.mixer.hook_out", "value", subspace=torch.ones(16, 2))
    with pytest.raises(ValueError, match="subspace has d=8"):
        interchange(model, clean, corrupt, [Site("blocks.0.mixer.hook_out", "value", subspace=torch.eye(8)[:, :2])])
    with pytest.raises(TypeError, match="Site.position"):
        Site("blocks.0.mixer.hook_out", 1.5)
    with pytest.raises(ValueError, match="metric"):
        interchange(model, clean, corrupt, [Site("blocks.0.mixer.hook_out", "value")], metric="logit")
    with pytest.raises(ValueError, match="batch_size"):
        interchange(model, clean, corrupt, [Site("blocks.0.mixer.hook_out", "value")], batch_size=0)
    with pytest.raises(TypeError, match="Batch"):
        interchange(model, clean.tokens, corrupt, [Site("blocks.0.mixer.hook_out", "value")])


# ----------------------------------------------------------------------------------------------
# Ablations
# ----------------------------------------------------------------------------------------------


def test_zero_and_mean_ablation(pair):
    clean, _ = pair
    model = CopyModel()
    result = ablate(model, clean, [Site("blocks.0.mixer.hook_out", "query"), Site("blocks.0.mixer.hook_out", "key")])
    assert result.baseline_correct.all()
    # zero output at the query: uniform logits, p = 1 / V exactly; ablating the key changes nothing
    assert torch.equal(result.p_answer[0], torch.full((len(clean),), 1 / VOCAB, dtype=torch.float64))
    assert torch.equal(result.p_answer[1], result.baseline_p) and result.correct[1].all()
    # mean ablation over four copies of one example is a no-op on that example
    same = clean.select(torch.zeros(4, dtype=torch.long))
    site = Site("blocks.0.hook_resid_pre", "value")
    mean = ablate(model, same, [site], mode="mean")
    assert torch.equal(mean.p_answer[0], mean.baseline_p)
    # the mean replaces the value position: the query no longer finds its value
    reference = ar_batch(64, 4, seed=5)
    means = site_means(model, reference, [site])
    with torch.no_grad():
        _, cache = model.run_with_cache(reference.tokens, names=[site.hook])
    rows = torch.arange(len(reference))
    torch.testing.assert_close(means[0], cache[site.hook][rows, reference.roles["value"]].mean(0))
    ablated = ablate(model, clean, [site], mode="mean", reference=reference)
    assert ablated.accuracy()[0] < 0.5 < ablated.baseline_correct.double().mean()
    frame = ablated.to_dataframe()
    assert frame.loc[0, "mode"] == "mean" and frame.loc[0, "baseline_accuracy"] == 1.0


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_resumed_ablation_agrees_with_whole_passes(mode, pair):
    clean, _ = pair
    torch.manual_seed(0)
    model = models.build("mamba", vocab_size=VOCAB, d_model=16, d_state=4, n_layers=2)
    sites = site_grid(model, ["blocks.{l}.mixer.hook_state", "blocks.{l}.mixer.hook_out"], ["key", "query"])
    resumed, whole = (ablate(model, clean, sites, mode=mode, resume=r) for r in (True, False))
    torch.testing.assert_close(resumed.p_answer, whole.p_answer, atol=1e-6, rtol=0)
    assert torch.equal(resumed.baseline_p, whole.baseline_p)
    assert (whole.p_answer - whole.baseline_p).abs().max() > 1e-3  # the ablations do something


def test_resumed_state_sites_run_declared_and_agree_with_whole_passes(pair, monkeypatch):
    """Resumed hook_state sites (whole, one head, a subspace of a head) are declared StatePatches
    run on the fast kernels (RecurrentMixer.declared_forward), with the values of whole passes,
    where the same patches run as hook functions on the instrumented path."""
    from models.mixers.base import RecurrentMixer

    clean, corrupt = pair
    torch.manual_seed(0)
    model = models.build("mamba2", vocab_size=VOCAB, d_model=16, n_heads=2, d_state=4, n_layers=2)
    basis = torch.linalg.qr(torch.randn(16 * 4, 3, generator=torch.Generator().manual_seed(0))).Q  # a head: [P, N]
    sites = site_grid(model, ["blocks.{l}.mixer.hook_state"], ["key", "value"])
    sites += [Site("blocks.0.mixer.hook_state", "key", head=1), Site("blocks.1.mixer.hook_state", "value", 0, basis)]
    declared = []
    original = RecurrentMixer.declared_forward
    monkeypatch.setattr(RecurrentMixer, "declared_forward",
                        lambda self, *args: declared.append(self.layer_idx) or original(self, *args))
    resumed = interchange(model, clean, corrupt, sites, min_effect=0.0)
    assert sorted(set(declared)) == [0, 1]
    declared.clear()
    whole = interchange(model, clean, corrupt, sites, min_effect=0.0, resume=False)
    assert not declared  # whole passes run under models.instrumented(): hook functions
    torch.testing.assert_close(resumed.p_patched, whole.p_patched, atol=1e-6, rtol=0)
    assert (whole.p_patched - whole.p_corrupt).abs().max() > 1e-5  # the patches do something (an untrained model)


# ----------------------------------------------------------------------------------------------
# Short-conv ablation
# ----------------------------------------------------------------------------------------------


class ConvMixer(nn.Module):
    def __init__(self, channels: int, width: int) -> None:
        super().__init__()
        self.conv_weight = nn.Parameter(torch.randn(channels, width))
        self.conv_bias = nn.Parameter(torch.randn(channels))


class ListedConvs(nn.Module):
    """A module that lists its kernel (an nn.Conv1d, weight [C, 1, W]) through short_convs()."""

    def __init__(self, channels: int, width: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, width, groups=channels, padding=width - 1)

    def short_convs(self):
        return [("kernel", self.conv.weight[:, 0, :])]


def test_short_conv_truncation_equals_a_narrower_conv_and_identity_is_the_input():
    torch.manual_seed(0)
    model = nn.ModuleDict({"a": ConvMixer(5, 4), "b": ListedConvs(5, 4),
                           "c": nn.Conv1d(5, 5, 4, groups=5), "dense": nn.Conv1d(5, 5, 4)})
    x = torch.randn(2, 9, 5)
    original = model["a"].conv_weight.detach().clone()
    names = ["a.conv_weight", "b.kernel", "c.weight"]  # listed once each; a dense conv is no short conv
    assert [name for name, _ in short_convs(model)] == names
    assert ablate_short_conv(model, width=2) == names
    assert torch.equal(model["c"].weight[:, 0, :2], torch.zeros(5, 2)) and model["dense"].weight.abs().min() > 0
    torch.testing.assert_close(short_conv(x, model["a"].conv_weight.detach()), short_conv(x, original[:, -2:]),
                               atol=1e-6, rtol=1e-6)
    assert torch.equal(model["b"].conv.weight[:, 0, :2], torch.zeros(5, 2))
    ablate_short_conv(model, mode="identity")
    assert torch.equal(short_conv(x, model["a"].conv_weight.detach()), x)
    conv = model["b"].conv
    with torch.no_grad():
        y = F.conv1d(x.transpose(1, 2), conv.weight, None, padding=3, groups=5)[..., :9].transpose(1, 2)
    assert torch.equal(y, x)
    with pytest.raises(ValueError, match="no short convolutions"):
        ablate_short_conv(rnn_model(), 1)
    with pytest.raises(ValueError, match="width"):
        ablate_short_conv(model, 0)
    with pytest.raises(ValueError, match="mode"):
        ablate_short_conv(model, 1, mode="delta")


@pytest.mark.parametrize("name", ["mamba", "based"])
def test_short_conv_ablation_on_a_registered_model(name):
    if name not in models.list_models():
        pytest.skip(f"the {name} mixer is not registered")
    torch.manual_seed(0)
    model = models.build(name, vocab_size=VOCAB, d_model=16, n_heads=2, d_conv=3, n_layers=1)
    tokens = torch.randint(0, VOCAB, (2, 10))
    changed = tokens.clone()
    changed[:, 4] = (changed[:, 4] + 1) % VOCAB
    with torch.no_grad():
        before = model(tokens)
        assert len(ablate_short_conv(model, 1)) == 1  # one kernel per layer
        after = model(tokens)
        assert (after - before).abs().max() > 1e-4
        # width 1: the conv output at t no longer depends on earlier inputs
        _, cache = model.run_with_cache(tokens, names=["blocks.0.mixer.hook_conv"])
        _, cache_changed = model.run_with_cache(changed, names=["blocks.0.mixer.hook_conv"])
    conv, conv_changed = cache["blocks.0.mixer.hook_conv"], cache_changed["blocks.0.mixer.hook_conv"]
    assert torch.equal(conv[:, 5:], conv_changed[:, 5:]) and not torch.equal(conv[:, 4], conv_changed[:, 4])


# ----------------------------------------------------------------------------------------------
# Corruptions
# ----------------------------------------------------------------------------------------------


def test_corrupt_ar_swaps_only_the_queried_key_for_an_absent_key(pair):
    clean, corrupt = pair
    rows = torch.arange(len(clean))
    changed = clean.tokens != corrupt.tokens
    assert torch.equal(changed, F.one_hot(clean.roles["key"], clean.tokens.shape[1]).bool())
    new = corrupt.tokens[rows, clean.roles["key"]]
    assert all(int(k) in KEY_IDS for k in new)
    assert not (corrupt.tokens == new[:, None]).logical_and(~changed).any()  # absent elsewhere
    assert (new != corrupt.tokens[:, -1]).all()  # the query no longer matches
    assert torch.equal(corrupt.targets, clean.targets) and torch.equal(corrupt.loss_mask, clean.loss_mask)
    assert torch.equal(corrupt_ar(clean, TASK, seed=1).tokens, corrupt.tokens)  # same seed, same bits
    with pytest.raises(ValueError, match="does not match the query token"):
        corrupt_key(clean, KEY_IDS, 0, key_role="value")
    with pytest.raises(TypeError, match="key_ids"):
        corrupt_ar(clean, SimpleNamespace(), 0)
    with pytest.raises(ValueError, match="absent"):
        corrupt_key(clean, range(2, 6), 0)  # 4 in-context keys leave no free candidate among 4


def test_corrupt_ar_on_the_recall_task():
    recall = pytest.importorskip("interp.tasks.recall")
    task = recall.AssociativeRecall(8, 8)
    clean = task.sample(16, 4, seed=0)
    corrupt = corrupt_ar(clean, task, seed=3)
    changed = clean.tokens != corrupt.tokens
    assert torch.equal(changed, F.one_hot(clean.roles["key"], clean.tokens.shape[1]).bool())
    assert torch.equal(answer_positions(clean), clean.roles["query"])


@pytest.mark.parametrize("name", models.list_models())
def test_every_layer_hook_of_the_zoo_patches_exactly(name, pair):
    """Every hook of a layer (patterns, 4-D states, heads) patched with the run's own values
    gives back the run's probabilities bit for bit; a value-position patch from clean runs."""
    clean, corrupt = pair
    clean, corrupt = clean.select(slice(0, 6)), corrupt.select(slice(0, 6))
    torch.manual_seed(0)
    model = models.build(name, vocab_size=VOCAB, d_model=16, n_heads=2, d_state=4, n_layers=1)
    hooks = [h for h in model.hook_names() if h.startswith("blocks.0.")]
    sites = [Site(h, "value") for h in hooks]
    with torch.no_grad(), models.instrumented():
        _, cache = model.run_with_cache(clean.tokens, names=hooks)
    sites += [Site(h, "query", head=1) for h in hooks if cache[h].dim() >= 4]  # [B, T, H, ...] / pattern
    own = patched_probs(model, clean, clean, sites, skip_noops=False, resume=False)
    result = interchange(model, clean, corrupt, sites, min_effect=0.0)
    assert torch.equal(own, result.p_clean.expand_as(own))
    assert torch.isfinite(result.p_patched).all()
    # resumed passes (the default) compute the same up to float rounding
    resumed_own = patched_probs(model, clean, clean, sites, skip_noops=False)
    torch.testing.assert_close(resumed_own, own, atol=1e-6, rtol=0)
    whole = interchange(model, clean, corrupt, sites, min_effect=0.0, resume=False)
    torch.testing.assert_close(result.p_patched, whole.p_patched, atol=1e-6, rtol=0)
