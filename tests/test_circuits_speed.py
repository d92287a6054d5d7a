"""The fast receiver gradients of EAP / EAP-IG (interp.analysis.circuits.gradients: one forward,
gradients at the maps' outputs times their rows, the norm's vector-Jacobian product) equal the
reference computation in which every receiver reads its own copy of the residual stream (a zero
leaf per receiver, slots by a side run of the mixer on the copies) and each group of scores is
one product, on tiny float64 models of several families, to 1e-10."""

import sys
from pathlib import Path

import pytest
import torch

import models
from interp.analysis.circuits import build_graph, eap, eap_ig, positional_graph, setup
from interp.analysis.circuits.gradients import LeafPass, fast_receivers
from interp.analysis.circuits.passes import edge_pass, sender_value

sys.path.insert(0, str(Path(__file__).parent))
from test_interventions import VOCAB, TASK, ar_batch, corrupt_ar  # noqa: E402

FAMILIES = {  # name: (model options, build_graph options, whether every mixer receiver has map rows)
    "attention": (dict(mixer="attention"), {}, True),
    "attention_gqa_gated": (dict(mixer="attention", n_kv_heads=2, positional="rope", norm="rmsnorm",
                                 mixer_options={"output_gate": True, "qk_norm": True}), {}, True),
    "mamba2": (dict(mixer="mamba2", mlp=True, mixer_options={"n_groups": 2}), {}, True),
    "mamba2_conv": (dict(mixer="mamba2", mlp=True), dict(conv=True), True),
    "deltanet": (dict(mixer="deltanet", mixer_options={"gate": True}), {}, True),
    "deltanet_conv": (dict(mixer="deltanet"), dict(conv=True), True),
    "gated_deltanet": (dict(mixer="gated_deltanet"), {}, True),
    "gated_deltanet_gva": (dict(mixer="gated_deltanet", mixer_options={"num_v_heads": 8}), {}, False),  # copies
    "gated_deltanet_gva_conv": (dict(mixer="gated_deltanet", mixer_options={"num_v_heads": 8}), dict(conv=True), True),
    "mamba_groups": (dict(mixer="mamba"), dict(channel_groups=2), False),
    "hybrid": (dict(mixer=["attention", "mamba2", "gated_deltanet"], n_layers=3, n_kv_heads=2), {}, True),
}


def tiny(family: str, seed: int = 0):
    torch.manual_seed(seed)
    options = dict(FAMILIES[family][0])
    mixer = options.pop("mixer")
    name = mixer if isinstance(mixer, str) else mixer[0]
    kwargs = {} if isinstance(mixer, str) else {"mixer": mixer}
    options.setdefault("n_layers", 2)
    model = models.build(name, vocab_size=VOCAB, d_model=16, **kwargs, **options).double().eval()
    return model, build_graph(model, **FAMILIES[family][1])


@pytest.fixture(scope="module")
def pair():
    clean = ar_batch(4, 3, seed=0)
    return clean, corrupt_ar(clean, TASK, seed=1)


def reference_grads(model, pair_setup, copies=1, alphas=None) -> dict[int, torch.Tensor]:
    """{receiver: d (summed metric) / d x_r [N, T, D]} with a zero leaf in every receiver's own
    copy of the stream, summed over `copies` interpolation steps alphas (EAP-IG) when given."""
    tokens = pair_setup.corrupt.tokens
    n = len(tokens)
    leaves = {}

    def delta_of(r, x, current):
        leaves[r] = torch.zeros_like(x, requires_grad=True)
        return leaves[r]

    hooks = []
    if alphas is not None:
        clean_e, corrupt_e = pair_setup.clean_acts["hook_embed"], pair_setup.corrupt_acts["hook_embed"]
        weights = alphas.repeat_interleave(n)[:, None, None]  # [copies N, 1, 1]
        path = corrupt_e.repeat(copies, 1, 1) + weights * (clean_e - corrupt_e).repeat(copies, 1, 1)
        hooks = [("hook_embed", lambda x, hook: path)]
    with torch.enable_grad():
        logits, _ = edge_pass(model, pair_setup.graph, tokens.repeat(copies, 1), pair_setup.at.repeat(copies),
                              delta_of, hooks)
        value = pair_setup.metric(logits, torch.arange(n).repeat(copies)).sum()
        order = sorted(leaves)
        grads = torch.autograd.grad(value, [leaves[r] for r in order], allow_unused=True)
    out = {r: torch.zeros_like(leaves[r]) if g is None else g for r, g in zip(order, grads)}
    return {r: g.view(copies, n, *g.shape[1:]).sum(0) for r, g in out.items()}


def reference_scores(pair_setup, grads) -> torch.Tensor:
    """[E, N]: (clean - corrupt) . g_r summed over positions, edge by edge."""
    graph = pair_setup.graph
    out = torch.zeros(graph.n_edges, len(pair_setup.at), dtype=torch.float64)
    for e, (u, r) in enumerate(graph.edges.tolist()):
        at = pair_setup.at if graph.receivers[r].site == "logits" else None
        sender = graph.senders[u]
        diff = sender_value(sender, pair_setup.clean_acts, at) - sender_value(sender, pair_setup.corrupt_acts, at)
        out[e] = (diff * grads[r]).sum((1, 2))
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_fast_receiver_gradients_equal_the_copies(family, pair):
    model, graph = tiny(family, seed=11)
    scored = setup(model, *pair, metric="kl", graph=graph)
    mixer_receivers = {r for r, receiver in enumerate(graph.receivers) if receiver.site == "mixer"}
    assert set(fast_receivers(model, graph)) == (mixer_receivers if FAMILIES[family][2] else set())
    run = LeafPass(model, scored.graph, scored.corrupt.tokens, scored.at, capture=False)
    n = len(scored.at)
    grads = run.gradients(scored.metric(run.logits, torch.arange(n)).sum())
    reference = reference_grads(model, scored)
    for r in range(len(scored.graph.receivers)):
        torch.testing.assert_close(grads.of([r])[0], reference[r], atol=1e-10, rtol=0,
                                   msg=scored.graph.receivers[r].name)
    assert max(g.abs().max().item() for g in reference.values()) > 1e-5  # not trivially zero


@pytest.mark.parametrize("family", list(FAMILIES))
def test_eap_and_eap_ig_scores_equal_the_reference(family, pair):
    model, graph = tiny(family, seed=12)
    ours = eap(model, *pair, metric="logit_diff", graph=graph, per_position=True)
    scored = ours.setup
    reference = reference_scores(scored, reference_grads(model, scored))
    torch.testing.assert_close(ours.per_example, reference, atol=1e-10, rtol=0)
    torch.testing.assert_close(ours.per_position.sum(2), reference, atol=1e-10, rtol=0)
    assert reference.abs().max() > 1e-3
    steps = 3
    ig = eap_ig(model, *pair, steps=steps, metric="logit_diff", graph=graph, rows=2 * len(scored.at),
                progress=False)  # 2 passes
    alphas = (torch.arange(steps, dtype=torch.float64) + 0.5) / steps
    reference = reference_scores(scored, reference_grads(model, scored, steps, alphas)) / steps
    torch.testing.assert_close(ig.per_example, reference, atol=1e-10, rtol=0)


def test_positional_eap_folds_the_fast_per_position_scores(pair):
    from interp.analysis.circuits.positional import fold

    model, graph = tiny("hybrid", seed=13)
    positional = positional_graph(graph, ["query"])
    ours = eap(model, *pair, graph=positional)
    scored = setup(model, *pair, graph=graph)
    reference = reference_grads(model, scored)
    per_position = torch.stack([reference_positions(scored, reference, e) for e in range(graph.n_edges)])
    base = eap(model, *pair, graph=graph, per_position=True)
    torch.testing.assert_close(base.per_position, per_position, atol=1e-10, rtol=0)
    torch.testing.assert_close(ours.per_example, fold(base, positional, False).per_example, atol=1e-12, rtol=0)


def reference_positions(pair_setup, grads, edge: int) -> torch.Tensor:
    """[N, T]: edge's terms per position (the logits' at the answer position)."""
    graph = pair_setup.graph
    u, r = graph.edges[edge].tolist()
    sender = graph.senders[u]
    n, length = pair_setup.clean.tokens.shape
    out = torch.zeros(n, length, dtype=torch.float64)
    if graph.receivers[r].site == "logits":
        at = pair_setup.at
        diff = sender_value(sender, pair_setup.clean_acts, at) - sender_value(sender, pair_setup.corrupt_acts, at)
        out[torch.arange(n), at] = (diff * grads[r]).sum((1, 2))
        return out
    diff = sender_value(sender, pair_setup.clean_acts) - sender_value(sender, pair_setup.corrupt_acts)
    return (diff * grads[r]).sum(2)
