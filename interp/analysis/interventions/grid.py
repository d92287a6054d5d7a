"""Site x example grids (interchange, ablation) as units: site chunks x example chunks
(interp.analysis.units).

    unit (i, j) = sites[i*cs : (i+1)*cs] x examples[j*ce : (j+1)*ce]      chunk = (cs, ce)

Each unit is one whole run of the analysis on its sites and examples (interchange: `exact.measure`,
whose unit function is exact.interchange_unit; ablation: ablation.ablation_unit): it caches the
clean and corrupted runs of its examples, then runs its own (site, example) pairs, resumed and packed as a
whole grid is. A unit's passes hold its own pairs only, so its numbers do not depend on which other
units exist, where they run or in what order: the merged grid equals the in-process run of the same
chunk bit for bit. The price is that each unit caches its examples' clean and corrupted runs
again, unless the process that runs it ran a unit of the same examples before: an interchange
unit plans its caches for the whole grid's sites, so every unit of one example chunk caches the
same two runs, and a process keeps the last chunk's (exact.shared_runs; the units of one example
chunk come one after another). Without that, two forwards of ce rows per unit cost 25% (GPT-2) to
60% (Mamba-130m) of a grid of units of 24-48 sites at T 64 (benchmarks/scale_out.py).

Merging: the per-pair numbers [S, N, ...] (p_patched, the scores) are placed by unit; the
per-example numbers [N, ...] (named by the caller: p_clean, p_corrupt, ...) come from the example
chunk's first site chunk; "stats" (counts: pairs run, skipped, passes) add up.
"""

from __future__ import annotations

import torch

from interp.analysis.units import Unit, UnitWork, chunks, run_units
from models.memory import budget_bytes

UNIT_SITES = 128      # sites per unit (default chunk)
UNIT_EXAMPLES = 256   # examples per unit (default chunk)


def check_chunk(chunk, n_sites: int, n_examples: int) -> tuple[int, int]:
    """chunk checked, or the default (UNIT_SITES, UNIT_EXAMPLES), each capped at the grid's size."""
    if chunk is None:
        return min(UNIT_SITES, n_sites), min(UNIT_EXAMPLES, n_examples)
    if (not isinstance(chunk, (tuple, list)) or len(chunk) != 2
            or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in chunk)):
        raise ValueError(f"chunk must be (sites per unit, examples per unit), two positive ints; got {chunk!r}")
    return min(chunk[0], n_sites), min(chunk[1], n_examples)


def grid_units(n_sites: int, n_examples: int, chunk: tuple[int, int]) -> list[Unit]:
    """Example chunk after example chunk (the units of one example chunk follow each other, so a
    worker reuses that chunk's cached runs: exact.shared_runs)."""
    return [Unit(f"s{s0:06d}-{s1:06d}_e{e0:06d}-{e1:06d}", {"sites": [s0, s1], "examples": [e0, e1]})
            for e0, e1 in chunks(n_examples, chunk[1]) for s0, s1 in chunks(n_sites, chunk[0])]


def site_grid_units(model, compute, inputs: dict, n_sites: int, n_examples: int, per_example: tuple[str, ...],
                    name: str, options: dict, max_memory, chunk, executor, out, progress: bool) -> dict:
    """The raw numbers of a site x example grid, merged from its units (module docstring).
    compute(model, inputs, spec): one unit's {name: tensor}; the memory budget is resolved here
    once (pinned), so that every worker plans its passes alike."""
    chunk = check_chunk(chunk, n_sites, n_examples)
    units = grid_units(n_sites, n_examples, chunk)
    settings = {k: list(v) if isinstance(v, tuple) else v for k, v in options.items()}
    work = UnitWork(model, compute, inputs, name=name,
                    options={"chunk": list(chunk), "max_memory": max_memory, **settings},
                    pinned={"max_memory": budget_bytes(max_memory)})
    results = run_units(work, units, executor=executor, out=out, progress=progress)
    return merge(units, results, n_sites, n_examples, per_example)


def merge(units: list[Unit], results: dict, n_sites: int, n_examples: int,
          per_example: tuple[str, ...]) -> dict[str, torch.Tensor]:
    first = results[units[0].key]
    merged = {}
    for name, value in first.items():
        if name == "stats":
            merged[name] = sum(results[u.key][name] for u in units)
        elif name in per_example:
            merged[name] = value.new_empty((n_examples, *value.shape[1:]))
        else:  # per pair: [S, N, ...]
            merged[name] = value.new_empty((n_sites, n_examples, *value.shape[2:]))
    for unit in units:
        (s0, s1), (e0, e1) = unit.spec["sites"], unit.spec["examples"]
        for name, value in results[unit.key].items():
            if name in per_example and s0 == 0:
                merged[name][e0:e1] = value
            elif name not in per_example and name != "stats":
                merged[name][s0:s1, e0:e1] = value
    return merged
