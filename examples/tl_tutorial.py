"""TransformerLens tutorial habits, run unchanged on our model and (where TransformerLens is
installed) on TL 4.3's TransformerBridge over the same weights, each result compared.

Every snippet below is written as a TransformerLens user writes it (Main Demo / Exploratory
Analysis style): the plain model call with return_type / loss_per_token / stop_at_layer /
start_at_layer, run_with_cache and cache keys, get_act_name, hooks with fwd and bwd hooks, the
weights (W_E, W_U, W_Q, W_O, OV circuits), tokens_to_residual_directions, direct logit
attribution, compute_head_results, the residual decompositions, QK / OV as TL's FactoredMatrix
and composition scores (where TransformerLens is installed), the tokenizer methods and cfg
fields. The one argument that
differs is `get_act_name` (TL's transformer_lens.utilities.get_act_name, or models.tl.names.get_act_name: the same
strings).

    python examples/tl_tutorial.py [CHECKPOINT_DIR] [--prompt TEXT]

CHECKPOINT_DIR: a local GPT-2 checkpoint directory with its tokenizer (nothing is downloaded);
without it a tiny random GPT-2 (float64) and a word tokenizer ("w1" ... "w49") are built in a
temporary directory. Prints one line per snippet (the largest difference from TL, or "ours
only") and exits 1 if one exceeds --atol.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path

import torch

import models
from models.tl.names import get_act_name as our_get_act_name

TINY_PROMPT = "w5 w12 w7 w30 w12 w7 w5 w30 w12"


def plain_call(model, tokens, get_act_name):
    resid = model(tokens, stop_at_layer=1)
    logits, loss = model(tokens, return_type="both")
    return {
        "model(tokens)": model(tokens),
        'model(tokens, return_type="loss")': model(tokens, return_type="loss"),
        "loss_per_token=True": model(tokens, return_type="loss", loss_per_token=True),
        'return_type="both"': torch.cat([logits.flatten(), loss[None]]),
        "stop_at_layer=1": resid,
        "start_at_layer=1": model(resid, start_at_layer=1),
        "start_at_layer=1, stop_at_layer=-1": model(resid, start_at_layer=1, stop_at_layer=-1),
    }


def cache_keys(model, tokens, get_act_name):
    logits, cache = model.run_with_cache(tokens)
    last = model.cfg.n_layers - 1
    return {
        'cache["pattern", 0]': cache["pattern", 0],
        'cache["resid_post", last]': cache["resid_post", last],
        "cache[get_act_name('attn_out', 0)]": cache[get_act_name("attn_out", 0)],
        'cache["blocks.0.ln1.hook_scale"]': cache["blocks.0.ln1.hook_scale"],
        'cache["normalized", 0, "ln2"]': cache["normalized", 0, "ln2"],
        "cache.compute_head_results(); cache['result', 1]": _head_results(cache),
    }


def _head_results(cache):
    cache.compute_head_results()
    return cache["result", 1]


def logit_attribution(model, tokens, get_act_name):
    answer_tokens = tokens[0, 1:3]  # two tokens of the prompt: "correct" and "wrong"
    directions = model.tokens_to_residual_directions(answer_tokens)  # [2, d_model]
    logit_diff_direction = directions[0] - directions[1]
    _, cache = model.run_with_cache(tokens)
    final = cache["resid_post", -1]
    scaled = cache.apply_ln_to_stack(final, layer=-1, pos_slice=-1)
    per_head = cache.stack_head_results(layer=-1, pos_slice=-1)
    per_head = cache.apply_ln_to_stack(per_head, layer=-1, pos_slice=-1)
    accumulated = cache.accumulated_resid(layer=-1, incl_mid=True, pos_slice=-1, apply_ln=True)
    return {
        "tokens_to_residual_directions": directions,
        "logit difference through the final norm": scaled @ logit_diff_direction,
        "per-head logit difference": per_head @ logit_diff_direction,
        "accumulated_resid logit lens": accumulated @ logit_diff_direction,
    }


def decompositions(model, tokens, get_act_name):
    _, cache = model.run_with_cache(tokens)
    answer, wrong = tokens[:, -1], tokens[:, -2]
    components, labels = cache.decompose_resid(layer=-1, pos_slice=-1, return_labels=True)
    heads, head_labels = cache.stack_head_results(layer=-1, pos_slice=-1, return_labels=True)
    _, resid_labels = cache.accumulated_resid(incl_mid=True, return_labels=True)
    return {
        "cache.decompose_resid(pos_slice=-1)": components,
        "decompose_resid labels": labels,
        "cache.decompose_resid(apply_ln=True)": cache.decompose_resid(apply_ln=True),
        "stack_head_results labels": head_labels,
        "accumulated_resid labels": resid_labels,
        "cache.logit_attrs(decompose_resid, answer, wrong)": cache.logit_attrs(components, answer, incorrect_tokens=wrong,
                                                                              pos_slice=-1),
        "cache.logit_attrs(stack_head_results, answer)": cache.logit_attrs(heads, answer, pos_slice=-1),
        "cache.get_full_resid_decomposition(expand_neurons=False)":
            cache.get_full_resid_decomposition(expand_neurons=False),
        "cache[get_act_name('k', 1)]": cache[get_act_name("k", 1)],
    }


def circuits(model, tokens, get_act_name):
    """QK / OV circuits (TL's FactoredMatrix: only where TransformerLens is installed)."""
    import importlib.util

    if importlib.util.find_spec("transformer_lens") is None:
        return {}
    W_E, W_U = model.W_E[:64], model.W_U[:, :64]  # a corner of the vocabulary (GPT-2's full one is 50257)
    return {
        "model.OV.AB": model.OV.AB,
        "model.QK[1].AB": model.QK[1].AB,
        "full OV circuit (W_E @ model.OV[0, 1] @ W_U).AB": (W_E @ model.OV[0, 1] @ W_U).AB,
        "full QK circuit (W_E @ model.QK[1, 0] @ W_E.T).AB": (W_E @ model.QK[1, 0] @ W_E.T).AB,
        "model.OV[1, 2].S": model.OV[1, 2].S,
        'model.all_composition_scores("Q").scores': model.all_composition_scores("Q").scores,
        'model.all_composition_scores("V").scores': model.all_composition_scores("V").scores,
    }


def hooks(model, tokens, get_act_name):
    def ablate_head_1(z, hook):
        z[:, :, 1] = 0.0
        return z

    ablated = model.run_with_hooks(tokens, return_type="loss", fwd_hooks=[(get_act_name("z", 0), ablate_head_1)])
    gradients = {}
    names = [get_act_name("pattern", 1), get_act_name("resid_pre", 1)]

    def keep(name):
        return lambda grad, hook: gradients.__setitem__(name, grad.detach().clone())

    with model.hooks(fwd_hooks=[(get_act_name("z", 0), ablate_head_1)], bwd_hooks=[(n, keep(n)) for n in names]):
        model(tokens, return_type="loss").backward()
    model.zero_grad()
    return {"run_with_hooks, head 0.1 ablated: loss": ablated,
            **{f"with model.hooks(bwd_hooks=...): d loss / d {n}": gradients[n] for n in names}}


def weights(model, tokens, get_act_name):
    return {
        "model.W_E": model.W_E, "model.W_U": model.W_U, "model.W_pos": model.W_pos,
        "model.W_Q[1, 2]": model.W_Q[1, 2], "model.b_K": model.b_K,
        "OV circuit model.W_V[0] @ model.W_O[0]": model.W_V[0] @ model.W_O[0],
        "model.blocks[0].attn.W_O": model.blocks[0].attn.W_O, "model.W_in": model.W_in, "model.b_out": model.b_out,
    }


def tokenizer_and_cfg(model, tokens, get_act_name):
    text = model.to_string(tokens[0, 1:])
    return {
        "model.to_tokens(text)": model.to_tokens(text),
        "model.to_tokens(text, prepend_bos=False)": model.to_tokens(text, prepend_bos=False),
        "model.to_str_tokens(text)": model.to_str_tokens(text),
        "model.to_string(tokens)": model.to_string(tokens),
        "model.to_single_token(model.to_str_tokens(tokens)[2])": model.to_single_token(model.to_str_tokens(tokens)[2]),
        "cfg (d_vocab, n_ctx, n_layers, d_model, n_heads, d_head, d_mlp, act_fn)":
            [model.cfg.d_vocab, model.cfg.n_ctx, model.cfg.n_layers, model.cfg.d_model, model.cfg.n_heads,
             model.cfg.d_head, model.cfg.d_mlp, model.cfg.act_fn],
        "model.blocks[l].attn.W_Q / W_K / W_O shapes": [tuple(getattr(block.attn, name).shape)
                                                      for block in model.blocks for name in ("W_Q", "W_K", "W_O")],
    }


SNIPPETS = (plain_call, cache_keys, logit_attribution, decompositions, circuits, hooks, weights, tokenizer_and_cfg)


def run_snippets(model, prompt: str, get_act_name) -> dict:
    """{snippet: value} of every snippet on model (tokens: model.to_tokens(prompt))."""
    tokens = model.to_tokens(prompt)
    results = {}
    for snippet in SNIPPETS:
        with torch.set_grad_enabled(snippet is hooks):
            results.update(snippet(model, tokens, get_act_name))
    return results


def difference(ours, theirs) -> float:
    """The largest absolute difference of two results (0 or inf for non-tensors: equal or not)."""
    if isinstance(ours, torch.Tensor):
        theirs = torch.as_tensor(theirs)
        if ours.shape != theirs.shape:
            return float("inf")
        return float((ours.detach().double() - theirs.detach().double()).abs().max()) if ours.numel() else 0.0
    return 0.0 if ours == theirs else float("inf")


def tiny_checkpoint(directory: Path) -> None:
    """A tiny random GPT-2 (float64) and a word tokenizer, saved in directory."""
    import tokenizers
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=50, n_embd=16, n_layer=3, n_head=4, n_positions=64,
                                     pad_token_id=0, bos_token_id=0, eos_token_id=0)
    source = transformers.GPT2LMHeadModel(config).double().eval()
    with torch.no_grad():  # weights of order one, so that every component matters
        for name, p in source.named_parameters():
            p.add_(0.3 * torch.randn_like(p) * (1 if "ln" not in name else 0.5))
    words = ["<|endoftext|>"] + [f"w{i}" for i in range(1, 50)]
    inner = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)},
                                                             unk_token="<|endoftext|>"))
    inner.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=inner, bos_token="<|endoftext|>",
                                                     eos_token="<|endoftext|>")
    source.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def transformer_lens_bridge(directory: Path, dtype: torch.dtype):
    """TL 4.3's bridge on the checkpoint without weight processing, or None without TL."""
    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError:
        return None
    import transformers

    source = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype,
                                                               attn_implementation="eager").eval()
    bridge = TransformerBridge.boot_transformers(str(directory), hf_model=copy.deepcopy(source), device="cpu",
                                                 dtype=dtype)
    bridge.enable_compatibility_mode(no_processing=True, disable_warnings=True)
    return bridge


def compare(directory: Path, prompt: str) -> dict[str, float | None]:
    """{snippet: largest difference from TL (None: TL not installed)} on the checkpoint."""
    model = models.from_pretrained(directory)
    ours = run_snippets(model, prompt, our_get_act_name)
    bridge = transformer_lens_bridge(directory, model.W_E.dtype)
    if bridge is None:
        return {name: None for name in ours}
    from transformer_lens.utilities import get_act_name  # TL 4's home of utils.get_act_name

    theirs = run_snippets(bridge, prompt, get_act_name)
    return {name: difference(value, theirs[name]) for name, value in ours.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", nargs="?", type=Path, help="local GPT-2 checkpoint directory with a tokenizer")
    parser.add_argument("--prompt", default=None, help="the prompt (default: one in the tiny tokenizer's words)")
    parser.add_argument("--atol", type=float, default=1e-10, help="largest difference from TL allowed")
    args = parser.parse_args(argv)
    if args.checkpoint is not None:
        differences = compare(args.checkpoint, args.prompt or "When Mary and John went to the store, John gave a")
    else:
        with tempfile.TemporaryDirectory(prefix="tl-tutorial-") as directory:
            tiny_checkpoint(Path(directory))
            differences = compare(Path(directory), args.prompt or TINY_PROMPT)
    worst = 0.0
    for name, value in differences.items():
        print(f"{name:70s} {'ours only (TransformerLens not installed)' if value is None else f'{value:.1e}'}")
        worst = max(worst, value or 0.0)
    return 1 if worst > args.atol else 0


if __name__ == "__main__":
    sys.exit(main())
