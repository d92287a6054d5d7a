"""generate with prompts of different lengths (prompt_lengths or an attention_mask with left or
right padding): every row generates exactly what it generates alone, its Cache entries equal its
own run's, and HF generate on a left-padded batch gives the same tokens (GPT-2, Llama)."""

import pytest
import torch

import models
from tests.test_decoding import VOCAB, small_model

LENGTHS, NEW, PAD = [5, 2, 4], 4, 0
NAMES = ["mamba", "mamba2", "attention", "mamba_attention", "deltanet", "gru", "hyena", "mamba3"]


def prompts(seed=1):
    """[B, 5] right-padded prompts (pad PAD past each row's length) and the unpadded rows."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(1, VOCAB, (n,), generator=g) for n in LENGTHS]
    padded = torch.full((len(rows), max(LENGTHS)), PAD)
    for b, row in enumerate(rows):
        padded[b, : len(row)] = row
    return padded, rows


def left_padded(rows):
    out = torch.full((len(rows), max(LENGTHS)), PAD)
    mask = torch.zeros_like(out)
    for b, row in enumerate(rows):
        out[b, out.shape[1] - len(row):], mask[b, out.shape[1] - len(row):] = row, 1
    return out, mask


@pytest.mark.parametrize("name", NAMES)
def test_each_row_generates_what_it_generates_alone(name):
    model = small_model(name)
    padded, rows = prompts()
    batched = model.generate(padded, NEW, prompt_lengths=LENGTHS, pad_token_id=PAD)
    assert batched.shape == (len(rows), max(LENGTHS) + NEW)
    for b, row in enumerate(rows):
        alone = model.generate(row[None], NEW)[0]
        assert torch.equal(batched[b, : len(alone)], alone), (b, batched[b], alone)
        assert (batched[b, len(alone):] == PAD).all()
    tokens, mask = left_padded(rows)
    assert torch.equal(model.generate(tokens, NEW, attention_mask=mask, pad_token_id=PAD), batched)


@pytest.mark.parametrize("name", ["mamba_attention", "mamba2"])
def test_each_rows_cache_equals_its_own_run(name):
    model = small_model(name)
    padded, rows = prompts()
    names = model.hook_names()
    out, cache = model.generate(padded, NEW, prompt_lengths=LENGTHS, pad_token_id=PAD, cache_names=names)
    for b, row in enumerate(rows):
        alone, own = model.generate(row[None], NEW, cache_names=names)
        end = alone.shape[1] - 1
        for hook in names:
            mine = cache[hook][b:b + 1]
            mine = mine[:, :, :end, :end] if hook.endswith(("hook_attn_scores", "hook_pattern")) else mine[:, :end]
            torch.testing.assert_close(mine, own[hook], atol=1e-5, rtol=1e-5, msg=f"row {b} {hook}")


def test_a_prompt_token_equal_to_eos_does_not_end_the_row():
    model = small_model("mamba")
    padded, rows = prompts()
    eos = int(rows[0][1])  # inside row 0's prompt, past the shortest prompt's length
    out = model.generate(padded, NEW, prompt_lengths=LENGTHS, eos_token_id=eos, pad_token_id=PAD)
    for b, row in enumerate(rows):
        alone = model.generate(row[None], NEW, eos_token_id=eos, pad_token_id=PAD)[0]
        assert torch.equal(out[b, : len(alone)], alone)
        assert (out[b, len(alone):] == PAD).all()
    assert torch.equal(out[0, : LENGTHS[0]], rows[0])


@pytest.mark.parametrize("kwargs, message", [
    (dict(prompt_lengths=[5, 2, 4], attention_mask=torch.ones(3, 5)), "not both"),
    (dict(prompt_lengths=[5, 0, 4], pad_token_id=0), "prompt_lengths must be 3 ints in \\[1, 5\\]"),
    (dict(prompt_lengths=[5, 6, 4], pad_token_id=0), "prompt_lengths must be"),
    (dict(prompt_lengths=[5, 2], pad_token_id=0), "prompt_lengths must be 3 ints"),
    (dict(prompt_lengths=[5.0, 2.0, 4.0], pad_token_id=0), "prompt_lengths must be"),
    (dict(attention_mask=torch.ones(3, 4), pad_token_id=0), "attention_mask must be a 0/1"),
    (dict(attention_mask=torch.tensor([[1, 0, 1, 1, 1]] * 3), pad_token_id=0), "one contiguous"),
    (dict(attention_mask=torch.tensor([[0] * 5] + [[1] * 5] * 2), pad_token_id=0), "one contiguous, non-empty"),
    (dict(prompt_lengths=[5, 2, 4]), "need pad_token_id"),
])
def test_bad_prompt_layouts_raise_naming_the_argument(kwargs, message):
    model = small_model("gru")
    with pytest.raises(ValueError, match=message):
        model.generate(prompts()[0], 2, **kwargs)


def test_equal_lengths_are_the_plain_path():
    model = small_model("gru")
    padded, _ = prompts()
    assert torch.equal(model.generate(padded, NEW, prompt_lengths=[5, 5, 5]), model.generate(padded, NEW))


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_left_padded_batch_equals_hf_generate(name):
    pytest.importorskip("transformers")
    from tests.test_interop import gpt2_source, llama_source

    source = {"gpt2": gpt2_source, "llama": llama_source}[name]()
    model = models.from_pretrained(source)
    _, rows = prompts(seed=2)
    tokens, mask = left_padded(rows)
    with torch.no_grad():
        expected = source.generate(tokens, attention_mask=mask, max_new_tokens=NEW, do_sample=False,
                                   pad_token_id=PAD, min_new_tokens=0)  # [B, 5 + NEW], left-padded
    ours = model.generate(tokens, NEW, attention_mask=mask, pad_token_id=PAD)
    for b, row in enumerate(rows):
        assert torch.equal(ours[b, : len(row) + NEW], expected[b, max(LENGTHS) - len(row):]), b
