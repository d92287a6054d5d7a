"""Positional circuits of pairs whose roles sit at different positions in the clean and corrupted
prompts (interp.analysis.circuits.positional's alignment by role), on tiny float64 models: the
corrupted prompt holds the clean one's (key, value) pairs in another order, so that the key and
value roles move, and (`longer`) one token more in front, so that every position and the answer
move. References written here by hand with plain hooks, joining positions as the docs say (a
role's position to its position, the positions left in order): exact edge patching equals the
corrupted run with the receiver's input moved by the sender's clean value at the joined position;
EAP and EAP-IG equal the gradient, taken with plain autograd, times those differences. A pair whose
roles sit at the same positions keeps exactly the scores it had; a circuit over every position
refuses a pair it cannot align in one line."""

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from interp.analysis.circuits import build_graph, eap, eap_ig, edge_effects, patched_metric, setup
from interp.analysis.circuits.edge_patching import _run
from interp.tasks.base import Batch

sys.path.insert(0, str(Path(__file__).parent))
from test_circuits import _manual_single_edge, tiny  # noqa: E402
from test_interventions import TASK, ar_batch, corrupt_ar  # noqa: E402

GROUPS = ["key", "value", "query"]
FAMILIES = ["attention", "mamba2"]


def moved_pair(longer: bool) -> tuple[Batch, Batch]:
    """(clean, corrupt): corrupt_ar's pair with the corrupted prompt's (key, value) pairs rotated by
    one slot (its key and value roles moved with them); longer: the corrupted prompt one token
    longer in front (the clean one padded at its end), so that its answer is one position later."""
    clean = ar_batch(4, 3, seed=0)
    corrupt = corrupt_ar(clean, TASK, seed=1)
    tokens, roles = corrupt.tokens.clone(), {k: v.clone() for k, v in corrupt.roles.items()}
    for j in range(3):  # slot j holds the pair of slot j - 1
        tokens[:, 1 + 2 * j:3 + 2 * j] = corrupt.tokens[:, 1 + 2 * ((j - 1) % 3):3 + 2 * ((j - 1) % 3)]
    for name in ("key", "value"):
        roles[name] = roles[name] + 2 - 6 * (roles[name] >= 5).long()
    corrupt = Batch(tokens, corrupt.targets, corrupt.loss_mask, corrupt.states, roles)
    if longer:
        pad = torch.zeros(len(clean), 1, dtype=torch.long)
        no = torch.zeros(len(clean), 1, dtype=torch.bool)
        clean = Batch(torch.cat([clean.tokens, pad], 1), torch.cat([clean.targets, pad], 1),
                      torch.cat([clean.loss_mask, no], 1), torch.cat([clean.states, pad], 1), clean.roles)
        front = torch.full((len(clean), 1), int(corrupt.tokens[0, 1]))
        corrupt = Batch(torch.cat([front, corrupt.tokens], 1), torch.cat([front, corrupt.targets], 1),
                        torch.cat([no, corrupt.loss_mask], 1), torch.cat([pad, corrupt.states], 1),
                        {k: v + 1 for k, v in corrupt.roles.items()})
    return clean, corrupt


def joined_by_hand(clean: Batch, corrupt: Batch) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(joined [N, T]: the clean position joined to each corrupted one, [G masks [N, T] of the
    groups' corrupted positions]), one example at a time: each role's position to its position,
    the positions left to those left in order (the answer is the query role here)."""
    n, length = corrupt.tokens.shape
    joined = torch.zeros(n, length, dtype=torch.long)
    masks = [torch.zeros(n, length, dtype=torch.bool) for _ in range(len(GROUPS) + 1)]
    for b in range(n):
        for g, name in enumerate(GROUPS):
            joined[b, int(corrupt.roles[name][b])] = int(clean.roles[name][b])
            masks[g][b, int(corrupt.roles[name][b])] = True
        rest = [[t for t in range(length) if t not in {int(batch.roles[r][b]) for r in GROUPS}]
                for batch in (clean, corrupt)]
        for t_clean, t_corrupt in zip(*rest):
            joined[b, t_corrupt] = t_clean
            masks[-1][b, t_corrupt] = True
    return joined, masks


def answers(batch: Batch) -> torch.Tensor:
    return batch.loss_mask.long().argmax(1)


def hand_gradients(model, tokens, at, metric, alphas=None, clean_embed=None):
    """{"mlp{l}" / "logits": d metric / d (the receiver's input) [N, T, D]} of the corrupted run with
    plain autograd (a zero leaf before each MLP's norm and the final norm), averaged over EAP-IG's
    embeddings corrupt + alpha (clean_embed - corrupt) when alphas are given."""
    out = {}
    for alpha in ([None] if alphas is None else alphas):
        leaves, handles = {}, []

        def leaf(name):
            def pre(module, args):
                leaves[name] = torch.zeros_like(args[0], requires_grad=True)
                return (args[0] + leaves[name],) + tuple(args[1:])
            return pre

        for layer, block in enumerate(model.blocks):
            handles.append(block.norm_mlp.register_forward_pre_hook(leaf(f"mlp{layer}")))
        handles.append(model.norm_final.register_forward_pre_hook(leaf("logits")))
        hooks = [] if alpha is None else [("hook_embed", lambda x, hook: x + alpha * (clean_embed - x))]
        try:
            with torch.enable_grad(), model.hooks(hooks):
                logits = model(tokens, at=at)
                value = metric(logits, torch.arange(len(tokens))).sum()
                grads = torch.autograd.grad(value, list(leaves.values()))
        finally:
            for handle in handles:
                handle.remove()
        for name, g in zip(leaves, grads):
            out[name] = g / (1 if alphas is None else len(alphas)) + out.get(name, 0)
    return out


def hand_scores(model, graph, scored, clean, corrupt, joined, masks, alphas=None):
    """{positional edge index: [N]} of every edge into an MLP or the logits, by hand."""
    base, groups = graph.base, len(graph.positions)
    rows = torch.arange(len(clean))[:, None]
    hooks = sorted({s.hook for s in base.senders})
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(clean.tokens, names=hooks)
        _, corrupt_cache = model.run_with_cache(corrupt.tokens, names=hooks)
    clean_embed = clean_cache["hook_embed"][rows, joined]  # at the corrupted positions
    grads = hand_gradients(model, corrupt.tokens, answers(corrupt), scored.metric, alphas, clean_embed)
    out = {}
    for e in range(graph.n_edges):
        u, r = base.edges[e // groups].tolist()
        sender, receiver = base.senders[u], base.receivers[r]
        name = "logits" if receiver.site == "logits" else f"mlp{receiver.layer}" if receiver.site == "mlp" else None
        if name is None:
            continue
        diff = clean_cache[sender.hook][rows, joined] - corrupt_cache[sender.hook]
        diff = diff if sender.head is None else diff[:, :, sender.head]
        grad = grads[name]
        if name == "logits":  # the final norm reads the answer position only: [N, 1, D] there
            at = torch.arange(diff.shape[1]) == answers(corrupt)[:, None]
            grad = torch.zeros_like(diff).masked_scatter(at[..., None].expand_as(diff), grad)
        out[e] = (diff * grad * masks[e % groups][..., None]).sum((1, 2))
    return out


def moved_setup(family: str, longer: bool) -> tuple:
    """(model, clean, corrupt, joined, masks, positional graph, its Setup) of moved_pair."""
    model = tiny(family)
    clean, corrupt = moved_pair(longer)
    graph = build_graph(model, positions=GROUPS)
    return (model, clean, corrupt, *joined_by_hand(clean, corrupt), graph, setup(model, clean, corrupt, graph=graph))


@pytest.mark.parametrize("longer", [False, True])
@pytest.mark.parametrize("family", FAMILIES)
def test_exact_edge_patching_joins_each_role_to_its_position(family, longer):
    model, clean, corrupt, joined, masks, graph, scored = moved_setup(family, longer)
    groups = len(graph.positions)
    picked = list(range(0, graph.n_edges, graph.n_edges // 40))  # every kind of receiver: slots, MLPs, logits
    effects = edge_effects(model, scored, picked)
    assert float((edge_effects(model, scored, picked, chunk=3) - effects).abs().max()) < 1e-12  # as units
    worst = 0.0
    for i, e in enumerate(picked):
        hand = _manual_single_edge(model, graph.base, e // groups, clean, corrupt, scored.metric,
                                   mask=masks[e % groups], joined=joined, at=answers(corrupt))
        worst = max(worst, float((effects[i] + scored.corrupt_metric - hand).abs().max()))
    assert worst < 1e-10, worst
    assert float(effects.abs().max()) > 1e-4  # the edges carry an effect


def joined_derivative(model, scored, corrupt, joined, edge: int, eps: float = 1e-5) -> torch.Tensor:
    """d metric / d s [N] (central differences) of the corrupted run with positional edge `edge`
    carrying corrupt + s (clean at the joined position - corrupt) of its sender, at s = 0."""
    mask = torch.zeros(1, scored.graph.n_edges, dtype=torch.bool)
    mask[0, edge] = True
    rows = torch.arange(len(joined))[:, None]
    ends = [_run(model, scored, corrupt.tokens, {h: v + s * eps * (scored.clean_acts[h][rows, joined] - v)
                                                 for h, v in scored.corrupt_acts.items()}, mask, "corrupt")
            for s in (1, -1)]
    return (ends[0] - ends[1])[0] / (2 * eps)


@pytest.mark.parametrize("longer", [False, True])
@pytest.mark.parametrize("family", FAMILIES)
def test_eap_and_eap_ig_join_each_role_to_its_position(family, longer):
    model, clean, corrupt, joined, masks, graph, scored = moved_setup(family, longer)
    scores = eap(model, clean, corrupt, graph=graph, progress=False)
    hand = hand_scores(model, graph, scored, clean, corrupt, joined, masks)
    edges = sorted(hand)
    got, want = scores.per_example[edges], torch.stack([hand[e] for e in edges])
    assert float((got - want).abs().max()) < 1e-10 and float(want.abs().max()) > 1e-4
    into_mixers = [e for e in scores.scores.abs().argsort(descending=True).tolist() if e not in hand]
    for e in into_mixers[:4]:  # the largest edges into heads / states, by the joined patch's derivative
        derivative = joined_derivative(model, scored, corrupt, joined, e)
        assert torch.allclose(scores.per_example[e], derivative, atol=1e-7, rtol=1e-5), graph.edge_names()[e]
    units = eap(model, clean, corrupt, graph=graph, progress=False, chunk=2)  # units of 2 examples, aligned alike
    assert float((units.per_example - scores.per_example).abs().max()) < 1e-12
    steps = 3
    ig = eap_ig(model, clean, corrupt, steps=steps, graph=graph, progress=False)
    hand = hand_scores(model, graph, scored, clean, corrupt, joined, masks, alphas=[(j + 0.5) / steps
                                                                                  for j in range(steps)])
    assert float((ig.per_example[edges] - torch.stack([hand[e] for e in edges])).abs().max()) < 1e-10
    assert float((ig.per_example[edges] - got).abs().max()) > 1e-6  # the path is not the corrupted point


@pytest.mark.parametrize("family", FAMILIES)
def test_moved_roles_are_not_scored_as_position_t_from_position_t(family):
    """The same corrupted prompt declared with the clean prompt's roles scores otherwise."""
    model = tiny(family)
    clean, corrupt = moved_pair(False)
    graph = build_graph(model, positions=GROUPS)
    moved = eap(model, clean, corrupt, graph=graph, progress=False).per_example
    fixed = eap(model, clean, replace(corrupt, roles=clean.roles), graph=graph, progress=False).per_example
    assert float((moved - fixed).abs().max()) > 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_roles_at_equal_positions_keep_exactly_todays_scores(family):
    """A pair whose corrupted roles equal its clean roles (a copy) is aligned position by position:
    no alignment is kept, and EAP, EAP-IG and edge patching give bit for bit the scores of the pair
    as it was (its positional EAP the plain per-position EAP summed over each group)."""
    model = tiny(family)
    clean = ar_batch(4, 3, seed=0)
    corrupt = corrupt_ar(clean, TASK, seed=1)
    same = replace(corrupt, roles={k: v.clone() for k, v in clean.roles.items()})
    graph = build_graph(model, positions=GROUPS)
    scored = setup(model, clean, same, graph=graph)
    assert scored.align is None and scored.corrupt_at is None
    for method in (lambda c: eap(model, clean, c, graph=graph, progress=False),
                   lambda c: eap_ig(model, clean, c, steps=2, graph=graph, progress=False)):
        assert torch.equal(method(same).per_example, method(corrupt).per_example)
    plain = eap(model, clean, corrupt, graph=graph.base, per_position=True, progress=False).per_position
    masks = scored.positions.double()
    folded = torch.einsum("ent,gnt->egn", plain, masks).flatten(0, 1)
    assert torch.allclose(eap(model, clean, same, graph=graph, progress=False).per_example, folded,
                          atol=1e-13, rtol=0)
    edges = torch.arange(0, graph.n_edges, 7)
    assert torch.equal(edge_effects(model, scored, edges), edge_effects(model, setup(model, clean, corrupt, graph=graph),
                                                                       edges))


def one_line(error) -> str:
    assert "\n" not in str(error.value)
    return str(error.value)


@pytest.mark.parametrize("longer, message", [
    (False, "pair 0 has role 'key' at position\\(s\\) 3 of the clean prompt and 5 of the corrupted one; a circuit "
            "over every position patches position t from position t; give it position groups with the roles "
            "\\(interp circuit --positions key,query,value\\)"),
    (True, "pair 0 has its clean answer at position 8 and its corrupted answer at 9 \\(prompts of different lengths, "
           "aligned by role only\\); a circuit over every position patches position t from position t; give it "
           "position groups with the roles")])
def test_a_circuit_over_every_position_refuses_a_pair_it_cannot_align(longer, message):
    model = tiny("attention")
    clean, corrupt = moved_pair(longer)
    for run in (lambda: setup(model, clean, corrupt), lambda: eap(model, clean, corrupt, progress=False),
                lambda: eap_ig(model, clean, corrupt, steps=2, progress=False),
                lambda: eap(model, clean, corrupt, progress=False, chunk=2)):
        with pytest.raises(ValueError, match=message) as error:
            run()
        one_line(error)
    scored = setup(model, clean, corrupt, graph=build_graph(model, positions=GROUPS))  # aligned by role: runs
    n = scored.graph.n_edges
    none = patched_metric(model, scored, torch.zeros(1, n, dtype=torch.bool), base="corrupt", source="clean")[0]
    assert torch.allclose(none, scored.corrupt_metric, atol=1e-12, rtol=0)  # nothing patched: the corrupted run


def test_a_group_of_other_sizes_in_the_two_prompts_is_refused_in_one_line():
    model = tiny("attention")
    clean, corrupt = moved_pair(False)
    roles = {**corrupt.roles, "value": corrupt.roles["key"]}  # value and key share a position: value has none
    with pytest.raises(ValueError, match="pair 0: position group 'value' is at position\\(s\\) \\[4\\] of the clean "
                                         "prompt and \\[\\] of the corrupted one") as error:
        eap(model, clean, replace(corrupt, roles=roles), graph=build_graph(model, positions=GROUPS), progress=False)
    one_line(error)
