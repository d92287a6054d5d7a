"""Per-head analysis of delta-rule (DeltaNet) models, and the belief-state analysis of PFSA-SR.

Head analysis (docs/deltanet-heads.md) of every layer whose mixer has a per-head beta clamp
(`mixer.clamp_beta(head, lo, hi)`, applied inside the delta-rule kernel on every path):

    reveal_accuracy(model, batch)                  accuracy at the "reveal" role positions
    head_activations(model, batch)                 {layer: (beta [B,T,H], states [B,T,H,V,K])}
    head_stats(model, batch)                       {layer: probes.heads.HeadStats}
    beta_clamped(model, layer, head, lo, hi)       context: one head's kernel clamp set
    kernel_settings(model, path, impl)             context: execution path and kernel forced
    ablate_heads(model, batch, path=, impl=)       HeadAblation: per head alone, beta clamped to
                                                   [0, 1] ("clamp") and, as a control, pinned to
                                                   the head's mean beta over the batch ("mean")
    analyze_run(run_dir, ...)                      all of it for a trained run directory, with an
                                                   HTML report (`interp heads runs/x`)

Each ablation is one forward pass over the whole batch (in chunks of at most `max_tokens` tokens)
with one head's kernel clamp set: 1 + 2 L H passes for L layers of H heads. `path` ("auto",
"fast", "instrumented") and `impl` (the kernel: "auto", "naive", "chunked", "triton") choose the
execution path; on CUDA "auto" runs Triton, `impl="triton"` forces it (the CPU interpreter under
TRITON_INTERPRET=1). Clamp, path and impl are restored afterwards.

Belief analysis of PFSA-SR (`interp.tasks.pfsa`). The exact belief is the normalised update
(prune, renormalise, transition). A linear recurrence cannot renormalise; the closest linear
recursion drops the renormalisation:

    u_0 = b_0;  swap:  u <- (1 - p) u + p (u o s);  ASK: u unchanged;  ITEM_v at slot i:  u <- u * [g_i = v]
    full reveal (every slot printed since the last swap):  u <- onehot(the printed arrangement)

so u_t = b_t * sum(u_t), and its mass ||u_t||_1 = P(partial reveals since the last full reveal)
decays exponentially whenever reveals are partial (`linear_belief`, `belief_mass`, `decay_rate`).
A full reveal determines the arrangement from the input alone, so the affine injection B(x)
restores the mass; a partial one cannot (the surviving mass depends on the state).
The marginal representation (`linear_marginals`, [n slots, n items], docs/deltanet-heads.md):

    M_0 = I (known start) or 1/n;  swap (i j):  rows i, j <- (1 - p) M_i + p M_j, (1 - p) M_j + p M_i
    ITEM_v at slot i:  row i <- e_v (injected),  column v of every other row <- 0 (not renormalised)

so an unrevealed slot keeps losing the mass the swaps moved onto revealed items
(`adversarial_tokens`: swap (0 2), reveal slot 0, repeated: slot 2's mass is (1 - p)^k).
Trained models are compared through `state_norms` (the norm of hook_state over time) and
`belief_probe` (ridge probe from hidden states to the true belief, R^2 per position).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from interp.training.evaluate import eval_seed, predictions
from interp.tasks.base import Batch
from interp.tasks.pfsa import PfsaSwaps, swap_update
from interp.tasks.repl import permutation_ids
from probes import heads as head_probes
from probes.linear import ProbeReport, probe_state

PATHS = ("auto", "fast", "instrumented")
IMPLS = ("auto", "naive", "chunked", "triton")
MODES = ("clamp", "mean")


# ----------------------------------------------------------------------------- model plumbing


def delta_layers(model: torch.nn.Module) -> list[int]:
    """Indices of the blocks whose mixer has a per-head beta clamp (DeltaNet-like)."""
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        raise TypeError(f"model must be a SequenceModel with .blocks; got {type(model).__name__}")
    return [i for i, block in enumerate(blocks) if hasattr(block.mixer, "clamp_beta")]


def _require_delta(model) -> list[int]:
    layers = delta_layers(model)
    if not layers:
        mixers = sorted({type(m).__name__ for b in model.blocks for m in b.mixers.values()})
        raise ValueError(f"model has no delta-rule layer with a beta clamp (mixers: {mixers}); "
                         "the head analysis needs a DeltaNet model")
    return layers


@contextlib.contextmanager
def kernel_settings(model, path: str = "auto", impl: str | None = None) -> Iterator[None]:
    """Within: every mixer (a parallel mixer2 too; an MLP-only block has none) runs `path`, every
    delta-rule mixer the kernel `impl` (None: unchanged)."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}; got {path!r}")
    if impl is not None and impl not in IMPLS:
        raise ValueError(f"impl must be None or one of {IMPLS}; got {impl!r}")
    mixers = [mixer for block in model.blocks for mixer in block.mixers.values()]
    saved = [(m.execution_path, m.options.get("impl") if hasattr(m, "clamp_beta") else None) for m in mixers]
    try:
        for mixer in mixers:
            mixer.execution_path = path
            if impl is not None and hasattr(mixer, "clamp_beta"):
                mixer.options["impl"] = impl
        yield
    finally:
        for mixer, (old_path, old_impl) in zip(mixers, saved):
            mixer.execution_path = old_path
            if hasattr(mixer, "clamp_beta"):
                mixer.options["impl"] = old_impl


def _role_positions(batch: Batch, role: str) -> torch.Tensor:
    if role not in batch.roles:
        raise ValueError(f"batch has no role {role!r}; roles: {sorted(batch.roles)}")
    positions = batch.roles[role]
    return positions[:, None] if positions.dim() == 1 else positions                # [N, k]


def reveal_accuracy(model, batch: Batch, role: str = "reveal", max_tokens: int = 1 << 16) -> float:
    """Fraction of (example, role position) pairs whose argmax prediction equals the target."""
    positions = _role_positions(batch, role)
    was_training = model.training
    model.eval()
    try:
        pred = predictions(model, batch.tokens, max_tokens)                             # [N, T]
    finally:
        model.train(was_training)
    return (pred.gather(1, positions) == batch.targets.gather(1, positions)).double().mean().item()


def reveal_accuracy_by_length(model, task, lengths: Sequence[int], n: int = 256, seed: int = 1,
                              role: str = "reveal") -> dict[int, float]:
    """{length: reveal accuracy} on n fresh examples per length (evaluation seed stream)."""
    return {int(t): reveal_accuracy(model, task.sample(n, int(t), eval_seed(seed, int(t))), role)
            for t in lengths}


@torch.no_grad()
def head_activations(model, batch: Batch, layers: Sequence[int] | None = None,
                     states: bool = True) -> dict[int, tuple[torch.Tensor, torch.Tensor | None]]:
    """{layer: (hook_beta [B, T, H], hook_state [B, T, H, V, K] or None)} for the delta-rule layers."""
    layers = _require_delta(model) if layers is None else list(layers)
    names = [f"blocks.{layer}.mixer.hook_beta" for layer in layers]
    if states:
        names += [f"blocks.{layer}.mixer.hook_state" for layer in layers]
    _, cache = model.run_with_cache(batch.tokens, names=names)
    return {layer: (cache[f"blocks.{layer}.mixer.hook_beta"],
                    cache[f"blocks.{layer}.mixer.hook_state"] if states else None) for layer in layers}


def head_stats(model, batch: Batch, method: str = "entropy", rtol: float = 1e-3) -> dict[int, head_probes.HeadStats]:
    """{layer: HeadStats} from one instrumented pass over `batch`."""
    return {layer: head_probes.head_statistics(beta, states, method, rtol)
            for layer, (beta, states) in head_activations(model, batch).items()}


# ----------------------------------------------------------------------------- ablations


@dataclass
class HeadAblation:
    """baseline: unablated reveal accuracy; rows: {layer, head, mode, accuracy, lo, hi} per ablation."""

    baseline: float
    rows: list[dict] = field(default_factory=list)

    def accuracy(self, mode: str = "clamp") -> dict[tuple[int, int], float]:
        return {(r["layer"], r["head"]): r["accuracy"] for r in self.rows if r["mode"] == mode}


@contextlib.contextmanager
def beta_clamped(model, layer: int, head: int, lo: float, hi: float) -> Iterator[None]:
    """Within: head `head` of layer `layer` has its beta clamped to [lo, hi] in the kernel."""
    if layer not in _require_delta(model):
        raise ValueError(f"layer must be one of the delta-rule layers {delta_layers(model)}; got {layer!r}")
    mixer = model.blocks[layer].mixer
    saved = mixer.beta_clamp
    try:
        mixer.clamp_beta(head, lo, hi)
        yield
    finally:
        mixer.beta_clamp = saved


def ablate_heads(model, batch: Batch, modes: Sequence[str] = MODES, path: str = "auto",
                 impl: str | None = None, role: str = "reveal", max_tokens: int = 1 << 16) -> HeadAblation:
    """Reveal accuracy with each head's beta ablated alone; see the module docstring."""
    layers = _require_delta(model)
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise ValueError(f"modes must be a non-empty subset of {MODES}; got {list(modes)!r}")
    means = {layer: beta.double().flatten(0, 1).mean(0).tolist()
             for layer, (beta, _) in head_activations(model, batch, layers, states=False).items()}
    with kernel_settings(model, path, impl):
        result = HeadAblation(reveal_accuracy(model, batch, role, max_tokens))
        for layer in layers:
            mixer = model.blocks[layer].mixer
            for head in range(mixer.heads):
                for mode in modes:
                    lo, hi = (0.0, 1.0) if mode == "clamp" else (means[layer][head], means[layer][head])
                    with beta_clamped(model, layer, head, lo, hi):
                        accuracy = reveal_accuracy(model, batch, role, max_tokens)
                    result.rows.append({"layer": layer, "head": head, "mode": mode, "accuracy": accuracy,
                                        "lo": lo, "hi": hi})
    return result


# ----------------------------------------------------------------------------- PFSA beliefs


def _check_pfsa(task) -> PfsaSwaps:
    if not isinstance(task, PfsaSwaps):
        raise TypeError(f"task must be a PFSA-SR task (interp.tasks.pfsa.PfsaSwaps); got {type(task).__name__}")
    return task


def _tokens(task, tokens) -> np.ndarray:
    _check_pfsa(task)
    tokens = np.asarray(tokens.cpu() if isinstance(tokens, torch.Tensor) else tokens)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [N, T]; got shape {tokens.shape}")
    return tokens


def linear_belief(task: PfsaSwaps, tokens: torch.Tensor) -> np.ndarray:
    """The unnormalised linear belief recursion u_t over the n! arrangements (reset at full
    reveals; module docstring): tokens [N, T] -> [N, T, n!] float64."""
    tokens = _tokens(task, tokens)
    n, length = tokens.shape
    G = task.group
    u = np.zeros((n, task.n_states))
    if task.init == "identity":
        u[:, 0] = 1.0
    else:
        u[:] = 1.0 / task.n_states
    out = np.empty((n, length, task.n_states))
    slot = np.zeros(n, dtype=np.int64)
    printed = np.full((n, task.n_items), -1)          # items printed per slot since the last swap (-1: none)
    for t in range(length):
        tok = tokens[:, t]
        is_swap, is_ask, is_item = _kinds(task, tok)
        if is_swap.any():
            swapped = swap_update(u, task.swap_element[np.where(is_swap, tok, 0)], task.p, G)
            u = np.where(is_swap[:, None], swapped, u)
            printed[is_swap] = -1
        slot = np.where(is_ask, tok - task.ask_ids.start, slot)
        if is_item.any():
            consistent = G.perms[:, slot].T == (tok - task.item_ids.start)[:, None]   # [N, n!]
            u = np.where(is_item[:, None] & ~consistent, 0.0, u)
            rows = np.nonzero(is_item)[0]
            printed[rows, slot[rows]] = tok[rows] - task.item_ids.start
            full = is_item & (printed >= 0).all(1) & _is_permutation(printed)
            if full.any():
                u[full] = 0.0
                u[full, permutation_ids(printed[full], G.perms)] = 1.0
        out[:, t] = u
    return out


def _kinds(task, tok: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Masks [N] of swap, ASK and ITEM tokens."""
    is_item = tok >= task.item_ids.start
    return tok < task.ask_ids.start, (tok >= task.ask_ids.start) & ~is_item, is_item


def _is_permutation(printed: np.ndarray) -> np.ndarray:
    return np.array([sorted(row) == list(range(len(row))) for row in printed.tolist()])


def linear_marginals(task: PfsaSwaps, tokens: torch.Tensor, dtype=np.float64) -> np.ndarray:
    """The linear marginal recursion M_t (module docstring) in `dtype`: tokens [N, T] -> [N, T, n, n]
    (slot, item); rows of unrevealed slots lose mass, nothing renormalises."""
    tokens = _tokens(task, tokens)
    n, length = tokens.shape
    k, p = task.n_items, dtype(task.p)
    M = np.broadcast_to(np.eye(k, dtype=dtype) if task.init == "identity" else np.full((k, k), 1 / k, dtype=dtype),
                        (n, k, k)).copy()
    out = np.empty((n, length, k, k), dtype=dtype)
    slot, rows = np.zeros(n, dtype=np.int64), np.arange(n)
    for t in range(length):
        tok = tokens[:, t]
        is_swap, is_ask, is_item = _kinds(task, tok)
        for r in np.nonzero(is_swap)[0]:
            i, j = task.pairs[tok[r]]
            M[r, [i, j]] = (dtype(1) - p) * M[r, [i, j]] + p * M[r, [j, i]]
        slot = np.where(is_ask, tok - task.ask_ids.start, slot)
        item = tok - task.item_ids.start
        for r in rows[is_item]:
            M[r, :, item[r]] = 0
            M[r, slot[r]] = 0
            M[r, slot[r], item[r]] = 1
        out[:, t] = M
    return out


def adversarial_tokens(task: PfsaSwaps, rounds: int, swap: tuple[int, int] = (0, 2), slot: int = 0) -> torch.Tensor:
    """One sequence [1, 3 * rounds]: SWAP_swap ASK_slot ITEM_slot, repeated (the reveal says the
    swap did not happen, a path of probability (1 - p)^rounds)."""
    task = _check_pfsa(task)
    pair = [tuple(x) for x in task.pairs.tolist()].index(tuple(sorted(swap)))
    step = [pair, task.ask_ids.start + slot, task.item_ids.start + slot]
    return torch.tensor([step * rounds])


def belief_mass(unnormalised: np.ndarray) -> np.ndarray:
    """||u_t||_1 (the probability of the reveals so far): [N, T, n!] -> [N, T]."""
    return np.abs(np.asarray(unnormalised)).sum(-1)


def decay_rate(norms: np.ndarray) -> float:
    """Least-squares slope of log(mean norm) against position: norms [N, T] (or [T]); < 0 means decay."""
    norms = np.asarray(norms, dtype=np.float64)
    curve = norms.mean(0) if norms.ndim == 2 else norms
    if curve.ndim != 1 or len(curve) < 2 or not np.all(curve > 0):
        raise ValueError(f"norms must be positive [N, T] or [T] with T >= 2; got shape {norms.shape}")
    return float(np.polyfit(np.arange(len(curve)), np.log(curve), 1)[0])


@torch.no_grad()
def state_norms(model, batch: Batch, layer: int = -1) -> np.ndarray:
    """Frobenius norm of blocks.{layer}.mixer.hook_state at every position: [N, T]."""
    layer = layer % len(model.blocks)
    name = f"blocks.{layer}.mixer.hook_state"
    _, cache = model.run_with_cache(batch.tokens, names=[name])
    return cache[name].flatten(2).double().norm(dim=-1).cpu().numpy()


@torch.no_grad()
def belief_probe(model, batch: Batch, hook: str = "blocks.-1.mixer.hook_state", alpha: float = 1.0,
                 seed: int = 0) -> ProbeReport:
    """Ridge probe from a cached activation [N, T, ...] to the true belief batch.states [N, T, n!]."""
    if hook.startswith("blocks.-1."):
        hook = f"blocks.{len(model.blocks) - 1}." + hook[len("blocks.-1."):]
    _, cache = model.run_with_cache(batch.tokens, names=[hook])
    return probe_state(cache[hook].float(), batch.states.float(), kind="ridge", alpha=alpha, seed=seed)


# ----------------------------------------------------------------------------- run directories


@dataclass
class RunAnalysis:
    """Everything `analyze_run` measured on one DeltaNet run directory."""

    name: str
    stats: dict[int, head_probes.HeadStats]
    histograms: dict[int, tuple[np.ndarray, np.ndarray]]
    ablation: HeadAblation

    def rows(self) -> list[dict]:
        """One row per head: statistics and the ablated accuracies."""
        clamp, mean = self.ablation.accuracy("clamp"), self.ablation.accuracy("mean")
        rows = []
        for layer, stats in self.stats.items():
            for row in stats.rows(layer):
                key = (layer, row["head"])
                row.update({"acc_clamp01": clamp.get(key, float("nan")), "acc_pin_mean": mean.get(key, float("nan"))})
                rows.append(row)
        return rows


def analyze_model(model, batch: Batch, name: str = "model", stats_examples: int = 64, path: str = "auto",
                  impl: str | None = None, bins: int = 40) -> RunAnalysis:
    """Head statistics (on the first `stats_examples` examples) and the ablation sweep (all of them)."""
    model.eval()
    subset = batch.select(slice(0, stats_examples))
    activations = head_activations(model, subset)
    stats = {layer: head_probes.head_statistics(beta, states) for layer, (beta, states) in activations.items()}
    top = max(2.0, max(float(beta.max()) for beta, _ in activations.values()))
    histograms = {layer: head_probes.beta_histogram(beta, bins, (0.0, top)) for layer, (beta, _) in activations.items()}
    return RunAnalysis(name, stats, histograms, ablate_heads(model, batch, path=path, impl=impl))


def analyze_run(run_dir: str | Path, n: int = 256, length: int | None = None, seed: int = 1,
                impl: str | None = None, device: str = "cpu") -> RunAnalysis:
    """Load a DeltaNet run and analyse it on n fresh traces of its task (`interp heads` writes the
    report: interp.report.heads). length: the task length (default: the run's train_length)."""
    import models
    from interp.training import checkpoint as ckpt
    from interp.tasks import make_task

    run_dir = Path(run_dir)
    config = ckpt.read_config(run_dir)
    task = make_task(config["task"]["name"], **config["task"].get("options", {}))
    model = models.load(run_dir, device=device)
    _require_delta(model)
    length = length or int(config.get("train", {}).get("train_length", 16))
    batch = task.sample(n, length, eval_seed(seed, length)).to(device)
    if "reveal" not in batch.roles:
        raise ValueError(f"task {task.name} has no 'reveal' role; the head analysis needs REPL or PFSA traces")
    return analyze_model(model, batch, name=config["model"].get("mixer", "deltanet"), impl=impl)

