"""A tokenizer and a tiny random GPT-2 built here (nothing downloaded), for the prompt tests."""

from __future__ import annotations

from pathlib import Path

import torch

from interp.prompts import IOI_NAMES, IOI_TEMPLATES

EOS = "<|endoftext|>"


def train_tokenizer():
    """A byte-level BPE (GPT-2's scheme) trained on every IOI sentence: each name one token with its space."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    sentences = [t.format(IO=a, S=b) for t in IOI_TEMPLATES for a in IOI_NAMES for b in IOI_NAMES if a != b]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(sentences, trainer)
    return tokenizer


def hf_tokenizer(tokenizer=None):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tokenizer or train_tokenizer(), eos_token=EOS)


def gpt2_source(vocab_size: int, seed: int = 0):
    """A tiny random GPT2LMHeadModel (weights jittered so nothing is near zero)."""
    import transformers as tf

    torch.manual_seed(seed)
    config = tf.GPT2Config(vocab_size=vocab_size, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                           bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model = tf.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    return model


def checkpoint_dir(path: Path) -> Path:
    """A transformers checkpoint directory: the tiny GPT-2 and its tokenizer, as save_pretrained writes them."""
    tokenizer = hf_tokenizer()
    gpt2_source(len(tokenizer)).save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path
