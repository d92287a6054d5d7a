"""Selective copying (seed 001; interp.tasks.selective_copy): data tokens scattered among noise tokens
at random positions, reproduced in order after the context, one per marker (no teacher forcing).
S4D (time-invariant, computed as a convolution on its fast path) vs Mamba (selective) vs H3
(time-invariant SSM with multiplicative gates) vs attention (a Transformer with rotary positions),
two layers each; per-token and whole-sequence copy accuracy at the training length and at twice it."""

from __future__ import annotations

import torch

from interp.reproduce import verdicts as rule
from interp.reproduce.engine import FIT_THRESHOLD, Plan, Run, fitted, select, size, unfit_note
from interp.report.evaluation import accuracy_vs_length
from interp.report.html import Table
from interp.training.evaluate import eval_seed, predictions

NAME = "selective-copy"
TITLE = "Selective copying: time-invariant S4D vs selective Mamba vs H3 vs attention"
SEED_001 = "001_44e260f4e2a25805.txt"
MAMBA = "Mamba paper (arXiv 2312.00752) App. E.1, as we recall it (not checked against the paper here)"
MODELS = {"s4d": ("s4d", {}), "mamba": ("mamba", {}), "h3": ("h3", {}),
          "attention": ("transformer", {"positional": "rope"})}

SCALE = {
    "quick": dict(d_model=8, d_state=4, n_layers=2, steps=6, batch_size=8, length=4, k=2, n_data=4, seeds=[0], n=32),
    "cpu": dict(d_model=64, d_state=16, n_layers=2, steps=2000, batch_size=64, length=32, k=4, n_data=8,
                seeds=[0, 1], n=512),
    "paper": dict(d_model=64, d_state=16, n_layers=2, steps=400_000, batch_size=64, length=4096, k=16, n_data=14,
                  seeds=[0, 1], n=1024),
}


def plan(scale: str) -> Plan:
    s = SCALE[scale]
    lr = 1e-4 if scale == "paper" else 3e-3
    runs = [Run(f"{label}-s{seed}", preset, "SelectiveCopy", {"n_tokens": s["k"], "n_data": s["n_data"]},
                {"d_model": s["d_model"], "n_layers": s["n_layers"], "d_state": s["d_state"], **extra},
                {"steps": s["steps"], "batch_size": s["batch_size"], "lr": lr, "train_length": s["length"],
                 "curriculum": True, "curriculum_start": s["k"], "curriculum_patience": 1, "eval_every": 25,
                 "eval_size": 128, "seed": seed},
                {"model": label, "seed": seed})
            for label, (preset, extra) in MODELS.items() for seed in s["seeds"]]
    paper = scale == "paper"
    sizes = [size("context positions L (curriculum from k, doubling at >= 95% on the last marker)", s["length"],
                  MAMBA if paper else "our choice"),
             size("tokens to copy k", s["k"], MAMBA if paper else "our choice"),
             size("data token kinds (vocab = kinds + noise + marker)", s["n_data"],
                  MAMBA + " (vocab 16 with noise; we add a marker)" if paper else "our choice"),
             size("layers", s["n_layers"], MAMBA), size("d_model", s["d_model"], MAMBA if paper else "our choice"),
             size("d_state", s["d_state"]), size("steps", s["steps"], MAMBA if paper else "our choice"),
             size("batch", s["batch_size"], MAMBA if paper else "our choice"),
             size("peak lr (warmup + cosine)", lr, MAMBA + " (constant there)" if paper else "our choice"),
             size("seeds", len(s["seeds"])), size("evaluation sequences", s["n"])]
    return Plan(scale, runs, sizes, settings={"lengths": [s["length"], 2 * s["length"]], "n": s["n"]},
                fit_metric=copy_fit, fit_n=s["n"])


@torch.no_grad()
def copy_accuracy(model, task, length: int, n: int, seed: int, device="cpu") -> tuple[float, float]:
    """(per-token accuracy over the k markers, fraction of sequences with all k right) on fresh data."""
    batch = task.sample(n, length, eval_seed(seed, length)).to(device)
    right = (predictions(model, batch.tokens) == batch.targets)[batch.loss_mask].reshape(n, -1)   # [n, k]
    return right.float().mean().item(), right.all(1).float().mean().item()


def copy_fit(model, task, run: Run, device: str, n: int) -> float:
    return copy_accuracy(model, task, run.train["train_length"], n, run.train["seed"] + 7, device)[0]


def measure(outcome, plan: Plan) -> dict:
    out = {}
    for length in plan.settings["lengths"]:
        token, whole = copy_accuracy(outcome.model, outcome.task, length, plan.settings["n"],
                                     outcome.run.info["seed"] + 1, next(outcome.model.parameters()).device)
        out[str(length)] = {"token": token, "sequence": whole}
    return out


def _token(o, length) -> float:
    return o.measures.get(str(length), {}).get("token", float("nan"))


def judge(done, plan: Plan):
    length = plan.settings["lengths"][0]
    chance = 1 / plan.runs[0].task_object().n_data

    def line(label):
        runs = select(done, model=label)
        accs = ", ".join(f"s{o.run.info['seed']} {_token(o, length):.2f}" for o in runs if o.measures)
        return runs, f"{label}: per-token copy accuracy at L={length} {accs or 'none'} (chance {chance:.2f})"

    def solved(label):
        return len(fitted(done, model=label))

    claims = []
    runs, text = line("mamba")
    s4d_runs, s4d_text = line("s4d")
    n_m, n_s = solved("mamba"), solved("s4d")
    verdict = ("inconclusive" if not runs or not s4d_runs else "reproduces" if n_m == len(runs) and n_s == 0 else "partly reproduces" if n_m > 0 and n_m > n_s
               else "did not fit" if n_m == 0 and n_s == 0 else "does not reproduce")
    def paired(model_runs, other_runs, want_fit, other_fit):
        """Per seed: the model's runs in the claim's direction (fit == want_fit) where the other model's run of
        that seed is as the claim needs (fit == other_fit; None: any)."""
        ok = {o.run.info["seed"] for o in other_runs if other_fit is None or o.fit == other_fit}
        return [rule.evidence(o, o.fit == want_fit if o.run.info["seed"] in ok else None) for o in model_runs]

    def accs(model_runs):
        return [_token(o, length) for o in model_runs if o.measures]

    claims.append(rule.claim(SEED_001, "Thanks to this content-based gating, selective state space models became able to "
                        "perform selective copying and induction-like tasks that earlier recurrent models could not "
                        "solve.", "이러한 콘텐츠 기반 게이팅(content-based gating) 덕분에 선택적 상태 공간 모델은 이전의 순환 "
                        "모델들이 해결하지 못했던 선택적 복사 및 유도(induction)-유사 작업을 수행할 수 있게 되었습니다.",
                        f"{text}; {n_m}/{len(runs)} seeds fit (>= {FIT_THRESHOLD}); {s4d_text}; {n_s}/{len(s4d_runs)} "
                        "fit" + unfit_note(runs), verdict, paired(runs, s4d_runs, True, False) + paired(s4d_runs, runs, False, True),
                        decides="per-token copy accuracy, Mamba " + ", ".join(f"{a:.2f}" for a in accs(runs))
                        + " vs S4D " + ", ".join(f"{a:.2f}" for a in accs(s4d_runs)),
                        interval=rule.span(accs(runs) + accs(s4d_runs), plan.settings["n"])))
    h3_runs, h3_text = line("h3")
    n_h = solved("h3")
    verdict = ("inconclusive" if not s4d_runs else "reproduces" if n_s == 0 and n_m > 0
               else "inconclusive" if n_s == 0 else "does not reproduce")
    claims.append(rule.claim(SEED_001, "But S4 had a limitation that matters for language: its dynamics were time-invariant. "
                        "... The model could not decide, based on content, to remember certain tokens and ignore others.",
                        "하지만 S4에는 언어에 중요한 한계가 있었습니다: 그 동역학(dynamics)이 시간 불변적(time-invariant)이었다는 "
                        "것입니다. ... 이 모델은 내용에 기반하여 특정 토큰을 기억하고 다른 토큰을 무시할지 결정할 수 없었습니다.",
                        f"{s4d_text}; {n_s}/{len(s4d_runs)} seeds fit; (H3, also time-invariant but gated: {h3_text}, "
                        f"{n_h}/{len(h3_runs)} fit); a failure counts only where Mamba fit with the same budget "
                        f"({n_m} did)", verdict, paired(s4d_runs, runs, False, True),
                        decides="S4D per-token copy accuracy " + ", ".join(f"{a:.2f}" for a in accs(s4d_runs)),
                        interval=rule.span(accs(s4d_runs), plan.settings["n"])))
    att_runs, att_text = line("attention")
    n_a = solved("attention")
    verdict = ("inconclusive" if not att_runs else "reproduces" if n_a == len(att_runs) else "partly reproduces" if n_a
               else "did not fit" if any(o.status == "did not fit" for o in att_runs) else "diverged")
    claims.append(rule.claim(SEED_001, "Attention can do exactly that: it selects. A fixed linear filter cannot.",
                        "어텐션은 정확히 그것을 할 수 있습니다: 선택합니다(selects). 고정된 선형 필터는 그럴 수 없습니다.",
                        f"{att_text}; {n_a}/{len(att_runs)} seeds fit" + unfit_note(att_runs), verdict,
                        [rule.evidence(o, o.fit) for o in att_runs],
                        decides="attention per-token copy accuracy " + ", ".join(f"{a:.2f}" for a in accs(att_runs)),
                        interval=rule.span(accs(att_runs), plan.settings["n"])))
    rows = [{"run": o.run.label, "status": o.status, "length reached": o.length_reached,
             **{f"{kind}@{t}": m[kind] for t, m in o.measures.items() for kind in ("token", "sequence")}}
            for o in done if o.measures]
    curves = {o.run.label: {int(t): m["token"] for t, m in o.measures.items()} for o in done if o.measures}
    sections = [Table(rows or [{"note": "no run trained yet"}],
                      heading="Copy accuracy: per token and whole sequence (all k right), at L and 2L")]
    if curves:   # none when nothing is trained yet (reproduce(train=False))
        sections.append(accuracy_vs_length(curves, FIT_THRESHOLD, length, title="Per-token copy accuracy vs context "
                                           "length").update_yaxes(title="per-token copy accuracy")
                        .update_xaxes(title="context positions L"))
    return claims, sections
