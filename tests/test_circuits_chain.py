"""Circuits on models without a residual stream (cfg.residual=False: the zoo's RNN stacks), whose
graph is a chain: a block's input is exactly the previous block's output, so each receiver reads
one stage (embed -> m0.in, m{l} -> m{l+1}.in or mlp{l}.in, the last stage -> logits). On tiny
float64 models: the full graph gives the clean metric and the empty graph the corrupted one; a
single patched edge equals a two-pass computation written here with plain hooks (the receiver's
input replaced by the sender's clean output); EAP equals the derivative of the edge patch."""

import sys
from pathlib import Path

import pytest
import torch

import models
from interp.analysis.circuits import build_graph, eap, eap_ig, edge_effects, faithfulness, setup

sys.path.insert(0, str(Path(__file__).parent))
from test_circuits import _patch_derivative, check_ends  # noqa: E402
from test_interventions import TASK, VOCAB, ar_batch, corrupt_ar  # noqa: E402

CHAINS = {  # name -> (mixer, n_layers, options)
    "lstm": ("lstm", 2, {}),
    "gru_mlp": ("gru", 3, {"mlp": True, "norm": "layernorm"}),  # norms between the stages
    "tanh_rnn": ("tanh_rnn", 2, {}),
    "token_gated_rnn": ("token_gated_rnn", 3, {}),
    "attention_heads": ("attention", 2, {"n_heads": 2}),  # per-head senders: each MLP input reads the heads
}


def chain_model(name: str, seed: int = 0):
    mixer, layers, options = CHAINS[name]
    torch.manual_seed(seed)
    return models.build(mixer, vocab_size=VOCAB, d_model=12, n_layers=layers, residual=False,
                        **options).double().eval()


@pytest.fixture(scope="module")
def pair():
    clean = ar_batch(4, 3, seed=0)
    return clean, corrupt_ar(clean, TASK, seed=1)


def test_graph_is_a_chain():
    assert build_graph(chain_model("lstm")).edge_names() == ["embed->m0.in", "m0->m1.in", "m1->logits"]
    assert build_graph(chain_model("gru_mlp")).edge_names() == [
        "embed->m0.in", "m0->mlp0.in", "mlp0->m1.in", "m1->mlp1.in", "mlp1->m2.in", "m2->mlp2.in", "mlp2->logits"]
    names = build_graph(chain_model("attention_heads")).edge_names()
    assert {"embed->a0.h1.k", "a0.h0->mlp0.in", "a0.h1->mlp0.in", "mlp0->a1.h0.q", "mlp1->logits"} <= set(names)
    assert not {"embed->a1.h0.q", "embed->mlp0.in", "a0.h0->a1.h0.q", "a0.h0->logits"} & set(names)
    assert len(build_graph(chain_model("lstm"), positions=["query"]).edge_names()) == 3 * 2  # query, other


@pytest.mark.parametrize("name", list(CHAINS))
def test_full_graph_is_clean_and_empty_graph_is_corrupt(name, pair):
    model = chain_model(name)
    scored, masks = check_ends(model, pair)
    assert torch.allclose(faithfulness(model, scored, masks.logical_not()),
                          torch.tensor([1.0, 0.0], dtype=torch.float64), atol=1e-9, rtol=0)


def _input_module(model, receiver):
    """The module whose input is the receiver's input: its block's norm (Identity without one)."""
    if receiver.site == "logits":
        return model.norm_final
    block = model.blocks[receiver.layer]
    return block.norm_mlp if receiver.site == "mlp" else block.norm_mixer


def _manual_chain_edge(model, graph, edge: int, clean, corrupt, metric_of) -> torch.Tensor:
    """The corrupted run with receiver r's input set to sender u's clean output (its only
    sender: without a residual stream r's input is u's output), by a plain forward pre-hook."""
    u, r = graph.edges[edge].tolist()
    sender, receiver = graph.senders[u], graph.receivers[r]
    with torch.no_grad():
        _, cache = model.run_with_cache(clean.tokens, names=[sender.hook])
        handle = _input_module(model, receiver).register_forward_pre_hook(
            lambda module, args: (cache[sender.hook],) + tuple(args[1:]))
        try:
            logits = model(corrupt.tokens)
        finally:
            handle.remove()
    return metric_of(logits[:, -1], torch.arange(len(clean)))


@pytest.mark.parametrize("name", ["lstm", "gru_mlp", "tanh_rnn", "token_gated_rnn"])
def test_single_edge_patch_equals_manual_two_pass(name, pair):
    model = chain_model(name, seed=1)
    scored = setup(model, *pair, metric="logit_diff")
    graph = scored.graph
    edges = list(range(graph.n_edges))
    effects = edge_effects(model, scored, edges)  # [E, N]
    for e in edges:
        manual = _manual_chain_edge(model, graph, e, *pair, scored.metric)
        assert torch.allclose(effects[e] + scored.corrupt_metric, manual, atol=1e-10, rtol=0), graph.edge_names()[e]
    assert effects.abs().min() > 1e-6  # every edge of a chain carries the whole signal


@pytest.mark.parametrize("name", list(CHAINS))
@pytest.mark.parametrize("metric", ["logit_diff", "kl"])
def test_eap_is_the_derivative_of_the_edge_patched_metric(name, metric, pair):
    model = chain_model(name, seed=2)
    scores = eap(model, *pair, metric=metric)
    scored = scores.setup
    for e in range(scored.graph.n_edges):
        derivative = _patch_derivative(model, scored, pair[1].tokens, e)
        assert torch.allclose(scores.per_example[e], derivative, atol=1e-7, rtol=1e-5), scored.graph.edge_names()[e]


def test_eap_ig_is_complete_over_the_embedding(pair):
    model = chain_model("lstm", seed=3)
    scores = eap_ig(model, *pair, steps=48, progress=False)
    effect = scores.setup.clean_metric - scores.setup.corrupt_metric
    total = scores.per_example[scores.graph.edges[:, 0] == 0].sum(0)  # [N] the one edge from embed
    assert torch.allclose(total, effect, atol=2e-3 * effect.abs().max().item(), rtol=0)
