"""`interp circuit RUN_DIR`: the circuit of a run trained on a retrieval task (AR, MQAR, ATR).

Clean examples of the run's task at its training length, each corrupted as `interp patch` does
(`--corrupt key` / `value`); every edge of the model's graph (positional with `--positions
key,value,query`: nodes per component and role) scored by EAP and EAP-IG
(interp.analysis.circuits), the top `--rescore` EAP-IG edges re-scored by exact edge patching,
the circuit chosen as the smallest number of top EAP-IG+exact edges whose faithfulness reaches
`--target` (default 0.8; interp.analysis.circuits.search), or the top `--fraction` of edges when
that is given, extracted and pruned, and faithfulness against size per method (`--prompts FILE
--tokenizer DIR`: your own prompt pairs on any model directory or transformers checkpoint, as
`interp patch` takes them). When no circuit is found the report and the printed line say why and
what to try. Prints the top edges and the circuit's faithfulness; writes an HTML report (default
RUN_DIR/circuit.html: the graph and the faithfulness curve) and the edge scores as CSV beside it.

With --executor local / ray (--workers ...) EAP and EAP-IG run as units of examples, the exact
re-scoring as units of edges and the faithfulness curve as units of circuits on the workers
(interp.analysis.circuits.units), each grid's finished units kept in units-<analysis>/ beside the
report: a rerun of the same command skips them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from interp.cli.args import (add_scale_out_arguments, check_out, count, device_name, executor_from_args, fail, fraction,
                            length_count, output_path, real, run_directory, seed_value, sequence_count)
from interp.cli.patch import add_prompt_arguments, comma_list, load_pair

IG_STEPS = count(4096, "each step is a forward and backward pass over every pair (EAP-IG uses 5 to 100); 4096 "
                       "steps cost as much as 4096 EAP runs")
RESCORED = count(100_000, "each edge is patched exactly, one forward pass over the pairs: 10^5 of them are hours "
                          "even for the smallest model", low=0)
CHANNEL_GROUPS = count(1 << 16, "one group per channel of the widest Mamba layer the field bounds allow")
FAITHFULNESS_TARGET = real(0, 1, "a share of the metric", low_open=True, sanity=False)

FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def add_parser(sub) -> None:
    circuit = sub.add_parser(
        "circuit", help="edge-level circuit (EAP, EAP-IG, exact edge patching) of a retrieval run",
        description="Score every edge of the model's graph (heads, recurrent states, mixers, MLPs) by EAP and "
                    "EAP-IG between clean and corrupted examples of a run trained on AR, MQAR or ATR; extract "
                    "the circuit and its faithfulness curve. Writes an HTML report and a CSV of edge scores.")
    circuit.add_argument("run_dir", type=run_directory, help="a run directory written by `interp train`")
    circuit.add_argument("--corrupt", choices=("key", "value"), default="key",
                         help="what the corrupted example changes: the queried key (out of context) or its value")
    circuit.add_argument("--metric", choices=("logit_diff", "prob", "kl"), default="logit_diff",
                         help="the metric scored and recovered")
    circuit.add_argument("--n", type=sequence_count, default=64, help="clean / corrupted pairs")
    circuit.add_argument("--length", type=length_count, default=None,
                         help="key-value pairs per example (default: the run's training length)")
    circuit.add_argument("--steps", type=IG_STEPS, default=8, help="EAP-IG interpolation steps")
    size = circuit.add_mutually_exclusive_group()
    size.add_argument("--target", type=FAITHFULNESS_TARGET, default=0.8,
                      help="the circuit is the smallest number of top edges whose faithfulness reaches this")
    size.add_argument("--fraction", type=fraction, default=None,
                      help="instead of --target: this share of all edges (it can round to no edge on a small graph)")
    circuit.add_argument("--rescore", type=RESCORED, default=50,
                         help="top EAP-IG edges re-scored by exact edge patching")
    circuit.add_argument("--positions", type=comma_list, default=None,
                         help="positional nodes: comma-separated roles (key, value, query, answer, bos, eos) and "
                              "integer positions, each node split by them (plus 'other', the positions left)")
    circuit.add_argument("--conv-nodes", action="store_true",
                         help="the short convolutions of Mamba-2 / DeltaNet / Gated DeltaNet as nodes of their own")
    circuit.add_argument("--channel-groups", type=CHANNEL_GROUPS, default=None,
                         help="split each Mamba (-1) layer's output into this many channel groups (senders s{l}.g{g})")
    circuit.add_argument("--seed", type=seed_value, default=2, help="seed of the clean examples")
    circuit.add_argument("--device", type=device_name, default="cpu", help="torch device")
    circuit.add_argument("--out", type=output_path, default=None, help="HTML report (default RUN_DIR/circuit.html)")
    circuit.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_scale_out_arguments(circuit, unit="chunk of examples, edges or circuits")
    add_prompt_arguments(circuit)
    circuit.set_defaults(func=run)


def units_out(args: argparse.Namespace, executor, analysis: str) -> dict:
    """{executor, out, progress}: with an executor, out = units-<analysis>/ beside the report
    (models.storage.paths.inside); without one, nothing (one run each, as before)."""
    if executor is None:
        return {}
    from models.storage.paths import inside

    report = Path(args.out or args.run_dir / "circuit.html")
    return {"executor": executor, "out": inside(report.parent, f"units-{analysis}"), "progress": not args.no_progress}


def measure(args: argparse.Namespace, executor=None):
    """(facts, {method: EdgeScores}, FaithfulSearch (its circuit None when none is found), faithfulness
    curve rows); executor: where the grids' units run (None: here, as one run each)."""
    from interp.analysis.circuits import build_graph, eap, eap_ig, extract, faithfulness, faithfulness_curve, rescore
    from interp.analysis.circuits.search import FaithfulSearch, smallest_faithful

    config, pairs, model, clean, corrupt = load_pair(args)
    task_name = config["task"]["name"]
    positions = None if args.positions is None else [int(p) if p.lstrip("-").isdigit() else p for p in args.positions]
    graph = build_graph(model, positions=positions, conv=args.conv_nodes, channel_groups=args.channel_groups)
    scores = {"eap": eap(model, clean, corrupt, metric=args.metric, graph=graph, **units_out(args, executor, "eap"))}
    scores["eap-ig"] = eap_ig(model, clean, corrupt, steps=args.steps, metric=args.metric, graph=graph,
                              **{"progress": not args.no_progress, **units_out(args, executor, "eap-ig")})
    scores["eap-ig+exact"] = rescore(model, scores["eap-ig"], k=min(args.rescore, graph.n_edges),
                                     **units_out(args, executor, "rescore"))
    chosen = scores["eap-ig+exact"]
    if args.fraction is None:
        found = smallest_faithful(model, chosen, target=args.target, executor=executor)
    else:
        circuit = extract(chosen, fraction=args.fraction)
        value = float(faithfulness(model, chosen.setup, circuit.kept)[0])
        found = FaithfulSearch(None, circuit, [{"n": circuit.n_edges, "n_edges": circuit.n_edges,
                                                "faithfulness": value}])
        if circuit.n_edges == 0:
            found.circuit, found.reason = None, (
                f"--fraction {args.fraction:g} of {graph.n_edges} edges keeps no edge on a path from the embedding to "
                "the logits; leave --fraction out to choose the size by --target")
    curve = faithfulness_curve(model, scores, fractions=sorted(set(FRACTIONS) | {args.fraction} - {None}),
                               **units_out(args, executor, "faithfulness"))
    facts = {"mixer": config["model"]["mixer"], "task": task_name, "pairs": pairs, "T": clean.tokens.shape[1],
             "edges": graph.n_edges}
    return facts, scores, found, curve


def report(args: argparse.Namespace, facts: dict, scores: dict, found, curve) -> Path:
    import pandas as pd
    import torch

    from interp.analysis.circuits import Circuit
    from interp.report.circuits import write_circuit_report
    from models.storage.writer import write_text

    ranking = scores["eap-ig+exact"]
    circuit = found.circuit or Circuit(ranking.graph, torch.zeros(ranking.graph.n_edges, dtype=torch.bool),
                                       ranking.scores)
    path = write_circuit_report(args.out or args.run_dir / "circuit.html", circuit, curve,
                                f"Circuit of {args.run_dir.name} ({facts['mixer']} on {facts['task']})",
                                search=found)
    names = circuit.graph.edge_names()
    frame = pd.DataFrame({"edge": names, **{m: s.scores.numpy() for m, s in scores.items()},
                          "in_circuit": circuit.kept.numpy()})
    write_text(path.with_suffix(".csv"), frame.to_csv(index=False))   # a link there is replaced, not followed
    return path


def run(args: argparse.Namespace) -> int:
    refused = check_out("circuit", args.out or args.run_dir / "circuit.html", file=True,
                        flag="--out" if args.out else "run_dir")
    if refused is not None:
        return refused
    from interp.analysis.units import GridFailed
    from models.storage.paths import DirectoryLocked

    executor = None
    try:
        executor = executor_from_args(args, "circuit")
        facts, scores, found, curve = measure(args, executor)
        path = report(args, facts, scores, found, curve)
    except (ValueError, TypeError, KeyError, FileNotFoundError, OSError, MemoryError, DirectoryLocked,
            GridFailed) as error:
        return fail("circuit", error)
    finally:
        if executor is not None:
            executor.close()
    print(f"{facts['mixer']} on {facts['task']} ({facts['pairs']} pairs, T {facts['T']}): {facts['edges']} edges, "
          f"{args.n} pairs; {circuit_line(found, facts['edges'])}")
    for name, value in scores["eap-ig+exact"].top(10):
        print(f"  {name:<36} {value:9.4f}")
    print(f"wrote {path} and {path.with_suffix('.csv')}")
    return 0


def circuit_line(found, edges: int) -> str:
    """What was found, in words: the circuit and its faithfulness, or why there is none."""
    if found.circuit is None:
        return f"no circuit: {found.reason}"
    how = "" if found.target is None else f" (the smallest of the sizes tried reaching {found.target:g})"
    whole = "; that is every edge on a path to the logits: the ranking singles out no smaller circuit" \
        if found.target is not None and found.everything else ""
    return f"circuit of {found.circuit.n_edges} of {edges} edges{how}, faithfulness {found.faithfulness:.3f}{whole}"
