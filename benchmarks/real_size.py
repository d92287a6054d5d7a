"""Real size: our instrumented models against the transformers model at the published 124M-130M
configurations (random weights, benchmarks/real_configs.py; nothing is downloaded).

    python benchmarks/real_size.py [--sections fwd,cache,patch,interchange,attribution]
                                   [--models gpt2,llama,mamba,mamba2] [--lengths 512,2048]
                                   [--rounds 2] [--threads 1] [--markdown]

Each (section, model) runs in a fresh subprocess (one thread), so a contender that runs out of
memory is recorded as killed instead of ending the run, and each starts from the same memory.
Within it the contenders are timed in interleaved rounds (benchmarks/timing.py; the minimum over
rounds) and each call's peak memory is read as the rise of the process's peak RSS over its RSS
just before the call (/proc/self/clear_refs resets the peak; malloc_trim first returns freed heap
to the system), the largest over the rounds. Ratios are ours / the source's: below 1 is better.

Sections:
  fwd          forward (no gradient) and forward+backward (cross-entropy on the next token,
               every parameter's gradient) at B = 1 and each length, ours against the source. A
               source call that does not finish in REAL_SIZE_SOURCE_LIMIT_S (400 s) is recorded
               as such (transformers' Mamba on a CPU: a Python loop over the positions) and
               ours is timed alone; its ratio is then an upper bound. forward+backward also
               counts the bytes autograd keeps for the backward (distinct storages packed by
               saved_tensors_hooks), and both passes the peak of live tensor bytes (the
               profiler's allocation records): memory by design, which the RSS peak shows only
               through the allocator (its heap state moves that peak by several percent).
  cache        run_with_cache at T = 512 under torch.no_grad(): every hook, hook_state only (and
               its head 0 / channel 0), and streamed to disk, against a plain forward of ours
               (time ratio, peak); the default budget (half the memory available) may refuse.
  patch        a state patch of the middle layer at t = T / 2, T = 1024: declared
               (models.StatePatch) and as a hook function, against a plain forward.
  lens         a propagating state edit (+delta on the state of the middle layer at t = T / 2)
               against TransformerLens 4.3 (when installed), whose eager scan takes it on
               hook_ssm_write (the write term dt x B^T; Mamba and Mamba-2): ours as a hook
               function on hook_state and as a declared StatePatch(deltas=...), on a small Mamba
               (d_model 256, 4 layers, vocab 1024; B 8, T 256) and on the real config (B 1,
               T 1024); the logits of both are compared (max abs difference).
  analysis     the logit lens at every position, a decomposition's direct logit attribution at
               the last position (T 512), the effective attention of one layer for one head /
               16 channels (T 1024, Mamba and Mamba-2), against a plain forward.
  import       models.from_pretrained of a saved checkpoint directory against transformers'
               from_pretrained of it: time, peak, peak / weight bytes.
  interchange  the exact interchange grid (each position x {hook_resid_pre, mixer.hook_out,
               mixer.hook_state} x layer) at N = 8, T = 64 and 512: sites per second and peak.
               A sample of positions is timed, the midpoint of every 8th (T 64) and 256th (T 512)
               stretch of positions (REAL_SIZE_STEP_64 / _512), whose mean cost per site is the
               grid's (a pass resumes at the site's position): the rate per site is what is
               reported, the whole grid's time its extrapolation.
  attribution  attribution patching of the same grid at N = 8, T = 512 (all positions).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from real_configs import REAL_SIZES, build_source, tokens  # noqa: E402
from timing import interleaved, load_average  # noqa: E402

SECTIONS = ("fwd", "cache", "patch", "lens", "analysis", "import", "interchange", "attribution")
RECURRENT = ("mamba", "mamba2")


# ---- memory -------------------------------------------------------------------------------

def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def with_peak(fn, peaks: list):
    """fn wrapped so each call appends its peak RSS rise (bytes) to peaks."""

    def run():
        _trim()
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # resets VmHWM to the current RSS
        before = _status("VmRSS:")
        out = fn()
        peaks.append(_status("VmHWM:") - before)
        return out

    return run


def saved_for_backward(fn) -> int:
    """Bytes of the distinct storages autograd keeps for the backward during fn() (the activation
    memory a backward needs, independent of the allocator's state, unlike the RSS peak)."""
    sizes = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        sizes[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fn()
    return sum(sizes.values())


def live_peak(fn) -> int:
    """The most bytes of CPU tensors alive at once during fn(): the running sum of the profiler's
    allocation and free records (torch.profiler, profile_memory), independent of the allocator."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as recorded:
        fn()
    changes = sorted((event.start_ns(), event.nbytes()) for event in recorded.profiler.kineto_results.events()
                     if event.name() == "[memory]" and event.device_type() == torch.autograd.DeviceType.CPU)
    live = peak = 0
    for _, change in changes:
        live += change
        peak = max(peak, live)
    return peak


def measure(contenders: dict, rounds: int, warmup: int = 1) -> dict:
    """{name: {"s": min wall s, "cpu": min CPU s, "peak": bytes, "load": "a-b"}} of interleaved rounds."""
    peaks = {name: [] for name in contenders}
    wrapped = {name: with_peak(fn, peaks[name]) for name, fn in contenders.items()}
    timing = interleaved(wrapped, rounds=rounds, warmup=warmup)
    return {name: {"s": timing[name].min, "cpu": timing[name].cpu_min, "peak": max(peaks[name]),
                   "load": timing.load} for name in contenders}


# ---- the sections (run in a worker subprocess) -------------------------------------------

def _pair(name: str):
    import models

    source = build_source(name)
    return source, models.from_pretrained(source)


def _loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


def section_fwd(name: str, lengths: list[int], rounds: int) -> list[dict]:
    source, ours = _pair(name)
    rows = []
    skipped = os.environ.get("REAL_SIZE_SOURCE_SKIP", "").split(",")
    for length in lengths:
        positions = getattr(source.config, "n_positions", None) or getattr(source.config, "max_position_embeddings", None)
        if positions is not None and length > positions:
            rows.append({"model": name, "T": length, "what": "forward, forward+backward",
                         "error": f"not run: the model has {positions} positions"})
            continue
        ids = tokens(name, 1, length)

        def backward(model, logits_of):
            def run():
                model.zero_grad(set_to_none=True)
                _loss(logits_of(model), ids).backward()
                model.zero_grad(set_to_none=True)
            return run

        ours_logits = lambda m: m(ids)  # noqa: E731
        source_logits = lambda m: m(ids, use_cache=False).logits  # noqa: E731
        for what, group in (
            ("forward", {"ours": torch.no_grad()(lambda: ours(ids)),
                         "source": torch.no_grad()(lambda: source(ids, use_cache=False).logits)}),
            ("forward+backward", {"ours": backward(ours, ours_logits), "source": backward(source, source_logits)}),
        ):
            if what in skipped or not _finishes(group["source"], SOURCE_LIMIT_S):  # transformers' Mamba on a CPU
                result = measure({"ours": group["ours"]}, rounds, warmup=1 if length <= 512 else 0)["ours"]
                rows.append({"model": name, "T": length, "what": what, "ours_s": result["s"], "ours_peak": result["peak"],
                             "source_over_s": SOURCE_LIMIT_S, "source_skipped": what in skipped, "load": result["load"]})
                continue
            result = measure(group, rounds, warmup=1 if length <= 512 else 0)
            tensors = {f"{who}_live": live_peak(group[who]) for who in group}
            if what != "forward":
                tensors.update({f"{who}_saved": saved_for_backward(group[who]) for who in group})
            rows.append({"model": name, "T": length, "what": what, **_versus(result), **tensors})
    return rows


SOURCE_LIMIT_S = int(os.environ.get("REAL_SIZE_SOURCE_LIMIT_S", "400"))


def _finishes(fn, limit_s: int) -> bool:
    """Whether fn() returns within limit_s seconds (SIGALRM: transformers' slow paths are Python loops over
    the positions, which it interrupts; one C call runs to its end first)."""
    import signal

    def expire(signum, frame):
        raise TimeoutError

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(limit_s)
    try:
        fn()
        return True
    except TimeoutError:
        return False
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _versus(result: dict, ours: str = "ours", source: str = "source") -> dict:
    a, b = result[ours], result[source]
    return {"ours_s": a["s"], "source_s": b["s"], "time_ratio": a["s"] / b["s"], "cpu_ratio": a["cpu"] / b["cpu"],
            "ours_peak": a["peak"],
            "source_peak": b["peak"], "peak_ratio": a["peak"] / max(b["peak"], 1), "load": a["load"]}


def section_cache(name: str, lengths: list[int], rounds: int) -> list[dict]:
    import tempfile

    _, ours = _pair(name)
    length = 512
    ids = tokens(name, 1, length)
    states = [n for n in ours.hook_names() if n.endswith("hook_state")]
    directory = Path(tempfile.mkdtemp(prefix="real-size-cache-"))

    def streamed():  # the previous round's files removed first (inside the timing: about 0.1 s for 11 GB)
        shutil.rmtree(directory / "run", ignore_errors=True)
        return ours.run_with_cache(ids, to_disk=directory / "run")

    group = {"forward": torch.no_grad()(lambda: ours(ids)),
             "run_with_cache, every hook": lambda: ours.run_with_cache(ids),
             "run_with_cache, streamed to disk": streamed}
    if states:
        group["run_with_cache, hook_state only"] = lambda: ours.run_with_cache(ids, names=states)
        group["run_with_cache, hook_state only, heads=[0]"] = lambda: ours.run_with_cache(ids, names=states, heads=[0])
    group = {what: torch.no_grad()(fn) for what, fn in group.items()}  # as a researcher reads activations
    rows = []
    for what, fn in group.items():  # one at a time: a refusal or a failure is a result of its own
        try:
            result = measure({"forward": group["forward"], what: fn}, rounds)
        except Exception as error:  # noqa: BLE001 - the refusal is the row
            rows.append({"model": name, "T": length, "what": what, "error": f"{type(error).__name__}: {error}"})
            continue
        rows.append({"model": name, "T": length, "what": what, "s": result[what]["s"],
                     "vs_forward": result[what]["s"] / result["forward"]["s"], "peak": result[what]["peak"],
                     "cpu_vs_forward": result[what]["cpu"] / result["forward"]["cpu"],
                     "forward_peak": result["forward"]["peak"], "load": result[what]["load"]})
    shutil.rmtree(directory, ignore_errors=True)
    return rows


def section_patch(name: str, lengths: list[int], rounds: int) -> list[dict]:
    import models

    if name not in RECURRENT:
        return []
    _, ours = _pair(name)
    length, layer = 1024, None
    ids, donor = tokens(name, 1, length, seed=0), tokens(name, 1, length, seed=1)
    layer = len(ours.blocks) // 2
    hook, t = f"blocks.{layer}.mixer.hook_state", length // 2
    with torch.no_grad():
        _, donor_cache = ours.run_with_cache(donor, names=[hook])
    state = donor_cache[hook][:, t].clone()
    del donor_cache

    def hook_fn(s, hook):
        s[:, t] = state
        return s

    group = {"forward": torch.no_grad()(lambda: ours(ids)),
             "declared StatePatch": torch.no_grad()(
                 lambda: ours.run_with_hooks(ids, fwd_hooks=[(hook, models.StatePatch.at(t, values=state))])),
             "hook-function patch": torch.no_grad()(lambda: ours.run_with_hooks(ids, fwd_hooks=[(hook, hook_fn)]))}
    result = measure(group, rounds)
    return [{"model": name, "T": length, "what": what, "s": r["s"], "vs_forward": r["s"] / result["forward"]["s"],
             "cpu_vs_forward": r["cpu"] / result["forward"]["cpu"],
             "peak": r["peak"], "forward_peak": result["forward"]["peak"], "load": r["load"]}
            for what, r in result.items()]


def section_lens(name: str, lengths: list[int], rounds: int) -> list[dict]:
    import copy
    import tempfile

    import models

    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError:
        return [{"model": name, "what": "TransformerLens", "error": "transformer-lens is not installed"}]
    if name not in RECURRENT:
        return []
    rows = []
    cases = (("small", 8, 256, _small(name)), ("small, float64", 8, 256, _small(name).double()),
             ("real", 1, 1024, build_source(name)))
    for label, batch, length, source in cases:
        ours = models.from_pretrained(source)
        directory = tempfile.mkdtemp(prefix="real-size-lens-")
        source.save_pretrained(directory)
        bridge = TransformerBridge.boot_transformers(directory, hf_model=copy.deepcopy(source), device="cpu")
        layer, t = len(ours.blocks) // 2, length // 2
        bridge.blocks[layer].mixer.eager_scan = True
        ids = torch.randint(0, source.config.vocab_size, (batch, length), generator=torch.Generator().manual_seed(4))
        hook = f"blocks.{layer}.mixer.hook_state"
        delta = 0.5 * torch.randn(batch, *ours.blocks[layer].mixer.state_shape, generator=torch.Generator().manual_seed(5),
                                  dtype=source.dtype)

        def ours_fn(s, hook):
            s[:, t] += delta
            return s

        def lens_fn(w, hook):  # Mamba [b, E, T, N], Mamba-2 [b, T, H, P, N]; float32 in its eager scan
            (w[:, :, t] if name == "mamba" else w[:, t]).add_(delta.to(w.dtype))
            return w

        declared = models.StatePatch(torch.arange(batch), torch.full((batch,), t), deltas=delta)
        group = {"ours forward": lambda: ours(ids),
                 "ours hook-function patch": lambda: ours.run_with_hooks(ids, fwd_hooks=[(hook, ours_fn)]),
                 "ours declared StatePatch": lambda: ours.run_with_hooks(ids, fwd_hooks=[(hook, declared)]),
                 "TransformerLens hook_ssm_write patch": lambda: bridge.run_with_hooks(
                     ids, fwd_hooks=[(f"blocks.{layer}.mixer.hook_ssm_write", lens_fn)])}
        group = {k: torch.no_grad()(fn) for k, fn in group.items()}
        diff = (group["ours hook-function patch"]() - group["TransformerLens hook_ssm_write patch"]().to(source.dtype)
                ).abs().max()
        result = measure(group, rounds)
        lens = result["TransformerLens hook_ssm_write patch"]
        rows += [{"model": f"{name} ({label})", "T": length, "what": f"{what}, B {batch}", "s": r["s"],
                  "vs_forward": r["s"] / result["ours forward"]["s"], "vs_lens": r["s"] / lens["s"],
                  "cpu_vs_lens": r["cpu"] / lens["cpu"],
                  "peak": r["peak"], "diff": float(diff), "load": r["load"]} for what, r in result.items()]
        del bridge, ours
        shutil.rmtree(directory, ignore_errors=True)
    return rows


def _small(name: str):
    """The small model of the TransformerLens comparison: d_model 256, 4 layers, vocab 1024."""
    import transformers as tf

    torch.manual_seed(0)
    if name == "mamba":
        config = tf.MambaConfig(vocab_size=1024, hidden_size=256, state_size=16, num_hidden_layers=4)
        return tf.MambaForCausalLM(config).eval()
    config = tf.Mamba2Config(vocab_size=1024, hidden_size=256, state_size=64, head_dim=64, num_heads=8, n_groups=1,
                             num_hidden_layers=4)
    return tf.Mamba2ForCausalLM(config).eval()


def _grid_batches(name: str, length: int, n: int = 8):
    """Clean and corrupt batches of random tokens: the corrupt run differs at the first position;
    the answer is the clean run's most likely last token (so p_clean is not tiny)."""
    from interp.tasks.base import Batch

    clean_tokens, corrupt_tokens = tokens(name, n, length, seed=2), tokens(name, n, length, seed=2).clone()
    corrupt_tokens[:, 0] = tokens(name, n, 1, seed=3)[:, 0]
    targets = torch.zeros_like(clean_tokens)
    mask = torch.zeros_like(clean_tokens, dtype=torch.bool)
    mask[:, -1] = True
    states = torch.zeros(n, length)
    return (lambda tk: Batch(tk, targets.clone(), mask, states))(clean_tokens), \
        Batch(corrupt_tokens, targets.clone(), mask, states)


def _grid(ours, name: str, positions):
    from interp.analysis.interventions import site_grid

    hooks = ["blocks.{l}.hook_resid_pre", "blocks.{l}.mixer.hook_out"]
    if name in RECURRENT:
        hooks.append("blocks.{l}.mixer.hook_state")
    return site_grid(ours, hooks, list(positions))


MAX_MEMORY = os.environ.get("REAL_SIZE_MAX_MEMORY")  # interchange / attribution budget (None: half the free memory)
INTERCHANGE_STEP = {64: int(os.environ.get("REAL_SIZE_STEP_64", "8")), 512: int(os.environ.get("REAL_SIZE_STEP_512", "256"))}


def section_interchange(name: str, lengths: list[int], rounds: int) -> list[dict]:
    from interp.analysis.interventions import interchange

    _, ours = _pair(name)
    rows = []
    for length in (64, 512):
        clean, corrupt = _grid_batches(name, length)
        with torch.no_grad():
            clean.targets[:, -1] = ours(clean.tokens)[:, -1].argmax(-1)
        step = INTERCHANGE_STEP[length]
        sites = _grid(ours, name, range(step // 2, length, step))  # each stratum's midpoint: its mean cost
        full = len(_grid(ours, name, range(length)))
        result = measure({"interchange": lambda: interchange(ours, clean, corrupt, sites, max_memory=MAX_MEMORY)}, 1,
                         warmup=0)["interchange"]
        rows.append({"model": name, "T": length, "what": f"interchange, N 8, {len(sites)} of {full} sites",
                     "s": result["s"], "sites_per_s": len(sites) / result["s"],
                     "sites_per_cpu_s": len(sites) / result["cpu"],
                     "grid_s": full / (len(sites) / result["s"]), "peak": result["peak"], "load": result["load"]})
    return rows


def section_attribution(name: str, lengths: list[int], rounds: int) -> list[dict]:
    from interp.analysis.interventions import attribute

    _, ours = _pair(name)
    length = 512
    clean, corrupt = _grid_batches(name, length)
    with torch.no_grad():
        clean.targets[:, -1] = ours(clean.tokens)[:, -1].argmax(-1)
    sites = _grid(ours, name, range(length))
    result = measure({"attribution": lambda: attribute(ours, clean, corrupt, sites, max_memory=MAX_MEMORY)}, 1,
                     warmup=0)["attribution"]
    return [{"model": name, "T": length, "what": f"attribution, N 8, {len(sites)} sites", "s": result["s"],
             "sites_per_s": len(sites) / result["s"], "peak": result["peak"], "load": result["load"]}]


def section_analysis(name: str, lengths: list[int], rounds: int) -> list[dict]:
    """The read-out analyses at T = 512, B = 1 against a plain forward of ours: the logit lens at
    every position (a run_with_cache of the residual hooks, then Cache.logit_lens: [L + 1, 1, T,
    vocab]), the residual decomposition's direct logit attribution at the last position, and
    (Mamba, Mamba-2) the effective attention of the middle layer at T = 1024 for one head / 16
    channels, every position pair."""
    from interp.analysis.effective_attention import effective_attention

    _, ours = _pair(name)
    length = 512
    ids = tokens(name, 1, length)
    resid = [n for n in ours.hook_names() if n.endswith(("hook_resid_pre", "hook_resid_mid", "hook_resid_post",
                                                          "hook_scale", "hook_embed", "mixer.hook_out", "mlp.hook_out"))]

    def lens():
        _, cache = ours.run_with_cache(ids, names=resid)
        return cache.logit_lens()

    def attribution():
        _, cache = ours.run_with_cache(ids, names=resid)
        return cache.logit_attrs(cache.decompose_resid(pos_slice=-1), int(ids[0, -1]), pos_slice=-1)  # LN inside

    group = {"forward": torch.no_grad()(lambda: ours(ids)), "logit lens, every position": torch.no_grad()(lens),
             "decomposition + direct logit attribution, last position": torch.no_grad()(attribution)}
    rows = []
    result = measure(group, rounds)
    rows += [{"model": name, "T": length, "what": what, "s": r["s"], "vs_forward": r["s"] / result["forward"]["s"],
             "cpu_vs_forward": r["cpu"] / result["forward"]["cpu"],
              "peak": r["peak"], "load": r["load"]} for what, r in result.items()]
    if name in RECURRENT:
        long_ids, layer = tokens(name, 1, 1024), len(ours.blocks) // 2
        index = torch.tensor([0]) if name == "mamba2" else torch.arange(16)
        what = f"effective attention, layer {layer}, {'head 0' if name == 'mamba2' else '16 channels'}"
        result = measure({"forward": torch.no_grad()(lambda: ours(long_ids)),
                          what: lambda: effective_attention(ours, long_ids, layer, index=index, progress=False)}, rounds)
        rows += [{"model": name, "T": 1024, "what": w, "s": r["s"], "vs_forward": r["s"] / result["forward"]["s"],
             "cpu_vs_forward": r["cpu"] / result["forward"]["cpu"],
                  "peak": r["peak"], "load": r["load"]} for w, r in result.items()]
    return rows


def section_import(name: str, lengths: list[int], rounds: int) -> list[dict]:
    """models.from_pretrained of a checkpoint directory (config.json + safetensors, as saved by
    transformers) against transformers' from_pretrained of the same directory: time and peak,
    beside the weights' bytes."""
    import tempfile

    import transformers as tf

    import models

    source = build_source(name)
    weights = sum(t.numel() * t.element_size() for t in source.state_dict().values())
    directory = tempfile.mkdtemp(prefix="real-size-import-")
    source.save_pretrained(directory)
    del source
    group = {"ours: models.from_pretrained(directory)": lambda: models.from_pretrained(directory),
             "transformers: AutoModelForCausalLM.from_pretrained(directory)":
                 lambda: tf.AutoModelForCausalLM.from_pretrained(directory)}
    result = measure(group, rounds)
    shutil.rmtree(directory, ignore_errors=True)
    return [{"model": name, "what": what, "s": r["s"], "peak": r["peak"], "weights": weights, "load": r["load"]}
            for what, r in result.items()]


# ---- the driver ---------------------------------------------------------------------------

def worker(section: str, name: str, lengths: list[int], rounds: int, threads: int) -> None:
    torch.set_num_threads(threads)
    os.environ.setdefault("INTERP_PROGRESS", "0")
    rows = globals()[f"section_{section}"](name, lengths, rounds)
    print("ROWS " + json.dumps(rows))


def run_worker(section: str, name: str, args, lengths: list[int] | None = None, skip: tuple = ()) -> list[dict]:
    """The rows of one worker subprocess; skip: the passes whose source is not run (it did not
    finish at a shorter length)."""
    command = [sys.executable, __file__, "--worker", section, "--models", name,
               "--lengths", ",".join(map(str, lengths or args.lengths)), "--rounds", str(args.rounds),
               "--threads", str(args.threads)]
    start = time.perf_counter()
    env = {**os.environ, "REAL_SIZE_SOURCE_SKIP": ",".join(skip)}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    for line in done.stdout.splitlines():
        if line.startswith("ROWS "):
            return json.loads(line[5:])
    reason = "killed (out of memory?)" if done.returncode in (-9, 137) else f"exit {done.returncode}"
    tail = done.stderr.strip().splitlines()[-1:] or [""]
    return [{"model": name, "what": section, "error": f"{reason} after {time.perf_counter() - start:.0f} s: {tail[0]}"}]


def _fwd_rows(name: str, args) -> list[dict]:
    """The fwd rows of one model, a worker per length (shortest first); a pass whose source did not
    finish at one length is not run for the source at the longer ones."""
    rows, slow = [], set(filter(None, os.environ.get("REAL_SIZE_SOURCE_SKIP", "").split(",")))
    for length in sorted(args.lengths):
        found = run_worker("fwd", name, args, [length], tuple(sorted(slow)))
        slow |= {r["what"] for r in found if "source_over_s" in r}
        rows += found
    return rows


def _pair_of(row: dict, kind: str) -> str:
    if f"ours_{kind}" not in row:
        return "-"
    ours, source = row[f"ours_{kind}"], row[f"source_{kind}"]
    return f"{gb(ours)} / {gb(source)} = {ours / source:.2f}"


def gb(n) -> str:
    return "-" if n is None else f"{n / 1e9:.2f}"


def table(section: str, rows: list[dict]) -> list[str]:
    """Markdown lines of one section's rows."""
    if section == "fwd":
        lines = ["| model | T | pass | ours s | source s | time ours / source | CPU time ours / source | ours peak GB | "
                 "source peak GB | peak ours / source | live tensors' peak GB, ours / source | saved for backward GB, "
                 "ours / source | load |", "|" + "---|" * 13]
        for r in rows:
            if "error" in r:
                lines.append(f"| {r['model']} | - | {r['what']} | {r['error']} |" + " |" * 9)
                continue
            if "source_over_s" in r:
                over = r["source_over_s"]
                note = f"not run (did not finish in {over} s at a shorter T)" if r.get("source_skipped") else \
                    f"did not finish in {over} s"
                lines.append(f"| {r['model']} | {r['T']} | {r['what']} | {r['ours_s']:.2f} | {note} | "
                             f"< {r['ours_s'] / over:.2f} | - | {gb(r['ours_peak'])} | - | - | - | - | {r['load']} |")
                continue
            lines.append(f"| {r['model']} | {r['T']} | {r['what']} | {r['ours_s']:.2f} | {r['source_s']:.2f} | "
                         f"{r['time_ratio']:.2f} | {r['cpu_ratio']:.2f} | {gb(r['ours_peak'])} | {gb(r['source_peak'])} | "
                         f"{r['peak_ratio']:.2f} | {_pair_of(r, 'live')} | {_pair_of(r, 'saved')} | {r['load']} |")
        return lines
    if section == "lens":
        lines = ["| model | T | contender | s | vs our forward | vs TransformerLens | CPU time vs TransformerLens | "
                 "peak GB | max abs diff of patched logits, ours vs TL | load |", "|" + "---|" * 10]
        for r in rows:
            if "error" in r:
                lines.append(f"| {r['model']} | - | {r['what']} | {r['error']} |" + " |" * 6)
                continue
            cpu = f"{r['cpu_vs_lens']:.2f}" if "cpu_vs_lens" in r else "-"
            lines.append(f"| {r['model']} | {r['T']} | {r['what']} | {r['s']:.3f} | {r['vs_forward']:.2f} | "
                         f"{r['vs_lens']:.2f} | {cpu} | {gb(r['peak'])} | {r['diff']:.1e} | {r['load']} |")
        return lines
    if section == "import":
        lines = ["| model | loader | s | peak GB | weights GB | peak / weights | load |", "|" + "---|" * 7]
        for r in rows:
            if "error" in r:
                lines.append(f"| {r['model']} | {r['what']} | {r['error']} |" + " |" * 4)
                continue
            lines.append(f"| {r['model']} | {r['what']} | {r['s']:.2f} | {gb(r['peak'])} | {gb(r['weights'])} | "
                         f"{r['peak'] / r['weights']:.2f} | {r['load']} |")
        return lines
    lines = ["| model | T | what | s | vs our forward | CPU time vs our forward | sites/s | whole grid s (extrapolated) "
             "| peak GB | load |", "|" + "---|" * 10]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r.get('T', '-')} | {r['what']} | {r['error']} |" + " |" * 6)
            continue
        ratio = f"{r['vs_forward']:.2f}" if "vs_forward" in r else "-"
        cpu = f"{r['cpu_vs_forward']:.2f}" if "cpu_vs_forward" in r else "-"
        rate = f"{r['sites_per_s']:.2f}" if "sites_per_s" in r else "-"
        grid = f"{r['grid_s']:.0f}" if "grid_s" in r else "-"
        lines.append(f"| {r['model']} | {r['T']} | {r['what']} | {r['s']:.2f} | {ratio} | {cpu} | {rate} | {grid} | "
                     f"{gb(r['peak'])} | {r['load']} |")
    return lines


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sections", default=",".join(SECTIONS))
    p.add_argument("--models", default=",".join(REAL_SIZES))
    p.add_argument("--lengths", default="512,2048")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--json", help="also write every row to this JSON file")
    p.add_argument("--worker", choices=SECTIONS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.lengths = [int(x) for x in args.lengths.split(",")]
    names = args.models.split(",")
    for name in names:
        if name not in REAL_SIZES:
            p.error(f"--models: {name!r} is not one of {REAL_SIZES}")
    if args.worker:
        worker(args.worker, names[0], args.lengths, args.rounds, args.threads)
        return {}
    sections = args.sections.split(",")
    for section in sections:
        if section not in SECTIONS:
            p.error(f"--sections: {section!r} is not one of {SECTIONS}")
    print(f"torch {torch.__version__}, {args.threads} thread(s), rounds {args.rounds}, load at start "
          f"{load_average():.1f}; peak = rise of peak RSS over RSS before the call")
    results = {}
    for section in sections:
        rows = [row for name in names for row in run_worker(section, name, args)] if section != "fwd" else [
            row for name in names for row in _fwd_rows(name, args)]
        results[section] = rows
        print(f"\n### {section}\n")
        print("\n".join(table(section, rows)), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
