"""Does the crossing time of the state-distinguishing subspace predict where models fail on longer
sequences? (docs/drift.md)

Trains state-dependent (tanh RNN, state-gated RNN) and affine models (linear RNN, token-gated RNN,
Mamba, negative Mamba, AUSSM, S4D) on the group word problems C2, C6 and S3 (aligned CoT, length
curriculum up to 60), evaluates them up to length 1000, measures q(t) and Tcross on the last
layer's hook_state (interp.analysis.error_control), and reports mp, Tcross (and the excess-drift Tcross) and
the Pearson r of log mp and log Tcross (all runs, affine models per group), plus Theorem-1 checks.

    python examples/error_control.py [--quick] [--steps N] [--models a,b] [--groups C6,S3] [--seeds 0,1]
    (finished runs in --out are reused; delete a run directory to retrain it)
"""

import argparse, time  # noqa: E401
from pathlib import Path
import torch

import models
from interp.analysis import error_control as ec
from interp.report import dynamics as fd
from interp.report.evaluation import accuracy_vs_length
from interp.training import checkpoint as ckpt
from interp.analysis.dynamics import jacobians, spectra
from interp.report.html import Table, Text, write_report
from interp.tasks import make_task
from interp.training.train import TrainConfig, TrainingDiverged, train

STATE_DEPENDENT = ["tanh_rnn", "state_gated_rnn"]
AFFINE = ["linear_rnn", "token_gated_rnn", "mamba", "negative_mamba", "aussm", "s4d"]
SSMS = {"mamba", "negative_mamba", "aussm", "s4d", "mamba3"}
TRAIN_LENGTH = 60


names = lambda text: [part for part in text.split(",") if part]  # noqa: E731


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="toy sizes and steps (a smoke test; numbers mean nothing)")
    p.add_argument("--steps", type=int, default=None, help="training steps per run (default 400; 30 with --quick)")
    p.add_argument("--models", type=names, default=STATE_DEPENDENT + AFFINE)
    p.add_argument("--groups", type=names, default=["C2", "C6", "S3"])
    p.add_argument("--seeds", type=lambda t: [int(s) for s in names(t)], default=[0])
    p.add_argument("--out", type=Path, default=None, help="default runs/error_control(-quick)")
    args = p.parse_args(argv)
    if set(args.models) - set(models.list_models()):
        p.error(f"argument --models: unknown models in {args.models}; choose from {models.list_models()}")
    args.steps = args.steps or (30 if args.quick else 400)
    args.out = args.out or Path("runs/error_control-quick" if args.quick else "runs/error_control")
    args.lengths = [60, 120] if args.quick else [60, 100, 200, 500, 1000]
    args.n = dict(n_fit=32, n_drift=16, n_eval=32, n_jac=2) if args.quick else dict(n_fit=256, n_drift=64, n_eval=256)
    return args


def run_one(name, group, seed, args):
    """Train (or reuse) one run and analyse it; returns (summary row, ErrorControl, model, task)."""
    task = make_task(group, format="acot")
    ssm = name in SSMS
    size = dict(d_model=8 if args.quick else (32 if ssm else 64), n_layers=1) | (dict(d_state=4) if ssm else {})
    cfg = models.preset_config(name, vocab_size=task.vocab_size, **size)
    tc = TrainConfig(steps=args.steps, batch_size=16 if args.quick else (64 if ssm else 128), lr=1e-2,
                     warmup=min(30, args.steps // 10), train_length=TRAIN_LENGTH, curriculum=True,
                     curriculum_patience=1, eval_every=10, eval_size=64, checkpoint_every=args.steps, seed=seed)
    started, run_dir = time.perf_counter(), args.out / f"{group}-{name}-s{seed}"
    result = train(cfg, task, tc, run_dir, resume=True, progress=False, label=name)
    trained = time.perf_counter() - started
    analysis = ec.analyze(result.model, task, TRAIN_LENGTH, args.lengths, seed=seed, name=name, **args.n)
    row = {"model": name, "kind": "state-dependent" if name in STATE_DEPENDENT else "affine", "group": group,
           "seed": seed, **{k: v for k, v in analysis.summary().items() if k not in ("name", "accuracy", "site")},
           **{f"acc@{t}": a for t, a in analysis.evaluation.final_accuracy.items()},
           "train_s": round(trained, 1), "analysis_s": round(time.perf_counter() - started - trained, 1)}
    ckpt.write_json(run_dir / "error_control.json", row)
    return row, analysis, result.model, task


def correlations(rows, key="tcross"):
    """Pearson r of log mp vs log Tcross (or tcross_excess) over subsets of runs."""
    subsets = {"all runs": rows, "affine, all groups": [r for r in rows if r["kind"] == "affine"]}
    for group in dict.fromkeys(r["group"] for r in rows):
        subsets[f"affine, {group}"] = [r for r in rows if r["kind"] == "affine" and r["group"] == group]
    pearson = {label: fd.loglog_pearson([x["mp"] or float("nan") for x in subset], [x[key] for x in subset])
               for label, subset in subsets.items()}
    return [{"Tcross": key, "runs": label, "pearson_r_loglog": r, "placed": n, "total": len(subsets[label])}
            for label, (r, n) in pearson.items()]


def main(argv=None):
    args = parse(argv)
    torch.set_num_threads(1)
    started, rows, analyses, diverged = time.perf_counter(), [], {}, []
    for group in args.groups:
        for name in args.models:
            for seed in args.seeds:
                try:
                    row, analysis, model, task = run_one(name, group, seed, args)
                except TrainingDiverged as error:
                    diverged.append(f"{group} {name} seed {seed}: {error}")
                    print(diverged[-1], flush=True)
                    continue
                rows.append(row)
                analyses[(group, name, seed)] = (analysis, model, task)
                print(f"{group:>3} {name:<16} seed {seed}: mp {row['mp']!s:>5}  Tcross {row['tcross']:8.1f}"
                      f"{' (est)' if row['tcross_estimated'] else '      '}  excess {row['tcross_excess']:9.1f}  q@60 {row['q_train']:.3f}  "
                      f"acc@{args.lengths[-1]} {row[f'acc@{args.lengths[-1]}']:.3f}  ({row['train_s']} s)", flush=True)
    corr, theorem = correlations(rows) + correlations(rows, "tcross_excess"), theorem1_rows(analyses, args)
    print(*corr, *theorem, sep="\n")
    report = write(args, rows, corr, theorem, analyses, diverged)
    ckpt.write_json(args.out / "summary.json", {"runs": rows, "correlations": corr, "theorem1": theorem,
                                                "diverged": diverged, "wall_s": round(time.perf_counter() - started, 1)})
    print(f"report: {report}  ({time.perf_counter() - started:.0f} s)")
    return rows, corr, theorem


def theorem1_rows(analyses, args):
    """Theorem 1 along a returning word, on the first seed's runs of the last group."""
    group, seed, out = args.groups[-1], args.seeds[0], []
    for (g, name, s), (analysis, model, task) in analyses.items():
        layer = ec.recurrent_layer(model, analysis.site)
        if (g, s) == (group, seed) and layer is not None:
            out.append({"model": name, "group": group, **ec.theorem1_on_run(model, task, analysis.subspace, layer)})
    return out


def write(args, rows, corr, theorem, analyses, diverged):
    sections = [Text(__doc__.split("\n\n")[1] + f"\n\nSteps {args.steps}; lengths {args.lengths}; seeds {args.seeds}."
                     + ("\n\n--quick smoke run: the numbers mean nothing." if args.quick else ""), heading="Setup"),
                Table(corr, heading="Pearson r of log mp and log Tcross"),
                fd.tcross_vs_mp(rows, title="Tcross vs mp, all runs"),
                fd.tcross_vs_mp([r | {"tcross": r["tcross_excess"], "tcross_estimated": r["tcross_excess_estimated"]}
                                 for r in rows], title="Excess-drift Tcross vs mp"),
                Table(fd.definition_correlations(rows), heading="Pearson r of log mp and log Tcross, per definition"),
                fd.tcross_vs_mp_by_definition(rows),
                Table([{k: v for k, v in r.items() if not isinstance(v, dict)} for r in rows], heading="Runs"),
                Text("\n\n".join(diverged) or "none", heading="Diverged runs"),
                Table(theorem, heading="Theorem 1: ||Q^T J_word Q - I||_2")]
    for group in args.groups:
        picked = {f"{n} s{s}": analyses[(g, n, s)][0] for (g, n, s) in analyses if g == group}
        sections += [accuracy_vs_length({k: a.evaluation for k, a in picked.items()}, 0.9, TRAIN_LENGTH,
                                                title=f"{group}: final-state accuracy vs length"),
                     fd.drift_curves({k: a.drift for k, a in picked.items()}, {k: a.tcross for k, a in picked.items()},
                                     TRAIN_LENGTH, title=f"{group}: drift ratio q(t)")]
    for (g, name, s), (analysis, model, task) in analyses.items():
        if (g, s) != (args.groups[-1], args.seeds[0]):
            continue
        sections.append(fd.state_projection(analysis.snapshots, title=f"{g} {name}: states on U"))
        layer = ec.recurrent_layer(model, analysis.site)
        if layer is not None and name in ("tanh_rnn", "token_gated_rnn"):
            tokens = task.sample(1, TRAIN_LENGTH, 12345).tokens
            spec = spectra(jacobians(model, tokens, layer), analysis.subspace.basis)
            sections.append(fd.jacobian_spectra(spec, title=f"{g} {name}: spectrum of Q^T J_t Q"))
    return write_report(args.out / "report.html", "Error control: Tcross vs mp", sections)


if __name__ == "__main__":
    main()
