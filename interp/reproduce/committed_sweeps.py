"""Committed sweep tables: the trial rows of a reproduction's sweeps (interp.sweep tables), kept in the
repository beside its committed runs, so that a later session continues a sweep instead of retraining
its trials.

    commit_table(out_dir, target_dir) -> rows added     out_dir/results.jsonl merged into target_dir/results.jsonl
                                                        (and target_dir/manifest.json, interp.reproduce.manifest)
    seed_table(target_dir, out_dir) -> rows added       the committed rows a sweep in out_dir lacks, appended there
    committed_rows(target_dir) -> {trial_id: row}

Layout: results/reproduce/<claim>-<scale>/<sweep>/results.jsonl, one row per finished trial exactly as the
sweep wrote it (params, results, trial_id, run_dir, attempts). Trial weights are not kept: an N* search
needs only whether each trial converged, and a joint trial's accuracies beyond the longest length are in
its row. A sweep directory seeded from the committed rows skips those trials (interp.sweep.run.Sweep runs
only the trial ids its table lacks) and the deterministic N* search retraces its rounds from them, so a
search stopped in any round continues from there. A trial id is the hash of the trial's parameters, so a
row committed under other parameters (another spec) is never taken for a trial of this one. A table
that does not match its manifest (a row edited after the commit) is refused (EditedResults).
"""

from __future__ import annotations

import json
from pathlib import Path

from interp.reproduce.manifest import check_manifest, write_manifest
from interp.sweep.table import RESULTS, ResultTable
from models.storage.paths import inside
from models.storage.writer import write_text


def committed_rows(target: str | Path) -> dict[str, dict]:
    """{trial_id: row} of target/results.jsonl ({} when there is none)."""
    target = Path(target)
    if not (target / RESULTS).exists():
        return {}
    check_manifest(target)
    return ResultTable(target).rows()


def commit_table(out: str | Path, target: str | Path) -> int:
    """Merge the finished trials of the sweep in `out` into target/results.jsonl (committed rows first, in
    their order, then the new ones in the sweep's order); returns the number of rows added."""
    found = ResultTable(out).rows() if (Path(out) / RESULTS).exists() else {}
    kept = committed_rows(target)
    added = [row for key, row in found.items() if key not in kept]
    if added:
        Path(target).mkdir(parents=True, exist_ok=True)
        rows = list(kept.values()) + added
        write_text(inside(Path(target), RESULTS),
                          "".join(json.dumps(r, sort_keys=True, default=float) + "\n" for r in rows))
        write_manifest(target)
    return len(added)


def seed_table(target: str | Path, out: str | Path) -> int:
    """Append to out/results.jsonl the committed rows of target whose trials it lacks; returns how many."""
    kept = committed_rows(target)
    if not kept:
        return 0
    table = ResultTable(out)
    have = table.rows()
    missing = [row for key, row in kept.items() if key not in have]
    for row in missing:
        table.append(row)
    return len(missing)
