"""`interp drift RUN_DIR`: the error-control analysis of a trained run (see `interp.analysis.error_control`).

Prints U's rank and M, the headline Tcross (measured or estimated; `--definition`, `--tau`) and
every definition's, q at the training length and at the horizon,
the contraction on U and accuracy by length with mp; writes an HTML report (default
RUN_DIR/drift.html) and RUN_DIR/drift.json. Kept free of heavy imports so `interp --help` stays fast.
The analysis is interp.analysis.error_control, the report interp.report.dynamics.

Several run directories, or --executor local|ray (--workers N, --address A): each run is one job
(`drift_job`, interp.sweep.runs.run_each) on worker processes or a Ray cluster, writing its own
RUN_DIR/drift.html and drift.json, identical to what `interp drift RUN_DIR` writes in a process with
one torch thread (docs/scaling-runs.md); a run that fails is one error line and the others go on.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from interp.cli.args import (add_scale_out_arguments, check_out, check_run_free, check_runs, check_workload,
                            device_name, executor_from_args, fail, length_list, output_path, over_runs, real,
                            run_directory, seed_value, sequence_count, step_count)

DRIFTS = ("pooled", "excess", "time", "same")   # interp.analysis.error_control.DRIFTS (kept light)


def statistic(text: str) -> str | float:
    if text == "mean":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be 'mean' or a percentile in [0, 100]; got {text!r}") from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"must be 'mean' or a percentile in [0, 100]; got {text!r}")
    return value


TAU = real(0, 1e6, "q = R / M is the drift in units of the centroids' separation, and a nearest-centroid read-out "
                   "misreads past 0.5", low_open=True)


def tau_value(text: str) -> float | str:
    if text in ("calibrated", "theory"):
        return text
    try:
        return TAU(text)
    except argparse.ArgumentTypeError as error:
        raise argparse.ArgumentTypeError(f"{error} (or 'calibrated' or 'theory')") from None


tau_value.limit = TAU.limit
statistic.limit = "at most 100: a percentile"


def add_parser(sub) -> None:
    drift = sub.add_parser(
        "drift", help="state-distinguishing subspace, drift q(t), Tcross, contraction and mp of a run",
        description="Error-control analysis of a trained run: centroids and the subspace U from "
                    "in-distribution sequences (the training length), the drift ratio q(t) on "
                    "sequences of the longest length, Tcross, the contraction on U and accuracy by "
                    "length. Writes an HTML report and drift.json. Several run directories run one after "
                    "another, or as parallel jobs with --executor local|ray (one job per run; "
                    "docs/scaling-runs.md).")
    drift.add_argument("run_dir", type=run_directory, nargs="+", metavar="run_dir",
                       help="one or more run directories written by `interp train`")
    drift.add_argument("--lengths", type=length_list, default=[60, 100, 200, 500, 1000],
                       help="evaluation lengths; the longest is the drift horizon (default 60,100,200,500,1000)")
    drift.add_argument("--site", default=None,
                       help="hook to analyse (default: the last block's mixer.hook_state, else hook_resid_post)")
    drift.add_argument("--n-fit", type=sequence_count, default=256, help="in-distribution sequences for U")
    drift.add_argument("--n-drift", type=sequence_count, default=64, help="long sequences for q(t)")
    drift.add_argument("--n", type=sequence_count, default=256, help="sequences per evaluated length")
    drift.add_argument("--definition", choices=DRIFTS, default="pooled",
                       help="the headline Tcross's drift: pooled centroids (default), excess over the "
                            "in-distribution level, time-indexed centroids against the initial "
                            "separation (the paper's reading) or against the same step's separation "
                            "(same); every reading is printed and in the report")
    drift.add_argument("--tau", type=tau_value, default=0.5,
                       help="threshold on q: a number (default 0.5), 'calibrated' (the read-out's own) or "
                            "'theory' (isotropic Gaussian classes in U's dimension misread 10%%)")
    drift.add_argument("--reference-step", type=step_count, default=None,
                       help="step of the separation M_ref of the time-indexed drift (default: the start)")
    drift.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                       help="skip calibrating tau from the read-out")
    drift.add_argument("--direction", choices=("random", "nearest"), default="random",
                       help="direction the calibration moves states along U (default random)")
    drift.add_argument("--statistic", type=statistic, default="mean",
                       help="spread R(t): 'mean' or a percentile such as 90")
    drift.add_argument("--normalize", action="store_true",
                       help="divide every state by its norm first (the view of a scale-invariant read-out)")
    drift.add_argument("--seed", type=seed_value, default=None, help="data seed (default: the run's)")
    drift.add_argument("--out", type=output_path, default=None,
                       help="HTML report (default RUN_DIR/drift.html; one run only)")
    drift.add_argument("--device", type=device_name, default="cpu", help="torch device")
    add_scale_out_arguments(drift, unit="run directory")
    drift.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        executor = executor_from_args(args, "drift")
    except ValueError as error:
        return fail("drift", error)
    options = dict(site=args.site, n_fit=args.n_fit, n_drift=args.n_drift, n_eval=args.n, tau=args.tau,
                   statistic=args.statistic, normalize=args.normalize, definition=args.definition,
                   reference_step=args.reference_step, calibrate=args.calibrate, direction=args.direction)
    if args.seed is not None:
        options["seed"] = args.seed
    if len(args.run_dir) > 1 or executor is not None:
        refused = check_runs("drift", args.run_dir, args.out if len(args.run_dir) > 1 else None) or next(
            (status for run_dir in args.run_dir
             if (status := check_out("drift", args.out or run_dir / "drift.html", file=True,
                                     flag="--out" if args.out else "run_dir")) is not None), None)
        if refused is not None:
            if executor is not None:
                executor.close()
            return refused
        return over_runs("drift", drift_job, args.run_dir, executor,
                         dict(lengths=args.lengths, out=args.out and str(args.out), device=args.device, **options),
                         show)
    from models.storage.paths import DirectoryLocked

    run_dir = args.run_dir[0]
    out = args.out or run_dir / "drift.html"
    refused = check_run_free("drift", run_dir) or check_out("drift", out, file=True,
                                                            flag="--out" if args.out else "run_dir")
    if refused is not None:
        return refused
    try:
        result = drift_checked(run_dir, args.lengths, out, device=args.device, **options)
    except (ValueError, TypeError, KeyError, OSError, DirectoryLocked) as error:
        return fail("drift", reference_hint(run_dir, error))
    show({"summary": result.summary(), "out": str(out)}, run_dir)
    return 0


def show(row: dict, run_dir: Path) -> None:
    summary = row["summary"]
    for key, value in summary.items():
        if not isinstance(value, dict):
            print(f"{key:>18}: {value}")
    readings = summary.get("readings") or []
    if readings:
        print(f"{'reading':>28}  {'tau':>7}  {'Tcross':>9}  tests")
        for reading in readings:
            cross = f"{reading['tcross']:.0f}" + ("~" if reading["tcross_estimated"] else "")
            print(f"{reading['definition']:>28}  {reading['tau']:7.3f}  {cross:>9}  {reading['tests']}")
        print("(~ estimated from the drift rate; nan: undefined, e.g. no calibration or no burn-in end)")
    print(f"wrote {row['out']} and {run_dir / 'drift.json'}")


def drift_checked(run_dir: str | Path, lengths, out: str | Path | None = None, device: str = "cpu", **options):
    """`drift_run` after the checks `interp drift` makes first: the run's task has a state at every
    step (task_misfit) and the sequences fit in memory (check_workload); ValueError naming what is wrong."""
    config, task = run_task(Path(run_dir))
    unfit = task_misfit(Path(run_dir), task)
    if unfit is not None:
        raise ValueError(unfit)
    horizon = max(lengths)
    for flag, n, length, length_flag in (("--n-fit", options.get("n_fit", 256), config["train"]["train_length"], None),
                                         ("--n-drift", options.get("n_drift", 64), horizon, "--lengths"),
                                         ("--n", options.get("n_eval", 256), horizon, "--lengths")):
        check_workload(task, n, length, flag, length_flag)
    return drift_run(run_dir, lengths, out, device=device, **options)


def drift_job(params: dict, run_dir: str) -> dict:
    """The executor's job for one run (interp.sweep.runs.run_each): drift_checked(run_dir, **params),
    its report at params["out"] (default RUN_DIR/drift.html); {"summary": drift.json's content,
    "out": the report's path}. An error about the reference step carries reference_hint's advice."""
    from models.storage.paths import DirectoryLocked

    params = dict(params)
    out = Path(params.pop("out", None) or Path(run_dir) / "drift.html")
    try:
        result = drift_checked(Path(run_dir), out=out, **params)
    except (ValueError, TypeError, KeyError, OSError, DirectoryLocked) as error:
        hint = reference_hint(Path(run_dir), error)
        if hint != str(error):
            raise ValueError(hint) from error
        raise
    return {"summary": result.summary(), "out": str(out)}


def run_task(run_dir: Path):
    """(config, task) of a run directory (ValueError, FileNotFoundError naming what is wrong)."""
    from interp.tasks import make_task
    from interp.training import checkpoint as ckpt

    config = ckpt.read_config(run_dir)
    try:
        return config, make_task(config["task"]["name"], **config["task"].get("options", {}))
    except (KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"{run_dir}/config.json: its 'task' entry is not a task record "
                         f"({{'name': ..., 'options': {{...}}}}): {error!r}") from None


def task_misfit(run_dir: Path, task) -> str | None:
    """Why the run's task cannot be analysed (what drift needs), or None when it can."""
    if hasattr(task, "n_states"):
        return None
    other = " (`interp patch` analyses retrieval runs: AR, MQAR, ATR)" if task.name in ("AR", "MQAR", "ATR") else ""
    return (f"{run_dir} was trained on {task.name!r}, which has no group-valued state at every step; interp drift "
            "needs a run of a task that has one (its centroids and subspace U are those states'): a group word "
            f"problem such as S3, Z5 or A4xZ5, REPL or PFSA{other}")


def reference_hint(run_dir: Path, error: Exception) -> str:
    """The error, and for a time-indexed separation of 0 (the model's states of two classes coincide at
    the reference step) what the drift needs: a --reference-step from which the tokens seen so far
    determine the state (on REPL / PFSA not before the first reveal)."""
    text = str(error)
    if "reference_step" not in text or not ("M_ref = 0" in text or "class present" in text):
        return text
    try:
        config, task = run_task(run_dir)
        length = config["train"]["train_length"]
        step = determined_from(task, length, int(config.get("seed", 0)))
    except (ValueError, TypeError, KeyError, OSError):
        return text
    where = (f"on {task.name} at length {length} the tokens determine the state from step {step} on: pass "
             f"--reference-step {step} or later" if step is not None else
             f"on {task.name} at length {length} the tokens never determine the state in 256 samples")
    return (f"argument --reference-step: {text}. The time-indexed drift needs the states of different classes to "
            f"differ at its reference step (default: the first step with the most classes present); {where}")


def determined_from(task, length: int, seed: int = 0, n: int = 256) -> int | None:
    """The first step (1-based position) from which, in n sampled sequences, any two sequences with
    the same tokens so far have the same state (the state is readable from the tokens at all); None
    when that never holds to the end."""
    import numpy as np

    batch = task.sample(n, length, seed)
    tokens = batch.tokens.numpy()                                                    # [N, T]
    states = batch.states.reshape(n, tokens.shape[1], -1).numpy()                    # [N, T, S]
    prefix, first = np.zeros(n, dtype=np.int64), None
    for t in range(tokens.shape[1]):
        _, prefix = np.unique(np.stack([prefix, tokens[:, t]], 1), axis=0, return_inverse=True)
        prefix = prefix.reshape(-1)                                                  # [N] id of tokens[:, :t+1]
        pairs = np.unique(np.column_stack([prefix, states[:, t]]), axis=0)
        determined = len(pairs) == len(np.unique(prefix))
        first = (first or t + 1) if determined else None
    return first


def drift_run(run_dir: str | Path, lengths, out: str | Path | None = None,
              device: str = "cpu", **options):
    """`interp drift`: analyse a run, write the HTML report (default RUN_DIR/drift.html) and
    RUN_DIR/drift.json (the summary), both under the run directory's lock (models.storage.paths.locked)."""
    from interp.analysis.error_control import analyze, load_run
    from interp.report.dynamics import write_drift_report
    from interp.training import checkpoint as ckpt
    from models.storage.paths import inside, locked

    model, task, config = load_run(run_dir, device)
    options.setdefault("name", config["model"]["mixer"])
    options.setdefault("seed", int(config.get("seed", 0)))
    result = analyze(model, task, config["train"]["train_length"], lengths, **options)
    with locked(run_dir, "run directory"):
        write_drift_report(result, out or inside(run_dir, "drift.html"), model=model, task=task)
        ckpt.write_json(inside(run_dir, "drift.json"), result.summary())
    return result
