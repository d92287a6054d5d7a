"""Circuit figures: the circuit graph and the faithfulness-vs-size curve, and their report.

    circuit_figure(circuit)          nodes by layer (x) and index within the layer (y; in a
                                     positional graph within the band of the node's position
                                     group: key, value, query, ..., other); an edge
                                     from a sender to the node its receiver feeds, width by |score|,
                                     blue for a positive score, red for a negative one, labelled
                                     by the input it reads (q / k / v, write / read); hover:
                                     the edge (sender -> receiver) and its score, a node's summed
                                     scores in and out
    faithfulness_figure(rows)        faithfulness against the number of edges kept (log axis), one
                                     line per scoring method (rows of circuits.faithfulness_curve)
    write_circuit_report(path, ...)  both in one offline HTML file with a table of the top edges
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import plotly.graph_objects as go

from interp.report.html import Table, Text, write_report
from interp.report.style import palette_color

POSITIVE, NEGATIVE = "#1f77b4", "#d62728"
MAX_WIDTH = 8.0
MAX_LABELLED = 60  # edges up to which each one's receiver input is written on it
PIXELS_PER_NODE, PIXELS_PER_LAYER = 40, 100  # room for a node and its label: vertical, horizontal


def _layout_nodes(graph, names: list[str]) -> dict[str, tuple[float, float]]:
    """x, y of each sender name (and "logits"): x the layer (MLPs at l + 0.5, embed -1, a parallel
    mixer2 at l + 0.25, a conv node at l - 0.3, Zamba2's shared block at l - 0.2), y the node's rank among the circuit's nodes of that x, centred; in a
    positional graph, y within its position group's band (the first group on top)."""
    x_of, group_of = {}, {}
    for sender in graph.senders:
        x = float(sender.layer) + {"mlp": 0.5, "conv": -0.3, "shared": -0.2}.get(sender.kind, 0.0)
        if sender.name.split(".")[0].split("@")[0].endswith("b"):
            x += 0.25
        x_of[sender.name], group_of[sender.name] = x, sender.position
    for group in graph.positions or (None,):
        name = "logits" if group is None else f"logits@{group}"
        x_of[name], group_of[name] = float(graph.n_layers), group
    columns: dict[tuple, list[str]] = {}
    for name in names:
        columns.setdefault((x_of[name], group_of[name]), []).append(name)
    height = max((len(column) for column in columns.values()), default=1) + 1  # a band's height
    bands = {group: -i * height for i, group in enumerate(graph.positions or (None,))}
    return {name: (x, bands[group] + i - (len(column) - 1) / 2)
            for (x, group), column in columns.items() for i, name in enumerate(column)}, height


def _target(graph, receiver) -> str:
    """The node a receiver's edges are drawn to: the first sender it feeds (at its own position
    group in a positional graph), or the logits."""
    if not receiver.feeds:
        return receiver.name.split(".")[0] if receiver.position is None else f"logits@{receiver.position}"
    first = receiver.feeds[0]
    return first if receiver.position is None else f"{first.rsplit('@', 1)[0]}@{receiver.position}"


def circuit_figure(circuit, title: str = "Circuit") -> go.Figure:
    """The circuit's graph (module docstring)."""
    graph, kept, scores = circuit.graph, circuit.kept, circuit.scores
    edges = [(int(e), *graph.edges[e].tolist()) for e in kept.nonzero()[:, 0]]
    targets = {e: _target(graph, graph.receivers[r]) for e, _, r in edges}
    order = {s.name: i for i, s in enumerate(graph.senders)}
    names = sorted({graph.senders[s].name for _, s, _ in edges} | set(targets.values()),
                   key=lambda n: order.get(n, len(order)))
    where, height = _layout_nodes(graph, names)
    biggest = max((abs(float(scores[e])) for e, _, _ in edges), default=1.0) or 1.0
    figure = go.Figure()
    mid_x, mid_y, mid_text, mid_role = [], [], [], []
    for e, s, r in edges:
        (x0, y0), (x1, y1) = where[graph.senders[s].name], where[targets[e]]
        score = float(scores[e])
        figure.add_trace(go.Scatter(x=[x0, x1], y=[y0, y1], mode="lines", hoverinfo="skip", showlegend=False,
                                    line=dict(width=0.5 + MAX_WIDTH * abs(score) / biggest,
                                              color=POSITIVE if score >= 0 else NEGATIVE), opacity=0.7))
        mid_x.append((x0 + x1) / 2)
        mid_y.append((y0 + y1) / 2)
        mid_text.append(f"{graph.senders[s].name} -> {graph.receivers[r].name}<br>score {score:.4g}")
        receiver = graph.receivers[r]
        role = receiver.name.split("@")[0].rsplit(".", 1)[-1]
        mid_role.append(role if receiver.slots or role == "rest" else "")
    labels = mid_role if len(edges) <= MAX_LABELLED else None  # the receiver's input (q, k, v, write, read)
    figure.add_trace(go.Scatter(x=mid_x, y=mid_y, mode="markers+text" if labels else "markers", text=labels,
                                textposition="bottom center", textfont=dict(size=10, color="#555"),
                                marker=dict(size=6, color="rgba(0,0,0,0.05)"), hovertext=mid_text,
                                hoverinfo="text", name="edges (hover; label: the input read)"))
    out_sum = {n: 0.0 for n in names}
    in_sum = {n: 0.0 for n in names}
    for e, s, _ in edges:
        out_sum[graph.senders[s].name] += float(scores[e])
        in_sum[targets[e]] += float(scores[e])
    kinds = {s.name: s.kind for s in graph.senders}
    if graph.positions:
        _link_positions(figure, names, where)
    _add_nodes(figure, names, kinds, where, in_sum, out_sum)
    _finish_layout(figure, circuit, title, height)
    return figure


def _link_positions(figure, names: list[str], where: dict) -> None:
    """A dotted line through one component's nodes at different position groups (it mixes positions)."""
    xs, ys = [], []
    for component in dict.fromkeys(n.split("@")[0] for n in names):
        members = [n for n in names if n.split("@")[0] == component]
        if len(members) > 1:
            xs += [where[n][0] for n in members] + [None]
            ys += [where[n][1] for n in members] + [None]
    if xs:
        figure.add_trace(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", line=dict(color="#888", dash="dot"),
                                    name="one component at several positions"))


def _add_nodes(figure, names, kinds, where, in_sum, out_sum) -> None:
    for i, kind in enumerate(("embed", "attention", "state", "mixer", "mlp", "logits", "conv", "shared")):
        members = [n for n in names if kinds.get(n, "logits") == kind]
        if not members:
            continue
        figure.add_trace(go.Scatter(
            x=[where[n][0] for n in members], y=[where[n][1] for n in members], mode="markers+text",
            text=[node_label(n) for n in members], textposition="middle right", name=kind,
            textfont=dict(size=10), cliponaxis=False,
            marker=dict(size=12, color=palette_color(i), line=dict(width=1, color="#333")),
            hovertext=[f"{n}<br>scores out {out_sum[n]:.4g}<br>scores in {in_sum[n]:.4g}" for n in members],
            hoverinfo="text"))


def node_label(name: str) -> str:
    """A node's label beside it: an attention head or MLP without its layer (on the x axis: a3.h11 ->
    h11, mlp3 -> mlp), anything else by its name; the position group is the band's (the hover has
    the full name)."""
    name = name.split("@")[0]
    if re.fullmatch(r"a\d+b?\.h\d+", name):
        return name.split(".", 1)[1]
    return "mlp" if re.fullmatch(r"mlp\d+", name) else name


def _finish_layout(figure, circuit, title: str, height: int) -> None:
    """Axes: layer on x; y the node within its layer, or in a positional graph the position
    group's band (ticks named by group, separated by dotted lines). The figure grows with the
    tallest column (PIXELS_PER_NODE) and, past 8 layers, with the layers (PIXELS_PER_LAYER), so
    labels keep their room at 250+ edges."""
    graph = circuit.graph
    yaxis = dict(title="node within the layer", showticklabels=False, zeroline=False)
    if graph.positions:
        centres = [-i * height for i in range(len(graph.positions))]
        yaxis = dict(title="position (role) - nodes of a layer stacked within it", zeroline=False,
                     tickvals=centres, ticktext=list(graph.positions), showgrid=False)
        for centre in centres[:-1]:
            figure.add_hline(y=centre - height / 2, line=dict(color="#bbb", dash="dot", width=1))
    bands = len(graph.positions) if graph.positions else 1
    size = max(600, 140 + 40 * bands + PIXELS_PER_NODE * height * bands)
    width = PIXELS_PER_LAYER * (graph.n_layers + 3) if graph.n_layers > 8 else None
    figure.update_layout(title=f"{title}: {circuit.n_edges} of {graph.n_edges} edges", height=size, width=width,
                         xaxis=dict(title="layer (MLP at +0.5, short conv at -0.3, shared block at -0.2; embed -1, "
                                          "logits last)", zeroline=False),
                         yaxis=yaxis, legend=dict(title="node kind"))


def faithfulness_figure(rows: Sequence[Mapping], title: str = "Faithfulness vs circuit size",
                        search=None) -> go.Figure:
    """Faithfulness against the edges kept, one line per method (rows: faithfulness_curve's); with
    `search` (a circuits.search.FaithfulSearch) also the sizes it tried, its target and its circuit."""
    figure = go.Figure()
    for i, method in enumerate(dict.fromkeys(row["method"] for row in rows)):
        mine = sorted((row for row in rows if row["method"] == method), key=lambda row: row["n_edges"])
        figure.add_trace(go.Scatter(
            x=[max(row["n_edges"], 1) for row in mine], y=[row["faithfulness"] for row in mine],
            mode="lines+markers", name=method, line=dict(color=palette_color(i)),
            hovertext=[f"{method}: {row['n_edges']} edges ({row['fraction']:.3g} of all), faithfulness "
                       f"{row['faithfulness']:.3f}" for row in mine], hoverinfo="text"))
    if search is not None and search.target is not None:
        _add_search(figure, search)
    figure.update_layout(title=title, xaxis=dict(title="edges kept (after pruning; 0 shown at 1)", type="log"),
                         yaxis=dict(title="faithfulness (metric recovered)"), legend=dict(title="scoring"),
                         height=450)
    return figure


def _add_search(figure: go.Figure, search) -> None:
    """The sizes the target search tried (grey crosses), the target (dashed) and the circuit chosen (a star)."""
    figure.add_trace(go.Scatter(
        x=[max(row["n_edges"], 1) for row in search.rows], y=[row["faithfulness"] for row in search.rows],
        mode="markers", name="sizes searched (eap-ig+exact)", marker=dict(symbol="x", size=7, color="#777"),
        hovertext=[f"top {row['n']} edges -> {row['n_edges']} after pruning: {row['faithfulness']:.3f}"
                   for row in search.rows], hoverinfo="text"))
    figure.add_hline(y=search.target, line=dict(color="#555", dash="dash", width=1),
                     annotation_text=f"target {search.target:g}", annotation_position="top left")
    if search.circuit is not None:
        figure.add_trace(go.Scatter(x=[max(search.circuit.n_edges, 1)], y=[search.faithfulness], mode="markers",
                                    name=f"circuit chosen ({search.circuit.n_edges} edges)",
                                    marker=dict(symbol="star", size=16, color="#111")))


def search_text(search) -> str:
    """How the circuit was chosen, or why there is none and what to try."""
    if search.circuit is None:
        return f"No circuit: {search.reason}."
    if search.target is None:
        return f"The circuit: the top edges by |score| for the share asked, {search.circuit.n_edges} after pruning."
    whole = (" That is every edge on a path to the logits: the ranking singles out no smaller circuit (finer nodes "
             "may: --positions, --conv-nodes, --channel-groups).") if search.everything else ""
    return (f"The circuit: the smallest number of top EAP-IG+exact edges whose faithfulness reaches the target "
            f"{search.target:g}, among {len(search.rows)} sizes tried (grey crosses in the curve below): "
            f"{search.circuit.n_edges} edges after pruning, faithfulness {search.faithfulness:.3f}.{whole}")


def write_circuit_report(path: str | Path, circuit, curve: Sequence[Mapping], title: str = "Circuit",
                         top: int = 20, search=None) -> Path:
    """One offline HTML file: how the circuit was chosen (with `search`), the circuit graph (or,
    when there is no circuit, why), the faithfulness curve and the top edges."""
    scores = circuit.scores
    order = scores.abs().argsort(descending=True)[:top].tolist()
    names = circuit.graph.edge_names()
    rows = [{"edge": names[i], "score": float(scores[i]), "in circuit": bool(circuit.kept[i])} for i in order]
    graph = [circuit_figure(circuit, title)] if circuit.n_edges else []
    return write_report(path, title, [
        *([Text(search_text(search))] if search is not None else []),
        Text("Edges: sender -> receiver (q / k / v inputs of attention heads; write / read of a recurrent "
             "head's state; `in` of a short-conv node and x / B / k / v where the state reads one; whole inputs). "
             "Width by |score|, blue positive, red negative. A positional graph's nodes sit in the band of "
             "their position (role); edges join equal positions, positions mix inside nodes."),
        *graph, faithfulness_figure(curve, search=search), Table(rows, heading=f"Top {top} edges by |score|"),
    ])
