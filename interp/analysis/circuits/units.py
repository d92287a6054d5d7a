"""Circuit grids as units (interp.analysis.units): the pieces the circuit analyses share.

    eap, eap_ig               unit = examples[j c : (j+1) c]             c default UNIT_PROMPTS
    edge_effects, rescore     unit = edges[i c : (i+1) c]                c default edge_chunk(N)
    faithfulness(_curve)      unit = (method, circuits[i c : (i+1) c])   c default edge_chunk(N)

Each unit is one call of the analysis' own in-process code on its share (eap.prompt_unit,
edge_patching.effects_unit, circuit.faithfulness_unit), with one torch thread, so the merged result
is a function of the inputs and the chunk alone. Merging: EAP's per_example [E, N] (and
per_position [E, N, T]) are concatenated along the examples, and the Setup the scores carry (the
pair's metrics and the senders' activations, which the edge grids read) is computed once in the
driver with one thread: unit files and transfers carry scores only (the senders' activations of a
GPT-2 unit of 16 prompts at T 64 are about 1 GB); edge effects' [k, N] rows and faithfulness' [K]
values are concatenated in order.

The edge grids ship a Setup to the workers: it is all data (metrics.AnswerMetric is a dataclass,
Graph keeps its name index outside its fields), so it pickles and has a stable digest. A worker
whose model sits on another device moves its Setup there (`setup_to`).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from interp.analysis.circuits.metrics import Setup
from interp.analysis.units import Unit, chunks, default_chunk

UNIT_PROMPTS = 64   # examples per EAP / EAP-IG unit (default chunk)
UNIT_ROWS = 1024    # patched rows (edges or circuits x examples) per edge-patching unit (default chunk)


def chunked(executor, out, chunk) -> bool:
    """Whether a call runs as units (any of executor, out, chunk given) or as before."""
    return executor is not None or out is not None or chunk is not None


def check_chunk(chunk, n: int, default: int, what: str) -> int:
    """chunk (items per unit) checked, or `default`; capped at the n items (at least 1)."""
    if chunk is None:
        chunk = default
    elif isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a positive int ({what} per unit); got {chunk!r}")
    return max(1, min(chunk, n))


def edge_chunk(n_examples: int) -> int:
    """The default edges (or circuits) per unit: about UNIT_ROWS patched rows of N examples each."""
    return default_chunk(n_examples, UNIT_ROWS)


def span_units(n: int, size: int, name: str, prefix: str = "") -> list[Unit]:
    """Units over range(n) in spans of `size`: key PREFIX{name[0]}START-STOP, spec {name: [start, stop]}."""
    return [Unit(f"{prefix}{name[0]}{a:06d}-{b:06d}", {name: [a, b]}) for a, b in chunks(n, size)]


def model_device(model) -> torch.device:
    return next(model.parameters()).device


# ----------------------------------------------------------------------------- Setups


def setup_to(pair: Setup, device: torch.device) -> Setup:
    """The Setup with the tensors setup() keeps on the model's device moved to `device` (a no-op
    where they are there)."""
    if pair.at.device == device:
        return pair
    metric = pair.metric
    metric = replace(metric, y=metric.y.to(device), rival=metric.rival.to(device),
                     clean_logp=None if metric.clean_logp is None else metric.clean_logp.to(device))
    return replace(pair, at=pair.at.to(device), metric=metric,
                   corrupt_at=None if pair.corrupt_at is None else pair.corrupt_at.to(device),
                   clean_acts={k: v.to(device) for k, v in pair.clean_acts.items()},
                   corrupt_acts={k: v.to(device) for k, v in pair.corrupt_acts.items()})


def cat_units(units: list[Unit], results: dict, name: str, dim: int = 0) -> torch.Tensor:
    """The tensors `name` of every unit, in the grid's order, concatenated along dim."""
    return torch.cat([results[u.key][name] for u in units], dim)
