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


def lens(source):
    """TransformerLens' TransformerBridge over source, unprocessed weights (skip when TL is absent)."""
    bridge_module = pytest.importorskip("transformer_lens.model_bridge")
    directory = tempfile.mkdtemp(prefix="tl-oracle-")
    source.save_pretrained(directory)
    bridge = bridge_module.TransformerBridge.boot_transformers(directory, hf_model=copy.deepcopy(source),
                                                               device="cpu", dtype=torch.float64)
    bridge.enable_compatibility_mode(no_processing=True, disable_warnings=True)
    return bridge


def ours(source):
    return models.from_pretrained(source)


def tokens(batch: int = 2, length: int = 7, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))
