"""The reproduction engine: a plan of runs -> train (reuse, resume, retry) -> measure -> verdicts -> report.

    reproduce(claim_module, scale="cpu", out="runs/reproduce/NAME-cpu", device="cpu") -> Path

A claim module (one per reproduction, `interp.reproduce.<name>`) defines

    NAME, TITLE                           the command's name and the report's title
    plan(scale) -> Plan                   the runs, and the sizes with the source of every number
    measure(outcome, plan) -> dict        JSON-able measurements of one trained run
    judge(done, plan) -> (claims, sections)   Claim rows with what was measured and a verdict,
                                          and the report's figures and tables
    study(out, plan, device, progress, log, train) -> dict   optional: work whose runs a search decides
                                          (its own resumable sweep); the result is plan.settings["study"],
                                          whose "pending" lists what train=False left untrained
    studied(plan) -> [Outcome]            optional: the study's runs (counted in the report's setup line)

Scales: "quick" (tiny, a smoke test in seconds; numbers mean nothing), "cpu" (about 30 minutes
on 2 cores), "medium" (where a claim defines it: the runs a claim rests on at the size where the
source paper's model fits, early-stopped at fit; CPU hours, meant to be trained across sessions
and committed under results/) and "paper" (the sizes the seeds or their papers state; for a GPU).

Training (`train_run`): every run trains with the length curriculum (or at its length when the
task has none) into out/runs/<label>. A finished run is reused as it is; an interrupted one
resumes from its last checkpoint (interp.training.train, bit for bit on the CPU). A run whose
loss diverges is retried from scratch with lr / `LR_RETRY_FACTOR` (at most `MAX_RETRIES` times),
each retry in its own directory <label>-lr<lr>, and the divergence is reported. A plan may stop a run early at fit
(`Plan.early_stop` = {"accuracy": a, "evals": k}): the run trains in chunks (`train(stop_at=...)`,
bit for bit the steps an uninterrupted run takes) and stops once the curriculum is at the training
length, the last k curriculum evaluations there are all >= a and the plan's fit metric (on fresh
data, the one that decides "fit" below) is >= a as well; the step is recorded in
out/runs/<label>/early_stop.json, so a rerun reuses the run as it stopped (the learning rate at
that step is the cosine's of the full budget, not 0). Such a run also stops when it *collapses*
(`collapse`: over the last `COLLAPSE["steps"]` steps every training accuracy at the current
curriculum length is below `COLLAPSE["fraction"]` of the best one reached at that length before; the
loss stays finite, so only this rule sees it) and is retried as a divergence; the collapse is
recorded in out/runs/<label>/collapsed.json, so a rerun goes to the retry at once. After training,
the run *fits* when the curriculum reached the training length and the in-distribution accuracy
(`plan.fit_metric`, final-state accuracy at the training length on fresh data by default) is at
least `FIT_THRESHOLD`; otherwise its status is "did not fit", with the length reached, and no
claim counts it as a model that fit and then failed to generalise.

Committed runs (interp.reproduce.results): before training, a run committed under
results/reproduce/<NAME>-<scale>/<label> (config, final weights, metrics, measurement cache) with
the config the plan would train is loaded instead; `commit_finished` commits finished runs,
`results.commit_unfinished` the last checkpoint of unfinished ones, which a later run resumes from.

On an executor (`reproduce(..., executor=make_executor("ray", workers=4))`, interp.sweep): the
plan's runs that are neither committed nor finished are first trained as jobs (`train_job`, one
per run, each in out/runs/<label> exactly as in-process: resumed, retried at a lower lr, stopped
early at fit), then the in-process pass above finds them finished and reuses them, measures and
judges as without an executor. A worker trains with one torch thread, so the weights equal those
of an in-process reproduction run with torch.set_num_threads(1) (tests/test_runs_executor.py); a run
that fails on its worker stops the reproduction with TrainingFailed once the other jobs are done
(theirs are kept: a rerun resumes). A claim's `study` runs in this process as before.

Measurements are cached per run (out/runs/<label>/reproduce.json, keyed by the claim, the
scale and a digest of the plan's settings), so a rerun only measures what is new, and the report is
rebuilt from the cache. A committed run's cache is used only while it matches the run's manifest
(interp.reproduce.manifest); an edited one is measured again. The verdicts are always judged anew
from the measurements (claims.json is an output, never read). Verdicts are one of `VERDICTS`, each
through the verdict rule (interp.reproduce.verdicts: seeds behind it, no verdict on a run still rising); a
claim without the rule's reason stops the report.
"""

from __future__ import annotations

import dataclasses
import importlib
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import models
from interp.report.html import Table, Text, text_table, write_report
from interp.reproduce import results as committed_runs
from interp.reproduce.plan import COLLAPSE_FILE, Outcome, Plan, Run, train_config
from interp.sweep.jobs import Job, Outcome as JobOutcome
from interp.sweep.runs import error_line
from interp.training import checkpoint as ckpt
from interp.training.evaluate import final_state_accuracy
from interp.training.train import TrainConfig, TrainingDiverged, train
from models.storage.paths import inside

SCALES = ("quick", "cpu", "medium", "paper")   # "medium": only the claims whose SCALE defines it
VERDICTS = ("reproduces", "partly reproduces", "does not reproduce", "did not fit", "diverged",
            "premise fails", "inconclusive")
FIT_THRESHOLD = 0.9
LR_RETRY_FACTOR = 3.0
MAX_RETRIES = 2
CACHE = "reproduce.json"
EARLY_STOP_FILE = "early_stop.json"
# A training collapse (2026-12-07: AUSSM L2 on S3 at lr 1e-2 went from 0.79 to 0.20-0.23 at length 16 and
# stayed there for 3,600 steps; Mamba-3 L2 s2 from 0.96 to 0.19 at length 60): accuracy at the current
# curriculum length below this fraction of its best there, at every logged step of the last `steps`.
COLLAPSE = {"fraction": 0.5, "steps": 500}
TRAIN_TIME = "train_time.json"


@dataclass
class Claim:
    """A row of the claim table: the seed's sentence (English, `quote`; the seed's own words,
    `original`) from `source` (a seed's file name or a paper), what was measured, a verdict; from the
    verdict rule (interp.reproduce.verdicts, which every judge goes through): why the verdict follows
    (`rule`), the runs and seeds behind it (`basis`), the number that decides it and its interval."""

    source: str
    quote: str
    original: str = ""
    measured: str = ""
    verdict: str = "inconclusive"
    rule: str = ""
    basis: str = ""
    decides: str = ""
    interval: str = ""

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"Claim.verdict must be one of {VERDICTS}; got {self.verdict!r}")

    def row(self) -> dict[str, str]:
        claim = f"{self.quote} ({self.source})" + (f" [{self.original}]" if self.original else "")
        return {"claim": claim, "what was measured": self.measured, "runs and seeds": self.basis,
                "decided by": " ".join(x for x in (self.decides, self.interval) if x) or "-",
                "verdict": self.verdict, "why (the verdict rule)": self.rule}


def claim_scales(claim) -> tuple[str, ...]:
    """The scales `claim` (a claim module) defines, in SCALES order."""
    return tuple(s for s in SCALES if s in getattr(claim, "SCALE", dict.fromkeys(("quick", "cpu", "paper"))))


def check_scale(scale: str, claim=None) -> str:
    allowed = SCALES if claim is None else claim_scales(claim)
    if scale not in allowed:
        name = "" if claim is None else f" for {claim.NAME}"
        raise ValueError(f"scale must be one of {', '.join(allowed)}{name}; got {scale!r}")
    return scale


def default_fit_metric(model, task, run: Run, device: str, n: int = 256) -> float:
    return final_state_accuracy(model, task, run.train["train_length"], n, run.train.get("seed", 0) + 7, device)


def fitted_evals(metrics: list[dict], train_length: int, rule: dict[str, Any]) -> bool:
    """The last rule["evals"] curriculum evaluations are at train_length and all >= rule["accuracy"]."""
    evals = [r for r in metrics if r.get("kind") == "eval"][-rule["evals"]:]
    return len(evals) == rule["evals"] and all(r["length"] >= train_length and r["accuracy"] >= rule["accuracy"]
                                               for r in evals)


def collapse(metrics: list[dict], rule: dict[str, Any] = COLLAPSE) -> str | None:
    """Why the training in `metrics` collapsed (see COLLAPSE), or None. Only training rows at the
    last row's curriculum length count, so the drop when the curriculum moves on is not one."""
    rows = [r for r in metrics if r.get("kind") == "train"]
    if not rows:
        return None
    length, last = rows[-1]["length"], rows[-1]["step"]
    at_length = [r for r in rows if r["length"] == length]
    before = [r["accuracy"] for r in at_length if r["step"] <= last - rule["steps"]]
    recent = [r["accuracy"] for r in at_length if r["step"] > last - rule["steps"]]
    if not before or not recent or max(recent) >= rule["fraction"] * max(before):
        return None
    return (f"collapsed: training accuracy at length {length} fell from {max(before):.2f} to at most "
            f"{max(recent):.2f} over steps {last - rule['steps'] + 1}-{last} (below {rule['fraction']:g} of its best)")


def train_until_fit(config, task, cfg: TrainConfig, run_dir: Path, rule: dict[str, Any] | None,
                    progress: bool, label: str, confirm: Callable | None = None,
                    after_chunk: Callable[[], None] | None = None):
    """train(...) to cfg.steps, or, with an early-stop rule, in chunks until `fitted_evals` holds
    and confirm(model) (the fit metric >= the rule's accuracy; None: no check) agrees; the stop is
    recorded in run_dir/EARLY_STOP_FILE and honoured when the run is reused. A `collapse` after a
    chunk raises TrainingDiverged (recorded in run_dir/COLLAPSE_FILE: a rerun raises at once).
    after_chunk() runs after every chunk that leaves the run unfinished (its checkpoint written)."""
    if rule is None:
        return train(config, task, cfg, run_dir, resume=True, progress=progress, label=label)
    if (run_dir / COLLAPSE_FILE).exists():
        raise TrainingDiverged(ckpt.read_json(run_dir / COLLAPSE_FILE)["reason"])
    marker = run_dir / EARLY_STOP_FILE
    if marker.exists():
        stopped = ckpt.read_json(marker)["step"]
        return train(config, task, cfg, run_dir, resume=True, stop_at=stopped, progress=progress, label=label)
    chunk = max(cfg.eval_every, cfg.steps // 20 // cfg.eval_every * cfg.eval_every)
    step = 0
    while True:
        result = train(config, task, cfg, run_dir, resume=True, stop_at=min(cfg.steps, (step // chunk + 1) * chunk),
                       progress=progress, label=label)
        step = result.step
        if step >= cfg.steps:
            return result
        reason = collapse(result.metrics)
        if reason is not None:
            ckpt.write_json(run_dir / COLLAPSE_FILE, {"step": step, "reason": reason, "rule": COLLAPSE})
            if after_chunk is not None:   # the kept copy carries the marker: another session retries at once
                after_chunk()
            raise TrainingDiverged(reason)
        if fitted_evals(result.metrics, cfg.train_length, rule) and (confirm is None or confirm(result.model)):
            ckpt.write_json(marker, {"step": step, "of_steps": cfg.steps, "rule": rule})
            return result
        if after_chunk is not None:
            after_chunk()


def train_run(run: Run, root: Path, device: str = "cpu", progress: bool = True,
              fit_metric: Callable | None = None, fit_n: int = 256, early_stop: dict | None = None,
              kept: Path | None = None, keep: bool = False, log: Callable[[str], None] = print) -> Outcome:
    """Train (reuse, resume) `run` under root/<label>; retry with a lower lr on divergence or collapse,
    each attempt in its own directory; stop early at fit under the rule `early_stop` (Plan.early_stop).
    kept: a results directory; each attempt first resumes from kept/unfinished/<its directory's name>
    when that copy is further along (results.resume_unfinished), and with keep=True its checkpoint is
    copied there after every chunk that leaves it unfinished (results.keep_unfinished), so another
    session resumes a retry as well as a first attempt."""
    task = run.task_object()
    config = models.preset_config(run.preset, vocab_size=task.vocab_size, **run.model)
    lr, retries, started = float(run.train["lr"]), [], time.perf_counter()

    def confirm(model) -> bool:
        return float((fit_metric or default_fit_metric)(model.eval(), task, run, device, fit_n)) >= early_stop["accuracy"]

    for attempt in range(MAX_RETRIES + 1):
        run_dir = root / (run.label if attempt == 0 else f"{run.label}-lr{lr:.3g}")
        cfg = train_config(run, lr, device)
        if kept is not None:
            committed_runs.resume_unfinished(run, kept, run_dir, device, log, lr)
        after_chunk = (lambda run_dir=run_dir: committed_runs.keep_unfinished(run, run_dir, kept)) \
            if keep and kept is not None else None
        before = _steps_done(run_dir)
        call = time.perf_counter()
        try:
            result = train_until_fit(config, task, cfg, run_dir, early_stop, progress, run.label, confirm,
                                     after_chunk)
        except TrainingDiverged as error:
            retries.append(f"diverged at lr {lr:.3g} ({str(error).split(';')[0]})")
            lr /= LR_RETRY_FACTOR
            continue
        seconds = _training_seconds(run_dir, time.perf_counter() - call if result.step > before else 0.0)
        model = result.model.eval()
        reached = result.final_length
        accuracy = float((fit_metric or default_fit_metric)(model, task, run, device, fit_n))
        fit = reached >= cfg.train_length and accuracy >= FIT_THRESHOLD
        if retries:
            retries.append(f"retried at lr {lr:.3g} (lr / {LR_RETRY_FACTOR:g} per divergence)")
        return Outcome(run, "fit" if fit else "did not fit", run_dir, lr, reached, accuracy, retries,
                       seconds, result.step, model, task, result.metrics)
    return Outcome(run, "diverged", None, lr * LR_RETRY_FACTOR, 0, None, retries, time.perf_counter() - started,
                   task=task)


def _steps_done(run_dir: Path) -> int:
    pointer = ckpt.read_pointer(run_dir) if (run_dir / ckpt.POINTER).exists() else None
    return pointer["step"] if pointer else 0


def _training_seconds(run_dir: Path, added: float) -> float | None:
    """The run's wall-clock training seconds over every process that trained it (run_dir/TRAIN_TIME,
    `added` this time); None for a run trained before the engine kept the count."""
    path = run_dir / TRAIN_TIME
    total = ckpt.read_json(path)["seconds"] if path.exists() else None
    if added > 0:
        total = (total or 0.0) + added
        ckpt.write_json(path, {"seconds": total})
    return total


def _cached(outcome: Outcome, key: dict) -> dict | None:
    trusted = outcome.committed and not outcome.committed_cache_edited
    paths = [outcome.run_dir / CACHE] + ([outcome.committed / CACHE] if trusted else [])
    path = next((p for p in paths if p.exists()), None)
    if path is None:
        return None
    saved = ckpt.read_json(path)   # a corrupt file: CheckpointError naming it
    if not isinstance(saved, dict) or "measures" not in saved:
        raise ckpt.CheckpointError(f"{path} is not a measurement cache (no 'measures' entry); delete it to "
                                   "measure again")
    return saved["measures"] if saved.get("key") == key else None


def measured(outcome: Outcome, claim, plan: Plan, name: str) -> dict[str, Any]:
    """claim.measure(outcome, plan), cached in the run directory (recomputed when the settings change)."""
    if outcome.run_dir is None:
        return {}
    key = {"claim": name, "scale": plan.scale, "settings": plan.digest(), "status": outcome.status}
    cached = _cached(outcome, key)
    if cached is not None:
        return cached
    values = claim.measure(outcome, plan)
    outcome.run_dir.mkdir(parents=True, exist_ok=True)
    ckpt.write_json(outcome.run_dir / CACHE, {"key": key, "measures": values})
    return values


def sizes_table(plan: Plan) -> Table:
    return Table(plan.sizes, heading=f"Sizes at scale {plan.scale!r} and where each number comes from")


class TrainingFailed(RuntimeError):
    """Runs of a plan failed on the executor's workers; `failures` maps each label to its error."""

    def __init__(self, failures: dict[str, str]) -> None:
        self.failures = failures
        first = next(iter(failures))
        super().__init__(f"{len(failures)} run(s) failed to train on the executor ({', '.join(failures)}); the "
                         f"others are trained and kept, a rerun resumes. {first}: {error_line(failures[first])}")


def train_job(params: dict, run_dir: str) -> dict:
    """One run of a plan trained in a worker (see `train_on`): the claim module params["claim"] (imported
    by name), its plan at params["scale"], the run params["label"], trained by `train_run` under
    params["root"] with no progress bar, resuming from and (params["keep"]) keeping unfinished attempts in
    params["results"].
    Returns the outcome's row."""
    claim = importlib.import_module(params["claim"])
    plan = claim.plan(params["scale"])
    run = next((r for r in plan.runs if r.label == params["label"]), None)
    if run is None:
        raise ValueError(f"{params['claim']}.plan({params['scale']!r}) has no run labelled {params['label']!r}")
    outcome = train_run(run, Path(params["root"]), params["device"], False, plan.fit_metric, plan.fit_n,
                        plan.early_stop, Path(params["results"]), params["keep"], lambda _line: None)
    return outcome.row()


def train_on(executor, claim, plan: Plan, out: Path, kept: Path, device: str = "cpu", keep_unfinished: bool = False,
             log: Callable[[str], None] = print) -> list[str]:
    """Train the runs of `plan` that are neither committed under `kept` nor finished in out/runs as
    jobs on `executor` (`train_job`; an unfinished run committed under kept/unfinished seeds its run
    directory first, as in-process); returns the labels trained. TrainingFailed after every job has
    ended when any failed."""
    root, todo = inside(out, "runs"), []
    for run in plan.runs:
        if committed_runs.committed_outcome(run, kept, root, device, lambda _line: None) is not None \
                or committed_runs.any_attempt_finished(run, root):
            continue
        todo.append(Job(run.label, {"claim": claim.__name__, "scale": plan.scale, "label": run.label,
                                    "root": str(root), "device": device, "results": str(kept),
                                    "keep": keep_unfinished}, str(root / run.label)))
    if not todo:
        return []
    root.mkdir(parents=True, exist_ok=True)
    log(f"{claim.NAME}: training {len(todo)} run(s) on the executor: {', '.join(job.key for job in todo)}")
    failures, finished_jobs = {}, []

    def on_done(outcome: JobOutcome) -> None:
        finished_jobs.append(outcome.job.key)
        where = f"[{len(finished_jobs)}/{len(todo)}] {claim.NAME} {outcome.job.key}"
        if outcome.row is None:
            failures[outcome.job.key] = outcome.error
            log(f"{where}: failed on its worker: {error_line(outcome.error)}")
        else:
            row = outcome.row
            log(f"{where}: trained on a worker, {row['status']}, length {row['length reached']}/{row['train length']}, "
                f"{row['steps']} steps ({'-' if row['train s'] is None else row['train s']} s training)")

    executor.run(train_job, todo, on_done)
    if failures:
        raise TrainingFailed({key: failures[key] for key in (job.key for job in todo) if key in failures})
    return [job.key for job in todo]


def reproduce(claim, scale: str = "cpu", out: str | Path | None = None, device: str = "cpu",
              progress: bool = True, log: Callable[[str], None] = print, results: str | Path | None = None,
              train: bool = True, keep_unfinished: bool = False, executor=None) -> Path:
    """Run the reproduction `claim` (a claim module) at `scale`; returns the report's path.

    Writes out/report.html, out/claims.json (the claim table and every run's row and measures) and
    out/runs/<label>/ per run. A run committed under `results` (default results/reproduce/NAME-SCALE,
    interp.reproduce.results) with the plan's config is loaded, not trained. Rerunning reuses
    finished runs and cached measurements. train=False: only committed and finished runs are used;
    the others are listed as not trained yet (a report of a profile still being trained).
    keep_unfinished=True: after every chunk of an early-stopped run its checkpoint is copied into
    `results`/unfinished/<label> (interp.reproduce.results), so that another session or machine
    resumes it from there. executor: an interp.sweep executor that trains the runs to train first,
    one job per run (`train_on`; the module docstring); None: every run trains in this process.
    """
    scale = check_scale(scale, claim)
    out = Path(out or f"runs/reproduce/{claim.NAME}-{scale}")
    kept = committed_runs.results_dir(claim.NAME, scale) if results is None else Path(results)
    plan = claim.plan(scale)
    labels = [r.label for r in plan.runs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"{claim.NAME}: run labels must be unique; got {labels}")
    started, done, pending = time.perf_counter(), [], []
    if executor is not None and train:
        train_on(executor, claim, plan, out, kept, device, keep_unfinished, log)
    for index, run in enumerate(plan.runs, 1):
        outcome = committed_runs.committed_outcome(run, kept, inside(out, "runs"), device, log)
        if outcome is None and not train and not committed_runs.any_attempt_finished(run, out / "runs"):
            pending.append(run.label)
            log(f"[{index}/{len(plan.runs)}] {claim.NAME} {run.label}: not trained yet (train=False)")
            continue
        reused = "committed in " + str(kept) if outcome else (
            "resuming/reusing" if (out / "runs" / run.label / ckpt.CONFIG).exists() else "training")
        log(f"[{index}/{len(plan.runs)}] {claim.NAME} {run.label}: {reused}")
        if outcome is None:
            outcome = train_run(run, inside(out, "runs"), device, progress, plan.fit_metric, plan.fit_n, plan.early_stop,
                                kept, keep_unfinished, log)
        outcome.measures = measured(outcome, claim, plan, claim.NAME)
        log(f"[{index}/{len(plan.runs)}] {claim.NAME} {run.label}: {outcome.status}, length "
            f"{outcome.length_reached}/{run.train['train_length']}, in-dist acc "
            f"{'-' if outcome.in_distribution is None else f'{outcome.in_distribution:.3f}'}, "
            f"{outcome.steps}/{run.train['steps']} steps"
            f"{'; ' + '; '.join(outcome.retries) if outcome.retries else ''} "
            f"({'-' if outcome.seconds is None else f'{outcome.seconds:.0f}'} s training)")
        done.append(outcome)
    if hasattr(claim, "study"):   # a reproduction whose runs a search decides (its own resumable sweep)
        plan.settings["study"] = claim.study(out, plan, device, progress, log, train)
        pending += plan.settings["study"].get("pending", [])
    claims, sections = claim.judge(done, plan)
    unruled = [c.quote[:60] for c in claims if not c.rule]
    if unruled:
        raise ValueError(f"{claim.NAME}: every claim's verdict must go through interp.reproduce.verdicts (no rule "
                         f"reason on: {'; '.join(unruled)})")
    counted = done + (claim.studied(plan) if hasattr(claim, "studied") else [])
    header = Text(f"{claim.__doc__.strip()}\n\nScale {scale!r}, device {device}; {len(counted)} runs "
                  + (f"({len(done)} of the plan, {len(counted) - len(done)} chosen by the study) " if len(counted) > len(done)
                     else "")
                  + f"({sum(o.fit for o in counted)} fit, {sum(o.status == 'did not fit' for o in counted)} did not fit, "
                  f"{sum(o.status == 'diverged' for o in counted)} diverged"
                  + (f"; {len(pending)} more runs or searches not trained yet, left out of every claim: "
                     f"{', '.join(pending)}" if pending else "") + "). A run fits when the curriculum reached the "
                  f"training length and its in-distribution accuracy is >= {FIT_THRESHOLD}; runs that did not fit "
                  "are reported as such and left out of every generalisation claim."
                  + (f" A run stops early once the curriculum is at the training length and its last "
                     f"{plan.early_stop['evals']} curriculum evaluations there are >= {plan.early_stop['accuracy']} "
                     "(the runs table gives the steps trained)." if plan.early_stop else "")
                  + ("\n\n--quick smoke run: toy sizes, the numbers and verdicts mean nothing." if scale == "quick" else ""),
                  heading="Setup")
    report = write_report(out / "report.html", claim.TITLE, [
        header, Table([c.row() for c in claims], heading="Claims", prose=True), *sections, sizes_table(plan),
        Table([o.row() for o in counted] or [{"note": "no run of the plan" + (" (its study's sweeps above decide them)"
                                                                        if hasattr(claim, "study") else " trained yet")}],
              heading="Runs (status, curriculum length reached, divergences; in-dist acc: "
              "the fit metric at the training length; steps: trained, fewer after an early stop; train s: wall-clock "
              "training seconds over every process that trained the run)", prose=True)])
    ckpt.write_json(out / "claims.json", {
        "name": claim.NAME, "scale": scale, "device": device, "seconds": round(time.perf_counter() - started, 1),
        "claims": [dataclasses.asdict(c) for c in claims], "pending": pending,
        "runs": [{**o.row(), "measures": o.measures} for o in done]})
    for c in claims:
        log(claim_lines(c))
    for table in (s for s in sections if isinstance(s, Table) and s.console):
        log(text_table(table))
    log(f"{claim.NAME}: report {report} ({time.perf_counter() - started:.0f} s)")
    return report


def claim_lines(c: Claim) -> str:
    """A claim as the console shows it after a reproduction: verdict and the seed's sentence, then what was
    measured, what decides it and the rule's reason, each on its own indented line."""
    lines = [f"[{c.verdict}] {c.quote}"] + [f"    {name}: {text}" for name, text in (
        ("measured", c.measured), ("decided by", "; ".join(x for x in (c.decides, c.interval) if x)),
        ("runs and seeds", c.basis), ("why", c.rule)) if text]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- helpers for claim modules


def fitted(done: list[Outcome], **info) -> list[Outcome]:
    """The outcomes that fit whose run.info matches every given tag."""
    return [o for o in done if o.fit and all(o.run.info.get(k) == v for k, v in info.items())]


def select(done: list[Outcome], **info) -> list[Outcome]:
    return [o for o in done if all(o.run.info.get(k) == v for k, v in info.items())]


def unfit_note(outcomes: list[Outcome]) -> str:
    """'; did not fit: a (length 8/40), diverged: b' for the outcomes that did not fit."""
    parts = [f"{o.run.label} did not fit (length {o.length_reached}/{o.run.train['train_length']}, "
             f"in-dist acc {o.in_distribution:.3f})" for o in outcomes if o.status == "did not fit"]
    parts += [f"{o.run.label} diverged at every lr tried" for o in outcomes if o.status == "diverged"]
    return ("; " + "; ".join(parts)) if parts else ""


def size(setting: str, value: Any, source: str = "our choice") -> dict[str, Any]:
    return {"setting": setting, "value": value, "source": source}


def commit_finished(claim, scale: str, out: str | Path, results: str | Path | None = None,
                    labels=None, device: str = "cpu", extra: dict[str, dict] | None = None,
                    runs=None) -> list[str]:
    """Commit every finished run of claim.plan(scale) under out/runs (those in `labels` only, when
    given; `runs`: these engine.Runs instead of the plan's, such as the runs a claim's study trains)
    with its measurement cache; extra: {label: fields for outcome.json}. Unfinished runs are left
    alone; returns the labels committed."""
    plan, done = claim.plan(scale), []
    target = committed_runs.results_dir(claim.NAME, scale) if results is None else Path(results)
    for run in plan.runs if runs is None else runs:
        if (labels is not None and run.label not in labels) or not committed_runs.any_attempt_finished(run, Path(out) / "runs"):
            continue
        outcome = train_run(run, Path(out) / "runs", device, False, plan.fit_metric, plan.fit_n, plan.early_stop)
        outcome.measures = measured(outcome, claim, plan, claim.NAME)
        committed_runs.commit_run(outcome, target, (extra or {}).get(run.label))
        for stale in committed_runs.attempt_dirs(run, target / committed_runs.UNFINISHED):
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale)
        done.append(run.label)
    return done
