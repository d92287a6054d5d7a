"""One analysis over many run directories: each run one job, in this process or on an executor.

    results = run_each(work, ["runs/a", "runs/b"], executor=None, **params) -> [RunResult], in the given order
    work(params, run_dir) -> dict         a module-level function (a worker imports it by name)

The analyses of the command line are such functions (`interp.cli.eval.eval_job`,
`interp.cli.drift.drift_job`, `interp.cli.heads.heads_job`): each loads its run, computes and
writes the run's own result file under the run directory's lock (models.storage.paths.locked) with atomic
writes, exactly as the single-run command does; they live next to those commands because drift and
heads write HTML reports (interp.report, which this package may not import).

    from interp.cli.drift import drift_job
    from interp.sweep.executors import make_executor
    executor = make_executor("ray", workers=4)            # or "local"; None: one run after another here
    try:
        results = run_each(drift_job, run_dirs, executor, lengths=[60, 1000], device="cpu")
    finally:
        executor.close()
    [r.run_dir for r in results if not r.ok]              # each failure's one-line `error` and `traceback`

A run that fails (an exception in its job, a worker that died past the executor's retries) is
reported in its RunResult and never stops the others. Nothing is written here but what the jobs
write into their own run directories: there is no sweep table, and a rerun computes again.

Same numbers as one process: a worker runs torch with one thread (interp.sweep.jobs.one_thread); a
job computes what the single-run command computes on its run, so the results are identical bit for
bit to that command's in a process with torch.set_num_threads(1) (tests/test_runs_executor.py).
With more threads a CPU reduction may be split differently and the last bits of a float can differ.
"""

from __future__ import annotations

import re
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from interp.sweep.jobs import Executor, Job, Outcome

# exception types whose message says what to fix (the commands' one-line user errors): the
# one-line `error` drops their name; any other type (a bug) keeps it
USER_ERRORS = ("ValueError", "TypeError", "KeyError", "OSError", "FileNotFoundError", "NotADirectoryError",
               "IsADirectoryError", "PermissionError", "DirectoryLocked", "PathRefused", "CheckpointError")


@dataclass
class RunResult:
    """What one run's job gave: its row, or the one-line error and the full traceback."""

    run_dir: str
    row: dict | None
    error: str | None = None       # one line; None when the job succeeded
    traceback: str | None = None   # the worker's formatted traceback (or the executor's reason)
    attempts: int = 1

    @property
    def ok(self) -> bool:
        return self.error is None


def error_line(text: str) -> str:
    """The one line that says why a job failed: the last line of its traceback (`Type: message`),
    without the type for the errors in USER_ERRORS (module docstring)."""
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    last = lines[-1].strip() if lines else "failed without a message"
    match = re.match(r"^(?:[\w.]+\.)?(\w+): (.*)$", last)
    if match and match.group(1) in USER_ERRORS:
        message = match.group(2)
        if match.group(1) == "KeyError":
            message = f"an entry {message} is missing (a file of the run corrupt or edited by hand?)"
        return message
    return last


def run_each(work: Callable[[dict, str], dict], run_dirs: Sequence[str | Path], executor: Executor | None = None,
             *, progress: bool = False, **params: Any) -> list[RunResult]:
    """work(params, run_dir) for every run directory (see the module docstring): on `executor`'s
    workers, or one after another in this process when executor is None. Returns one RunResult per
    run directory, in the given order. ValueError when `run_dirs` is empty or names a directory
    twice (two jobs would race for one run's lock)."""
    if not callable(work):
        raise TypeError(f"work must be a function work(params, run_dir) -> dict; got {type(work).__name__}")
    dirs = [str(d) for d in run_dirs] if not isinstance(run_dirs, (str, Path)) else [str(run_dirs)]
    if not dirs:
        raise ValueError("run_dirs must name at least one run directory; got none")
    seen: dict[Path, str] = {}
    for d in dirs:
        key = Path(d).resolve()
        if key in seen:
            raise ValueError(f"run_dirs names one run directory twice: {seen[key]!r} and {d!r}")
        seen[key] = d
    results: dict[str, RunResult] = {}
    bar = _bar(len(dirs), progress)

    def on_done(outcome: Outcome) -> None:
        job = outcome.job
        if outcome.row is not None:
            results[job.key] = RunResult(job.run_dir, outcome.row, attempts=outcome.attempts)
        else:
            results[job.key] = RunResult(job.run_dir, None, error_line(outcome.error), str(outcome.error),
                                         outcome.attempts)
        bar.update(1)
        bar.set_postfix(failed=sum(not r.ok for r in results.values()), refresh=False)

    jobs = [Job(d, dict(params), d) for d in dirs]
    try:
        if executor is None:
            for job in jobs:
                on_done(_here(work, job))
        else:
            executor.run(work, jobs, on_done)
    finally:
        bar.close()
    for job in jobs:   # an executor that lost a job without reporting it: say so rather than drop the run
        results.setdefault(job.key, RunResult(job.run_dir, None, "the executor reported no outcome for this run",
                                              "the executor reported no outcome for this run"))
    return [results[d] for d in dirs]


def _here(work: Callable[[dict, str], dict], job: Job) -> Outcome:
    """One job in this process (torch keeps this process' threads), its exception caught as a worker's is."""
    try:
        row = work(dict(job.params), job.run_dir)
        if not isinstance(row, dict):
            raise TypeError(f"the job function must return a dict; got {type(row).__name__}")
        return Outcome(job, row, None)
    except Exception:  # noqa: BLE001 - reported as this run's failure, the other runs go on
        return Outcome(job, None, traceback.format_exc())


def _bar(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, disable=not enabled, desc="runs", unit="run", file=sys.stderr, dynamic_ncols=True)
