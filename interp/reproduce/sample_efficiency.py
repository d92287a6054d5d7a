"""Sample efficiency and the sharing coefficient (seed 002, arXiv 2602.18333; docs/sample-efficiency.md):
N*_n (the fewest training sequences of length n from which some lr x seed reaches validation loss
below a threshold) per length and N*_joint for all lengths mixed, kappa = sum_n N*_n / N*_joint,
and the joint model's accuracy beyond the longest length. This reproduction has no fixed list of
runs: the N* search (interp.analysis.sample_efficiency) decides them, run as a resumable sweep
(interp.sweep, local processes) under OUT/sweep. Finished trials are committed as table rows under
results/reproduce/sample-efficiency-<scale>/ (`commit`; interp.reproduce.committed_sweeps) and seed
every later run's sweeps, so a search spread over sessions trains each trial once.

Scales with a Transformer budget search ("quick", "medium"): the Transformer's depth, width, lr, warmup
and steps are not fixed but the cheapest budget of an explicit grid (interp.reproduce.budget) whose
trial converges on the budget format (CoT, where the seed says Transformers do best) at the longest
length with the search's largest training set (N = n_max, or the data's capacity); the Transformer's
N* sweep then runs at that budget under OUT/sweep-transformer, the other models' under OUT/sweep. Where
no budget converges, the Transformer has no N* ("did not fit"), with every budget tried."""

from __future__ import annotations

import math
from pathlib import Path

from interp.analysis import sample_efficiency as se
from interp.reproduce import budget, committed_sweeps
from interp.reproduce import verdicts as rule
from interp.reproduce.engine import Outcome, Plan, Run, size
from interp.reproduce.results import results_dir
from interp.report import sample_efficiency as figures
from interp.report.html import Table
from interp.sweep.executors import make_executor
from interp.sweep.jobs import Outcome as JobOutcome
from interp.sweep.run import TrialsFailed, run_spec
from interp.sweep.spec import load_spec
from interp.sweep.table import ResultTable, trial_id

NAME = "sample-efficiency"
TITLE = "Sample efficiency: N* per length and the sharing coefficient kappa"
SEED_002 = "002_f8265f3efe5ff6aa.txt"
RNNS = ("lstm", "dense_ssm", "mamba")
SHARED = 1.5   # kappa above this reads as a shared mechanism, below 1 / SHARED as interference
OOD_MIN = 2   # conditions needed on each side of SHARED before the kappa-OOD claim gets a verdict

# The medium Transformer budgets (depth / width / lr / warmup / steps per trial), tried cheapest first: depth 2 / 4 / 6
# and width 64 / 128 our choice up to seed 002's 6-layer GPT-2-style Transformer; lr within the paper profile's
# 1e-4..1e-3; warmup our choice; 2000-4000 steps per trial our choice (the cpu profile's 400 converged nowhere).
MEDIUM_BUDGETS = [dict(n_layers=2, d_model=64, n_heads=4, lr=1e-3, warmup=100, steps=2000),
                  dict(n_layers=4, d_model=64, n_heads=4, lr=1e-3, warmup=100, steps=2000),
                  dict(n_layers=6, d_model=128, n_heads=8, lr=3e-4, warmup=200, steps=4000)]

SCALE = {   # "cpu" and "paper" are examples/sample_efficiency.py's "tiny" and "paper" scales
    "quick": dict(models=["lstm", "transformer"], tasks=["Z5"], formats=["acot"], min_length=2, max_length=3,
                  lrs=[0.01], seeds=[0], search={"n0": 8, "resolution": 0.5, "n_max": 16}, width=8, layers=1,
                  train={"steps": 20, "batch_size": 8, "val_size": 16, "eval_every": 10, "val_threshold": 0.05},
                  workers=1, budget=[dict(n_layers=1, d_model=8, n_heads=2, lr=0.01, warmup=2, steps=20),
                                     dict(n_layers=1, d_model=16, n_heads=2, lr=0.01, warmup=2, steps=20)],
                  budget_format="acot"),
    # seeds 0-2 at cpu and medium (issue 37: a verdict needs the claim's direction in >= 2 seeds, and the
    # sample-efficiency claims run >= 3; seed 2 added 2026-12-07, not trained yet at medium)
    "cpu": dict(models=["lstm", "transformer"], tasks=["Z5"], formats=["outcome", "acot"], min_length=3,
                max_length=5, lrs=[0.01], seeds=[0, 1, 2], search={"n0": 32, "resolution": 0.25, "n_max": 512},
                width=16, layers=2,
                train={"steps": 400, "batch_size": 32, "val_size": 96, "eval_every": 50, "val_threshold": 0.05},
                workers=2),
    # medium (issue 26): CoT added (the seed: Transformers do best under CoT), the N* bound raised to the data's
    # capacity at length 6 (Z5: 15,625 sequences), the Transformer's budget searched (MEDIUM_BUDGETS); lengths from 4:
    # length 3 has 125 sequences (63 to train on once validation is held out), and no model of either kind found an
    # N* there in any format, so every kappa over 3..6 was a bound (2026-12-03)
    "medium": dict(models=["lstm", "transformer"], tasks=["Z5"], formats=["outcome", "cot", "acot"], min_length=4,
                   max_length=6, lrs=[0.01], seeds=[0, 1, 2], search={"n0": 32, "resolution": 0.25, "n_max": 8192},
                   width=16, layers=2,
                   train={"steps": 400, "batch_size": 32, "val_size": 96, "eval_every": 50, "val_threshold": 0.05},
                   workers=2, budget=MEDIUM_BUDGETS, budget_format="cot"),
    "paper": dict(models=["transformer", "lstm", "dense_ssm", "mamba"], tasks=["Z5", "S5"],
                  formats=["outcome", "cot", "acot"], min_length=2, max_length=10, lrs=[1e-4, 3e-4, 1e-3],
                  seeds=[0, 1, 2], search={"n0": 64, "resolution": 0.1, "n_max": 1 << 20}, width=128, layers=6,
                  train={"steps": 20000, "batch_size": 64, "val_size": 1024, "eval_every": 250,
                         "val_threshold": 0.01}, workers=2),
}


def spec(s: dict, scale: str, models=None, transformer: dict | None = None) -> dict:
    """The N* sweep spec (interp.sweep) of a scale entry s: models (default s["models"]) x tasks x formats,
    widths per model; transformer: a budget (interp.reproduce.budget grid entry) for a Transformer-only spec,
    whose lr, warmup and steps replace the scale's."""
    models = s["models"] if models is None else models
    options = {"transformer": {"d_model": s["width"], "n_layers": s["layers"], "n_heads": 4 if s["width"] >= 16 else 2},
               "lstm": {"d_model": s["width"]}, "dense_ssm": {"d_model": s["width"]},
               "mamba": {"d_model": s["width"], "d_state": 8}}
    lrs, train, name = s["lrs"], s["train"], f"sample-efficiency-{scale}"
    if transformer is not None:
        options["transformer"] = {k: transformer[k] for k in budget.MODEL_KEYS}
        lrs, name = [transformer["lr"]], f"{name}-transformer-{budget.budget_label(transformer)}"
        train = {**train, "steps": transformer["steps"], "warmup": transformer["warmup"]}
    return {"kind": "n_star", "name": name, "models": models, "tasks": s["tasks"],
            "formats": s["formats"], "min_length": s["min_length"], "max_length": s["max_length"],
            "lrs": lrs, "seeds": s["seeds"], "search": s["search"], "train": train,
            "model_options": {m: options[m] for m in models}}


def plan(scale: str) -> Plan:
    s = SCALE[scale]
    paper = scale == "paper"
    searched = bool(s.get("budget"))
    sizes = [size("models", s["models"], SEED_002 + (" (6-layer GPT-2-style Transformer, RNNs, Mamba)" if paper else "; a subset")),
             size("tasks", s["tasks"], SEED_002 + " (Z_m addition, S5)" if paper else "our choice (Z5: room for held-out data)"),
             size("formats", s["formats"], SEED_002 + " (outcome, CoT, aligned CoT)"),
             size("lengths", f"{s['min_length']}..{s['max_length']} and joint",
                  SEED_002 + " (kappa sums n = 2..L)" if paper else "our choice" + (
                      " (from 4: Z5 has 125 sequences of length 3, 63 to train on; no N* was found there in any "
                      "format, so every kappa over 3..6 was only a bound)" if scale == "medium" else "")),
             size("Transformer layers" + (" (searched)" if searched else ""),
                  "the budget search's" if searched else s["layers"],
                  SEED_002 + " (6 layers)" if paper else "our choice"),
             size("width" + (" (RNNs)" if searched else ""), s["width"]),
             size("lr x seed grid" + (" (RNNs; the Transformer: its budget's lr x these seeds)" if searched else ""),
                  f"{s['lrs']} x {s['seeds']}"),
             size("N* search (geometric from n0, then binary)", s["search"],
                  "issue 26: n_max up to the data's capacity at the longest length (CoT needs more data)"
                  if scale == "medium" else "our choice"),
             size("training per trial" + (" (RNNs; the Transformer: its budget's steps and warmup)" if searched else ""),
                  s["train"]), size("local worker processes", s["workers"])]
    others = [m for m in s["models"] if not (searched and m == "transformer")]
    settings = {"spec": spec(s, scale, others) if others else None, "workers": s["workers"]}
    if searched:
        sizes.append(size(f"Transformer budgets (cheapest first; a budget fits when its {s['budget_format']} trial at "
                          f"length {s['max_length']} with the largest training set converges)",
                          "; ".join(budget.budget_label(e) for e in s["budget"]),
                          "issue 26 and MEDIUM_BUDGETS' comment" if scale == "medium" else "our choice (smoke test)"))
        settings["budget"] = s["budget"]
    return Plan(scale, [], sizes, settings=settings)


def budget_trial(s: dict, run: Run) -> dict:
    """The trial params (se.train_trial) of a budget candidate: its format at the longest length, with the
    search's largest training set (n_max, or the data's capacity there)."""
    condition = [c for c in se.conditions(["transformer"], s["tasks"][:1], [s["budget_format"]], s["max_length"],
                                          model_options={"transformer": dict(run.model)},
                                          min_length=s["max_length"],
                                          train={**s["train"], "steps": run.train["steps"],
                                                 "warmup": run.train["warmup"]})
                 if c["length"] == s["max_length"]][0]
    capacity = se.data_capacity(condition)
    n = s["search"]["n_max"] if capacity is None else min(s["search"]["n_max"], capacity)
    return {**condition, "n": n, "lr": run.train["lr"], "seed": s["seeds"][0]}


def transformer_budget(out: Path, plan: Plan, log, train: bool = True) -> dict:
    """budget.search over the scale's Transformer budgets, one finite-data trial each under out/budget/<label>,
    its row kept in the table out/budget/results.jsonl (seeded from the committed one); train=False: a
    budget whose trial is in neither table stops the search there ("not trained yet")."""
    s = SCALE[plan.scale]
    base = Run("transformer", "transformer", s["tasks"][0], {"format": s["budget_format"]}, {},
               {"train_length": s["max_length"]}, {"model": "transformer"})
    table = ResultTable(out / "budget")
    committed_sweeps.seed_table(results_dir(NAME, plan.scale) / "budget", out / "budget")

    def obtain(run: Run) -> Outcome | None:
        params = budget_trial(s, run)
        row = table.rows().get(trial_id(params))
        if row is None and not train:
            return None
        if row is None:
            row = {**se.train_trial(params, out / "budget" / run.label), "trial_id": trial_id(params),
                   "run_dir": run.label, "attempts": 1}
            table.append(row)
        return Outcome(run, "fit" if row["converged"] else "did not fit", out / "budget" / run.label, run.train["lr"],
                       s["max_length"], row["val_accuracy"], [], row["seconds"], row["steps_run"])

    found = budget.search(budget.candidates(base, s["budget"]), obtain, log)
    chosen = next((e for e in s["budget"] if budget.budget_label(e) == found["chosen"]), None)
    return {"chosen": chosen, "search": found["rows"]}


class CommittedOnly:
    """An executor that trains nothing (reproduce(train=False)): every trial the table lacks fails as not
    trained, so an N* search whose rounds are not all in the table stops with TrialsFailed."""

    def run(self, fn, jobs, on_done) -> None:
        for job in jobs:
            on_done(JobOutcome(job, None, "not trained yet (train=False)"))

    def close(self) -> None:
        pass


def _sweep(spec_data: dict, out: Path, workers: int, progress: bool, train: bool = True):
    executor = make_executor("local", workers) if train else CommittedOnly()
    try:
        return run_spec(load_spec(spec_data), executor, out, progress=progress)
    finally:
        executor.close()


SWEEPS = ("sweep", "sweep-transformer")   # out/<name>: the RNNs' N* sweep, the Transformer's at its budget


def study(out, plan: Plan, device: str, progress: bool, log, train: bool = True) -> dict:
    """Run (or resume) the N* sweep under out/sweep (and, with a Transformer budget search, the search under
    out/budget and the Transformer's sweep at the chosen budget under out/sweep-transformer); its rows, N*s
    and kappas as JSON-able data. Each sweep directory is first seeded with the trials committed under
    results/reproduce/sample-efficiency-<scale>/ (`commit`). train=False: only committed and finished
    trials; a search they do not complete is listed under "pending"."""
    out, workers, kept = Path(out), plan.settings["workers"], results_dir(NAME, plan.scale)
    outcomes, pending, seeds_trained = [], [], {}

    def sweep(data: dict, name: str) -> None:
        committed_sweeps.seed_table(kept / name, out / name)
        try:
            outcomes.append(_sweep(data, out / name, workers, progress, train))
            return
        except TrialsFailed as error:
            if train:
                raise
            pending.append(f"the N* sweep {name} ({len(error.failures)} trials of its next round not trained)")
        # train=False: the N*s of the seeds whose trials are committed, so the report shows what they give
        # (the claims then read 'inconclusive: k of n seeds trained')
        have = {row.get("seed") for row in committed_sweeps.committed_rows(kept / name).values()}
        fewer = [seed for seed in data["seeds"] if seed in have]
        if fewer and len(fewer) < len(data["seeds"]):
            try:
                outcomes.append(_sweep({**data, "seeds": fewer}, out / name, workers, progress, False))
                seeds_trained[name] = {"trained": fewer, "planned": list(data["seeds"])}
            except TrialsFailed:
                pass

    if plan.settings["spec"]:
        sweep(plan.settings["spec"], SWEEPS[0])
    found = None
    if plan.settings.get("budget"):
        found = transformer_budget(out, plan, log, train)
        if found["chosen"] is not None:
            sweep(spec(SCALE[plan.scale], plan.scale, ["transformer"], found["chosen"]), SWEEPS[1])
        elif any(r["status"] == budget.NOT_TRAINED for r in found["search"]):
            pending.append("the Transformer's budget search (a budget not trained yet)")
    rows = [r for o in outcomes for r in o.rows]
    log(f"{NAME}: {len(rows)} trials, {sum(r['converged'] for r in rows)} converged"
        + (f"; pending: {'; '.join(pending)}" if pending else ""))
    return {"n_star": [r.row() for o in outcomes for r in o.n_star], "kappa": [k for o in outcomes for k in o.kappa],
            "trials": len(rows), "pending": pending, "seeds_trained": seeds_trained, **({"budget": found} if found else {})}


def commit(out: str | Path, scale: str, results: str | Path | None = None) -> dict[str, int]:
    """Merge the finished trials under out (budget, sweep, sweep-transformer) into the committed tables
    (default results/reproduce/sample-efficiency-<scale>/); {table: rows added}."""
    target = Path(results) if results is not None else results_dir(NAME, scale)
    return {name: committed_sweeps.commit_table(Path(out) / name, target / name) for name in ("budget", *SWEEPS)}


def measure(outcome, plan: Plan) -> dict:   # no fixed runs: the study measures
    return {}


def _show(value) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else (
        f"{value:.2f}" if isinstance(value, float) else str(value))


def bound(row) -> float | None:
    """kappa_low where kappa itself is unknown (NaN) and the bound is finite and positive, else None."""
    low = row.get("kappa_low")
    if isinstance(row["kappa"], float) and math.isfinite(row["kappa"]):
        return None
    return low if isinstance(low, (int, float)) and math.isfinite(low) and low > 0 else None


def carried(row) -> str:
    """'N* carried by: 4 s0, s1; 5 s0; joint s1 (of seeds 0, 1)': the seeds that converged at each N*."""
    by = row.get("carried_by") or {}
    seeds = sorted({int(s) for s in row.get("by_seed") or {}})
    return ("N* carried by: " + "; ".join(f"{n} " + (", ".join(f"s{s}" for s in c) or "none") for n, c in by.items())
            + (f" (of seeds {', '.join(map(str, seeds))})" if seeds else "")) if by else "seeds per N* not recorded"


def kappa_bracket(row, n_star_rows) -> str:
    """kappa's interval from the N* searches' brackets (each N* lies in (last failure, N*])."""
    mine = [r for r in n_star_rows if (r["model"], r["task"], r["format"], r.get("max_length"))
            == (row["model"], row["task"], row["format"], row.get("max_length"))]
    joint = next((r for r in mine if r["length"] == "joint"), None)
    parts = [r for r in mine if r["length"] != "joint"]
    if joint is None or not parts or any(r["n_star"] is None for r in parts + [joint]):
        return "-"
    low = sum(r["last_failure"] + 1 for r in parts) / joint["n_star"]
    high = sum(r["n_star"] for r in parts) / (joint["last_failure"] + 1)
    return f"[{low:.2f}, {high:.2f}] (from the N* search brackets)"


def judge(done, plan: Plan):
    kappa = plan.settings["study"]["kappa"]
    pending = plan.settings["study"].get("pending", [])
    def line(rows):
        return "; ".join(f"{r['model']} {r['task']} {r['format']}: kappa {_show(r['kappa'])}"
                         + (f" (>= {_show(bound(r))}: a lower bound, N*_joint found and some N*_n not within the search)"
                            if bound(r) is not None else "")
                         + f" (N*_joint {_show(r['n_star_joint'])}, sum N*_n {_show(r['sum_n_star'])}; {carried(r)})"
                         for r in rows) or ("no kappa yet: " + "; ".join(pending) if pending else "none")
    trained = plan.settings["study"].get("seeds_trained", {})

    def claim(quote, original, measured, verdict, rows, per_seed=None, **numbers):
        """rule.claim with one Evidence per (condition, seed): per_seed(row, seed values) -> supports; while some
        of the plan's seeds are untrained the verdict is 'inconclusive', saying what the trained seeds give."""
        items = [rule.Evidence(f"{r['model']} {r['format']} s{seed}", int(seed), per_seed(r, values) if per_seed else None)
                 for r in rows for seed, values in (r.get("by_seed") or {}).items()]
        ruled = rule.rule(verdict, items)
        seeds = sorted({e.seed for e in items})
        ruled.basis = (f"{len(rows)} condition{'s' * (len(rows) != 1)} x seed{'s' * (len(seeds) != 1)} "
                       f"{', '.join(map(str, seeds))} (N* searches; per seed its own smallest converging N)"
                       if items else rule.basis([]))
        sweeps = {SWEEPS[1] if r["model"] == "transformer" and plan.settings.get("budget") else SWEEPS[0] for r in rows}
        short = [trained[name] for name in sorted(sweeps) if name in trained]   # sweeps with seeds not trained yet
        if short:
            ruled = rule.Ruling("inconclusive", f"inconclusive: {len(short[0]['trained'])} of {len(short[0]['planned'])} "
                                f"seeds trained (seeds {short[0]['trained']} of {short[0]['planned']}; the rest not "
                                f"trained yet); with the seeds trained the rule gives: {ruled.reason}", ruled.basis)
        return rule.claim(SEED_002, quote, original, measured, "", ruling=ruled, **numbers)

    def side(low_ok: bool):
        """per_seed for a claim on kappa > SHARED (low_ok) or <= SHARED: a seed's kappa, or its bound where it decides."""
        def supports(_row, v):
            value, low, high = (v.get(k, math.nan) for k in ("kappa", "low", "high"))
            if math.isfinite(value):
                return (value > SHARED) == low_ok
            if math.isfinite(low) and low > SHARED:
                return low_ok
            if math.isfinite(high) and high <= SHARED:
                return not low_ok
            return None
        return supports

    def numbers(rows):
        known_rows = [r for r in rows if isinstance(r["kappa"], float) and math.isfinite(r["kappa"])]
        return {"decides": "; ".join(f"{r['model']} {r['format']} kappa {_show(r['kappa'])}" for r in known_rows)
                or "no kappa", "interval": "; ".join(f"{r['model']} {r['format']} {kappa_bracket(r, n_star)}"
                                                      for r in known_rows)}

    n_star = plan.settings["study"]["n_star"]
    transformer = [r for r in kappa if r["model"] == "transformer"]
    rnn = [r for r in kappa if r["model"] in RNNS and r["format"] in ("outcome", "acot")]
    known = lambda rows: [r for r in rows if isinstance(r["kappa"], float) and math.isfinite(r["kappa"])]  # noqa: E731

    def verdict(rows, ok, bound_decides):
        """ok(kappa) per row with a kappa; a row with only a lower bound counts where bound_decides(bound) is
        "ok" or "not ok" (a bound above the sharing threshold settles kappa > SHARED), else it is left out."""
        judged = [ok(r["kappa"]) for r in known(rows)]
        judged += [bound_decides(bound(r)) == "ok" for r in rows if r not in known(rows) and bound(r) is not None
                   and bound_decides(bound(r)) is not None]
        if not judged:   # some N* never converged within the search's bound, or (train=False) was not searched yet;
            # a lower bound that decides nothing is a measurement too little to settle the claim, not a failure to fit
            undecided = any(bound(r) is not None for r in rows)
            return "inconclusive" if plan.settings["study"].get("pending") or undecided else "did not fit"
        settled_all = len(judged) == len(rows)
        return ("reproduces" if all(judged) and settled_all else "partly reproduces" if any(judged)
                else "does not reproduce")

    above = lambda low: "ok" if low > SHARED else None          # noqa: E731  kappa >= low > SHARED
    contradicts = lambda low: "not ok" if low > SHARED else None  # noqa: E731

    searched = plan.settings["study"].get("budget")
    note = ""
    if searched:
        tried = [r for r in searched["search"] if r["status"] not in (budget.NOT_TRIED, budget.NOT_TRAINED)]
        note = (f"; Transformer budget search ({len(tried)} of {len(searched['search'])} budgets tried, cheapest first): "
                + ", ".join(f"{r['budget']} {r['status']} (val acc {_show(r['in-dist acc'])})" for r in tried)
                + (f"; chosen: {budget.budget_label(searched['chosen'])}" if searched["chosen"] else
                   "; stopped at a budget not trained yet" if any(r["status"] == budget.NOT_TRAINED
                                                                  for r in searched["search"]) else "; none fit"))
    claims = [claim("Transformers show a low sharing coefficient (kappa ~ 1 or kappa < 1) in every task format, "
                    "meaning they learn length-specific solutions in isolation.",
                    "트랜스포머는 모든 작업 형식에서 낮은 공유 계수(κ ≈ 1 또는 κ < 1)를 보입니다. 이는 이들이 길이 특화된 "
                    "솔루션을 고립적으로 학습함을 나타냅니다.", line(transformer) + note,
                    verdict(transformer, lambda k: k <= SHARED, contradicts), transformer, side(False), **numbers(transformer)),
              claim("Recurrent models show a high sharing coefficient (kappa >> 1) in their preferred regimes "
                    "(Outcome and ACoT).", "순환 모델은 선호하는 체제(Outcome 및 ACoT)에서 높은 공유 계수(κ ≫ 1)를 "
                    "나타냅니다.", line(rnn), verdict(rnn, lambda k: k > SHARED, above), rnn, side(True), **numbers(rnn))]
    ood = [r for r in known(kappa) if any(k.startswith("ood_acc_") for k in r)]
    pairs = [(r["kappa"], max(v for k, v in r.items() if k.startswith("ood_acc_") and isinstance(v, float)
                              and math.isfinite(v)) if any(k.startswith("ood_acc_") and isinstance(v, float)
                                                           and math.isfinite(v) for k, v in r.items()) else math.nan)
             for r in ood]
    pairs = [(k, a) for k, a in pairs if math.isfinite(a)]
    high = [a for k, a in pairs if k > SHARED]
    low = [a for k, a in pairs if k <= SHARED]
    ood_verdict = ("inconclusive" if min(len(high), len(low)) < OOD_MIN else "reproduces" if min(high) > max(low)
                   else "does not reproduce")
    pooled = None if ood_verdict == "inconclusive" else ood_verdict == "reproduces"
    claims.append(claim("Correlation with OOD: the paper finds a strong correlation between a high sharing "
                        "coefficient and generalisation to unseen sequence lengths; models with a low sharing coefficient "
                        "fail to extrapolate.", "OOD와의 상관관계: 논문은 높은 공유 계수와 보지 못한 시퀀스 길이에 대한 일반화 "
                        "능력(OOD) 사이의 강한 상관관계를 발견했습니다. 낮은 공유 계수를 가진 모델은 외삽에 실패합니다.",
                        "joint model's best accuracy beyond L by kappa: " + (", ".join(f"kappa {k:.2f}: {a:.2f}" for k, a in pairs)
                                                                             or "none")
                        + f"; a verdict needs >= {OOD_MIN} conditions with kappa above {SHARED} and >= {OOD_MIN} at or "
                        f"below it (one point per side orders two numbers, it measures no correlation): "
                        f"{len(high)} and {len(low)}", ood_verdict, ood, lambda _r, _v: pooled,
                        decides=f"{len(high)} conditions above {SHARED}, {len(low)} at or below"))
    sections = [Table(kappa or [{"note": "no kappa (the search found no joint N*)"}], heading="kappa per model, task, format"),
                Table([{k: v for k, v in r.items() if k != "trials"} for r in plan.settings["study"]["n_star"]]
                      or [{"note": "no N*"}], heading="N* per condition")]
    if searched:
        sections.insert(0, Table(searched["search"], heading="Transformer budget search (cheapest first; the first "
                                 "budget whose trial converges runs the Transformer's N* sweep)"))
    if any(r["n_star"] is not None for r in n_star):
        sections.append(figures.n_star_vs_length(n_star))
    if any(bound(r) is not None or r in known(kappa) for r in kappa):
        sections += [figures.kappa_bars(kappa), figures.kappa_vs_ood(kappa)]
    return claims, sections
