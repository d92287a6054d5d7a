"""Decoding at the real-size configs (random weights): our generate vs transformers' generate.

    python benchmarks/generation.py [--models mamba mamba2 gpt2] [--prompt 512] [--new 128]
                                    [--rounds 2] [--threads 1] [--markdown]

For each model (benchmarks/real_configs.py: Mamba-130m, Mamba-2 130M, GPT-2 small, Llama 125M, and
a 172M NemotronH hybrid of Mamba-2, attention and MLP layers; here: "lfm2", LFM2-350M's published
config, 354M parameters, 10 gated short-conv and 6 GQA attention layers, ~1.4 GB in float32),
converted with models.from_pretrained, B = 1, greedy, in one process, the contenders interleaved
in rounds (benchmarks/timing.py):
  ours: generate N tokens from the DecodingState after the prompt (a copy per run; the copy is
      timed, < 0.3 ms a token): t_N / N; the prompt alone (max_new_tokens = 1) beside it;
  HF: generate with max_new_tokens = 1 (the prompt, one read-out) and = N: (t_N - t_1) / (N - 1);
  ours + hook_state readers: a reader on every layer's hook_state (it keeps the largest |h| of
      each call), so every new token's states pass through the hook point (the instrumented path);
  ours + state patch: a models.StatePatch (deltas) on the middle layer's hook_state (the first
      recurrent layer from the middle on) at the generated position T + N / 2 (the steps
      without an entry run plain).
Memory: the bytes our DecodingState carries after the prompt and after N tokens (constant for a
purely recurrent model; the KV cache grows by 2 L G d_head values a token) and HF's cache the
same way. Also whether our greedy tokens equal HF's (random real-size weights: near-ties may
split them; the first differing step is reported).

    python benchmarks/generation.py --reader-cost [--models mamba2] [--prompt 256] [--new 64]

The cost of hook_state readers on every layer during generate (prompt and new tokens), each
contender in a fresh process per round, interleaved (the order reversed every other round), CPU
seconds of the generating thread, minimum over rounds: plain; readers selecting steps (their
`positions`: the last prompt step and every generated one, models/decoding/readers.py streams them);
readers selecting head 0 only (`heads`); readers of every step (the prompt's [B, T, *S] formed).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch

import models
from models import StatePatch
from models.memory import format_bytes
from real_configs import HYBRIDS, REAL_SIZES, build_source, tokens  # benchmarks/real_configs.py
from timing import interleaved, load_average  # benchmarks/timing.py


# LFM2-350M (LiquidAI/LFM2-350M config.json): d 1024, 16 layers, attention at 2, 5, 8, 10, 12, 14
LFM2_ATTENTION = (2, 5, 8, 10, 12, 14)
EXTRA = ("lfm2",)


def lfm2_source(seed: int = 0) -> torch.nn.Module:
    """A random-weight transformers Lfm2ForCausalLM of LFM2-350M's config, eval mode, float32."""
    import transformers as tf

    torch.manual_seed(seed)
    config = tf.Lfm2Config(
        vocab_size=65536, hidden_size=1024, intermediate_size=6656, num_hidden_layers=16, num_attention_heads=16,
        num_key_value_heads=8, conv_L_cache=3, block_multiple_of=256, block_ffn_dim_multiplier=1.0,
        block_auto_adjust_ff_dim=True, max_position_embeddings=128000, rope_theta=1e6, norm_eps=1e-5,
        tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=7,
        layer_types=["full_attention" if i in LFM2_ATTENTION else "conv" for i in range(16)])
    return tf.Lfm2ForCausalLM(config).eval()


def source_and_prompt(name: str, length: int) -> tuple[torch.nn.Module, torch.Tensor]:
    """The random-weight transformers model `name` and a random prompt [1, length] in its vocabulary."""
    if name == "lfm2":
        source = lfm2_source()
        return source, torch.randint(0, source.config.vocab_size, (1, length),
                                     generator=torch.Generator().manual_seed(0))
    return build_source(name), tokens(name, 1, length)


def hf_generate(source, prompt, new: int, **options):
    return source.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, pad_token_id=0, **options)


def tensor_bytes(obj, seen=None) -> int:
    """The bytes of every tensor reachable from obj (attributes, lists, tuples, dicts), each once."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v, seen) for v in obj)
    if hasattr(obj, "__dict__") and not isinstance(obj, (type, torch.nn.Module)):
        return sum(tensor_bytes(v, seen) for v in vars(obj).values())
    return 0


def hf_run(source, prompt, new: int) -> tuple[torch.Tensor, int]:
    """HF's greedy tokens [1, T + new] and the bytes of its cache after them."""
    out = hf_generate(source, prompt, new, return_dict_in_generate=True)
    cache = getattr(out, "past_key_values", None) or getattr(out, "cache_params", None)
    return out.sequences, tensor_bytes(cache)


def state_readers(model, found: list):
    def read(x, hook):
        found.append(float(x.detach().abs().amax()))
    return [(n, read) for n in model.hook_names() if n.endswith("mixer.hook_state")]


def middle_patch(model, position: int):
    """A StatePatch (deltas 0.01) at `position` on the first layer from the middle on with a
    hook_state (a hybrid's middle layer may be attention), or None where none has one."""
    layer = next((i for i, block in enumerate(model.blocks)
                  if i >= len(model.blocks) // 2 and hasattr(block.mixer, "hook_state")), None)
    if layer is None:
        return None
    deltas = torch.full((1, *model.blocks[layer].mixer.state_shape), 0.01)
    return [(f"blocks.{layer}.mixer.hook_state", StatePatch([0], [position], deltas=deltas))]


def contenders(ours, source, prompt, new: int) -> dict:
    """{label: fn}: ours from the state after the prompt (copied: each run starts there) for N
    tokens, plain, with readers and with a state patch; the prompt alone; HF for 1 and N tokens."""
    first, state = ours.generate(prompt, 1, return_state=True, progress=False)
    feed, found = first[:, -1:], []
    patch = middle_patch(ours, prompt.shape[1] + new // 2)
    runs = {
        "ours prompt": lambda: ours.generate(prompt, 1, progress=False),
        f"ours {new}": lambda: ours.generate(feed, new, state=state.copy(), progress=False),
        "HF 1": lambda: hf_generate(source, prompt, 1),
        f"HF {new}": lambda: hf_generate(source, prompt, new),
    }
    if any(n.endswith("hook_state") for n in ours.hook_names()):
        def with_readers():
            with ours.hooks(readers=state_readers(ours, found)):
                return ours.generate(feed, new, state=state.copy(), progress=False)
        runs[f"ours + readers {new}"] = with_readers
    if patch is not None:
        runs[f"ours + state patch {new}"] = lambda: ours.generate(feed, new, state=state.copy(), fwd_hooks=patch,
                                                                  progress=False)
    return runs


def per_token(rounds, label: str, new: int, prefill_label: str | None = None) -> tuple[float, float, float]:
    """(min, median, CPU min) seconds per new token over the rounds' wall times and the thread's
    CPU times (what the load leaves meaningful, benchmarks/timing.py): t_N / N for a run that
    starts from the state after the prompt, (t_N - t_1) / (N - 1) against its prompt-only run."""
    def spread(full, base):  # per-token times, sorted
        if base is None:
            return sorted(t / new for t in full)
        return sorted((a - b) / (new - 1) for a, b in zip(full, base))

    run, base = rounds[label], None if prefill_label is None else rounds[prefill_label]
    wall = spread(run.times, None if base is None else base.times)
    cpu = spread(run.cpu_times, None if base is None else base.cpu_times)
    return wall[0], wall[len(wall) // 2], cpu[0]


def measure(name: str, length: int, new: int, n_rounds: int) -> dict:
    source, prompt = source_and_prompt(name, length)
    ours = models.from_pretrained(source)
    with torch.no_grad():
        ours_tokens, state = ours.generate(prompt, new, return_state=True, progress=False)
        hf_tokens, hf_bytes = hf_run(source, prompt, new)
        _, prompt_state = ours.generate(prompt, 1, return_state=True, progress=False)
        differs = (ours_tokens[0, length:] != hf_tokens[0, length:]).nonzero()
        runs = contenders(ours, source, prompt, new)
        rounds = interleaved(runs, rounds=n_rounds, warmup=0)
    result = {
        "model": name, "prompt": length, "new": new, "load": rounds.load,
        "tokens equal HF": "yes" if not len(differs) else f"until step {int(differs[0])}",
        "ours state after prompt": prompt_state.nbytes, "ours state after N": state.nbytes,
        "HF cache after prompt": hf_run(source, prompt, 1)[1], "HF cache after N": hf_bytes,
    }
    result["ours ms/token"] = per_token(rounds, f"ours {new}", new)
    result["HF ms/token"] = per_token(rounds, f"HF {new}", new, "HF 1")
    for extra in ("readers", "state patch"):
        if f"ours + {extra} {new}" in runs:
            result[f"ours + {extra} ms/token"] = per_token(rounds, f"ours + {extra} {new}", new)
    result["prompt ms (ours / HF, min)"] = (min(rounds["ours prompt"].times), min(rounds["HF 1"].times))
    return result


def show(result: dict, markdown: bool) -> None:
    def fmt(value):
        if isinstance(value, tuple) and all(isinstance(v, float) for v in value):
            return " / ".join(f"{v * 1e3:.1f}" for v in value)  # seconds -> ms
        if isinstance(value, int) and value > 4096:
            return format_bytes(value)
        return str(value)

    rows = [(k, fmt(v)) for k, v in result.items()]
    if markdown:
        print("| " + " | ".join(k for k, _ in rows) + " |")
        print("|" + "---|" * len(rows))
        print("| " + " | ".join(v for _, v in rows) + " |")
    else:
        for k, v in rows:
            print(f"  {k:32s} {v}")


READER_MODES = ("plain", "readers, selected steps", "readers, heads [0]", "readers, every step")


def largest_state_reader(positions=None, heads=None):
    """A hook_state reader keeping the largest |h| it is handed; positions / heads: its selection."""
    def read(x, hook):
        read.largest = max(read.largest, float(x.abs().amax()))
    read.largest, read.positions, read.heads = 0.0, positions, heads
    return read


def reader_run(name: str, mode: str, length: int, new: int) -> dict:
    """In this process: {"prompt", "total"} CPU seconds of generate(prompt, 1) and (prompt, new)
    with `mode`'s readers on every hook_state (after a short warm-up generate)."""
    source, prompt = source_and_prompt(name, length)
    ours = models.from_pretrained(source)
    del source
    selection = {"plain": None, "readers, selected steps": dict(positions=[length - 1, *range(length, length + new - 1)]),
                 "readers, heads [0]": dict(heads=[0]), "readers, every step": {}}[mode]
    readers = [] if selection is None else [(n, largest_state_reader(**selection)) for n in ours.hook_names()
                                            if n.endswith("mixer.hook_state")]
    times = {}
    with ours.hooks(readers=readers):
        ours.generate(prompt[:, :16], 2, progress=False)
        for label, count in (("prompt", 1), ("total", new)):
            start = time.thread_time()
            ours.generate(prompt, count, progress=False)
            times[label] = time.thread_time() - start
    return times


def reader_cost(name: str, length: int, new: int, rounds: int, threads: int) -> list[str]:
    """Markdown rows: each READER_MODES contender's prompt and prompt + new CPU seconds (min over
    rounds, a fresh process each) and its ratio to plain."""
    found: dict[str, list[dict]] = {mode: [] for mode in READER_MODES}
    load = [load_average()]
    for r in range(rounds):
        for mode in READER_MODES if r % 2 == 0 else reversed(READER_MODES):
            command = [sys.executable, __file__, "--reader-run", mode, "--models", name, "--prompt", str(length),
                       "--new", str(new), "--threads", str(threads)]
            out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
            found[mode].append(json.loads(out.strip().splitlines()[-1]))
    load.append(load_average())
    best = {mode: {k: min(run[k] for run in runs) for k in ("prompt", "total")} for mode, runs in found.items()}
    rows = []
    for mode in READER_MODES:
        b, p = best[mode], best["plain"]
        rows.append(f"| {name} | {length} + {new} | {mode} | {b['prompt']:.2f} s ({b['prompt'] / p['prompt']:.2f}) | "
                    f"{b['total']:.2f} s ({b['total'] / p['total']:.2f}) | "
                    f"{(b['total'] - b['prompt']) / (new - 1) * 1e3:.0f} ms | {load[0]:.1f}-{load[1]:.1f} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["mamba", "mamba2", "gpt2", "nemotron_h"],
                        choices=REAL_SIZES + HYBRIDS + EXTRA)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--reader-cost", action="store_true", help="readers on every hook_state, fresh processes")
    parser.add_argument("--reader-run", choices=READER_MODES, help=argparse.SUPPRESS)  # one --reader-cost process
    args = parser.parse_args()
    if args.new < 2:
        parser.error(f"--new must be >= 2 (the per-token time needs two lengths); got {args.new}")
    torch.set_num_threads(args.threads)
    if args.reader_run:
        print(json.dumps(reader_run(args.models[0], args.reader_run, args.prompt, args.new)))
        return
    if args.reader_cost:
        print("| model | prompt + new | readers | prompt CPU (vs plain) | prompt + new CPU (vs plain) | "
              "per new token | load |\n|---|---|---|---|---|---|---|")
        for name in args.models:
            print("\n".join(reader_cost(name, args.prompt, args.new, args.rounds, args.threads)), flush=True)
        return
    print(f"generation: B 1, prompt {args.prompt}, {args.new} new tokens, {args.threads} thread(s); "
          "ms/token as wall min / wall median / CPU min over rounds")
    for name in args.models:
        print(name)
        show(measure(name, args.prompt, args.new, args.rounds), args.markdown)


if __name__ == "__main__":
    main()
