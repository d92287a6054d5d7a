"""The verdict rule every claim of every reproduction goes through (issue 37 item 4).

    Evidence(label, seed, supports, rising=None)      one run (or one seed's reading) behind a claim
    evidence(outcome, supports) -> Evidence           from a trained or committed run (rising from its metrics)
    still_rising(metrics, steps, ...) -> str | None   why the run's evaluation accuracy was still rising
    rule(verdict, evidence) -> Ruling                 the verdict the data allow, with its reason and basis
    exact(verdict, what) -> Ruling                    a computation with no training behind it (no seeds)
    claim(source, quote, original, measured, verdict, evidence, decides=, interval=) -> engine.Claim

A claim module's judge first applies the claim's own bar (stated in its "what was measured" text) and
gets a raw verdict; `rule` then checks that the data behind it carry it, and otherwise turns it into
"inconclusive", saying why. The rule never strengthens a verdict. Its parts:

1. Still rising (`still_rising`): no verdict rests on a run whose evaluation accuracy was still rising
   when its training ended. From metrics.jsonl: the curriculum evaluations ("eval" rows) at the run's
   last curriculum length, in the last quarter of its steps against the quarter before; the run is
   still rising when the mean rose by at least RISE["min"] and by more than RISE["se"] standard errors
   of the difference (Welch: the spread of the evaluations in each window); with fewer than two
   evaluations at that length in either window, when the curriculum reached it within the last half of
   training (too few evaluations to tell, and the run was still moving). A run stopped early at fit (fewer steps than planned, status fit) has
   stopped improving by the early-stop rule, and so has one at RISE["ceiling"] or above at the end: the mean
   of its last window, or of its last RISE["end"] of the steps (at least two evaluations; accuracy capped at
   1 cannot rise further, while a quarter window can still hold the climb that led there). A run with no metrics (hand-made outcomes in tests) counts as not rising. The N* trials of
   sample-efficiency are not runs here: N* is defined at a fixed step budget per trial, so they are not tested.
2. Seeds: each decided piece of evidence (supports True or False, not None) counts for its seed; a
   seed is in the claim's direction when all its decided evidence supports the claim, against it when
   none does, mixed otherwise. "reproduces" needs the claim's direction in >= MIN_SEEDS seeds; "does not
   reproduce" the opposite in >= MIN_SEEDS seeds; "partly reproduces" and "premise fails" need
   >= MIN_SEEDS decided seeds. "did not fit", "diverged" and "inconclusive" pass (with their counts),
   except that a "did not fit" whose runs are still rising is "inconclusive".
3. Exact computations (no training: `exact`) need no seeds; they are said to be exact.

Every Claim carries the rule's reason (`Claim.rule`), the runs and seeds behind it (`Claim.basis`) and,
where the claim module gives them, the number that decides it and its interval (`Claim.decides`,
`Claim.interval`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from interp.reproduce.engine import VERDICTS, Claim

MIN_SEEDS = 2
RISE = {"min": 0.02, "se": 2.0, "ceiling": 0.99, "end": 0.1}
ASSERTIVE = ("reproduces", "partly reproduces", "does not reproduce", "premise fails")


@dataclass
class Evidence:
    """One run (or one seed's reading) behind a claim. supports: True (in the claim's direction), False
    (against it), None (not decided: left out of the seed count). rising: why its evaluation accuracy was
    still rising when training ended (`still_rising`), or None."""

    label: str
    seed: int
    supports: bool | None
    rising: str | None = None
    fit: bool = True


@dataclass
class Ruling:
    verdict: str
    reason: str
    basis: str


def still_rising(metrics: list[dict], steps: int | None = None, stopped_at_fit: bool = False,
                 rise: dict = RISE) -> str | None:
    """Why the evaluation accuracy in `metrics` (a run's metrics.jsonl rows) was still rising when training
    ended (the module docstring, part 1), or None. steps: the steps trained (default: the last row's)."""
    evals = [r for r in metrics if r.get("kind") == "eval" and r.get("accuracy") is not None]
    if stopped_at_fit or not evals:
        return None
    end = steps if steps is not None else max(r["step"] for r in metrics)
    length = evals[-1]["length"]
    at = [r for r in evals if r["length"] == length]
    half, quarter = end - end / 2, end - end / 4
    last = [r["accuracy"] for r in at if r["step"] > quarter]
    before = [r["accuracy"] for r in at if half < r["step"] <= quarter]
    final = [r["accuracy"] for r in at if r["step"] > end - rise["end"] * end]
    at_ceiling = [window for window in (last, final if len(final) >= 2 else []) if window]
    if any(float(np.mean(window)) >= rise["ceiling"] for window in at_ceiling):
        return None
    if len(last) < 2 or len(before) < 2:
        reached = min(r["step"] for r in at)
        if reached > half and any(r["length"] != length for r in evals):
            return (f"the curriculum reached its last length {length} at step {reached} of {end}, within the last "
                    f"half (too few evaluations there to tell; accuracy {at[0]['accuracy']:.2f} -> "
                    f"{at[-1]['accuracy']:.2f})")
        return None
    gain = float(np.mean(last) - np.mean(before))
    se = math.sqrt(np.var(last, ddof=1) / len(last) + np.var(before, ddof=1) / len(before))
    if gain >= rise["min"] and gain > rise["se"] * se:
        return (f"evaluation accuracy at length {length} still rising at the end of training: mean "
                f"{np.mean(before):.2f} over steps {int(half) + 1}-{int(quarter)} -> {np.mean(last):.2f} over steps "
                f"{int(quarter) + 1}-{end} (+{gain:.2f}, {gain / se if se > 0 else math.inf:.1f} standard errors)")
    return None


def evidence(outcome, supports: bool | None) -> Evidence:
    """Evidence from an engine.Outcome: its label, seed (run.info["seed"], else run.train["seed"]) and
    whether its evaluation accuracy was still rising (`still_rising` on its metrics)."""
    run = outcome.run
    seed = run.info.get("seed", run.train.get("seed", 0))
    stopped = outcome.fit and outcome.steps and outcome.steps < run.train.get("steps", outcome.steps)
    rising = None if outcome.status == "diverged" else still_rising(outcome.metrics or [], outcome.steps or None,
                                                                  bool(stopped))
    return Evidence(run.label, int(seed), supports, rising, outcome.fit)


def _seeds(items) -> str:
    return ", ".join(f"s{s}" for s in sorted(items))


def basis(items: list[Evidence]) -> str:
    """'N runs, seeds 0, 1' (the runs and seeds behind a claim)."""
    if not items:
        return "no runs"
    seeds = sorted({e.seed for e in items})
    runs = len({e.label for e in items})
    return f"{runs} run{'s' * (runs != 1)}, seed{'s' * (len(seeds) != 1)} {', '.join(map(str, seeds))}"


def rule(verdict: str, items: list[Evidence], why: str = "") -> Ruling:
    """The verdict `verdict` (the claim's own bar) under the rule (the module docstring), with its reason;
    why: the claim's reason for a verdict that passes (e.g. for a raw 'inconclusive')."""
    if verdict not in VERDICTS:
        raise ValueError(f"verdict must be one of {VERDICTS}; got {verdict!r}")
    items = list(items)
    where = basis(items)
    decided = [e for e in items if e.supports is not None]
    rising = [e for e in (decided if verdict != "did not fit" else [e for e in items if not e.fit]) if e.rising]
    if rising and verdict != "inconclusive" and verdict != "diverged":
        first = rising[0]
        more = f"; also still rising: {', '.join(e.label for e in rising[1:])}" if len(rising) > 1 else ""
        return Ruling("inconclusive", f"inconclusive (was '{verdict}'): {first.label} {first.rising}{more}; train to "
                      "a plateau", where)
    by_seed: dict[int, list[bool]] = {}
    for e in decided:
        by_seed.setdefault(e.seed, []).append(bool(e.supports))
    pro = {s for s, v in by_seed.items() if all(v)}
    con = {s for s, v in by_seed.items() if not any(v)}
    mixed = set(by_seed) - pro - con
    counts = (f"the claim's direction in {len(pro)} of {len(by_seed)} seeds"
              + (f" ({_seeds(pro)})" if pro else "") + (f", against it in {_seeds(con)}" if con else "")
              + (f", mixed in {_seeds(mixed)}" if mixed else ""))
    if verdict == "reproduces" and len(pro) < MIN_SEEDS:
        return Ruling("inconclusive", f"inconclusive (was 'reproduces'): {counts}; 'reproduces' needs >= {MIN_SEEDS}",
                      where)
    if verdict == "does not reproduce" and len(con) < MIN_SEEDS:
        return Ruling("inconclusive", f"inconclusive (was 'does not reproduce'): {counts}; 'does not reproduce' needs "
                      f"the opposite in >= {MIN_SEEDS}", where)
    if verdict == "partly reproduces" and by_seed and not pro | mixed:
        return Ruling("inconclusive", f"inconclusive (was 'partly reproduces'): {counts}; no run in the claim's "
                      "direction", where)
    if verdict in ("partly reproduces", "premise fails") and len(by_seed) < MIN_SEEDS:
        return Ruling("inconclusive", f"inconclusive (was '{verdict}'): {len(by_seed)} seed decided "
                      f"({_seeds(by_seed) or 'none'}); '{verdict}' needs >= {MIN_SEEDS}", where)
    if verdict == "premise fails":
        return Ruling(verdict, f"premise fails: checked in {len(by_seed)} seeds ({_seeds(by_seed)}), failing in "
                      f"{_seeds(con) or 'none'}" + (f", holding in {_seeds(pro | mixed)}" if pro | mixed else "")
                      + (f"; {why}" if why else ""), where)
    if verdict in ASSERTIVE:
        return Ruling(verdict, f"{verdict}: {counts}" + (f"; {why}" if why else ""), where)
    if verdict == "did not fit":
        unfit = [e for e in items if not e.fit]
        return Ruling(verdict, f"did not fit: {len(unfit)} of {len(items)} runs did not fit, none still rising"
                      + (f"; {why}" if why else ""), where)
    if not items:
        return Ruling(verdict, f"{verdict}: no runs behind it (none of this kind in the plan, or none trained yet)",
                      where)
    return Ruling(verdict, f"{verdict}: {why or 'by the claim bar (see what was measured)'}", where)


def exact(verdict: str, what: str) -> Ruling:
    """A verdict from a computation with no training behind it: no seeds, nothing to rise."""
    if verdict not in VERDICTS:
        raise ValueError(f"verdict must be one of {VERDICTS}; got {verdict!r}")
    return Ruling(verdict, f"{verdict}: exact ({what}); no training, so no seeds are needed", "exact computation")


def claim(source: str, quote: str, original: str, measured: str, verdict: str, items=None, *, ruling: Ruling | None = None,
          why: str = "", decides: str = "", interval: str = "") -> Claim:
    """An engine.Claim whose verdict went through `rule` (or the given `ruling`, e.g. `exact`)."""
    ruled = ruling if ruling is not None else rule(verdict, items or [], why)
    return Claim(source, quote, original, measured, ruled.verdict, rule=ruled.reason, basis=ruled.basis,
                 decides=decides, interval=interval)


def wilson(p: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson interval of a proportion p measured on n samples."""
    if n <= 0 or not math.isfinite(p):
        return math.nan, math.nan
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def span(values, n: int | None = None) -> str:
    """'[lo, hi]' of the Wilson intervals around the smallest and largest of `values` (accuracies on n
    sequences each), or the plain range without n."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return ""
    if n is None:
        return f"[{min(values):.2f}, {max(values):.2f}] (range over runs)"
    return (f"[{wilson(min(values), n)[0]:.2f}, {wilson(max(values), n)[1]:.2f}] (95% Wilson, n = {n} per run, "
            "over the runs)")
