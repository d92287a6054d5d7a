"""Running sweeps: trials through an executor into the table, resumable; the N* study on top.

    sweep = Sweep(out, executor, fn)        out/results.jsonl, out/runs/<trial_id>/, out/failures.jsonl
    rows = sweep(trials)                    run what is not finished yet; rows in trial order
    run_spec(spec, executor, out) -> SweepOutcome

`Sweep` is the runner that `interp.analysis.sample_efficiency.find_n_star` drives: each call
skips the trials whose id is already in the table (a re-run of a killed sweep picks up where it
stopped, and the N* search, being deterministic, retraces its rounds from the table), runs the
others through the executor with a tqdm bar over trials, appends each row as it arrives, and
records the failures. A grid sweep lists its failures at the end; the N* search cannot go on
without a round's rows, so a failed trial there raises TrialsFailed (fix it, then re-run).

One sweep at a time writes into `out`: `Sweep` calls and `run_spec` hold its lock
(models.storage.paths.locked); a second sweep on the same directory raises DirectoryLocked naming the
holder's pid rather than run the same trials again.

Each trial's row is its params plus the trial function's results plus trial_id, run_dir (relative
to out) and attempts.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from interp.analysis import sample_efficiency as se
from interp.sweep.executors import Executor, Job, Outcome
from interp.sweep.spec import SweepSpec
from interp.sweep.table import RESULTS, ResultTable, trial_id
from interp.training.preflight import check_output_dir
from models.storage.paths import in_place_file, inside, locked
from models.storage.writer import write_json, write_text

RUNS, N_STAR, KAPPA = "runs", "n_star.jsonl", "kappa.jsonl"


class TrialsFailed(RuntimeError):
    """Trials of an N* round failed; `failures` holds {trial_id, params, error}."""

    def __init__(self, failures: list[dict]) -> None:
        self.failures = failures
        super().__init__(f"{len(failures)} trial(s) failed; first: {failures[0]['error'].strip().splitlines()[-1]}")


class Sweep:
    """Runs trials once each into `out` (see the module docstring)."""

    def __init__(self, out: str | Path, executor: Executor, fn: Callable[[Mapping[str, Any], str], dict], *,
                 progress: bool = True, raise_on_failure: bool = False) -> None:
        self.out, self.executor, self.fn = Path(out), executor, fn
        self.table = ResultTable(out)
        self.progress, self.raise_on_failure = progress, raise_on_failure
        self.failures: list[dict] = []
        self.ran = 0

    def __call__(self, trials: Sequence[Mapping[str, Any]]) -> list[dict]:
        with locked(self.out, "sweep directory"):
            return self._run(trials)

    def _run(self, trials: Sequence[Mapping[str, Any]]) -> list[dict]:
        keys = [trial_id(params) for params in trials]
        in_place_file(self.out, RESULTS)   # refused before any trial runs: a link, a shared file
        finished = self.table.rows()
        todo, seen = [], set()
        for key, params in zip(keys, trials):
            if key not in finished and key not in seen:
                seen.add(key)
                todo.append(Job(key, dict(params), str(inside(self.out, RUNS, key))))
        failures: list[dict] = []
        if todo:
            (self.out / RUNS).mkdir(parents=True, exist_ok=True)
            bar = _bar(len(trials), len(trials) - len(todo), self.progress)

            def on_done(outcome: Outcome) -> None:
                job = outcome.job
                if outcome.row is None:
                    failures.append({"trial_id": job.key, "params": job.params, "error": outcome.error,
                                     "attempts": outcome.attempts})
                else:
                    row = {**job.params, **outcome.row, "trial_id": job.key,
                           "run_dir": str(Path(RUNS) / job.key), "attempts": outcome.attempts}
                    self.table.append(row)
                    finished[job.key] = row
                    self.ran += 1
                bar.update(1)
                bar.set_postfix(failed=len(failures), refresh=False)

            try:
                self.executor.run(self.fn, todo, on_done)
            finally:
                bar.close()
        self.failures = failures
        self.table.write_failures(failures)
        if failures and self.raise_on_failure:
            raise TrialsFailed(failures)
        return [finished[key] for key in keys if key in finished]


def _bar(total: int, initial: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, disable=not enabled, desc="trials", unit="trial",
                file=sys.stderr, dynamic_ncols=True)


@dataclass
class SweepOutcome:
    """What a spec's run produced: the table's rows, failures and, for n_star specs, the answers."""

    rows: list[dict]
    failures: list[dict]
    n_star: list[se.NStar] = field(default_factory=list)
    kappa: list[dict] = field(default_factory=list)


def run_spec(spec: SweepSpec, executor: Executor, out: str | Path, *, progress: bool = True) -> SweepOutcome:
    """Run a grid spec's trials, or the N* study of an n_star spec (writing n_star.jsonl and
    kappa.jsonl next to the table); spec.json records the spec in out."""
    out = Path(out)
    check_output_dir(out)
    with locked(out, "sweep directory", create=True):   # made already locked
        return _run_spec(spec, executor, out, progress)


def _run_spec(spec: SweepSpec, executor: Executor, out: Path, progress: bool) -> SweepOutcome:
    write_json(out / "spec.json", spec.data)
    sweep = Sweep(out, executor, spec.trial_function(), progress=progress, raise_on_failure=spec.kind == "n_star")
    if spec.kind == "grid":
        rows = sweep(spec.trials())
        return SweepOutcome(rows, sweep.failures)
    search = {"n0": 16, "resolution": 0.1, "n_max": 1 << 16, **spec.search}
    results = se.find_n_star(spec.conditions(), spec.configs(), sweep, **search)
    kappa = se.kappa_rows(results)
    _write_jsonl(out / N_STAR, [r.row() for r in results])
    _write_jsonl(out / KAPPA, kappa)
    return SweepOutcome([row for r in results for row in r.trials], sweep.failures, results, kappa)


def _write_jsonl(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    write_text(path, "".join(json.dumps(r, sort_keys=True, default=float) + "\n" for r in rows))
