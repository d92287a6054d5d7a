"""The report of `interp patch` (patch.html): restoration per site, exact and / or attribution.

    write_patch_report(path, setup, results, clean, title) -> Path
    agreement_rows(exact, estimate, top) -> [row]        the agreement table, one row per quantity

setup: {"mixer", "run_dir", "task", "pairs", "n", "seed", "corrupt", "min_effect", "top", and
"prompts": the prompt file or None} (what was run); results: {"exact": InterchangeResult,
"attribution": InterchangeResult} (either or both);
clean: the clean Batch (its roles label the position axes). docs/restoration.md explains the numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from interp.report.html import Table, Text, write_report
from interp.report.interventions import attribution_scatter, position_labels, restoration_bound, restoration_heatmap

QUANTITIES = (("restoration", "p(y)"), ("logit_diff_restoration", "logit(y) - logit(y')"))

AGREEMENT_HELP = (
    "How to read the agreement table (over the examples both methods keep; docs/restoration.md in the "
    "repository):\n\n"
    "r_pairs: Pearson r between the exact and the estimated restoration over every (site, example) pair. "
    "r_nonzero: the same over the pairs where either is non-zero (sites that cannot matter are 0 in both and "
    "would inflate r); n_nonzero: how many such pairs. r_site_means: Pearson r over the per-site means (does "
    "the estimate rank the sites as the exact grid does?). r_site_median: the median over sites of each site's r "
    "across examples. recall_top: the share of the exact top-k sites (largest mean restoration) that are also "
    "among the estimate's top k, k = {top}: what a screen keeping k sites would find. NaN: undefined (fewer "
    "than 3 values, a constant, or fewer than k sites with a mean).\n\n"
    "Expect loose per-pair agreement (a saturated probability is far from linear in an activation) and "
    "closer per-site agreement; the logit difference is nearer linear than p(y).")


def agreement_rows(exact, estimate, top: int) -> list[dict[str, Any]]:
    """{"restoration of", r_pairs, r_nonzero, n_nonzero, r_site_means, r_site_median, recall_top}
    for p(y) and the logit difference (interp.analysis.interventions.agreement)."""
    from interp.analysis.interventions import agreement

    return [{"restoration of": label, **agreement(exact, estimate, of, top=top)} for of, label in QUANTITIES]


def setup_text(setup: Mapping[str, Any]) -> str:
    if setup.get("prompts") is not None:
        return (f"{setup['mixer']} ({setup['run_dir']}) on the {setup['n']} clean / corrupted prompt pairs of "
                f"{setup['prompts']} (interp.prompts). An example is kept where p_clean(y) - p_corrupt(y) > "
                f"{setup['min_effect']}.\n\n"
                "restoration = (p_patched(y) - p_corrupt(y)) / (p_clean(y) - p_corrupt(y)) at the prompt's last "
                "token, y the pair's answer; the logit difference is logit(answer) - logit(wrong_answer) there. "
                "exact: interchange (each site patched from the clean run); attribution: the first-order estimate "
                "(a_clean - a_corrupt) . d p(y) / d a at the corrupted run. Positions are labelled by the roles of "
                "the prompt file found there, with the share of pairs.")
    corrupted = ("the queried key replaced, in context, by a key absent from the example (the corrupted run "
                 "cannot know the answer)" if setup["corrupt"] == "key" else
                 "the queried key's value replaced by a value absent from the example (the corrupted run has "
                 "its own answer y')")
    return (f"{setup['mixer']} ({setup['run_dir']}) on {setup['task']} with {setup['pairs']} key-value pairs; "
            f"{setup['n']} clean examples (seed {setup['seed']}), each corrupted: {corrupted}. An example is kept "
            f"where p_clean(y) - p_corrupt(y) > {setup['min_effect']}.\n\n"
            "restoration = (p_patched(y) - p_corrupt(y)) / (p_clean(y) - p_corrupt(y)) at the query, y the clean "
            "answer: 0 nothing restored, 1 fully. exact: interchange (each site patched from the clean run); "
            "attribution: the first-order estimate (a_clean - a_corrupt) . d p(y) / d a at the corrupted run. "
            "Positions are labelled by the roles found there in the clean examples with the share of examples "
            "(key: the queried key's occurrence in context, value: its value, query: where the answer is "
            "predicted). High restoration at the value position reads as induction (the association stored "
            "at the value and looked up later), at the query or key position as direct retrieval.")


def write_patch_report(path: str | Path, setup: Mapping[str, Any], results: Mapping[str, Any], clean,
                       title: str) -> Path:
    """The HTML report: setup, (with both methods) the agreement table, its explanation and the
    scatter of site means, then one restoration heatmap per method on one colour scale (the exact
    result's; estimates beyond it are drawn at the scale's end and say so in the title)."""
    sections: list = [Text(setup_text(setup), heading="Setup")]
    if len(results) == 2:
        top = setup["top"]
        sections += [Table(agreement_rows(results["exact"], results["attribution"], top),
                           heading=f"Agreement of attribution with exact interchange (top k = {top})"),
                     Text(AGREEMENT_HELP.format(top=top)),
                     attribution_scatter(results["exact"], results["attribution"])]
    # one colour scale, set by exact interchange where it ran: an attribution estimate far off (a
    # linearisation that overshoots at one site) would otherwise wash out every other cell of both
    bound = restoration_bound(results["exact"] if "exact" in results else next(iter(results.values())))
    labels = position_labels(clean)
    sections += [restoration_heatmap(result, title=f"{method}: mean restoration of p(y)", bound=bound, labels=labels)
                 for method, result in results.items()]
    return write_report(path, title, sections)
