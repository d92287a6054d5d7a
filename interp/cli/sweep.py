"""`interp sweep SPEC`: run a sweep spec (a grid, or the N* / kappa study) locally or on Ray.

    interp sweep spec.yaml --out sweeps/x [--executor local|ray] [--workers N] [--address ADDR]

Re-running the same command resumes: finished trials are skipped. An n_star spec also writes
n_star.jsonl, kappa.jsonl and report.html into --out. Exit status 0 when every trial finished,
1 when some failed (listed), 2 for a bad spec or argument.

A spec runs code; run only specs you trust, as you would a script:
  - a .py spec is executed as Python (to define SPEC) when it is loaded;
  - "trial": "module:function" imports that module (running its import-time code) in this
    process and in every worker, then calls the function for each trial. The default,
    interp.analysis.sample_efficiency:train_trial, runs only this toolkit's code.
A .json or .yaml spec with the default trial executes nothing but the toolkit.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from interp.cli.args import count, fail, gpu_share, output_path, real, worker_count

CPUS = real(0, 4096, "the CPUs of a large Ray cluster")
RETRIES = count(100, "a trial that kills its worker every time is retried no more", low=0)


def add_executor_arguments(parser: argparse.ArgumentParser) -> None:
    """--out, --executor, --workers, --address, --cpus-per-trial, --gpus-per-trial, --max-retries."""
    parser.add_argument("--out", type=output_path, required=True, help="sweep directory (created, or resumed)")
    parser.add_argument("--executor", choices=("local", "ray"), default="local",
                        help="local: a process pool (default); ray: Ray core tasks")
    parser.add_argument("--workers", type=worker_count, default=1,
                        help="local: worker processes; ray: CPUs of the local cluster it starts (default 1)")
    parser.add_argument("--address", default=None,
                        help="ray: join the cluster at this address ('auto', 'ray://host:10001'; it listens "
                             "as that cluster is configured) instead of starting a local one, which listens "
                             "on 127.0.0.1 only")
    parser.add_argument("--cpus-per-trial", type=CPUS, default=1.0, help="ray: num_cpus per trial")
    parser.add_argument("--gpus-per-trial", type=gpu_share, default=0.0, help="ray: num_gpus per trial")
    parser.add_argument("--max-retries", type=RETRIES, default=2,
                        help="reruns of a trial whose worker died (default 2)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--no-report", action="store_true", help="n_star specs: skip report.html")


def add_parser(sub) -> None:
    parser = sub.add_parser("sweep", help="run a sweep spec (grid or N* study), resumable, local or Ray",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", type=Path, help="the spec: .json, .yaml or .py (SPEC = {...}); see interp.sweep.spec")
    add_executor_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from interp.sweep.spec import load_spec

    try:
        spec = load_spec(args.spec)
    except ValueError as error:
        return fail("sweep", error)
    return run_loaded(spec, args, "sweep")


def run_loaded(spec, args: argparse.Namespace, command: str) -> int:
    """Run a checked spec with the executor the arguments name; print the summary."""
    from interp.sweep.executors import make_executor
    from interp.sweep.run import TrialsFailed, run_spec
    from interp.training.preflight import Refused

    try:
        executor = make_executor(args.executor, args.workers, args.max_retries, address=args.address,
                                 num_cpus=args.cpus_per_trial, num_gpus=args.gpus_per_trial)
    except ValueError as error:
        return fail(command, error)
    try:
        outcome = run_spec(spec, executor, args.out, progress=not args.no_progress)
    except Refused as error:   # --out is a file, unwritable, a name too long
        return fail(command, f"argument --out: {error}")
    except TrialsFailed as error:
        _print_failures(error.failures)
        print(f"the N* search stopped: fix the failing trials and re-run the same command to resume ({args.out})")
        return 1
    except (ValueError, RuntimeError) as error:   # a bad spec or output; a Ray cluster that cannot start
        return fail(command, error)
    except OSError as error:   # --out on a file system the preflight could not foresee failing
        return fail(command, f"argument --out: {error}")
    finally:
        executor.close()
    print(f"{len(outcome.rows)} trial rows in {args.out / 'results.jsonl'}")
    if spec.kind == "n_star":
        _print_kappa(outcome.kappa)
        if not args.no_report:
            from interp.report.sample_efficiency import write_sample_efficiency_report

            path = write_sample_efficiency_report(args.out / "report.html", [r.row() for r in outcome.n_star],
                                                  outcome.kappa, outcome.rows)
            print(f"report: {path}")
    if outcome.failures:
        _print_failures(outcome.failures)
        return 1
    return 0


def _print_failures(failures: list[dict]) -> None:
    print(f"{len(failures)} trial(s) failed:")
    for failure in failures:
        last = (failure["error"] or "").strip().splitlines()[-1:] or ["?"]
        print(f"  {failure['trial_id']} (attempts {failure['attempts']}): {last[0]}")


def _print_kappa(rows: list[dict]) -> None:
    for row in rows:
        ood = ", ".join(f"{k[8:]}: {v:.2f}" for k, v in row.items() if k.startswith("ood_acc_"))
        print(f"  {row['model']:>12} {row['task']} {row['format']:>7}  N*_joint {row['n_star_joint']}  "
              f"sum N*_n {row['sum_n_star']}  kappa {row['kappa']:.2f} (bounds {row['kappa_low']:.2f} .. "
              f"{row['kappa_high']:.2f})  OOD acc {ood}")
