"""Which attention heads move the indirect object's name to the answer? IOI on your own prompts.

Builds IOI prompt pairs from text (interp.prompts.ioi_pairs: "When Mary and John went to the
store, John gave a drink to" -> " Mary" against " John"; the corrupted prompt puts the IO name at
S2, so its answer flips), tokenizes them with the model's tokenizer (interp.prompts.tokenize_pairs:
roles IO, S1, S2, END as token positions) and asks, per head:

  exact        restoration of logit(IO) - logit(S) when the head's output at END is patched from
               the clean run into the corrupted one (interchange);
  attribution  its first-order estimate (attribute);
  attention    how much the head attends from END to the IO name in the clean run (a name mover
               reads the name it copies).

Then the circuit: the edges of largest EAP score on the same pairs. A head that moves the IO name
restores the logit difference and attends to IO.

With a checkpoint directory (a transformers GPT-2 or another attention model saved with
save_pretrained, its tokenizer beside it; nothing is downloaded) the numbers are that model's.
Without one, a tiny random GPT-2 and a byte-level BPE tokenizer trained here on the IOI sentences
stand in (in memory, nothing written): the pipeline runs, the numbers mean nothing.

    python examples/your_prompts.py [CHECKPOINT_DIR] [--n 32] [--seed 0] [--top 8]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import models
from interp.analysis.circuits import eap
from interp.analysis.interventions import Site, attribute, interchange
from interp.prompts import IOI_NAMES, IOI_TEMPLATES, ioi_pairs, tokenize_pairs

EOS = "<|endoftext|>"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", type=Path, nargs="?", default=None,
                   help="transformers checkpoint directory with its tokenizer (default: a tiny random GPT-2)")
    p.add_argument("--n", type=int, default=32, help="IOI prompt pairs")
    p.add_argument("--seed", type=int, default=0, help="seed of the pairs (and of the toy model)")
    p.add_argument("--top", type=int, default=8, help="heads and edges printed")
    return p.parse_args(argv)


def train_tokenizer():
    """A byte-level BPE (GPT-2's scheme) trained on every IOI sentence: each name one token with its space."""
    from tokenizers import Tokenizer, decoders, models as bpe, pre_tokenizers, trainers

    sentences = [t.format(IO=a, S=b) for t in IOI_TEMPLATES for a in IOI_NAMES for b in IOI_NAMES if a != b]
    tokenizer = Tokenizer(bpe.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(sentences, trainer)
    return tokenizer


def toy_gpt2(vocab_size: int, seed: int = 0):
    """A tiny random transformers GPT2LMHeadModel (weights jittered so that heads differ)."""
    import transformers as tf

    torch.manual_seed(seed)
    config = tf.GPT2Config(vocab_size=vocab_size, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                           bos_token_id=0, eos_token_id=0, pad_token_id=0)
    source = tf.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for parameter in source.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    return source


def model_and_tokenizer(checkpoint: Path | None, seed: int):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if checkpoint is not None:
        tokenizer = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True, trust_remote_code=False)
        return models.from_pretrained(checkpoint).eval(), tokenizer
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(), eos_token=EOS)
    return models.from_pretrained(toy_gpt2(len(tokenizer), seed)).eval(), tokenizer


def head_sites(model) -> list[Site]:
    """Each attention head's output (hook_z) at END, layer by layer."""
    names = set(model.hook_names())
    return [Site(f"blocks.{l}.mixer.hook_z", "END", head=h) for l in range(model.cfg.n_layers)
            if f"blocks.{l}.mixer.hook_pattern" in names for h in range(model.cfg.n_heads)]


def attention_to_io(model, clean) -> dict[str, float]:
    """{site label: mean attention from END to IO} over the clean prompts."""
    names = [f"blocks.{l}.mixer.hook_pattern" for l in range(model.cfg.n_layers)]
    names = [n for n in names if n in set(model.hook_names())]
    _, cache = model.run_with_cache(clean.tokens, names=names)
    rows = torch.arange(len(clean))
    out = {}
    for name in names:
        pattern = cache[name][rows, :, clean.roles["END"], clean.roles["IO"]]   # [N, H]
        for h, value in enumerate(pattern.mean(0).tolist()):
            out[Site(name.replace("hook_pattern", "hook_z"), "END", head=h).label] = value
    return out


def run(args: argparse.Namespace) -> dict:
    model, tokenizer = model_and_tokenizer(args.checkpoint, args.seed)
    prompts = tokenize_pairs(tokenizer, ioi_pairs(args.n, seed=args.seed))
    clean, corrupt = prompts.clean, prompts.corrupt
    sites = head_sites(model)
    if not sites:
        raise SystemExit("this model has no attention heads (hook_pattern); its heads cannot move a name")
    exact = interchange(model, clean, corrupt, sites, min_effect=0.0, metrics=["logit_diff"], progress=False)
    estimate = attribute(model, clean, corrupt, sites, min_effect=0.0, metrics=["logit_diff"], progress=False)
    attention = attention_to_io(model, clean)
    ld_exact = exact.logit_diff_restoration.nanmean(1)
    ld_estimate = estimate.logit_diff_restoration.nanmean(1)
    print(f"{args.n} IOI pairs, T {clean.tokens.shape[1]}; logit(IO) - logit(S): clean "
          f"{exact.logit_diff_clean.mean():.3f}, corrupted {exact.logit_diff_corrupt.mean():.3f}")
    print(f"{'head output at END':<34} {'exact':>8} {'attrib.':>8} {'attn END->IO':>13}")
    heads = {}
    for i in ld_exact.nan_to_num(nan=float("-inf")).argsort(descending=True)[:args.top].tolist():
        label = sites[i].label
        heads[label] = (float(ld_exact[i]), float(ld_estimate[i]), attention[label])
        print(f"{label:<34} {heads[label][0]:8.3f} {heads[label][1]:8.3f} {heads[label][2]:13.3f}")
    edges = eap(model, clean, corrupt, progress=False).top(args.top)
    print("circuit (EAP, logit difference): top edges")
    for name, score in edges:
        print(f"  {name:<32} {score:9.4f}")
    return {"heads": heads, "edges": edges}


if __name__ == "__main__":
    run(parse_args())
