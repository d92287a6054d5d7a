"""Retrieval mechanisms (seed 003, arXiv 2505.15105; docs/restoration.md): associative recall at
several sizes with 2-layer attention (no positions), Based, Mamba, H3, Hyena and DeltaNet; the
short-convolution ablation both ways (Mamba retrained with d_conv = 1, as the paper does, and the
trained d_conv = 4 convolution truncated at load time); associative treecall (ATR) with Mamba
without short conv (d_conv = 1) next to attention (and Mamba with it, --scale medium). --scale medium
trains AR 8 / 16 and ATR 12, where the cpu budget did not fit, with a length curriculum (SEARCH:
the budget search that chose it). Interchange interventions (clean vs the
queried key swapped out of the context) restore the block input (hook_resid_pre) and the mixer
output (mixer.hook_out) per layer x role (key, value, query); the reading is taken at layer 1's
block input: value -> induction, query or key -> direct retrieval.

ATR (interp.tasks.treecall) puts a phrase's head first, so the answer's occurrence (role value, the
parent's head) always precedes the queried child (role key): a key corruption cannot reach the value
position, and the value restoration is 0 by causality. The paper's ATR measure (the memorisation score
of its code, github.com/aryamanarora/tinylang, tinylang/eval/interchange.py) corrupts the answer's
occurrence instead and restores at the child's: an induction model stores the parent at the child and
reads it from there. So on ATR a second interchange swaps the value token out of the document
(`corrupt_value`), and the reading is induction when the key restores >= READ_MIN at layer 1's block
input under it (and at least as much as the query); otherwise the key-corruption reading above."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np

from interp.analysis.interventions import (ablate_short_conv, corrupt_ar, corrupt_atr, corrupt_value, interchange,
                                          short_convs, site_grid)
from interp.reproduce import verdicts as rule
from interp.reproduce.engine import Plan, Run, fitted, select, size, unfit_note
from interp.report.interventions import accuracy_vs_d_conv, cell_text, restoration_heatmap
from interp.report.html import Table, Text
from interp.training.evaluate import final_state_accuracy

NAME = "retrieval"
TITLE = "Retrieval mechanisms on associative recall and treecall"
SEED_003 = "003_dd63ef8b0daf4735.txt"
HOOKS = ("blocks.{l}.hook_resid_pre", "blocks.{l}.mixer.hook_out")
ROLES = ("key", "value", "query")
WIDTHS = (4, 3, 2, 1)
READ_MIN = 0.5   # a role "restores" when its mean restoration is at least this

#          label: (preset, overrides)
AR_MODELS = {"attention": ("transformer", {"positional": "none"}), "based": ("based", {"mixer_options": {"window": 2}}),
             "mamba": ("mamba", {"d_conv": 4}), "h3": ("h3", {}), "hyena": ("hyena", {}), "deltanet": ("deltanet", {}),
             "mamba d_conv=1": ("mamba", {"d_conv": 1})}
ATR_MODELS = {"attention": ("transformer", {"positional": "none"}), "mamba d_conv=1": ("mamba", {"d_conv": 1}),
              "mamba": ("mamba", {"d_conv": 4})}
# medium AR: every model of seed 003's AR claims (Based, DeltaNet, H3 and Hyena added 2026-12-03, fourth session)
MEDIUM_AR = ("attention", "mamba", "mamba d_conv=1", "based", "deltanet", "h3", "hyena")
CURRICULUM = {"curriculum": True, "curriculum_start": 2, "curriculum_patience": 2}   # medium: doubling at >= 95%
EARLY_STOP = {"accuracy": 0.95, "evals": 4}   # medium: 4 evaluations (100 steps) at the training length
# The medium budget search (2026-12-03, seed 0, one thread at nice 5, load 4-6): probe -> (final-state accuracy on 512
# fresh sequences at the training length, steps trained of the budget, training CPU seconds)
# (None: not measured). Every probe: d 64, 2 layers, batch 64, d_state 8, eval every 25 steps on 128 sequences.
SEARCH = {
    "AR 8/16 attention, no curriculum, lr 1e-3, 1500 steps": (0.13, 1500, None),
    "AR 8/16 Mamba, no curriculum, lr 3e-3, 1500 steps": (0.13, 1500, None),
    "ATR 12 attention, no curriculum, lr 1e-3, 1500 steps": (0.82, 1500, None),
    "ATR 12 Mamba d_conv=1, no curriculum, lr 3e-3, 1500 steps": (0.77, 1500, None),
    "AR 8/16 attention, curriculum, lr 1e-3, warmup 100, 3000 steps": (0.94, 3000, 82),
    "AR 8/16 attention seed 1, curriculum, lr 1e-3, warmup 100, 3000 steps": (0.88, 3000, 75),
    "AR 8/16 attention, curriculum, lr 1e-3, warmup 100, 6000 steps": (0.98, 3600, 97),
    "AR 8/16 attention seed 1, curriculum, lr 1e-3, warmup 100, 6000 steps": (0.97, 3600, 85),
    "AR 8/16 Mamba, curriculum, lr 3e-3, warmup 100, 3000 steps": (0.98, 1650, 61),
    "ATR 12 attention, curriculum, lr 1e-3, warmup 100, 3000 steps": (0.85, 3000, 69),
    "ATR 12 Mamba d_conv=1, curriculum, lr 3e-3, warmup 100, 3000 steps (stuck at 8 terminals)": (0.70, 3000, 91),
    "AR 8/16 Mamba d_conv=1, curriculum, lr 3e-3, warmup 100, 3000 steps (stuck at 2 pairs, 0.5)": (0.13, 3000, 67),
    "ATR 12 attention, curriculum, lr 1e-3, warmup 100, 8000 steps": (0.92, 8000, 182),
    "ATR 12 Mamba, curriculum, lr 3e-3, warmup 100, 8000 steps": (0.97, 2800, 96),
    "ATR 12 Mamba d_conv=1, curriculum, lr 3e-3, warmup 100, 8000 steps": (0.88, 8000, 262),
    "ATR 12 Mamba d_conv=1, curriculum, lr 3e-3, warmup 100, 16000 steps": (0.95, 16000, 530),
    "ATR 12 Mamba, curriculum, lr 3e-3, warmup 100, 16000 steps": (0.97, 3200, 126),
    "ATR 12 attention, curriculum, lr 1e-3, warmup 100, 16000 steps": (0.96, 12000, 305),
}

SCALE = {
    # all_at: the AR size every model trains at; small_models: the models also trained at the other sizes.
    # cpu: all at 4 pairs / 8 keys, where attention and Mamba fit in 1500 steps (at 8 / 16 neither did:
    # accuracy 0.13 / 0.13, Based 1.00, H3 0.25) - our choice
    "quick": dict(ar=[(2, 4)], all_at=(2, 4), small_models=(), models=("attention", "mamba", "mamba d_conv=1"),
                  atr_models=("mamba d_conv=1",), atr_length=4, d_attn=8, d_ssm=8, d_state=2, steps=6,
                  batch=8, n=16, n_patch=8, seeds=[0]),
    "cpu": dict(ar=[(4, 8), (8, 16)], all_at=(4, 8), small_models=("attention", "mamba", "based"),
                atr_models=("attention", "mamba d_conv=1"), atr_length=12, d_attn=64, d_ssm=64,
                d_state=8, steps=1500, batch=64, n=512, n_patch=128, seeds=[0]),
    # medium (issue 26): AR 8 / 16 and ATR 12 where the cpu budget did not fit, with the length curriculum
    # (2 -> 4 -> 8 pairs / -> 12 terminals) found by the budget search (SEARCH), early-stopped at fit
    "medium": dict(ar=[(8, 16)], all_at=(8, 16), small_models=(), models=MEDIUM_AR, atr_models=tuple(ATR_MODELS),
                   atr_length=12, d_attn=64, d_ssm=64, d_state=8, steps=3000, atr_steps=16000, batch=64, n=512,
                   ar_steps={"attention": 6000},   # 3000 fit seed 0 (0.94), not seed 1 (0.88)
                   n_patch=128, seeds=[0, 1], eval_every=25, train={**CURRICULUM, "warmup": 100}, warmup=100),
    "paper": dict(ar=[(4, 64), (8, 64), (16, 64)], all_at=(16, 64), small_models=tuple(AR_MODELS), atr_length=32, d_attn=64, d_ssm=128,
                  d_state=16, steps=20_000, batch=128, n=1024, n_patch=512, seeds=[0, 1]),
}


def slug(text: str) -> str:
    return text.replace(" ", "").replace("=", "")


def plan(scale: str) -> Plan:
    s, runs = SCALE[scale], []

    def add(task, options, length, label, preset, extra, info):
        steps = s.get("atr_steps", s["steps"]) if task == "ATR" else s.get("ar_steps", {}).get(label, s["steps"])
        for seed in s["seeds"]:
            d = s["d_attn"] if preset == "transformer" else s["d_ssm"]
            runs.append(Run(f"{task}{'' if task == 'ATR' else length}-{slug(label)}-s{seed}", preset, task, options,
                            {"d_model": d, "n_layers": 2, "d_state": s["d_state"], **extra},
                            {"steps": steps, "batch_size": s["batch"], "lr": 1e-3 if preset == "transformer" else 3e-3,
                             "train_length": length, "eval_every": s.get("eval_every", max(1, steps // 20)),
                             "eval_size": 128, "seed": seed, **s.get("train", {})},
                            {**info, "model": label, "seed": seed}))

    for pairs, keys in s["ar"]:
        for label, (preset, extra) in AR_MODELS.items():
            if label in s.get("models", AR_MODELS) and ((pairs, keys) == s["all_at"] or label in s["small_models"]):
                add("AR", {"n_keys": keys, "n_values": keys}, pairs, label, preset, extra,
                    {"task": "AR", "pairs": pairs, "keys": keys})
    for label, (preset, extra) in ATR_MODELS.items():
        if label in s.get("atr_models", ATR_MODELS):
            add("ATR", {}, s["atr_length"], label, preset, extra, {"task": "ATR", "pairs": s["atr_length"], "keys": 64})
    sizes = [size("AR sizes (pairs in context, keys = values)", s["ar"], "up to 16 pairs: the paper's code (issue 17); "
                  "the vocabulary is our choice"),
             size("AR size every model trains at" + (" (the others: " + ", ".join(s["small_models"]) + ")"
                                                      if s["small_models"] else ""), s["all_at"],
                  "the largest" if s["all_at"] == s["ar"][-1] else "our choice (where attention and Mamba fit in the "
                  "step budget)"),
             size("layers", 2, SEED_003 + " (two-layer induction)"),
             size("d_model attention / others", f"{s['d_attn']} / {s['d_ssm']}", "issue 17 (d >= 32 for attention, "
                  "larger for Mamba); the numbers are our choice"),
             size("attention positions", "none", "issue 17 (attention without positions)"),
             size("Mamba d_conv (trained) / ablation", "4 / retrained at 1 and truncated to 4, 3, 2, 1", SEED_003),
             size("Based sliding window", 2), size("ATR document terminals", s["atr_length"]),
             size("d_state", s["d_state"]),
             size("steps (AR / ATR) / batch", f"{s['steps']}"
                  + "".join(f" ({label}: {n})" for label, n in s.get("ar_steps", {}).items())
                  + f" / {s.get('atr_steps', s['steps'])} / {s['batch']}"),
             size("peak lr", "3e-3 (attention 1e-3)"), size("seeds", len(s["seeds"])),
             size("interchange pairs (kept where p_clean - p_corrupt > 0.01)", s["n_patch"]),
             size("accuracy sequences", s["n"])]
    early = EARLY_STOP if scale == "medium" else None
    if scale == "medium":
        sizes += medium_sizes(s)
    return Plan(scale, runs, sizes, settings={"n": s["n"], "n_patch": s["n_patch"], "atr_corrupted": ["key", "value"]}, fit_n=s["n"], early_stop=early)


def medium_sizes(s: dict) -> list[dict]:
    """The medium profile's curriculum, warmup and early stop, and the budget search that chose them."""
    rows = [size("length curriculum", f"from {CURRICULUM['curriculum_start']}, doubling after "
                 f"{CURRICULUM['curriculum_patience']} evaluations (every {s['eval_every']} steps) at >= 95%",
                 "the budget search below (without it attention and Mamba stayed at chance on AR 8 / 16)"),
            size("warmup steps", s["warmup"]),
            size("early stop at fit (curriculum at the training length, last k evaluations and the fit metric >= a)",
                 f"k = {EARLY_STOP['evals']}, a = {EARLY_STOP['accuracy']}", "our choice (CPU budget)")]
    return rows + [size(f"budget search: {probe}", f"accuracy {acc:.2f}, {steps} steps"
                        + ("" if cpu is None else f", {cpu:.0f} CPU-s"),
                        "the cpu profile (2026-12-02)" if cpu is None else
                        "probe 2026-12-03 (seed 0 unless named, one thread, nice 5, load 4-8; REPRODUCTIONS.md)")
                   for probe, (acc, steps, cpu) in SEARCH.items()]


def reading(rows: list[dict]) -> str:
    """The mechanism read at layer 1's block input (the module docstring)."""
    at = layer1_inputs(rows)
    if not at:
        return "none (no pairs kept)"
    best = max(("value", "query", "key"), key=lambda role: at.get(role, float("-inf")))
    if at[best] < READ_MIN:
        return f"none (no role restores >= {READ_MIN})"
    return {"value": "induction", "query": "direct retrieval", "key": "direct retrieval (key)"}[best]


def measure(outcome, plan: Plan) -> dict:
    model, task, info = outcome.model, outcome.task, outcome.run.info
    seed, length = info["seed"], outcome.run.train["train_length"]
    accuracy = final_state_accuracy(model, task, length, plan.settings["n"], seed + 1)
    clean = task.sample(plan.settings["n_patch"], length, seed + 2)
    corrupt = (corrupt_ar if info["task"] == "AR" else corrupt_atr)(clean, task, seed + 3)
    rows, kept = restoration_rows(model, clean, corrupt)
    out = {"accuracy": accuracy, "restoration": rows, "n_kept": kept, "n_pairs": len(clean)}
    if info["task"] == "ATR":   # the answer's occurrence swapped out (the module docstring)
        value_rows, value_kept = restoration_rows(model, clean, corrupt_value(clean, task.terminal_ids, seed + 4))
        out["value_corrupted"] = {"restoration": value_rows, "n_kept": value_kept}
    out["reading"] = read_measures(out)
    if short_convs(model) and outcome.run.model.get("d_conv") == 4:
        truncated = {}
        for width in WIDTHS:
            ablated = copy.deepcopy(model)
            ablate_short_conv(ablated, width)
            truncated[str(width)] = final_state_accuracy(ablated, task, length, plan.settings["n"], seed + 1)
        out["truncated"] = truncated
    return out


def restoration_rows(model, clean, corrupt) -> tuple[list[dict], int]:
    """Mean restoration per layer x hook x role (rows) and the number of pairs kept."""
    # no bar of its own: a second's work inside a reproduction, whose log already counts the runs (its bar broke the
    # background logs' lines)
    result = interchange(model, clean, corrupt, site_grid(model, HOOKS, ROLES), batch_size=2048, progress=False)
    rows = [{"layer": site.layer, "hook": site.component, "role": site.position, "restoration": mean, "sem": sem}
            for site, mean, sem in zip(result.sites, result.mean().tolist(), result.sem().tolist())]
    return rows, int(result.n_kept)


def layer1_inputs(rows: list[dict]) -> dict[str, float]:
    """role -> restoration at layer 1's block input (NaN rows, the mean over no kept pairs, left out)."""
    return {r["role"]: r["restoration"] for r in rows if r["layer"] == 1 and r["hook"] == "hook_resid_pre"
            and np.isfinite(r["restoration"])}


def read_measures(measures: dict) -> str:
    """The reading of one run: on ATR the value-corruption reading first (the module docstring)."""
    if "value_corrupted" in measures:
        at = layer1_inputs(measures["value_corrupted"]["restoration"])
        if at.get("key", float("-inf")) >= READ_MIN and at["key"] >= at.get("query", float("-inf")):
            return "induction"
    return reading(measures["restoration"])


def judge(done, plan: Plan):
    for o in done:   # the reading from the cached rows (measurements cached before a fix of `reading` stay valid)
        if o.measures.get("restoration"):
            o.measures["reading"] = read_measures(o.measures)
    ar = [o for o in done if o.run.info["task"] == "AR"]

    def read(label, task="AR"):
        runs = [o for o in (ar if task == "AR" else select(done, task="ATR")) if o.run.info["model"] == label]
        fits = [o for o in runs if o.fit]
        text = ", ".join(f"{o.run.label}: acc {o.measures.get('accuracy', float('nan')):.2f}, {o.measures.get('reading', '-')}"
                         for o in runs)
        return runs, fits, text

    def reading_claim(labels, want, quote, original):
        texts, fits, runs_all = [], [], []
        for label in labels:
            runs, f, text = read(label)
            texts.append(text)
            fits += f
            runs_all += runs
        agree = [o for o in fits if o.measures.get("reading", "").startswith(want)]
        verdict = ("did not fit" if not fits else "reproduces" if len(agree) == len(fits)
                   else "partly reproduces" if agree else "does not reproduce")
        items = [rule.evidence(o, o.measures.get("reading", "").startswith(want) if o.fit else None) for o in runs_all]
        return rule.claim(SEED_003, quote, original, "; ".join(t for t in texts if t)   # a model not in the plan: no text
                          + f"; read on the runs that fit ({len(fits)})" + unfit_note(runs_all), verdict, items,
                          decides=f"{len(agree)} of {len(fits)} fitted runs read as {want} at layer 1's block input")

    claims = [
        reading_claim(("attention", "based"), "induction", "Transformers and Based learn an induction mechanism: they "
                      "store the key-value association at the value token during the forward pass so that a later layer "
                      "can retrieve the answer.", "트랜스포머 및 Based: 유도 메커니즘을 학습합니다. 이들은 순전파 과정에서 "
                      "값(value) 토큰에 키-값 연관을 저장하여, 이후 레이어가 답을 검색할 수 있도록 합니다."),
        reading_claim(("mamba", "deltanet"), "direct retrieval", "Mamba and DeltaNet mainly use direct retrieval: they "
                      "compute the association at the query token without explicitly storing it at the value token.",
                      "Mamba 및 DeltaNet: 주로 직접 검색을 사용합니다. 이들은 (종종 레이어 0 또는 1에서) 값 토큰에 연관을 "
                      "명시적으로 저장하지 않고 쿼리 토큰에서 연관을 계산합니다.")]
    fail_runs = [o for o in ar if o.run.info["model"] in ("h3", "hyena")]
    n_fit = sum(o.fit for o in fail_runs)
    sizes = {(o.run.info["pairs"], o.run.info["keys"]) for o in fail_runs}
    learnable = [o for o in ar if o.fit and o.run.info["model"] not in ("h3", "hyena")
                 and (o.run.info["pairs"], o.run.info["keys"]) in sizes]   # a failure counts where others fit
    fail_accs = [o.measures.get("accuracy", float("nan")) for o in fail_runs]
    claims.append(rule.claim(SEED_003, "H3 and Hyena fail to learn the task effectively under these conditions.",
                        "H3 및 Hyena: 이러한 조건 하에서 작업을 효과적으로 학습하는 데 실패합니다.",
                        ("; ".join(f"{o.run.label}: acc {o.measures.get('accuracy', float('nan')):.2f} ({o.status})"
                                   for o in fail_runs) + f"; {n_fit} of {len(fail_runs)} fit; other models that fit "
                         f"at the same size: {', '.join(o.run.label for o in learnable) or 'none'}")
                        if fail_runs else "no H3 / Hyena runs at this scale",
                        "inconclusive" if not learnable else "reproduces" if n_fit == 0
                        else "partly reproduces" if n_fit < len(fail_runs) else "does not reproduce",
                        [rule.evidence(o, not o.fit if learnable else None) for o in fail_runs],
                        why="a failure counts where another model fit at the same size",
                        decides="H3 / Hyena accuracy " + ", ".join(f"{a:.2f}" for a in fail_accs),
                        interval=rule.span(fail_accs, plan.settings["n"])))
    retrained_all = [o for o in ar if o.run.info["model"] == "mamba d_conv=1"]
    full = [o for o in fitted(done, task="AR", model="mamba")]
    fit_sizes = {(o.run.info["pairs"], o.run.info["keys"]) for o in full}
    # a collapse counts where Mamba with d_conv = 4 fit at the same size
    retrained = [o for o in retrained_all if (o.run.info["pairs"], o.run.info["keys"]) in fit_sizes]
    trunc = ", ".join(f"{o.run.label}: " + ", ".join(f"w{w} {a:.2f}" for w, a in o.measures["truncated"].items())
                      for o in full if "truncated" in o.measures)
    collapsed = [o for o in retrained if o.measures.get("accuracy", 1.0) < 0.5]
    retrained_accs = [o.measures.get("accuracy", float("nan")) for o in retrained]
    claims.append(rule.claim(SEED_003, "In Mamba the short convolution is essential for AR: reducing the convolution kernel "
                        "size to 1 or removing it makes Mamba's AR performance collapse to nearly 0.",
                        "Mamba에서: 단기 컨볼루션은 AR에 필수적입니다. 컨볼루션 커널 크기를 1로 줄이거나 제거하면, Mamba의 AR "
                        "성능은 거의 0에 가깝게 붕괴됩니다.",
                        "retrained with d_conv = 1: " + ", ".join(f"{o.run.label} acc {o.measures.get('accuracy', float('nan')):.2f}"
                                                                   for o in retrained_all)
                        + f" (compared where d_conv = 4 fit at the same size: {', '.join(o.run.label for o in retrained) or 'nowhere'})"
                        + f"; Mamba d_conv = 4 truncated at load time (no retraining): {trunc or 'no fitted d_conv=4 run'}",
                        "inconclusive" if not retrained else "reproduces" if len(collapsed) == len(retrained)
                        else "partly reproduces" if collapsed else "does not reproduce",
                        [rule.evidence(o, o in collapsed) for o in retrained],
                        decides="retrained d_conv = 1 accuracy " + ", ".join(f"{a:.2f}" for a in retrained_accs),
                        interval=rule.span(retrained_accs, plan.settings["n"])))
    atr_runs, atr_fit, atr_text = read("mamba d_conv=1", "ATR")
    _, att_fit, att_text = read("attention", "ATR")
    _, _, conv_text = read("mamba", "ATR")
    induction = [o for o in atr_fit if o.measures.get("reading") == "induction"]
    reference = [o for o in att_fit if o.measures.get("reading") == "induction"]   # the claim's "like the Transformer"
    profiles = "; ".join(atr_profile(o) for o in select(done, task="ATR") if o.measures.get("restoration"))
    atr_verdict = ("did not fit" if not atr_fit else "reproduces" if len(induction) == len(atr_runs)
                   else "partly reproduces" if induction else "premise fails" if att_fit and not reference
                   else "does not reproduce")
    atr_items = [rule.evidence(o, o.measures.get("reading") == "induction" if o.fit else None)
                 for o in (att_fit if atr_verdict == "premise fails" else atr_runs)]
    claims.append(rule.claim(SEED_003, "On ATR, Mamba without short convolution successfully learns a two-layer induction "
                        "mechanism (storing at the value), like the Transformer.",
                        "메커니즘의 변화: ATR에서 단기 컨볼루션이 없는 Mamba는 트랜스포머와 유사하게 (값에 저장하는) 2-레이어 "
                        "유도 메커니즘을 성공적으로 학습합니다.", f"{atr_text}; attention on ATR: {att_text}"
                        + (f"; Mamba with d_conv = 4 on ATR: {conv_text}" if conv_text else "") + unfit_note(atr_runs)
                        + (f". Layer-1 block input restoration (key / value / query): {profiles}" if profiles else "")
                        + (". Attention, the claim's reference, does not read as induction on this ATR either"
                           if att_fit and not reference else ""), atr_verdict, atr_items,
                        why="the premise read on attention, the claim's reference" if atr_verdict == "premise fails" else "",
                        decides=f"{len(induction)} of {len(atr_runs)} Mamba d_conv=1 ATR runs read as induction; "
                        f"attention {len(reference)} of {len(att_fit)}"))
    atr_acc = [o.measures.get("accuracy", 0.0) for o in atr_runs]
    others = {label: [o.measures.get("accuracy", 0.0) for o in select(done, task="ATR", model=label)]
              for label in ATR_MODELS if label != "mamba d_conv=1"}
    others = {label: acc for label, acc in others.items() if acc}
    other_acc = [a for acc in others.values() for a in acc]
    def beats(o):   # per seed: Mamba d_conv=1 against the other models' runs of the same seed
        rivals = [r.measures.get("accuracy", 0.0) for r in select(done, task="ATR", seed=o.run.info["seed"])
                  if r.run.info["model"] != "mamba d_conv=1"]
        return o.measures.get("accuracy", 0.0) >= max(rivals) - 0.02 if rivals else None

    claims.append(rule.claim(SEED_003, "Behavioural result: Mamba, even without short convolution, matches or beats every other "
                        "architecture on ATR.", "행동 결과: Mamba는 단기 컨볼루션 없이도 다른 모든 아키텍처보다 우수하거나 "
                        "대등한 성능을 ATR에서 보여줍니다.",
                        f"ATR accuracy: Mamba d_conv=1 {', '.join(f'{a:.2f}' for a in atr_acc)}"
                        + "".join(f"; {label} {', '.join(f'{a:.2f}' for a in acc)}" for label, acc in others.items())
                        + f" (compared at this scale: {', '.join(others) or 'no other model'}); steps trained: "
                        + ", ".join(f"{o.run.label} {o.steps}/{o.run.train['steps']}" for o in select(done, task="ATR"))
                        + (" (a run stops early at fit, so accuracies near the stop threshold are not maxima)"
                           if plan.early_stop else ""),
                        "did not fit" if not atr_fit else "inconclusive" if not other_acc else "reproduces"
                        if min(atr_acc) >= max(other_acc) - 0.02 else "does not reproduce",
                        [rule.evidence(o, beats(o)) for o in atr_runs],
                        why="a seed counts when its Mamba d_conv=1 run is within 0.02 of the best other model's run",
                        decides=f"Mamba d_conv=1 {min(atr_acc, default=float('nan')):.2f} (lowest) vs the best other "
                        f"{max(other_acc, default=float('nan')):.2f}",
                        interval=rule.span(atr_acc + other_acc, plan.settings["n"])))
    summary = [{"run": o.run.label, "status": o.status, "accuracy": o.measures.get("accuracy"),
                "pairs kept": o.measures.get("n_kept"), "reading (layer-1 block input)": o.measures.get("reading")}
               for o in done]
    sections = [Table(summary, heading="Accuracy and mechanism reading per run")]
    for o in done:
        if o.measures.get("value_corrupted", {}).get("n_kept"):
            sections.append(restoration_figure(o, "value"))
        if o.measures.get("restoration") and o.measures.get("n_kept"):
            sections.append(restoration_figure(o))
        elif o.measures.get("restoration"):
            sections.append(Text(f"{o.run.label}: accuracy {o.measures['accuracy']:.2f}; no pair kept (the corrupted "
                                 "input lowers the answer's probability in none of them), so there is no restoration "
                                 "to draw.", heading=f"{o.run.label}: no restoration profile"))
    truncated = {o.run.label: {int(w): a for w, a in o.measures["truncated"].items()} for o in done
                 if "truncated" in o.measures}
    if truncated:
        sections.append(accuracy_vs_d_conv(truncated))
    sections.append(Table([{"run": o.run.label, "corrupted": corrupted,
                            **{k: r[k] for k in ("layer", "hook", "role", "restoration", "sem")}}
                           for o in done for corrupted, rows in (("key", o.measures.get("restoration", [])),
                                                                 ("value", o.measures.get("value_corrupted", {})
                                                                  .get("restoration", [])))
                           for r in rows],
                          heading="Restoration per run, corrupted token, layer, hook and role (mean over kept pairs)"))
    return claims, sections


def atr_profile(outcome) -> str:
    """'label: value corrupted k / v / q, key corrupted k / v / q' at layer 1's block input."""
    m = outcome.measures

    def triple(rows):
        at = layer1_inputs(rows)
        return " / ".join(cell_text(at[r]) if r in at else "-" for r in ("key", "value", "query"))
    value = f"value corrupted {triple(m['value_corrupted']['restoration'])}, " if "value_corrupted" in m else ""
    return f"{outcome.run.label}: {value}key corrupted {triple(m['restoration'])}"


def restoration_figure(outcome, corrupted: str = "key"):
    """The heatmap of layers x roles per hook (interp.report.interventions) from the cached rows of the
    key corruption (or, corrupted="value", the ATR value corruption): a stand-in with the
    InterchangeResult fields the builder reads (sites, mean, n_kept, kept)."""
    m = outcome.measures
    part = m if corrupted == "key" else m["value_corrupted"]
    rows = part["restoration"]
    sites = [SimpleNamespace(layer=r["layer"], component=r["hook"], position=r["role"]) for r in rows]
    result = SimpleNamespace(sites=sites, n_kept=part["n_kept"], kept=range(m["n_pairs"]),
                             mean=lambda: np.array([r["restoration"] for r in rows]))
    return restoration_heatmap(result, title=f"{outcome.run.label} ({corrupted} corrupted): accuracy "
                                              f"{m['accuracy']:.2f}, reading: {m['reading']}")
