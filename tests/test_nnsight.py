"""interp.nnsight.wrap: batched invokes, hook-grammar envoys, interchange equal to the native one."""

import sys
from pathlib import Path

import pytest
import torch
from nnsight import NNsight

import models
from interp.analysis.interventions import Site, answer_probs, interchange
from interp.nnsight import wrap

sys.path.insert(0, str(Path(__file__).parent))
from test_interventions import TASK, VOCAB, ar_batch, corrupt_ar  # noqa: E402


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = models.build("tanh_rnn", vocab_size=VOCAB, d_model=16, n_layers=2, residual=True, norm="layernorm")
    clean = ar_batch(16, 4, seed=0)
    return model, clean, corrupt_ar(clean, TASK, seed=1)


def test_wrap_gives_an_nnsight_model_with_envoys_named_by_the_grammar(setup):
    model, clean, _ = setup
    nn_model = wrap(model)
    assert isinstance(nn_model, NNsight)
    assert nn_model.hook_envoy("blocks.1.mixer.hook_state") is nn_model.blocks[1].mixer.hook_state
    with pytest.raises(ValueError, match=r"unknown hook name 'blocks.1.mixer.hook_stat'.*hook_state"):
        nn_model.hook_envoy("blocks.1.mixer.hook_stat")
    with pytest.raises(TypeError, match="SequenceModel"):
        wrap(torch.nn.Linear(2, 2))
    with torch.no_grad(), nn_model.trace(clean.tokens):
        states = nn_model.blocks[1].mixer.hook_state.output.save()
        logits = nn_model.output.save()
    # traces run on the instrumented path (bit-identical to it; the fast path agrees to ~1e-6)
    with torch.no_grad(), models.instrumented():
        expected_logits, cache = model.run_with_cache(clean.tokens, names=["blocks.1.mixer.hook_state"])
        assert torch.equal(model(clean.tokens), expected_logits)  # the wrapped model still runs plainly
    assert torch.equal(states, cache["blocks.1.mixer.hook_state"])
    assert torch.equal(logits, expected_logits)


def test_invokes_batch_into_one_forward_pass(setup):
    model, clean, corrupt = setup
    nn_model = wrap(model)
    rows_seen = []
    handle = model.embed.register_forward_hook(lambda module, args, out: rows_seen.append(args[0].shape[0]))
    try:
        with torch.no_grad(), nn_model.trace() as tracer:
            with tracer.invoke(clean.tokens):
                first = nn_model.output.save()
            with tracer.invoke(corrupt.tokens[:5]):
                second = nn_model.output.save()
    finally:
        handle.remove()
    assert rows_seen == [len(clean) + 5]
    with torch.no_grad(), models.instrumented():
        assert torch.equal(first, model(clean.tokens)) and torch.equal(second, model(corrupt.tokens[:5]))
    with pytest.raises(ValueError, match="same length T"):
        with torch.no_grad(), nn_model.trace() as tracer:
            with tracer.invoke(clean.tokens):
                nn_model.output.save()
            with tracer.invoke(clean.tokens[:, :-1]):
                nn_model.output.save()


def test_nnsight_interchange_equals_native_interchange(setup):
    """Patch hook_out at the value and hook_state at the key (a causal state patch) via nnsight."""
    model, clean, corrupt = setup
    sites = [Site("blocks.0.mixer.hook_state", "key"), Site("blocks.0.mixer.hook_out", "value"),
             Site("blocks.1.mixer.hook_state", "value")]
    native = interchange(model, clean, corrupt, sites, min_effect=0.0, resume=False)  # whole passes, as nnsight
    nn_model = wrap(model)
    rows = torch.arange(len(clean))
    logits = []
    with torch.no_grad(), nn_model.trace() as tracer:
        barriers = [tracer.barrier(2) for _ in sites]
        with tracer.invoke(clean.tokens):
            values = []
            for site, barrier in zip(sites, barriers):
                values.append(nn_model.hook_envoy(site.hook).output[rows, clean.roles[site.position]])
                barrier()
        for i, (site, barrier) in enumerate(zip(sites, barriers)):
            with tracer.invoke(corrupt.tokens):
                barrier()
                nn_model.hook_envoy(site.hook).output[rows, corrupt.roles[site.position]] = values[i]
                logits.append(nn_model.output.save())
    y, query = clean.targets[rows, -1], clean.roles["query"]
    p_patched = torch.stack([answer_probs(out, query, y) for out in logits])
    assert torch.equal(p_patched, native.p_patched)
    # the state patches changed the answer: they propagated from the patched step to the query
    assert (p_patched[[0, 2]] - native.p_corrupt).abs().max() > 1e-4
    restoration = (p_patched - native.p_corrupt) / (native.p_clean - native.p_corrupt)
    kept = native.kept
    assert kept.any()
    assert torch.equal(restoration[:, kept], native.restoration[:, kept])


@pytest.mark.parametrize("name", ["mamba", "deltanet", "attention"])
def test_nnsight_patch_equals_native_across_mixers(name, setup):
    """A state patch (kernel pins for Mamba / DeltaNet) or a q/k/v patch through nnsight."""
    _, clean, corrupt = setup
    torch.manual_seed(0)
    model = models.build(name, vocab_size=VOCAB, d_model=16, n_heads=2, d_state=4, n_layers=1)
    hook = "blocks.0.mixer.hook_state" if "blocks.0.mixer.hook_state" in model.hook_names() else "blocks.0.mixer.hook_v"
    native = interchange(model, clean, corrupt, [Site(hook, "key")], min_effect=0.0, resume=False)
    nn_model = wrap(model)
    rows = torch.arange(len(clean))
    with torch.no_grad(), nn_model.trace() as tracer:
        barrier = tracer.barrier(2)
        with tracer.invoke(clean.tokens):
            value = nn_model.hook_envoy(hook).output[rows, clean.roles["key"]]
            barrier()
        with tracer.invoke(corrupt.tokens):
            barrier()
            nn_model.hook_envoy(hook).output[rows, corrupt.roles["key"]] = value
            logits = nn_model.output.save()
    p = answer_probs(logits, clean.roles["query"], clean.targets[rows, -1])
    assert torch.equal(p, native.p_patched[0])
    assert not torch.equal(p, native.p_corrupt)  # the patch reached the answer (tiny for an untrained Mamba)
