"""Greedy decoding of imported models (models.from_pretrained) gives HF generate's tokens, on tiny
random configs of GPT-2, Llama, Mamba, Mamba-2 and Jamba (every parameter jittered), with and
without an end-of-sequence token."""

import pytest
import torch

import models
from tests.interop_parity import VOCAB
from tests.test_interop import gpt2_source, jamba_source, llama_source, mamba_source
from tests.test_interop_mamba2 import mamba2_source

tf = pytest.importorskip("transformers")
SOURCES = {"gpt2": gpt2_source, "llama": llama_source, "mamba": mamba_source, "mamba2": mamba2_source,
           "jamba": jamba_source}
B, T, NEW = 3, 20, 24  # T + NEW beyond Mamba-2's chunk 16


def prompt(seed=1):
    return torch.randint(1, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


def hf_greedy(source, tokens, eos):
    with torch.no_grad():
        return source.generate(tokens, attention_mask=torch.ones_like(tokens), max_new_tokens=NEW, do_sample=False,
                               eos_token_id=eos, pad_token_id=0 if eos is None else eos, min_new_tokens=0)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_greedy_tokens_equal_hf_generate(name):
    source = SOURCES[name]()
    model = models.from_pretrained(source)
    tokens = prompt()
    expected = hf_greedy(source, tokens, None)
    assert expected.shape == (B, T + NEW)
    assert torch.equal(model.generate(tokens, NEW), expected)
    ours = model.generate(tokens, NEW)
    eos = int(ours[1, T + 2])  # a token row 1 produces: its row stops there
    expected = hf_greedy(source, tokens, eos)
    assert torch.equal(model.generate(tokens, NEW, eos_token_id=eos), expected)
