"""Interchange grid: batched `interp.analysis.interventions.interchange` vs one forward pass per site (and pyvene).

Grid: 2 layers x 4 hooks x 4 roles (key, value, query, answer) = 32 sites, N = 256 AR pairs
(clean, key-corrupted). Methods, timed side by side in one process (round-robin rounds, so every
method sees the same drift in machine load), each with its own copy of the model:

  loop      what one writes by hand: the clean run cached once, then per site one
            `run_with_hooks` pass of the N corrupted examples with that site patched, every
            mixer on the instrumented path (models.instrumented())
  loop-auto the same loop on the default path: each mixer is instrumented only where a per-step
            hook (hook_state, ...) is patched, the fast path elsewhere
  all-pairs interchange(batch_size=R, skip_noops=False, resume=False): every (site, example)
            pair, packed into whole passes of up to R rows
  whole     interchange(batch_size=R, resume=False): the same, without the pairs whose patch
            cannot change the answer (site after the answer position, or clean value == corrupt
            value there)
  batched   interchange(batch_size=R) as shipped: also resumes each pair at its site's block and
            first position from the corrupt run's cache and stops at the answer
            (SequenceModel.resume_from)
  pyvene    pyvene.IntervenableModel with one VanillaIntervention per site ("pos" unit), one call
            (a source and a base pass) per site; same model, sites and positions
            (benchmarks/pyvene_peer.py; hook_state shown to pyvene flattened to [B, T, prod(S)])

Each row's cost is also given as a ratio to one plain forward pass of the same N rows at full
length (`model(corrupt.tokens)` under no_grad on the default path, timed in the same round-robin
rounds): seconds / forward seconds, which a slower or busier machine scales alike, so a
regression shows as a larger ratio on any machine.

The exact grid (a second table, issue 36): benchmarks/attribution.py's grid on its untrained
models (Mamba d_state 8, Transformer with RoPE; d_model 64, 2 layers; AR with keys and values
from 2 x pairs each): every position x {hook_resid_pre, mixer.hook_out, mixer.hook_state
(Mamba)} x both layers, N pairs, `interchange` as shipped (min_effect 0.01), timed against one
plain forward of the N rows (benchmarks/timing.interleaved: min wall and min CPU of the calling
thread over the rounds); interventions / s counts sites x N over the min wall time.

Every method except loop-auto runs inside models.instrumented(); interchange's resumed passes
(batched) lift it and take the default path per mixer, like loop-auto, so they agree with the
others up to float rounding (last column). Time covers the interchange only (model, data and
imports are set up before); peak memory is a fresh process's peak RSS during one run minus its RSS
before. "work" counts what the blocks computed: rows x positions summed over every block call
(whole, cached and resumed passes alike; a resumed pass's recomputed prefix for Based / BaseConv /
Hyena is not counted), so seconds / work shows what a pass costs beyond its arithmetic. Agreement: max |p_patched -
p_patched(loop)| over sites x examples.

    python benchmarks/interventions.py [--markdown] [--exact-only]
    python3 benchmarks/interventions.py --device cuda --markdown     (on a GPU: packing's side)

With --device cuda every method runs on the GPU (timings synchronised; peak memory is the GPU's
peak allocation during one run, `torch.cuda.max_memory_allocated`); methods whose packages are
missing there (pyvene) are reported as failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import models  # noqa: E402
from interp.analysis.interventions import Site, answer_probs, corrupt_ar, interchange, site_grid  # noqa: E402
from interp.tasks import make_task  # noqa: E402
from interp.tasks.recall import AssociativeRecall  # noqa: E402
from models.backbone import SequenceModel  # noqa: E402
from models.registry import preset_config  # noqa: E402
from pyvene_peer import PyveneGrid  # noqa: E402  (benchmarks/pyvene_peer.py)
from timing import interleaved  # noqa: E402  (benchmarks/timing.py)

ROLES = ["key", "value", "query", "answer"]
MODELS = {
    "tanh_rnn": dict(
        build=dict(d_model=64, n_layers=2, residual=True, norm="layernorm"),
        hooks=["blocks.{l}.hook_resid_pre", "blocks.{l}.mixer.hook_in", "blocks.{l}.mixer.hook_state",
               "blocks.{l}.mixer.hook_out"],
    ),
    "mamba": dict(
        build=dict(d_model=32, n_layers=2, d_state=8),
        hooks=["blocks.{l}.hook_resid_pre", "blocks.{l}.mixer.hook_conv", "blocks.{l}.mixer.hook_state",
               "blocks.{l}.mixer.hook_out"],
    ),
}
# (N pairs, method, rows per pass or None) per model
PLAN = {
    "tanh_rnn": [(256, "loop", None), (256, "loop-auto", None), (256, "all-pairs", 2048), (256, "whole", 256), (256, "batched", 256),
                 (256, "batched", 2048), (256, "pyvene", None), (16, "loop", None), (16, "loop-auto", None), (16, "whole", 512),
                 (16, "batched", 512)],
    "mamba": [(256, "loop", None), (256, "loop-auto", None), (256, "all-pairs", 2048), (256, "whole", 256), (256, "batched", 256),
              (256, "batched", 2048), (256, "pyvene", None), (16, "loop", None), (16, "loop-auto", None), (16, "whole", 512),
              (16, "batched", 512)],
}


# the exact grid of benchmarks/attribution.py: its models' shapes, its hooks (per layer, where present)
EXACT_MODELS = {"mamba": dict(d_state=8, d_conv=4), "transformer": dict(positional="rope")}
EXACT_HOOKS = ("hook_resid_pre", "mixer.hook_out", "mixer.hook_state")


def rss_mb(field: str) -> float:
    """VmRSS (now) or VmHWM (peak) of this process in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def setup(name: str, n: int, pairs: int, device: str = "cpu"):
    torch.manual_seed(0)
    task = AssociativeRecall(n_keys=32, n_values=32)
    clean = task.sample(n, pairs, seed=0)
    corrupt = corrupt_ar(clean, task, seed=1)
    model = models.build(name, vocab_size=task.vocab_size, **MODELS[name]["build"]).eval().to(device)
    sites = site_grid(model, MODELS[name]["hooks"], ROLES)
    return model, clean.to(device), corrupt.to(device), sites


def loop_probs(model, clean, corrupt, sites) -> torch.Tensor:
    """p_patched [S, N]: the clean run cached once, then one patched pass per site."""
    rows = torch.arange(len(clean))
    query = clean.roles["query"]
    y = clean.targets[rows, query]
    _, cache = model.run_with_cache(clean.tokens, names=sorted({s.hook for s in sites}))
    out = []
    for site in sites:
        source = cache[site.hook][rows, clean.roles[site.position]]

        def patch(act, hook, source=source, position=corrupt.roles[site.position]):
            act = act.clone()
            act[rows, position] = source
            return act

        out.append(answer_probs(model.run_with_hooks(corrupt.tokens, fwd_hooks=[(site.hook, patch)]), query, y))
    return torch.stack(out)


def runner(name: str, method: str, rows: int | None, n: int, pairs: int, device: str = "cpu"):
    """(run() -> p_patched [S, N], passes counter) for one method on its own copy of the model."""
    model, clean, corrupt, sites = setup(name, n, pairs, device)
    grid = PyveneGrid(model) if method == "pyvene" else None  # ImportError where pyvene is missing
    passes = [0, 0]  # unembedding calls, row-positions computed summed over blocks
    if method != "pyvene":  # pyvene runs on its own copy of the model; its adapter counts instead
        model.unembed.register_forward_hook(lambda *args: passes.__setitem__(0, passes[0] + 1))
        for block in model.blocks:  # hook_resid_mid sees [rows, positions, D] in whole and resumed passes
            block.hook_resid_mid.register_forward_hook(
                lambda module, args, out: passes.__setitem__(1, passes[1] + out.shape[0] * out.shape[1]))

    def run() -> torch.Tensor:
        with torch.no_grad(), models.instrumented(method != "loop-auto"):
            if method == "pyvene":
                probs = grid(clean, corrupt, sites)
                passes[0] = grid.adapter.calls
                return probs
            if method in ("loop", "loop-auto"):
                return loop_probs(model, clean, corrupt, sites)
            return interchange(model, clean, corrupt, sites, batch_size=rows, min_effect=0.0,
                               skip_noops=method != "all-pairs", resume=method == "batched").p_patched

    if device == "cpu":
        return run, passes

    def run_synchronised() -> torch.Tensor:
        result = run()
        torch.cuda.synchronize()
        return result

    return run_synchronised, passes


def forward_runner(name: str, n: int, pairs: int, device: str = "cpu"):
    """run() -> logits [N, T, V]: one plain forward of the N corrupted rows at full length, no
    hooks, each mixer on its default path (the unit of the ratio column)."""
    model, _, corrupt, _ = setup(name, n, pairs, device)

    def run() -> torch.Tensor:
        with torch.no_grad():
            logits = model(corrupt.tokens)
        if device == "cuda":
            torch.cuda.synchronize()
        return logits

    return run


def exact_grid(name: str, n: int, pairs: int):
    """benchmarks/attribution.py's grid on its untrained model: (model, clean, corrupt, sites);
    sites: every position x EXACT_HOOKS x both layers."""
    task = make_task("AR", n_keys=2 * pairs, n_values=2 * pairs)
    clean = task.sample(n, pairs, seed=4)
    corrupt = corrupt_ar(clean, task, seed=5)
    torch.manual_seed(0)
    model = SequenceModel(preset_config(name, vocab_size=task.vocab_size, d_model=64, n_layers=2,
                                        **EXACT_MODELS[name])).eval()
    length = clean.tokens.shape[1]
    sites = [Site(f"blocks.{l}.{h}", t) for l in range(2) for h in EXACT_HOOKS
             if f"blocks.{l}.{h}" in model.hook_names() for t in range(length)]
    return model, clean, corrupt, sites


def exact_table(names, n: int, pairs: int, rounds: int) -> list[str]:
    """Markdown rows: interchange over the exact grid vs one plain forward of the same N rows, per
    model, timed in the same interleaved rounds (after one warm-up round)."""
    contenders, grids, results = {}, {}, {}
    for name in names:
        model, clean, corrupt, sites = grids[name] = exact_grid(name, n, pairs)

        def grid(name=name, model=model, clean=clean, corrupt=corrupt, sites=sites):
            results[name] = interchange(model, clean, corrupt, sites, min_effect=0.01, progress=False)

        def forward(model=model, tokens=corrupt.tokens):
            with torch.no_grad():
                model(tokens)

        contenders |= {f"{name} grid": grid, f"{name} forward": forward}
    timed = interleaved(contenders, rounds=rounds, warmup=1)
    lines = [
        f"Exact grid (benchmarks/attribution.py's, untrained, N = {n}, T = {2 * pairs + 4}; "
        f"{rounds} interleaved rounds after one warm-up, load average {timed.load}): min wall s / min CPU s",
        "",
        "| model | sites x pairs | pairs run / skipped (passes) | grid | plain forward (N rows) | "
        "grid / forward, wall (CPU) | interventions / s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in names:
        grid, forward, result = timed[f"{name} grid"], timed[f"{name} forward"], results[name]
        sites = len(grids[name][3])
        lines.append(
            f"| {name} | {sites} x {n} | {result.n_run} / {result.n_skipped} ({result.n_passes}) | "
            f"{grid.min:.3f} / {grid.cpu_min:.3f} | {forward.min:.4f} / {forward.cpu_min:.4f} | "
            f"{grid.min / forward.min:.1f}x ({grid.cpu_min / forward.cpu_min:.1f}x) | {sites * n / grid.min:,.0f} |"
        )
    return lines


def gpu_peak_memory(run) -> str:
    """Peak GPU allocation (MiB) during one run, above what was allocated before it."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    run()
    return f"{(torch.cuda.max_memory_allocated() - before) / 2**20:.0f}"


def child(name: str, method: str, rows: int | None, n: int, pairs: int) -> None:
    """Peak memory of one run in a fresh process (the timing runs side by side in the parent)."""
    torch.set_num_threads(1)
    run, _ = runner(name, method, rows, n, pairs)
    before = rss_mb("VmRSS")
    run()
    print(json.dumps({"peak_mb": rss_mb("VmHWM") - before}))


def peak_memory(name, method, rows, n, pairs) -> str:
    cmd = [sys.executable, __file__, "--child", name, method, str(rows or 0), "--n", str(n), "--pairs", str(pairs)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode:
        return "failed: " + (proc.stderr.strip().splitlines() or ["?"])[-1][:100]
    return f"{json.loads(proc.stdout.strip().splitlines()[-1])['peak_mb']:.0f}"


def time_side_by_side(runs: dict, repeats: int) -> tuple[dict, dict]:
    """Fastest time of each run over `repeats` round-robin rounds (after one warm-up round, which
    also gives each method's result); failures are reported instead of timed."""
    results, best = {}, {}
    for key, run in runs.items():
        try:
            results[key] = run()
        except Exception as error:  # noqa: BLE001  (a failing contender is reported in the table)
            results[key] = error
    for _ in range(repeats):
        for key, run in runs.items():
            if isinstance(results[key], Exception):
                continue
            start = time.perf_counter()
            run()
            best[key] = min(best.get(key, float("inf")), time.perf_counter() - start)
    return results, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=256, help=argparse.SUPPRESS)
    parser.add_argument("--pairs", type=int, default=8, help="key-value pairs in context (T = 2 pairs + 4)")
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--repeats", type=int, default=3, help="round-robin rounds; each method's time is its fastest")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--exact-only", action="store_true", help="only the exact grid's table (CPU)")
    args = parser.parse_args()
    if args.child:
        name, method, rows = args.child
        child(name, method, int(rows) or None, args.n, args.pairs)
        return

    torch.set_num_threads(1)
    exact = [] if args.device == "cuda" else [""] + exact_table(list(EXACT_MODELS), args.n, args.pairs, args.repeats + 2)
    if args.exact_only:
        print("\n".join(exact[1:]))
        return
    where = (f"{torch.cuda.get_device_name()} (peak memory: GPU allocation)" if args.device == "cuda"
             else "1 thread, 2-core CPU shared with other jobs")
    lines = [
        f"Machine: {platform.machine()}, torch {torch.__version__}, {where} "
        f"(load average {os.getloadavg()[0]:.1f} at start). AR with {args.pairs} pairs in context "
        f"(T = {2 * args.pairs + 4}), untrained models (timing only), 2 layers x 4 hooks x 4 roles = 32 sites; "
        f"methods timed side by side in one process, fastest of {args.repeats} round-robin rounds; peak "
        f"memory from one run of each method in a fresh process; x forward: seconds over those of one plain "
        f"forward of the N rows at full length, timed in the same rounds.",
        "",
        "| model | N pairs | method | rows per pass | forward passes | work (k row-positions x blocks) | "
        "seconds | x forward | speed-up vs loop | speed-up vs loop-auto | peak extra memory (MiB) | max abs diff p vs loop |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in args.models:
        for n in sorted({n for n, _, _ in PLAN[name]}, reverse=True):
            plan = [(method, rows) for size, method, rows in PLAN[name] if size == n]
            runs, counters, missing = {}, {}, {}
            for method, rows in plan:
                try:
                    runs[method, rows], counters[method, rows] = runner(name, method, rows, n, args.pairs, args.device)
                except ImportError as error:  # pyvene where it is not installed
                    missing[method, rows] = error
            runs["forward", None] = forward_runner(name, n, args.pairs, args.device)  # the ratio's unit
            results, best = time_side_by_side(runs, args.repeats)
            results.update(missing)
            reference = results["loop", None]
            for method, rows in plan:
                head = f"| {name} | {n} | {method} | {rows or n} |"
                result = results[method, rows]
                if isinstance(result, Exception):
                    lines.append(f"{head} - | - | - | - | - | - | - | failed: {type(result).__name__}: {str(result)[:90]} |")
                    print(lines[-1], flush=True)
                    continue
                seconds = best[method, rows]
                speedups = " | ".join(f"{best[loop, None] / seconds:.1f}x" for loop in ("loop", "loop-auto"))
                passes = counters[method, rows][0] // (args.repeats + 1)
                work = "-" if method == "pyvene" else f"{counters[method, rows][1] / (args.repeats + 1) / 1e3:.0f}"
                memory = (peak_memory(name, method, rows, n, args.pairs) if args.device == "cpu"
                          else gpu_peak_memory(runs[method, rows]))
                lines.append(
                    f"{head} {passes} | {work} | {seconds:.2f} | {seconds / best['forward', None]:.1f} | {speedups} | "
                    f"{memory} | {(result - reference).abs().max().item():.1e} |"
                )
                print(lines[-1], flush=True)
            lines.append(f"| {name} | {n} | plain forward | {n} | 1 | - | {best['forward', None]:.4f} | 1.0 | "
                         "- | - | - | - |")
            print(lines[-1], flush=True)
    print("\n".join(lines + exact) if args.markdown else "\n".join(exact))


if __name__ == "__main__":
    main()
