"""Imported transformers SSMs: our fast path and causal hook_state patch vs the source model.

    python benchmarks/interop.py [--d-model 256] [--layers 4] [--length 512] [--batch 8]
                                 [--rounds 3] [--threads 1] [--markdown]

For a random transformers MambaForCausalLM (and Mamba2ForCausalLM when models.interop converts
it) at d_model 256, 4 layers, T 512, B 8, converted with models.from_pretrained, in one process,
contenders interleaved in rounds (benchmarks/timing.py):
  (a) forward, no gradient: our fast path (`model(tokens)`) vs the source's own CPU forward;
  (b) one causal patch of the last layer's recurrent state at t = T / 2 from a donor prompt:
      ours as a full `run_with_hooks` pass (hook_state pinned, the scan re-run through the
      kernels), ours resumed (`resume_from` the cached clean run at that layer and t, as
      `interchange` does), vs the source run the Python way: the prefix t + 1 tokens in one
      call, the cached state replaced, then one call per later token (models.interop.reference).
      "ours resumed from the patched carry": resume_from at t + 1 with the cached state after t
      replaced (the same intervention at every position after t, on the fast path: no hook).
      "ours declared patch": the same patch as a models.StatePatch (positions + values), which the
      mixer runs on its fast kernels (stopped at t, the state replaced, resumed: no [B, T, *S]
      states), as a full pass and resumed.
      The source runs one call per token from the start ("source step loop", the baseline) or
      its first t + 1 tokens in one call ("prefix in one call"; on the CPU transformers' Mamba
      scan is itself a loop over the positions).
      Logits agree at every position after t (the max abs difference is reported; at t itself ours
      also reads the patched state out, the source's step loop cannot). When transformer-lens is
      installed, also its TransformerBridge over the same source with the eager Python scan of the
      patched layer and a hook_ssm_state patch: a different intervention (the state is replaced
      where it is read out at t only, not in the recurrence), timed for the cost of a per-step
      state hook; its logits are compared with our read-out-only patch of the same state
      (examples/pretrained_state_patching.readout_only).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import tempfile
from pathlib import Path

import torch

import models
from models.interop.reference import stepwise_logits
from models.interop.registry import CONVERTERS
from timing import interleaved  # benchmarks/timing.py

VOCAB = 1024


def sources(d_model: int, layers: int) -> dict[str, torch.nn.Module]:
    import transformers as tf

    torch.manual_seed(0)
    ids = dict(pad_token_id=0, bos_token_id=0, eos_token_id=0)
    built = {"mamba": tf.MambaForCausalLM(tf.MambaConfig(vocab_size=VOCAB, hidden_size=d_model, state_size=16,
                                                         num_hidden_layers=layers, **ids))}
    if "mamba2" in CONVERTERS:
        built["mamba2"] = tf.Mamba2ForCausalLM(tf.Mamba2Config(
            vocab_size=VOCAB, hidden_size=d_model, state_size=64, head_dim=64, num_heads=2 * d_model // 64,
            n_groups=1, num_hidden_layers=layers, **ids))
    return {name: model.eval() for name, model in built.items()}


def contenders(src, model, clean, donor, t: int, lens: bool = True):
    """{name: fn} for (a) and (b), and a check of the patched logits (max abs diff after t)."""
    last = len(model.blocks) - 1
    hook = f"blocks.{last}.mixer.hook_state"
    with torch.no_grad():
        _, donor_cache = model.run_with_cache(donor, names=[hook])
        hooks = model.resume_hooks(last)
        _, clean_cache = model.run_with_cache(clean, names=hooks["resid"] + hooks["carry"])
    state = donor_cache[hook][:, t].contiguous()

    def patch(s, hook):
        s[:, -(clean.shape[1] - t)] = state  # position t in full and resumed runs alike
        return s

    rows = torch.arange(clean.shape[0])
    carried = dict(clean_cache)
    carried[hook] = clean_cache[hook].clone()
    carried[hook][:, t] = state  # resume_from continues from the carried (patched) state after t

    def passes(fn):
        """(a full run_with_hooks pass, a pass resumed at the last layer and t) with fn on hook_state."""

        @torch.no_grad()
        def full():
            return model.run_with_hooks(clean, fwd_hooks=[(hook, fn)])

        @torch.no_grad()
        def resumed():
            with model.hooks([(hook, fn)]):
                return model.resume_from(clean_cache, rows, last, t, clean.shape[1])

        return full, resumed

    ours_full, ours_resumed = passes(patch)
    # the same patch declared: state after step t (counted from the end: full and resumed runs alike)
    ours_declared_full, ours_declared_resumed = passes(models.StatePatch.at(t - clean.shape[1], values=state))

    @torch.no_grad()
    def ours_carried():
        return model.resume_from(carried, rows, last, t + 1, clean.shape[1])

    def source_loop():
        return stepwise_logits(src, clean, {(last, t): state.clone()})

    def source_prefilled():
        return stepwise_logits(src, clean, {(last, t): state.clone()}, prefill=t + 1)

    reference = source_loop()
    diffs = {"ours full pass": (ours_full() - reference)[:, t + 1:].abs().max().item(),
             "ours resumed": (ours_resumed() - reference[:, t:])[:, 1:].abs().max().item(),
             "ours declared patch, full pass": (ours_declared_full() - reference)[:, t + 1:].abs().max().item(),
             "ours declared patch, resumed": (ours_declared_resumed() - reference[:, t:])[:, 1:].abs().max().item(),
             "ours resumed from the patched carry": (ours_carried() - reference[:, t + 1:]).abs().max().item(),
             "source step loop, prefix in one call": (source_prefilled() - reference)[:, t + 1:].abs().max().item()}
    forward = {"ours fast path": lambda: torch.no_grad()(model)(clean),
               "source forward": lambda: torch.no_grad()(src)(clean)}
    patched = {"ours full pass": ours_full, "ours resumed": ours_resumed,
               "ours declared patch, full pass": ours_declared_full, "ours declared patch, resumed": ours_declared_resumed,
               "ours resumed from the patched carry": ours_carried, "source step loop": source_loop,
               "source step loop, prefix in one call": source_prefilled}
    lens = transformer_lens_patch(src, clean, last, t, state) if lens else None
    if lens is not None:
        with torch.no_grad():
            readout = load_recipe().readout_only(model, clean, last, t, state)
        patched["TransformerLens hook_ssm_state (read-out only)"] = lens
        diffs["TransformerLens hook_ssm_state (read-out only)"] = (lens() - readout).abs().max().item()
    return forward, patched, diffs


def load_recipe():
    path = Path(__file__).resolve().parents[1] / "examples" / "pretrained_state_patching.py"
    spec = importlib.util.spec_from_file_location("pretrained_state_patching", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def transformer_lens_patch(src, clean, layer: int, t: int, state: torch.Tensor):
    """A TransformerBridge hook_ssm_state patch of `layer` at t (its eager scan), or None when
    transformer-lens is missing or cannot wrap the source."""
    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError:
        return None
    directory = tempfile.mkdtemp(prefix="interop-tl-")
    src.save_pretrained(directory)  # boot reads the config from a path; the weights come from hf_model
    try:  # a copy: the bridge swaps its own components into the model it wraps
        bridge = TransformerBridge.boot_transformers(directory, hf_model=copy.deepcopy(src), device="cpu")
        bridge.blocks[layer].mixer.eager_scan = True
    except Exception as error:  # an architecture its bridge does not wrap
        print(f"TransformerLens: {type(src).__name__} not wrapped: {type(error).__name__}: {error}")
        return None
    hook = f"blocks.{layer}.mixer.hook_ssm_state"  # Mamba: [B, E, T, N], the position on its pos_dim
    pos_dim = getattr(bridge.hook_dict[hook], "pos_dim", None)
    if pos_dim is None:  # Mamba-2's bridge: per-chunk states, no per-position state to patch
        print(f"TransformerLens: {type(src).__name__}'s {hook} has no position axis (pos_dim None); left out")
        return None

    def patch(s, hook):
        at_t = s.movedim(pos_dim, 1)[:, t]  # a view of s at position t
        if at_t.shape != state.shape:
            raise ValueError(f"its state at t has shape {tuple(at_t.shape)}, ours {tuple(state.shape)}")
        at_t.copy_(state)
        return s

    run = lambda: torch.no_grad()(bridge.run_with_hooks)(clean, fwd_hooks=[(hook, patch)])  # noqa: E731
    try:
        run()
    except (ValueError, IndexError) as error:  # a state layout other than ours
        print(f"TransformerLens: {type(src).__name__}'s hook_ssm_state not patched like ours: {error}")
        return None
    return run


def main(argv=None) -> list[tuple]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--models", default="mamba,mamba2", help="comma-separated: mamba, mamba2 (when converted)")
    p.add_argument("--no-transformer-lens", action="store_true", help="skip the TransformerLens contender")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(1)
    clean, donor = torch.randint(0, VOCAB, (2, args.batch, args.length), generator=gen)
    t = args.length // 2
    rows = []
    wanted = set(args.models.split(","))
    for name, src in sources(args.d_model, args.layers).items():
        if name not in wanted:
            continue
        model = models.from_pretrained(src)
        forward, patched, diffs = contenders(src, model, clean, donor, t, not args.no_transformer_lens)
        for part, group, baseline in (("(a) forward", forward, "source forward"),
                                      ("(b) causal patch", patched, "source step loop")):
            timing = interleaved(group, rounds=args.rounds, warmup=1)
            for contender in group:
                mine, base = timing[contender], timing[baseline]
                rows.append((name, part, contender, mine.min, mine.median, base.min / mine.min, mine.cpu_min,
                             base.cpu_min / mine.cpu_min, diffs.get(contender), timing.load))
    print(f"B={args.batch} T={args.length} d_model={args.d_model} layers={args.layers} vocab={VOCAB} "
          f"threads={args.threads} patch at t={t} of the last layer; torch {torch.__version__}")
    head = ("| model | part | contender | min s | median s | speed-up vs source (min wall) | CPU s (min) | "
            "speed-up vs source (CPU) | max abs diff logits after t | load |")
    print(head if args.markdown else head.replace("|", " "))
    if args.markdown:
        print("|" + "---|" * 10)
    for name, part, contender, best, median, ratio, cpu, cpu_ratio, diff, load in rows:
        diff = "-" if diff is None else f"{diff:.1e}"
        print(f"| {name} | {part} | {contender} | {best:.3f} | {median:.3f} | {ratio:.1f}x | {cpu:.3f} | "
              f"{cpu_ratio:.1f}x | {diff} | {load} |")
    return rows


if __name__ == "__main__":
    main()
