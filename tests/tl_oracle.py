"""A tiny random GPT-2 (float64) as ours (models.from_pretrained) and, where TransformerLens is
installed, as its TransformerBridge in compatibility mode without weight processing (fold_ln
off), so both compute the same numbers from the same weights: the oracle of tests/test_tl_*.py."""

from __future__ import annotations

import copy
import tempfile

import pytest
import torch

import models

VOCAB, LAYERS, HEADS, D_MODEL = 50, 3, 4, 16
IDS = dict(pad_token_id=0, bos_token_id=0, eos_token_id=0)


def gpt2_source():
    """The transformers GPT-2 (float64, eval mode, eager attention)."""
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = tf.GPT2Config(vocab_size=VOCAB, n_embd=D_MODEL, n_layer=LAYERS, n_head=HEADS, n_positions=64,
                           attn_implementation="eager", **IDS)
    model = tf.GPT2LMHeadModel(config).double().eval()
    with torch.no_grad():  # weights of order one, so that every component matters
        for name, p in model.named_parameters():
            p.add_(0.3 * torch.randn_like(p) * (1 if "ln" not in name else 0.5))
    return model


def word_tokenizer():
    """A transformers tokenizer over VOCAB words ("<|endoftext|>" id 0: BOS, EOS and pad as
    GPT-2's, then "w1" ... "w49"), built offline; like GPT-2's it adds no BOS itself."""
    tokenizers = pytest.importorskip("tokenizers")
    tf = pytest.importorskip("transformers")
    words = ["<|endoftext|>"] + [f"w{i}" for i in range(1, VOCAB)]
    inner = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)},
                                                             unk_token="<|endoftext|>"))
    inner.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    return tf.PreTrainedTokenizerFast(tokenizer_object=inner, bos_token="<|endoftext|>", eos_token="<|endoftext|>")


def lens(source, tokenizer=None):
    """TransformerLens' TransformerBridge over source, unprocessed weights (skip when TL is absent);
    tokenizer: saved beside the weights, so the bridge loads it."""
    bridge_module = pytest.importorskip("transformer_lens.model_bridge")
    directory = tempfile.mkdtemp(prefix="tl-oracle-")
    source.save_pretrained(directory)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    bridge = bridge_module.TransformerBridge.boot_transformers(directory, hf_model=copy.deepcopy(source),
                                                               device="cpu", dtype=torch.float64)
    bridge.enable_compatibility_mode(no_processing=True, disable_warnings=True)
    return bridge


def ours(source):
    return models.from_pretrained(source)


def tokens(batch: int = 2, length: int = 7, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))
