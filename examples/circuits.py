"""Which paths carry the answer of associative recall? Edge-level circuits through attention and states.

Trains (or reloads from OUT/<model>) a 2-layer Transformer, Mamba-2 and hybrid (attention, then
Mamba-2) on AR and scores every edge of each model's *positional* graph by EAP-IG on clean /
key-corrupted pairs (interp.analysis.circuits: nodes per component and role key / value / query /
other; heads' q / k / v inputs; recurrent heads' state write and read-out; the short convolution
of Mamba-2 as a node of its own), re-scores the top edges by exact edge patching, keeps the top
--fraction of edges (pruned), measures its faithfulness and writes the circuit figure (nodes by
layer and role). Then it asks seed 003's question at the level of paths:

  Transformer  is the circuit the induction path? embed@key -> a layer-0 head's value input at
               the key (the previous-token head reads the key), a layer-0 head@value -> a layer-1
               head's key input@value (where it writes the key), the layer-1 heads -> logits. (The key corruption leaves the query token as it is, so no score flows
               from the query's own embedding.)
  Mamba-2      is it short conv -> state -> read-out? The conv reading the key (edges into
               c*.in@key), the conv's output read by the state at the value (c* -> s*.x@value
               and s*.B@value: the conv carries the key beside its value, into x or into the
               input vector B), the read-out C at the query (into
               s*.read@query), the last layer's states -> logits.

Reading: each share is the |score| of a kind of edge at that role over its |score| at every role
(into the logits: the share of their |score| from that layer).
Only a model that solves AR says anything (the accuracy is printed); --quick runs toy sizes,
numbers mean nothing.

    python examples/circuits.py [--models transformer,mamba2,hybrid] [--steps 3000] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from interp.analysis.circuits import build_graph, eap, eap_ig, extract, faithfulness, faithfulness_curve, rescore
from interp.analysis.interventions import corrupt_ar
from interp.report.circuits import write_circuit_report
from interp.tasks import make_task
from interp.training.evaluate import final_state_accuracy
from interp.training.train import TrainConfig, train
from models.registry import preset_config

MODELS = {"transformer": ("transformer", dict(positional="rope")), "mamba2": ("mamba2", dict(mlp=True)),
          "hybrid": ("transformer", dict(mixer=["attention", "mamba2"], positional="none"))}
DEFAULTS = dict(models="transformer,mamba2,hybrid", steps=3000, batch_size=64, d_model=64, pairs=4, n_keys=8, n=128,
                steps_ig=8, fraction=0.05, rescore=50, seed=0)
QUICK = dict(steps=4, batch_size=8, d_model=16, pairs=3, n_keys=5, n=8, steps_ig=2, rescore=5)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, value in DEFAULTS.items():
        p.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    p.add_argument("--out", default="runs/circuits")
    p.add_argument("--quick", action="store_true", help="toy sizes: a smoke run, numbers mean nothing")
    args = p.parse_args(argv)
    if args.quick:
        vars(args).update(QUICK)
    return args


def trained(name: str, task, args):
    preset, extra = MODELS[name]
    cfg = preset_config(preset, vocab_size=task.vocab_size, d_model=args.d_model, n_layers=2, **extra)
    every = max(1, args.steps // 10)
    config = TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=1e-3, warmup=min(100, every),
                         train_length=args.pairs, eval_every=every, eval_size=256, log_every=every,
                         checkpoint_every=every, seed=args.seed)
    return train(cfg, task, config, out=str(Path(args.out) / name), resume=True, progress=False, label=name).model.eval()


def share(scores, sender: str, receiver: str, role: str, where: str) -> float:
    """|score| of the edges sender*@where -> receiver*role@where over that of the same edges at every
    position group (NaN when none carries any)."""
    graph = scores.graph
    mine, every = 0.0, 0.0
    for e, (u, r) in enumerate(graph.edges.tolist()):
        s, t = graph.senders[u], graph.receivers[r]
        base = t.name.split("@")[0]
        if s.name.startswith(sender) and base.startswith(receiver) and base.endswith(role):
            value = float(scores.scores[e].abs())
            every += value
            mine += value if t.position == where else 0.0
    return mine / every if every > 0 else float("nan")


def logit_share(scores, sender: str) -> float:
    """Share of the |score| into the logits that comes from senders named sender*."""
    graph = scores.graph
    into = [e for e, r in enumerate(graph.edges[:, 1].tolist()) if graph.receivers[r].site == "logits"]
    mine = [e for e in into if graph.senders[graph.edges[e, 0]].name.startswith(sender)]
    return float(scores.scores[mine].abs().sum() / scores.scores[into].abs().sum())


def paths(name: str, scores) -> dict:
    """The shares of the question's edges (module docstring)."""
    if name == "transformer":
        return {"a0 -> a1.k at value": share(scores, "a0.", "a1.", ".k", "value"),
                "embed -> a0.v at key": share(scores, "embed", "a0.", ".v", "key"),
                "a1 -> logits": logit_share(scores, "a1.")}
    shares = {"into conv at key": share(scores, "", "c", ".in", "key"),
              "conv -> state x at value": share(scores, "c", "s", ".x", "value"),
              "conv -> state B at value": share(scores, "c", "s", ".B", "value"),
              "read-out at query": share(scores, "", "s", ".read", "query"),
              "s1 -> logits": logit_share(scores, "s1.")}
    if name == "hybrid":  # attention first: does a layer-0 head feed the conv at the key / value?
        shares["a0 -> s1 conv at key/value"] = (share(scores, "a0.", "c1.", ".in", "key")
                                                 + share(scores, "a0.", "c1.", ".in", "value"))
    return shares


def run(args) -> dict:
    task = make_task("AR", n_keys=args.n_keys, n_values=args.n_keys)
    clean = task.sample(args.n, args.pairs, seed=args.seed + 2)
    corrupt = corrupt_ar(clean, task, seed=args.seed + 3)
    out = {}
    for name in args.models.split(","):
        model = trained(name, task, args)
        accuracy = final_state_accuracy(model, task, args.pairs, 256, args.seed + 1)
        graph = build_graph(model, positions=["key", "value", "query"], conv=True)
        plain = eap(model, clean, corrupt, graph=graph)
        ig = eap_ig(model, clean, corrupt, steps=args.steps_ig, graph=graph, progress=False)
        exact = rescore(model, ig, k=min(args.rescore, ig.graph.n_edges))
        circuit = extract(exact, fraction=args.fraction)
        faithful = float(faithfulness(model, ig.setup, circuit.kept)[0])
        curve = faithfulness_curve(model, {"eap": plain, "eap-ig": ig, "eap-ig+exact": exact})
        report = write_circuit_report(Path(args.out) / f"{name}.html", circuit, curve, f"{name} on AR")
        out[name] = {"AR accuracy": accuracy, "edges": ig.graph.n_edges, "circuit edges": circuit.n_edges,
                     "faithfulness": round(faithful, 3), **{k: round(v, 3) for k, v in paths(name, ig).items()}}
        print(name, out[name], "top:", exact.top(5), f"report: {report}", flush=True)
    return out


if __name__ == "__main__":
    run(parse_args())
