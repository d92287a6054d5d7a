"""Circuits (interp.analysis.circuits) on tiny float64 models of every family: the full graph gives
the clean run and the empty graph the corrupted one; a single patched edge equals a manual
two-pass computation written here with plain hooks; EAP equals the derivative of the edge-patched
metric (central differences); EAP-IG is complete (its embedding scores sum to the effect)."""

import sys
from pathlib import Path

import pytest
import torch

import models
from interp.analysis.circuits import build_graph, eap, eap_ig, edge_effects, patched_metric, setup
from interp.analysis.circuits.edge_patching import _run

sys.path.insert(0, str(Path(__file__).parent))
from test_interventions import TASK, VOCAB, ar_batch, corrupt_ar  # noqa: E402

FAMILIES = {
    "attention": dict(mixer="attention"),
    "attention_gqa_gated": dict(mixer="attention", n_kv_heads=2, positional="rope", norm="rmsnorm",
                                mixer_options={"output_gate": True, "qk_norm": True}),
    "mamba": dict(mixer="mamba"),
    "mamba2": dict(mixer="mamba2", mlp=True),
    "deltanet": dict(mixer="deltanet"),
    "gated_deltanet": dict(mixer="gated_deltanet"),
    "lstm": dict(mixer="lstm", residual=True, norm="layernorm"),
    "hybrid": dict(mixer=["attention", "mamba2"]),
    "zamba2": dict(mixer="mamba2", shared_block=[0, 0], shared_adapter_rank=2, mlp=True, d_state=4, n_heads=4,
                   mlp_activation="geglu", norm="rmsnorm",
                   mixer_options={"mamba2": {"n_heads": 2}}),
}


def tiny(family: str, seed: int = 0):
    torch.manual_seed(seed)
    options = dict(FAMILIES[family])
    mixer = options.pop("mixer")
    name = mixer if isinstance(mixer, str) else mixer[0]
    kwargs = {} if isinstance(mixer, str) else {"mixer": mixer}
    return models.build(name, vocab_size=VOCAB, d_model=16, n_layers=2, **kwargs, **options).double().eval()


@pytest.fixture(scope="module")
def pair():
    clean = ar_batch(4, 3, seed=0)
    return clean, corrupt_ar(clean, TASK, seed=1)


def test_graph_of_attention_counts_every_edge():
    model = tiny("attention")
    graph = build_graph(model)
    layers, heads = model.cfg.n_layers, model.cfg.n_heads
    assert len(graph.senders) == 1 + layers * (heads + 1)  # embed, heads, MLPs
    assert len(graph.receivers) == layers * (3 * heads + 1) + 1  # q / k / v per head, MLP inputs, logits
    # block l's heads read embed and every sender of earlier blocks; its MLP also its own heads
    into_heads = sum(3 * heads * (1 + l * (heads + 1)) for l in range(layers))
    into_mlps = sum(1 + l * (heads + 1) + heads for l in range(layers))
    assert graph.n_edges == into_heads + into_mlps + len(graph.senders)
    assert "a0.h1->a1.h2.k" in graph.edge_names() and "mlp1->logits" in graph.edge_names()
    assert "a1.h0->a0.h0.q" not in graph.edge_names()


def test_graph_of_recurrent_mixers_has_state_nodes():
    names = [r.name for r in build_graph(tiny("mamba2")).receivers]
    assert {"s0.h0.write", "s0.g0.B", "s0.g0.read", "s0.rest"} <= set(names)
    names = [r.name for r in build_graph(tiny("gated_deltanet")).receivers]
    assert {"s1.h3.write", "s1.h3.read", "s1.rest"} <= set(names)
    assert [s.name for s in build_graph(tiny("lstm")).senders] == ["embed", "m0", "m1"]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_full_graph_is_clean_and_empty_graph_is_corrupt(family, pair):
    check_ends(tiny(family), pair)


def check_ends(model, pair):
    """Assert the full graph gives the clean metric, the empty one the corrupted; -> (the Setup,
    the masks [2, E] of the full and empty graphs' patched edges)."""
    scored = setup(model, *pair, metric="logit_diff")
    n = scored.graph.n_edges
    masks = torch.stack([torch.zeros(n, dtype=torch.bool), torch.ones(n, dtype=torch.bool)])
    full, empty = patched_metric(model, scored, masks)
    assert torch.allclose(full, scored.clean_metric, atol=1e-12, rtol=0)
    assert torch.allclose(empty, scored.corrupt_metric, atol=1e-10, rtol=0)
    assert (scored.clean_metric - scored.corrupt_metric).abs().max() > 1e-3  # the pair differs
    return scored, masks


def _patch_derivative(model, scored, tokens, edge: int, eps: float = 1e-5) -> torch.Tensor:
    """d metric / d t [N] (central differences) of the corrupted run with edge carrying
    corrupt + t (clean - corrupt) of its sender, at t = 0: what EAP estimates."""
    mask = torch.zeros(1, scored.graph.n_edges, dtype=torch.bool)
    mask[0, edge] = True
    ends = [_run(model, scored, tokens, {h: scored.corrupt_acts[h] + s * eps * (scored.clean_acts[h]
                                          - scored.corrupt_acts[h]) for h in scored.clean_acts}, mask) for s in (1, -1)]
    return (ends[0] - ends[1])[0] / (2 * eps)


def _group_term(model, tokens, sender) -> torch.Tensor:
    """W_out[:, group g] v_g [N, T, D] of a Mamba channel-group sender, from out_proj's input v."""
    linear, seen = model.get_submodule(sender.hook), []
    handle = linear.register_forward_hook(lambda module, args, out: seen.append(args[0]))
    try:
        model(tokens)
    finally:
        handle.remove()
    width = linear.in_features // sender.split
    columns = slice(sender.head * width, (sender.head + 1) * width)
    return seen[0][..., columns] @ linear.weight[:, columns].T


def _manual_single_edge(model, graph, edge: int, clean, corrupt, metric_of, mask=None, joined=None,
                        at=None) -> torch.Tensor:
    """The corrupted run with edge u -> r carrying u's clean output, with plain hooks: cache both
    runs, recompute r's node from its corrupted stream + (clean - corrupt) of u, patch it in.
    mask [N, T]: at those positions only (a positional edge). joined [N, T]: the clean position
    whose value each corrupted position takes (default the same); at [N]: the corrupted answers."""
    u, r = graph.edges[edge].tolist()
    sender, receiver = graph.senders[u], graph.receivers[r]
    names = sorted({sender.hook, "hook_embed"} | {f"blocks.{l}.hook_resid_pre" for l in range(graph.n_layers)}
                   | {f"blocks.{l}.shared.hook_out" for l in range(graph.n_layers)}
                   | {f"blocks.{l}.hook_resid_mid" for l in range(graph.n_layers)}
                   | {f"blocks.{graph.n_layers - 1}.hook_resid_post"})
    names = [n for n in names if n in model.hook_dict]
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(clean.tokens, names=names)
        _, corrupt_cache = model.run_with_cache(corrupt.tokens, names=names)
        if sender.split:  # a Mamba channel group: its term of out_proj in both runs
            diff = _group_term(model, clean.tokens, sender) - _group_term(model, corrupt.tokens, sender)
        else:
            source = clean_cache[sender.hook]
            if joined is not None:  # the clean values at the positions joined to the corrupted ones
                source = source[torch.arange(len(source))[:, None], joined]
            diff = source - corrupt_cache[sender.hook]
            diff = diff if sender.head is None else diff[:, :, sender.head]  # [N, T, D]
        diff = diff if sender.channels is None else diff[:, :, sender.channels[0]:sender.channels[1]]  # a conv node
        diff = diff if mask is None else diff * mask[..., None]
        block = model.blocks[receiver.layer] if receiver.site != "logits" else None
        if receiver.site == "logits":
            final = model.norm_final(corrupt_cache[f"blocks.{graph.n_layers - 1}.hook_resid_post"] + diff)
            hooks = [("hook_final", lambda x, hook: final)]
        elif receiver.site == "mlp":
            out = block.mlp(block.norm_mlp(corrupt_cache[f"blocks.{receiver.layer}.hook_resid_mid"] + diff))
            hooks = [(f"blocks.{receiver.layer}.mlp.hook_out", lambda x, hook: out)]
        elif receiver.site == "conv":  # reads a conv node's channels of hook_conv: add the difference there
            (hook, axis, indices), = receiver.slots
            hooks = [(hook, lambda x, hook: x.index_add(axis, torch.tensor(indices), diff))]
        elif receiver.site.startswith("shared"):  # Zamba2's shared branch reads x and the embedding
            x, e = corrupt_cache[f"blocks.{receiver.layer}.hook_resid_pre"], corrupt_cache["hook_embed"]
            out = block.shared(x + diff, e) if receiver.site == "shared" else block.shared(x, e + diff)
            hooks = [(f"blocks.{receiver.layer}.shared.hook_out", lambda x, hook: out)]
        else:
            stream = corrupt_cache[f"blocks.{receiver.layer}.hook_resid_pre"]
            if hasattr(block, "shared"):  # the mixer reads norm(x + shared(x, e))
                stream = stream + corrupt_cache[f"blocks.{receiver.layer}.shared.hook_out"]
            normed = block.norm_mixer(stream + diff)
            if not receiver.slots:  # a whole input, or the rest: the slots' hooks at their corrupted values
                slot_hooks = sorted({h for i in graph.mixer_receivers(receiver.layer, receiver.module)
                                     for h, _, _ in graph.receivers[i].slots})
                _, slot_cache = model.run_with_cache(corrupt.tokens, names=slot_hooks) if slot_hooks else (None, {})
                with model.hooks([(h, lambda x, hook: slot_cache[hook.name]) for h in slot_hooks]):
                    out = getattr(block, receiver.module)(normed)
                hooks = [(f"blocks.{receiver.layer}.{receiver.module}.hook_out", lambda x, hook: out)]
            else:
                seen = {}
                with model.hooks(readers=[(h, lambda x, hook: seen.__setitem__(hook.name, x.clone()))
                                          for h, _, _ in receiver.slots]):
                    getattr(block, receiver.module)(normed)
                hooks = [(h, _replace(seen[h], axis, idx)) for h, axis, idx in receiver.slots]
        logits = model.run_with_hooks(corrupt.tokens, fwd_hooks=hooks)
    at = torch.full((len(clean),), clean.tokens.shape[1] - 1) if at is None else at
    return metric_of(logits[torch.arange(len(clean)), at], torch.arange(len(clean)))


def _replace(value, axis, indices):
    def patch(x, hook):
        out = x.clone()
        index = torch.tensor(indices)
        return out.index_copy_(axis, index, value.index_select(axis, index))

    return patch


@pytest.mark.parametrize("family", ["attention", "attention_gqa_gated", "mamba", "mamba2", "deltanet",
                                    "gated_deltanet", "lstm", "zamba2"])
def test_single_edge_patch_equals_manual_two_pass(family, pair):
    model = tiny(family, seed=1)
    scored = setup(model, *pair, metric="logit_diff")
    graph = scored.graph
    kinds = {}
    for e, (u, r) in enumerate(graph.edges.tolist()):  # one edge into each kind of receiver, not from embed
        receiver = graph.receivers[r]
        kind = receiver.name.split(".")[-1] if receiver.slots else receiver.site + receiver.name[-3:]
        if graph.senders[u].name != "embed" or kind not in kinds:
            kinds[kind] = e
    edges = sorted(kinds.values())
    effects = edge_effects(model, scored, edges)  # [k, N]
    for row, e in enumerate(edges):
        manual = _manual_single_edge(model, graph, e, *pair, scored.metric)
        assert torch.allclose(effects[row] + scored.corrupt_metric, manual, atol=1e-10, rtol=0), \
            graph.edge_names()[e]
    assert effects.abs().max() > 1e-6


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("metric", ["logit_diff", "prob", "kl"])
def test_eap_is_the_derivative_of_the_edge_patched_metric(family, metric, pair):
    model = tiny(family, seed=2)
    scores = eap(model, *pair, metric=metric)
    scored = scores.setup
    top = scores.scores.abs().argsort(descending=True)[:3].tolist()
    for e in top:
        derivative = _patch_derivative(model, scored, pair[1].tokens, e)
        assert torch.allclose(scores.per_example[e], derivative, atol=1e-7, rtol=1e-5), scored.graph.edge_names()[e]


def test_eap_per_position_sums_to_the_scores(pair):
    scores = eap(tiny("hybrid"), *pair, per_position=True)
    assert torch.allclose(scores.per_position.sum(2), scores.per_example, atol=1e-12)
    into_logits = scores.graph.edges[:, 1] == len(scores.graph.receivers) - 1
    assert (scores.per_position[into_logits][:, :, :-1] == 0).all()  # the answer (last) position only


@pytest.mark.parametrize("family", ["attention", "mamba2", "gated_deltanet"])
def test_eap_ig_is_complete_over_the_embedding(family, pair):
    model = tiny(family, seed=3)
    scores = eap_ig(model, *pair, steps=48, rows=4 * 16, progress=False)
    graph = scores.graph
    from_embed = graph.edges[:, 0] == 0
    total = scores.per_example[from_embed].sum(0)  # [N]
    effect = scores.setup.clean_metric - scores.setup.corrupt_metric
    assert torch.allclose(total, effect, atol=2e-3 * effect.abs().max().item(), rtol=0)
    one_step = eap_ig(model, *pair, steps=1, progress=False)
    plain = eap(model, *pair)
    assert not torch.allclose(one_step.scores, plain.scores)  # the midpoint, not the corrupted end


def test_bad_arguments_raise(pair):
    model = tiny("attention")
    with pytest.raises(ValueError, match="metric"):
        eap(model, *pair, metric="accuracy")
    with pytest.raises(ValueError, match="steps"):
        eap_ig(model, *pair, steps=0)
    scored = setup(model, *pair)
    with pytest.raises(ValueError, match="masks"):
        patched_metric(model, scored, torch.zeros(1, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="source"):
        patched_metric(model, scored, torch.zeros(1, scored.graph.n_edges, dtype=torch.bool), source="zero")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_pruning_keeps_faithfulness_and_the_ends_are_one_and_zero(family, pair):
    from interp.analysis.circuits import faithfulness, prune_edges

    model = tiny(family, seed=4)
    scored = setup(model, *pair)
    n = scored.graph.n_edges
    generator = torch.Generator().manual_seed(0)
    raw = torch.rand(6, n, generator=generator) < torch.tensor([0.1, 0.2, 0.3, 0.5, 0.7, 0.9])[:, None]
    pruned = torch.stack([prune_edges(scored.graph, m) for m in raw])
    assert (pruned <= raw).all() and (pruned.sum(1) < raw.sum(1)).any()
    ends = torch.stack([torch.ones(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool)])
    values = faithfulness(model, scored, torch.cat([raw, pruned, ends]))
    assert torch.allclose(values[:6], values[6:12], atol=1e-9, rtol=0)
    assert torch.allclose(values[12:], torch.tensor([1.0, 0.0], dtype=torch.float64), atol=1e-9, rtol=0)


def test_extract_rescore_and_curve(pair):
    from interp.analysis.circuits import extract, faithfulness_curve, rescore

    model = tiny("hybrid", seed=5)
    scores = eap(model, *pair)
    circuit = extract(scores, n=10, prune=False)
    assert circuit.n_edges == 10 and set(circuit.edge_names()) == {name for name, _ in scores.top(10)}
    assert extract(scores, threshold=float("inf")).n_edges == 0
    exact = rescore(model, scores, k=5)
    top = scores.scores.abs().argsort(descending=True)[:5]
    assert torch.allclose(exact.per_example[top], edge_effects(model, scores.setup, top), atol=1e-12)
    rest = torch.ones(scores.graph.n_edges, dtype=torch.bool)
    rest[top] = False
    assert torch.equal(exact.per_example[rest], scores.per_example[rest])
    curve = faithfulness_curve(model, {"eap": scores, "exact": exact}, fractions=(0.0, 0.3, 1.0))
    assert [(row["method"], row["fraction"]) for row in curve] == [(m, f) for m in ("eap", "exact") for f in (0, 0.3, 1)]
    assert [row["faithfulness"] for row in curve if row["fraction"] in (0.0, 1.0)] == pytest.approx([0, 1, 0, 1], abs=1e-9)
    with pytest.raises(ValueError, match="exactly one"):
        extract(scores, n=3, fraction=0.1)
    with pytest.raises(ValueError, match="n must"):
        extract(scores, n=-1)


def test_block_layouts_mlp_only_and_parallel_mixers(pair):
    torch.manual_seed(6)
    model = models.build("attention", mixer=["deltanet", None, "attention"], mixer2=[None, None, "mamba2"],
                         mlp=[False, True, True], vocab_size=VOCAB, d_model=16, n_layers=3).double()
    graph = build_graph(model)
    names = [s.name for s in graph.senders]
    assert "mlp1" in names and "a2.h0" in names and "s2b.h0" in names and not any(n.startswith(("a1", "s1")) for n in names)
    assert "s2b.h1.write" in [r.name for r in graph.receivers]
    scored = setup(model, *pair)
    n = graph.n_edges
    ends = patched_metric(model, scored, torch.stack([torch.zeros(n, dtype=torch.bool), torch.ones(n, dtype=torch.bool)]))
    assert torch.allclose(ends[0], scored.clean_metric, atol=1e-12, rtol=0)
    assert torch.allclose(ends[1], scored.corrupt_metric, atol=1e-10, rtol=0)
    edges = [graph.edge_index("mlp1->s2b.h1.write"),
             graph.edge_index("mlp1->a2.h0.q"), graph.edge_index("s0.h0->mlp1.in")]
    effects = edge_effects(model, scored, edges)
    for row, e in enumerate(edges):
        manual = _manual_single_edge(model, graph, e, *pair, scored.metric)
        assert torch.allclose(effects[row] + scored.corrupt_metric, manual, atol=1e-10, rtol=0), graph.edge_names()[e]


def test_mean_baseline_of_identical_examples_is_the_clean_run(pair):
    from interp.analysis.circuits import faithfulness

    clean, corrupt = pair
    same = clean.select(torch.zeros(len(clean), dtype=torch.long))  # N copies of example 0
    model = tiny("hybrid", seed=7)
    scored = setup(model, same, corrupt.select(torch.zeros(len(clean), dtype=torch.long)))
    n = scored.graph.n_edges
    values = patched_metric(model, scored, torch.ones(1, n, dtype=torch.bool), source="mean")
    assert torch.allclose(values[0], scored.clean_metric, atol=1e-10, rtol=0)  # the mean of copies is the copy
    assert torch.allclose(faithfulness(model, scored, torch.zeros(1, n, dtype=torch.bool), baseline="mean"),
                          torch.ones(1, dtype=torch.float64), atol=1e-9)


def test_graph_of_zamba2_shared_blocks():
    graph = build_graph(tiny("zamba2"))
    names = graph.edge_names()
    assert {"z0", "z1"} <= {s.name for s in graph.senders}
    assert "embed->z1.e" in names and "mlp0->z1.in" in names and "z0->s0.h1.write" in names and "z0->s0.rest" in names
    assert not {"mlp0->z1.e", "z0->mlp0.in", "z0->s1.h0.write", "z0->logits", "z0->z1.in"} & set(names)
    assert [e for e in names if e.endswith("->z1.e")] == ["embed->z1.e"]


CONV_FAMILIES = ["mamba2", "deltanet", "gated_deltanet", "gdn_gva"]


def _conv_model(family: str, seed: int):
    if family != "gdn_gva":
        return tiny(family, seed)
    torch.manual_seed(seed)
    return models.build("gated_deltanet", vocab_size=VOCAB, d_model=16, n_layers=2,
                        mixer_options={"num_heads": 2, "num_v_heads": 4}).double().eval()


def test_conv_nodes_graph():
    graph = build_graph(tiny("mamba2"), conv=True)
    names = graph.edge_names()
    assert {"c0.h1.x", "c1.g0.B", "c1.g0.C"} <= {s.name for s in graph.senders}
    assert "embed->c1.h0.x.in" in names and "c1.h0.x->s1.h0.x" in names and "c1.g0.C->s1.g0.read" in names
    assert [n for n in names if n.startswith("c1.h0.x->")] == ["c1.h0.x->s1.h0.x"]  # one reader each
    assert [r.slots for r in graph.receivers if r.name == "s1.h0.write"][0] == (("blocks.1.mixer.hook_dt", 2, (0,)),)
    model = _conv_model("gdn_gva", 0)
    d_k = model.blocks[1].mixer.d_k
    reader = next(r for r in build_graph(model, conv=True).receivers if r.name == "s1.k1.read")
    assert reader.feeds == ("s1.h2", "s1.h3") and reader.slots[0][2] == tuple(range(d_k, 2 * d_k))  # key head 1's q


@pytest.mark.parametrize("family", CONV_FAMILIES)
def test_conv_nodes_are_exact(family, pair):
    """Full = clean, empty = corrupt; one edge into each kind of receiver (conv inputs, the
    readers of conv nodes, the rest) = the manual two-pass; EAP = the derivative of the patch."""
    model = _conv_model(family, seed=8)
    scores = eap(model, *pair, graph=build_graph(model, conv=True))
    scored, graph = scores.setup, scores.graph
    n = graph.n_edges
    ends = patched_metric(model, scored, torch.stack([torch.zeros(n, dtype=torch.bool), torch.ones(n, dtype=torch.bool)]))
    assert torch.allclose(ends[0], scored.clean_metric, atol=1e-12, rtol=0)
    assert torch.allclose(ends[1], scored.corrupt_metric, atol=1e-10, rtol=0)
    kinds = {}
    for e, (u, r) in enumerate(graph.edges.tolist()):
        receiver = graph.receivers[r]
        kind = receiver.site + "." + receiver.name.split(".")[-1]
        if graph.senders[u].name != "embed" or kind not in kinds:
            kinds[kind] = e
    edges = sorted(kinds.values())
    assert any(graph.receivers[graph.edges[e, 1]].site == "conv" for e in edges)
    effects = edge_effects(model, scored, edges)
    for row, e in enumerate(edges):
        manual = _manual_single_edge(model, graph, e, *pair, scored.metric)
        assert torch.allclose(effects[row] + scored.corrupt_metric, manual, atol=1e-10, rtol=0), graph.edge_names()[e]
    conv_edges = [e for e in range(n) if graph.senders[graph.edges[e, 0]].kind == "conv"]
    for e in sorted(conv_edges, key=lambda e: -scores.scores[e].abs())[:2] + scores.scores.abs().argsort()[-2:].tolist():
        derivative = _patch_derivative(model, scored, pair[1].tokens, e)
        assert torch.allclose(scores.per_example[e], derivative, atol=1e-7, rtol=1e-5), graph.edge_names()[e]


@pytest.mark.parametrize("family", ["mamba", "hybrid_mamba"])
def test_mamba_channel_groups_are_exact(family, pair):
    if family == "mamba":
        model = tiny("mamba", seed=11)
    else:
        torch.manual_seed(11)
        model = models.build("attention", mixer=["mamba", "attention"], vocab_size=VOCAB, d_model=16,
                             n_layers=2).double().eval()
    graph = build_graph(model, channel_groups=4)
    assert [s.name for s in graph.senders if s.layer == 0 and s.kind == "state"] == [f"s0.g{g}" for g in range(4)]
    scores = eap(model, *pair, graph=graph)
    scored = scores.setup
    terms = scored.clean_acts["blocks.0.mixer.out_proj"]  # [N, T, G, D]
    _, cache = model.run_with_cache(pair[0].tokens, names=["blocks.0.mixer.hook_out"])
    assert torch.allclose(terms.sum(2), cache["blocks.0.mixer.hook_out"], atol=1e-12)  # the groups sum to the output
    n = graph.n_edges
    ends = patched_metric(model, scored, torch.stack([torch.zeros(n, dtype=torch.bool), torch.ones(n, dtype=torch.bool)]))
    assert torch.allclose(ends[0], scored.clean_metric, atol=1e-12, rtol=0)
    assert torch.allclose(ends[1], scored.corrupt_metric, atol=1e-10, rtol=0)
    edges = [e for e, name in enumerate(graph.edge_names()) if name.startswith("s0.g")]
    effects = edge_effects(model, scored, edges)
    for row, e in enumerate(edges):
        manual = _manual_single_edge(model, graph, e, *pair, scored.metric)
        assert torch.allclose(effects[row] + scored.corrupt_metric, manual, atol=1e-10, rtol=0), graph.edge_names()[e]
        assert torch.allclose(scores.per_example[e], _patch_derivative(model, scored, pair[1].tokens, e),
                              atol=1e-7, rtol=1e-5), graph.edge_names()[e]
    assert effects.abs().max() > 1e-6
    with pytest.raises(ValueError, match="divide"):
        build_graph(model, channel_groups=5)
    with pytest.raises(ValueError, match="channel_groups"):
        build_graph(tiny("attention"), channel_groups=2)
