"""models.decoding: every zoo model decodes token by token from its carried state with the logits
of a full forward on the prefix; generate (greedy, sampling, per-row eos); DecodingState."""

import pytest
import torch

import models
from models.decoding import DecodingState
from models.decoding.step import advance, mixer_kind

VOCAB, B, T, NEW = 7, 3, 5, 6
SMALL = dict(vocab_size=VOCAB, d_model=16, n_heads=2, d_state=4, n_layers=2)


def small_model(name: str) -> models.SequenceModel:
    torch.manual_seed(0)
    return models.build(name, **SMALL).eval()


def prompt(batch=B, length=T, seed=1):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def decode_and_compare(model, tokens, steps=NEW):
    """Prefill, then `steps` one-token calls (the argmax fed back); each call's logits against the
    full forward on the prefix so far. Returns the largest difference and the final sequence."""
    with torch.no_grad():
        logits, state = advance(model, tokens)
        worst, seq = (logits - model(tokens)[:, -1]).abs().max().item(), tokens
        for _ in range(steps):
            new = logits.argmax(-1)[:, None]
            seq = torch.cat([seq, new], dim=1)
            logits, state = advance(model, new, state)
            worst = max(worst, (logits - model(seq)[:, -1]).abs().max().item())
    assert state.position == seq.shape[1]
    return worst, seq


@pytest.mark.parametrize("name", models.list_models())
def test_each_decoding_step_equals_the_full_forward(name):
    model = small_model(name)
    worst, _ = decode_and_compare(model, prompt())
    assert worst < 1e-5, worst


@pytest.mark.parametrize("name", ["mamba", "gru", "deltanet", "mamba_attention"])
def test_decoding_on_the_instrumented_path_equals_the_full_forward(name):
    model = small_model(name).set_execution_path("instrumented")
    worst, _ = decode_and_compare(model, prompt())
    assert worst < 1e-5, worst


def test_recurrent_steps_do_not_rescan_the_prefix(monkeypatch):
    """A one-token call of a recurrent mixer scans one step: fast_segment sees T = 1."""
    model = small_model("mamba")
    lengths = []
    mixer_cls = type(model.blocks[0].mixer)
    original = mixer_cls.fast_segment

    def spy(self, u, inputs, initial=None):
        lengths.append(u.shape[1])
        return original(self, u, inputs, initial)

    monkeypatch.setattr(mixer_cls, "fast_segment", spy)
    with torch.no_grad():
        _, state = advance(model, prompt())
        lengths.clear()
        advance(model, torch.zeros(B, 1, dtype=torch.long), state)
    assert lengths == [1, 1]
    assert [mixer_kind(b.mixer) for b in small_model("mamba_attention").blocks] == ["recurrent", "attention"]


def test_kv_cache_grows_and_holds_every_position():
    model = small_model("transformer")
    with torch.no_grad():
        _, state = advance(model, prompt())
        for _ in range(4):
            _, state = advance(model, torch.ones(B, 1, dtype=torch.long), state)
    keys = state.trimmed()[0]["keys"]
    assert keys.shape == (B, model.cfg.kv_heads, T + 4, model.cfg.head_dim)
    _, state = model.generate(prompt(), NEW, return_state=True)
    assert state.layers[0]["keys"].shape[2] == T + NEW - 1 == state.position  # space made once, for every position


def reference_greedy(model, tokens, steps):
    seq = tokens
    with torch.no_grad():
        for _ in range(steps):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1)[:, None]], dim=1)
    return seq


@pytest.mark.parametrize("name", ["mamba", "transformer", "based", "lstm"])
def test_greedy_generate_equals_argmax_of_full_forwards(name):
    model = small_model(name)
    tokens = prompt()
    assert torch.equal(model.generate(tokens, NEW), reference_greedy(model, tokens, NEW))
    assert torch.equal(model.generate(tokens, 0), tokens)


def test_eos_stops_each_row_and_pads_it():
    model = small_model("mamba")
    tokens = prompt()
    free = model.generate(tokens, NEW)
    eos = int(free[0, T + 1])  # row 0 produces it at its second new token
    out = model.generate(tokens, NEW, eos_token_id=eos, pad_token_id=6 if eos != 6 else 5)
    pad = 6 if eos != 6 else 5
    for row in range(B):
        generated = free[row, T:].tolist()
        stop = generated.index(eos) + 1 if eos in generated else len(generated)
        assert out[row, T:T + stop].tolist() == generated[:stop]
        assert (out[row, T + stop:] == pad).all()
    finished_all = all(eos in free[r, T:].tolist() for r in range(B))
    assert out.shape[1] <= T + NEW and (finished_all or out.shape[1] == T + NEW)


def test_sampling_is_seeded_and_top_k_1_is_greedy():
    model = small_model("gru")
    tokens = prompt()
    a = model.generate(tokens, NEW, do_sample=True, temperature=1.5, top_p=0.9, seed=3)
    b = model.generate(tokens, NEW, do_sample=True, temperature=1.5, top_p=0.9, seed=3)
    assert torch.equal(a, b)
    draws = {tuple(model.generate(tokens, NEW, do_sample=True, temperature=3.0, seed=s)[0].tolist()) for s in range(6)}
    assert len(draws) > 1  # the seed matters
    greedy = model.generate(tokens, NEW)
    assert torch.equal(model.generate(tokens, NEW, do_sample=True, top_k=1, seed=0), greedy)
    assert torch.equal(model.generate(tokens, NEW, do_sample=True, top_p=1e-6, seed=0), greedy)


def test_top_p_keeps_the_smallest_set_reaching_p():
    from models.decoding.sampling import next_tokens

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    seen = {int(next_tokens(logits, True, 1.0, None, 0.75, torch.Generator().manual_seed(s))) for s in range(200)}
    assert seen == {0, 1}
    seen = {int(next_tokens(logits, True, 1.0, 3, None, torch.Generator().manual_seed(s))) for s in range(300)}
    assert seen == {0, 1, 2}


@pytest.mark.parametrize("name", ["mamba_attention", "based"])
def test_state_copy_select_save_load_continue_alike(name, tmp_path):
    model = small_model(name)
    tokens = prompt()
    with torch.no_grad():
        _, state = advance(model, tokens)
        saved = state.copy()
        nxt = torch.tensor([[1], [2], [3]])
        expected, _ = advance(model, nxt, state)
        again, _ = advance(model, nxt, saved.copy())
        torch.testing.assert_close(again, expected, atol=0, rtol=0)
        saved.save(tmp_path / "state.safetensors")
        loaded = DecodingState.load(tmp_path / "state.safetensors")
        assert loaded.position == T
        torch.testing.assert_close(advance(model, nxt, loaded)[0], expected, atol=0, rtol=0)
        rows = saved.select(torch.tensor([2, 0]))
        torch.testing.assert_close(advance(model, nxt[[2, 0]], rows)[0], expected[[2, 0]], atol=0, rtol=0)


def test_continuing_generate_from_a_state_equals_one_run():
    model = small_model("mamba2")
    tokens = prompt()
    whole = model.generate(tokens, NEW)
    first, state = model.generate(tokens, 3, return_state=True)
    rest = model.generate(first[:, -1:], NEW - 3, state=state)
    assert torch.equal(torch.cat([first, rest[:, 1:]], dim=1), whole)


def test_edited_state_changes_what_comes_next():
    model = small_model("mamba")
    with torch.no_grad():
        logits, state = advance(model, prompt())
        edited = state.copy()
        edited.layers[1]["state"].mul_(0)
        nxt = logits.argmax(-1)[:, None]
        assert not torch.allclose(advance(model, nxt, state.copy())[0], advance(model, nxt, edited)[0])


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_new_tokens=-1), "max_new_tokens"),
    (dict(max_new_tokens=2, temperature=0.0, do_sample=True), "temperature"),
    (dict(max_new_tokens=2, top_k=0, do_sample=True), "top_k"),
    (dict(max_new_tokens=2, top_p=1.5, do_sample=True), "top_p"),
    (dict(max_new_tokens=2, eos_token_id=VOCAB), "eos_token_id"),
])
def test_bad_options_raise_naming_them(kwargs, message):
    model = small_model("mamba")
    with pytest.raises(ValueError, match=message):
        model.generate(prompt(), **kwargs)


def test_learned_positions_bound_the_length():
    model = models.build("transformer", **SMALL, max_len=8).eval()
    with pytest.raises(ValueError, match="max_len=8"):
        model.generate(prompt(), 5)  # positions 0..8 would run
    assert model.generate(prompt(), 4).shape == (B, 9)  # the last token is never run


@pytest.mark.parametrize("name", ["mamba", "mamba2", "gated_deltanet", "lstm", "mamba3"])
def test_a_recurrent_model_carries_constant_memory(name):
    model = small_model(name)
    with torch.no_grad():
        _, state = advance(model, prompt())
        size = state.nbytes
        for _ in range(4):
            _, state = advance(model, torch.ones(B, 1, dtype=torch.long), state)
            assert state.nbytes == size


def test_the_kv_cache_grows_by_one_key_and_value_per_layer_and_token():
    model = small_model("transformer")
    with torch.no_grad():
        _, state = advance(model, prompt())
        size = state.nbytes
        _, state = advance(model, torch.ones(B, 1, dtype=torch.long), state)
    per_token = 2 * model.cfg.n_layers * B * model.cfg.kv_heads * model.cfg.head_dim * 4
    assert state.nbytes - size == per_token
