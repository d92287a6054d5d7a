"""Circuits through recurrent states: a per-model graph of senders (embedding, attention heads,
recurrent heads' state read-outs, whole mixers, MLPs) and receivers (q / k / v, a state's write
and read-out, whole inputs, logits), scored by EAP and EAP-IG, verified by exact edge patching.

Modules: `graph` (build_graph: the nodes and edges from the hook grammar; optionally positional,
with short-conv nodes, Mamba by channel groups), `positional` (position groups' masks, scores of a
positional graph), `passes` (one forward
in which each receiver reads its own copy of the residual stream), `gradients` (every receiver's
gradient from one forward and backward), `metrics` (the pair and the
metric: p(y), logit difference, KL), `eap` (eap, eap_ig), `edge_patching` (patched_metric,
edge_effects), `circuit` (extract with pruning, faithfulness, faithfulness_curve, rescore), `units`
(what the grids share when run as units: executor=, out=, chunk=).
"""

from interp.analysis.circuits.circuit import (Circuit, extract, faithfulness, faithfulness_curve, prune_edges,
                                              rescore)
from interp.analysis.circuits.eap import EdgeScores, eap, eap_ig
from interp.analysis.circuits.edge_patching import edge_effects, patched_metric
from interp.analysis.circuits.graph import Graph, Receiver, Sender, build_graph, positional_graph
from interp.analysis.circuits.metrics import METRICS, Setup, setup

__all__ = ["Circuit", "EdgeScores", "extract", "faithfulness", "faithfulness_curve", "prune_edges", "rescore", "Graph", "METRICS", "Receiver", "Sender", "Setup", "build_graph", "eap", "eap_ig",
           "positional_graph",
           "edge_effects", "patched_metric", "setup"]
