"""generate: the prompt in one call, then one call a token (models.decoding.step.advance), the
next token from models.decoding.sampling; its bounds (MAX_NEW_TOKENS), prompts of different
lengths (prompt_layout) and StatePatches across calls (split_hooks, call_patches).

State patches. A `models.StatePatch` in fwd_hooks names absolute steps (times >= 0): each call
gets the entries it covers, shifted to its own time axis. Patches apply in step order, each on
the state the earlier ones left (models.hooks.state_patch), in a decoding call and in a full forward
alike, so patches at prompt and generated positions change every later token as the same
patches in a full forward over the final sequence. Hook functions on hook_state patch what they
see (hook.position tells them where). docs/generation.md is the guide.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from models.decoding import DecodingState
from models.decoding.readers import Recorder
from models.decoding.sampling import check_sampling, next_tokens
from models.decoding.step import advance, mixer_kind
from models.hooks import StatePatch
from models.memory import progress_bar

READ_OUT_HOOKS = ("hook_final", "hook_logits", "norm_final.hook_scale")
MAX_NEW_TOKENS = 1 << 20   # every model kind; a longer continuation is generated in pieces (state=)
SECONDS_PER_TOKEN_LAYER = 5e-4   # the floor of one token's step per layer (a 1-layer tanh RNN: 1.6 ms on a CPU)

def check_new_tokens(model, max_new_tokens: int) -> None:
    """ValueError past MAX_NEW_TOKENS, with the time it would take at the floor of a step's cost:
    a recurrent model has no max_len to stop it, and the loop would run for years."""
    if max_new_tokens > MAX_NEW_TOKENS:
        seconds = max_new_tokens * SECONDS_PER_TOKEN_LAYER * model.cfg.n_layers
        raise ValueError(f"max_new_tokens {max_new_tokens} is past the bound {MAX_NEW_TOKENS}: at "
                         f"{SECONDS_PER_TOKEN_LAYER * 1e3:g} ms a token per layer or more ({model.cfg.n_layers} layers) "
                         f"it would run for at least {_duration(seconds)}; generate in pieces (return_state=True, "
                         "then state=)")


def _duration(seconds: float) -> str:
    for unit, size in (("years", 365.25 * 86400), ("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


def split_hooks(model, fwd_hooks) -> tuple[list, list[tuple[str, StatePatch]]]:
    """fwd_hooks -> (hook functions, [(hook_state name, StatePatch)]): StatePatches are handed to
    each call translated to its positions (call_patches); their times must be >= 0."""
    with model.hooks(fwd_hooks):  # checks them as run_with_hooks does (a bare pair, unknown names, ...)
        pass
    functions, patches = [], []
    for pair in fwd_hooks:
        if not isinstance(pair[1], StatePatch):
            functions.append(pair)
            continue
        name, patch = pair
        names = [n for n in model.hook_dict if name(n)] if callable(name) else [name]
        for target in names:
            model.hook_point(target)
            if not target.endswith("hook_state") or mixer_kind(model.get_submodule(target.rsplit(".", 1)[0])) == "attention":
                raise ValueError(f"a StatePatch goes on a recurrent mixer's hook_state; got {target!r}")
            if int(patch.times.min()) < 0:
                raise ValueError(f"a StatePatch in generate names absolute steps (times >= 0); got "
                                 f"times {patch.times.tolist()[:8]} on {target!r}")
            patches.append((target, patch))
    return functions, patches


def call_patches(model, patches, start: int, n: int) -> list[tuple[str, StatePatch]]:
    """The StatePatches' entries a call at positions [start, start + n) covers, as StatePatches
    on that call's time axis (a recomputed mixer's axis starts at 0, a recurrent one's at start)."""
    out = []
    for name, patch in patches:
        kind = mixer_kind(model.get_submodule(name.rsplit(".", 1)[0]))
        first = 0 if kind == "recompute" else start
        keep = (patch.times >= first) & (patch.times < start + n)
        if not bool(keep.any()):
            continue
        rows, times = patch.rows[keep], patch.times[keep] - first
        if patch.mode == "map":
            out.append((name, StatePatch(rows, times, fn=patch.payload)))
        else:
            index = keep.nonzero()[:, 0].to(patch.payload.device)
            given = {"values" if patch.mode == "set" else "deltas": patch.payload[index]}
            out.append((name, StatePatch(rows, times, **given)))
    return out


def prompt_layout(tokens: torch.Tensor, prompt_lengths, attention_mask, pad: int | None):
    """(tokens [B, T] with each row's prompt first, lengths [B] long or None when every row is
    T long) from generate's prompt_lengths (B ints in [1, T]; tokens right-padded) or
    attention_mask [B, T] (1 on each row's prompt: one contiguous run, moved to the front)."""
    if prompt_lengths is None and attention_mask is None:
        return tokens, None
    if prompt_lengths is not None and attention_mask is not None:
        raise ValueError("give prompt_lengths or attention_mask, not both")
    batch, length = tokens.shape
    if attention_mask is not None:
        mask = torch.as_tensor(attention_mask, device=tokens.device)
        if tuple(mask.shape) != (batch, length) or not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError(f"attention_mask must be a 0/1 [B, T]={(batch, length)} tensor; got "
                             f"{tuple(mask.shape)} {mask.dtype}")
        mask = mask.bool()
        lengths = mask.sum(1)
        starts = mask.int().argmax(1)  # each row's first prompt position
        ends = starts + lengths
        inside = (torch.arange(length, device=tokens.device) >= starts[:, None]) & \
                 (torch.arange(length, device=tokens.device) < ends[:, None])
        if bool((lengths == 0).any()) or not bool((inside == mask).all()):
            raise ValueError("attention_mask must mark one contiguous, non-empty run of prompt positions per row")
        index = (starts[:, None] + torch.arange(length, device=tokens.device)).clamp(max=length - 1)
        tokens = tokens.gather(1, index)  # [B, T], each row's prompt first
    else:
        lengths = torch.as_tensor(prompt_lengths, device=tokens.device)
        if lengths.dtype.is_floating_point or lengths.dtype == torch.bool or tuple(lengths.shape) != (batch,) \
                or bool(((lengths < 1) | (lengths > length)).any()):
            raise ValueError(f"prompt_lengths must be {batch} ints in [1, {length}] (tokens [B, T]={(batch, length)}); "
                             f"got {torch.as_tensor(prompt_lengths).tolist()}")
    lengths = lengths.long()
    if bool((lengths == length).all()):
        return tokens, None
    if pad is None:
        raise ValueError("prompts of different lengths need pad_token_id (or eos_token_id) for the rows that end "
                         "before the longest; got neither")
    return tokens, lengths


def generate(model, tokens: torch.Tensor, max_new_tokens: int, *, do_sample: bool = False, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
             eos_token_id: int | None = None, pad_token_id: int | None = None, fwd_hooks: Sequence[tuple] = (),
             cache_names=None, state: DecodingState | None = None, return_state: bool = False,
             prompt_lengths=None, attention_mask: torch.Tensor | None = None,
             allow_nonfinite: bool = False, progress: bool = True):
    """Continue tokens [B, T] by up to max_new_tokens tokens -> tokens [B, T + N] (N <= max_new_tokens).

    Greedy (argmax) by default; do_sample=True samples with temperature, top_k and top_p from a
    torch.Generator seeded with `seed` (same seed, same tokens on the CPU). eos_token_id: a row
    that produced it is finished; later positions of that row hold pad_token_id (default: the
    eos id) and the loop stops when every row is finished (finished rows are still computed,
    on the pad tokens). fwd_hooks: [(name or predicate, fn)] patches active for the prompt and
    every new token (hook.position says where a call is: models.decoding.step); StatePatches
    name absolute steps. cache_names: hook names (as run_with_cache's `names`) to record over
    prompt + generated positions: returns (tokens, Cache) with [B, T + N - 1, ...] entries (the
    last token is sampled, never run; read-out hooks hold every prompt position only when
    named). state: a DecodingState to continue from (tokens are then the tokens at positions
    state.position, ...; it is advanced in place); return_state=True appends the final state
    to what is returned.

    Prompts of different lengths: prompt_lengths (B ints, tokens right-padded) or attention_mask
    [B, T] (1 on each row's prompt, one contiguous run: left or right padding, as a tokenizer
    gives). Every row generates as it would alone: all rows share absolute positions, the
    common prefix of the shortest prompt runs at once and a longer row's remaining prompt
    tokens are fed one per step in place of the token it would have chosen (prompt_layout).
    Row b of the result is its prompt, up to max_new_tokens new tokens, then pad_token_id (or
    the eos id; one of them is required): [B, max length + N]. Hooks and the Cache see every
    row at every position; a row's positions past its end run on pad tokens.
    """
    check_sampling(max_new_tokens, do_sample, temperature, top_k, top_p, seed)
    check_new_tokens(model, max_new_tokens)
    for name, value in (("eos_token_id", eos_token_id), ("pad_token_id", pad_token_id)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 0 <= value < model.cfg.vocab_size):
            raise ValueError(f"{name} must be None or a token id in [0, {model.cfg.vocab_size}); got {value!r}")
    model.check_tokens(tokens)
    pad = eos_token_id if pad_token_id is None else pad_token_id
    tokens, lengths = prompt_layout(tokens, prompt_lengths, attention_mask, pad)
    last = (0 if state is None else state.position) + tokens.shape[1] + max_new_tokens - 1  # positions run
    if hasattr(model, "pos_embed") and last > model.cfg.max_len:
        raise ValueError(f"{tokens.shape[1]} tokens + max_new_tokens={max_new_tokens} run {last} positions; the "
                         f"learned positions allow max_len={model.cfg.max_len}")
    functions, patches = split_hooks(model, fwd_hooks)
    names = [] if cache_names is None else model.resolve_hook_names(cache_names)
    recorder = Recorder(names)
    hooked_names = {n for n in names} | {n for n, _ in functions if isinstance(n, str)}
    full_read_out = any(n.endswith(READ_OUT_HOOKS) for n in hooked_names) or any(callable(n) for n, _ in functions)
    generator = torch.Generator().manual_seed(seed) if do_sample and seed is not None else None
    first = tokens.shape[1] if lengths is None else int(lengths.min())  # run at once
    out = feed = tokens[:, :first]
    steps = tokens.shape[1] - first + max_new_tokens
    finished = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    with torch.no_grad(), model.hooks(functions, readers=recorder.readers(), allow_nonfinite=allow_nonfinite), \
            progress_bar(steps, progress, desc="generate", unit="tok") as bar:
        for step in range(steps):
            start = 0 if state is None else state.position
            recorder.call_start = start
            with model.hooks(call_patches(model, patches, start, feed.shape[1]), allow_nonfinite=allow_nonfinite):
                logits, state = advance(model, feed, state, all_logits=full_read_out and step == 0, room=last)
            logits = logits[:, -1] if logits.dim() == 3 else logits
            new = next_tokens(logits, do_sample, temperature, top_k, top_p, generator)
            prompted = torch.zeros_like(finished)
            if lengths is not None:  # rows still in their prompt take it; rows past their N take pad
                column, position = min(out.shape[1], tokens.shape[1] - 1), out.shape[1]
                prompted = position < lengths
                new = torch.where(prompted, tokens[:, column], new)
                finished |= position >= lengths + max_new_tokens
            if eos_token_id is not None or lengths is not None:
                new = torch.where(finished, torch.full_like(new, pad), new)
            if eos_token_id is not None:
                finished |= (new == eos_token_id) & ~prompted
            out = torch.cat([out, new[:, None]], dim=1)
            feed = new[:, None]
            bar.update(1)
            if bool(finished.all()):
                break
    result = [out]
    if cache_names is not None:
        result.append(recorder.cache(model, out.shape[1] - 1))
    if return_state:
        result.append(state)
    return result[0] if len(result) == 1 else tuple(result)
