"""Positional circuits (interp.analysis.circuits.positional) on tiny float64 models: nodes per
(component, position group); the full positional graph gives the clean run and the empty one the
corrupted run; a single positional edge equals a manual two-pass computation with the sender's
difference at the group's positions only; EAP on the positional graph equals the derivative of
the positional edge patch and sums over the groups to the plain EAP."""

import sys
from pathlib import Path

import pytest
import torch

from interp.analysis.circuits import build_graph, eap, edge_effects, extract, faithfulness, patched_metric, setup
from interp.analysis.circuits.graph import positional_graph
from interp.analysis.circuits.positional import position_masks

sys.path.insert(0, str(Path(__file__).parent))
from test_circuits import _manual_single_edge, _patch_derivative, pair, tiny  # noqa: E402, F401 (pair: the module's fixture)

ROLES = ["key", "value", "query"]


def test_positional_graph_splits_every_node_and_edge_by_group():
    model = tiny("attention")
    base = build_graph(model)
    graph = positional_graph(base, ROLES)
    groups = len(ROLES) + 1
    assert graph.positions == ("key", "value", "query", "other") and graph.base is base
    assert (len(graph.senders), len(graph.receivers), graph.n_edges) == (
        groups * len(base.senders), groups * len(base.receivers), groups * base.n_edges)
    names = graph.edge_names()
    assert "a0.h1@value->a1.h2.k@value" in names and "a0.h1@value->a1.h2.k@query" not in names  # equal positions
    e = base.edge_index("a0.h1->a1.h2.k")
    assert names[e * groups + 1] == "a0.h1@value->a1.h2.k@value"
    q = next(r for r in graph.receivers if r.name == "a1.h2.q@query")
    assert set(q.feeds) == {f"a1.h2@{g}" for g in graph.positions}  # attention mixes positions
    mlp = next(r for r in graph.receivers if r.name == "mlp0.in@key")
    assert mlp.feeds == ("mlp0@key",)  # an MLP does not


def test_position_masks_partition_the_positions(pair):
    clean, _ = pair
    masks = position_masks(clean, ("query", "key", "-1", "other"))
    n, length = clean.tokens.shape
    assert masks.shape == (4, n, length) and torch.equal(masks.sum(0), torch.ones(n, length, dtype=torch.long))
    rows = torch.arange(n)
    assert masks[0, rows, clean.roles["query"]].all() and masks[1, rows, clean.roles["key"]].all()
    assert not masks[2, :, length - 1].any()  # the query is the last position here: claimed first
    with pytest.raises(ValueError, match="positions"):
        build_graph(tiny("attention"), positions=["key", "key"])
    with pytest.raises(ValueError, match="role"):
        setup(tiny("attention"), *pair, graph=build_graph(tiny("attention"), positions=["nowhere"]))



def test_position_masks_of_multi_query_roles():
    from interp.tasks import make_task

    batch = make_task("MQAR", n_keys=8, n_values=8, n_queries=2).sample(3, 4, seed=0)  # roles [N, 2]
    masks = position_masks(batch, ("query", "key", "other"))
    assert masks[0].sum(1).tolist() == [2, 2, 2] and masks[1].sum(1).tolist() == [2, 2, 2]
    for column in range(2):
        assert masks[0, torch.arange(3), batch.roles["query"][:, column]].all()
        assert masks[1, torch.arange(3), batch.roles["key"][:, column]].all()
    assert torch.equal(masks.sum(0), torch.ones_like(masks[0], dtype=torch.long))


@pytest.mark.parametrize("family", ["attention", "mamba", "mamba2", "gated_deltanet", "hybrid", "zamba2"])
def test_full_positional_graph_is_clean_and_empty_is_corrupt(family, pair):
    model = tiny(family)
    scored = setup(model, *pair, graph=build_graph(model, positions=ROLES))
    n = scored.graph.n_edges
    full, empty = patched_metric(model, scored, torch.stack([torch.zeros(n, dtype=torch.bool),
                                                              torch.ones(n, dtype=torch.bool)]))
    assert torch.allclose(full, scored.clean_metric, atol=1e-12, rtol=0)
    assert torch.allclose(empty, scored.corrupt_metric, atol=1e-10, rtol=0)
    one_group = torch.zeros(n, dtype=torch.bool)
    one_group[1::4] = True  # every edge at the value position only: neither end
    middle = patched_metric(model, scored, one_group[None])[0]
    assert (middle - scored.clean_metric).abs().max() > 1e-6 and (middle - scored.corrupt_metric).abs().max() > 1e-6


@pytest.mark.parametrize("family", ["attention_gqa_gated", "mamba", "mamba2", "gated_deltanet", "zamba2"])
def test_single_positional_edge_equals_manual_two_pass(family, pair):
    model = tiny(family, seed=1)
    scored = setup(model, *pair, graph=build_graph(model, positions=ROLES))
    graph, base = scored.graph, scored.graph.base
    groups = len(graph.positions)
    kinds = {}
    for e, (u, r) in enumerate(base.edges.tolist()):  # one edge into each kind of receiver, not from embed
        receiver = base.receivers[r]
        kind = receiver.name.split(".")[-1] if receiver.slots else receiver.site + receiver.name[-3:]
        if base.senders[u].name != "embed" or kind not in kinds:
            kinds[kind] = e
    for group in range(groups):
        edges = [e * groups + group for e in sorted(kinds.values())]
        effects = edge_effects(model, scored, edges)  # [k, N]
        for row, e in enumerate(edges):
            manual = _manual_single_edge(model, base, e // groups, *pair, scored.metric,
                                         mask=scored.positions[group].double())
            assert torch.allclose(effects[row] + scored.corrupt_metric, manual, atol=1e-10, rtol=0), \
                graph.edge_names()[e]
        assert effects.abs().max() > 1e-8, graph.positions[group]


@pytest.mark.parametrize("family", ["attention", "mamba", "mamba2", "hybrid"])
def test_positional_eap_is_the_derivative_of_the_positional_edge_patch(family, pair):
    model = tiny(family, seed=2)
    graph = build_graph(model, positions=ROLES)
    scores = eap(model, *pair, graph=graph)
    scored = scores.setup
    top = scores.scores.abs().argsort(descending=True)[:4].tolist()
    for e in top:
        derivative = _patch_derivative(model, scored, pair[1].tokens, e)
        assert torch.allclose(scores.per_example[e], derivative, atol=1e-7, rtol=1e-5), graph.edge_names()[e]
    plain = eap(model, *pair, graph=graph.base)
    summed = scores.per_example.view(graph.base.n_edges, len(graph.positions), -1).sum(1)
    assert torch.allclose(summed, plain.per_example, atol=1e-12, rtol=0)  # the groups partition the positions


@pytest.mark.parametrize("conv", [False, True])
def test_positional_circuit_pruning_keeps_faithfulness(conv, pair):
    from interp.analysis.circuits import prune_edges

    model = tiny("hybrid", seed=4)
    scored = setup(model, *pair, graph=build_graph(model, positions=ROLES, conv=conv))
    n = scored.graph.n_edges
    generator = torch.Generator().manual_seed(0)
    raw = torch.rand(4, n, generator=generator) < torch.tensor([0.1, 0.3, 0.6, 0.9])[:, None]
    pruned = torch.stack([prune_edges(scored.graph, m) for m in raw])
    assert (pruned <= raw).all() and (pruned.sum(1) < raw.sum(1)).any()
    values = faithfulness(model, scored, torch.cat([raw, pruned]))
    assert torch.allclose(values[:4], values[4:], atol=1e-9, rtol=0)
    circuit = extract(eap(model, *pair, graph=scored.graph), n=20)
    assert all("@" in name for name in circuit.edge_names()) and circuit.n_edges <= 20


@pytest.mark.parametrize("family", ["mamba2", "gated_deltanet"])
def test_positional_conv_nodes_are_exact(family, pair):
    """The conv read at the value position of what the stream held at the key: positional conv
    nodes, exact at both ends, per single edge (manual two-pass) and to first order."""
    model = tiny(family, seed=9)
    graph = build_graph(model, positions=ROLES, conv=True)
    scores = eap(model, *pair, graph=graph)
    scored, base, groups = scores.setup, graph.base, len(graph.positions)
    n = graph.n_edges
    ends = patched_metric(model, scored, torch.stack([torch.zeros(n, dtype=torch.bool), torch.ones(n, dtype=torch.bool)]))
    assert torch.allclose(ends[0], scored.clean_metric, atol=1e-12, rtol=0)
    assert torch.allclose(ends[1], scored.corrupt_metric, atol=1e-10, rtol=0)
    reader = base.edge_index("c1.h0.x->s1.h0.x" if family == "mamba2" else "c1.h0.v->s1.h0.v")
    into_conv = base.edge_index("embed->c1.h0.x.in" if family == "mamba2" else "s0.h0->c1.h0.v.in")
    edges = [e * groups + g for e in (reader, into_conv) for g in range(groups)]
    effects = edge_effects(model, scored, edges)
    for row, e in enumerate(edges):
        manual = _manual_single_edge(model, base, e // groups, *pair, scored.metric,
                                     mask=scored.positions[e % groups].double())
        assert torch.allclose(effects[row] + scored.corrupt_metric, manual, atol=1e-10, rtol=0), graph.edge_names()[e]
    assert effects.abs().max() > 1e-6
    for e in edges:
        derivative = _patch_derivative(model, scored, pair[1].tokens, e)
        assert torch.allclose(scores.per_example[e], derivative, atol=1e-7, rtol=1e-5), graph.edge_names()[e]


def test_positional_conv_report_renders(pair, tmp_path):
    from interp.analysis.circuits import faithfulness_curve
    from interp.report.circuits import circuit_figure, write_circuit_report
    from tests.browser import assert_renders

    model = tiny("hybrid", seed=10)
    scores = eap(model, *pair, graph=build_graph(model, positions=ROLES, conv=True))
    circuit = extract(scores, n=25)
    figure = circuit_figure(circuit)
    assert list(figure.layout.yaxis.ticktext) == ["key", "value", "query", "other"]
    centres = list(figure.layout.yaxis.tickvals)
    half = (centres[0] - centres[1]) / 2
    nodes = [(text.split("<br>")[0], y) for trace in figure.data if trace.mode == "markers+text" and trace.hovertext
             for text, y in zip(trace.hovertext, trace.y) if "scores out" in text]
    assert {name for name, _ in nodes} >= set(circuit.nodes()) and len(nodes) > 3
    for name, y in nodes:  # each node inside its position group's band
        assert abs(y - centres[ROLES.index(name.split("@")[1]) if "@other" not in name else 3]) < half, name
    curve = faithfulness_curve(model, {"eap": scores}, fractions=(0.0, 0.1, 1.0))
    assert_renders(write_circuit_report(tmp_path / "c.html", circuit, curve, "hybrid, positional, conv nodes"))


def test_positional_mamba_channel_groups_ends_and_eap(pair):
    model = tiny("mamba", seed=12)
    graph = build_graph(model, positions=ROLES, channel_groups=2)
    scores = eap(model, *pair, graph=graph)
    scored, n = scores.setup, graph.n_edges
    ends = patched_metric(model, scored, torch.stack([torch.zeros(n, dtype=torch.bool), torch.ones(n, dtype=torch.bool)]))
    assert torch.allclose(ends[0], scored.clean_metric, atol=1e-12, rtol=0)
    assert torch.allclose(ends[1], scored.corrupt_metric, atol=1e-10, rtol=0)
    for e in scores.scores.abs().argsort()[-3:].tolist():
        assert torch.allclose(scores.per_example[e], _patch_derivative(model, scored, pair[1].tokens, e),
                              atol=1e-7, rtol=1e-5), graph.edge_names()[e]
