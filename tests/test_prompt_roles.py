"""The corrupted prompt's own roles (interp.prompts: PromptPair.corrupted_roles, "corrupted_roles" in
a prompt file): a pair whose corrupted prompt has its roles elsewhere - names in another order, a
name of more tokens - patches by role exactly as the source transformers model patched by hand
at the aligned positions (interchange), and its first-order estimate is the hand-computed
gradient product (attribute); analyses that patch position t from position t, and circuits whose
edges join equal positions, refuse such pairs in one line naming the pair; a malformed
corrupted_roles entry is one line naming the pair and the role."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

import models
from interp.analysis.circuits import build_graph, eap
from interp.analysis.interventions import Site, attribute, interchange, site_grid
from interp.prompts import PromptPair, ioi_pairs, read_prompts, tokenize_pairs
from tests.prompt_fixtures import gpt2_source, hf_tokenizer

pytest.importorskip("transformers")

ROLES = {"IO": "Mary", "S1": ["John", 0], "S2": ["John", 1], "END": -1}
SWAPPED = PromptPair("When Mary and John went to the store, John gave a drink to",
                     "When John and Mary went to the store, Mary gave a drink to", " Mary", " John", ROLES,
                     {"IO": ["Mary", 0], "S1": "John", "S2": ["Mary", 1], "END": -1})
LONGER = PromptPair("When Kate and Tom went to the park, Tom gave a ball to",
                    "When Christopher and Tom went to the park, Christopher gave a ball to", " Kate", " Tom",
                    {"IO": "Kate", "S1": ["Tom", 0], "S2": ["Tom", 1], "END": -1},
                    {"IO": "Christopher", "S1": "Tom", "S2": ["Christopher", 1], "END": -1})
SAME = PromptPair("When Anne and Paul went to the office, Paul handed a book to",
                  "When Anne and Paul went to the office, Anne handed a book to", " Anne", " Paul",
                  {"IO": "Anne", "S1": ["Paul", 0], "S2": ["Paul", 1], "END": -1})   # no corrupted_roles: aligned
PAIRS = [SWAPPED, LONGER, SAME]


@pytest.fixture(scope="module")
def tokenizer():
    return hf_tokenizer()


@pytest.fixture(scope="module")
def gpt2(tokenizer):
    source = gpt2_source(len(tokenizer))
    return source, models.from_pretrained(source).eval()


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text)["input_ids"]


def position(tokenizer, text: str, word: str, k: int = 0) -> int:
    """The token position of the last token of the k-th occurrence of `word` in text, by hand: the
    longest prefix of text before the word's end that its tokens cover."""
    end = -1
    for _ in range(k + 1):
        end = text.index(word, end + 1)
    end += len(word)
    return next(t for t in range(len(ids(tokenizer, text))) if len(tokenizer.decode(ids(tokenizer, text)[:t + 1])) >= end)


def test_corrupted_roles_point_at_the_corrupted_prompts_words(tokenizer):
    prompts = tokenize_pairs(tokenizer, PAIRS)
    assert prompts.lengths.tolist()[1] < prompts.corrupt_lengths.tolist()[1]   # "Christopher" is several tokens
    assert prompts.lengths.tolist()[::2] == prompts.corrupt_lengths.tolist()[::2]
    for b, pair in enumerate(PAIRS):
        roles = pair.corrupted_roles or {}
        for name in ("IO", "S1", "S2"):
            clean = pair.roles[name] if isinstance(pair.roles[name], list) else [pair.roles[name], 0]
            assert int(prompts.clean.roles[name][b]) == position(tokenizer, pair.clean, *clean)
            spec = roles.get(name, clean)
            spec = spec if isinstance(spec, list) else [spec, 0]
            text = pair.corrupted if pair.corrupted_roles else pair.clean
            assert int(prompts.corrupt.roles[name][b]) == position(tokenizer, text, *spec), (b, name)
        assert int(prompts.corrupt.roles["END"][b]) == int(prompts.corrupt_lengths[b]) - 1
        assert prompts.corrupt.loss_mask[b].nonzero()[:, 0].tolist() == [int(prompts.corrupt_lengths[b]) - 1]
    assert int(prompts.corrupt.roles["IO"][0]) == 3 and int(prompts.clean.roles["IO"][0]) == 1   # swapped order


def hand_patched(source, tokenizer, pair: PromptPair, layer: int, clean_at: int, corrupt_at: int,
                 answer: int) -> tuple[float, float, float, float]:
    """(p_clean, p_corrupt, p_patched, first-order p_patched) of `answer` at each prompt's last token by
    the transformers model itself, each prompt run alone (no padding): block `layer`'s input at
    corrupt_at of the corrupted run replaced by the clean run's at clean_at."""
    clean, corrupt = (torch.tensor([ids(tokenizer, text)]) for text in (pair.clean, pair.corrupted))
    with torch.no_grad():
        out = source(clean, output_hidden_states=True)
        p_clean = out.logits[0, -1].double().softmax(-1)[answer].item()
        value = out.hidden_states[layer][0, clean_at].clone()

    def replace(module, args):
        hidden = args[0].clone()
        hidden[0, corrupt_at] = value
        return (hidden, *args[1:])

    handle = source.transformer.h[layer].register_forward_pre_hook(replace)
    try:
        with torch.no_grad():
            p_patched = source(corrupt).logits[0, -1].double().softmax(-1)[answer].item()
    finally:
        handle.remove()
    run = source(corrupt, output_hidden_states=True)
    p = run.logits[0, -1].double().softmax(-1)[answer]
    hidden = run.hidden_states[layer]
    grad, = torch.autograd.grad(p, hidden)
    estimate = p.item() + float(((value - hidden[0, corrupt_at].detach()) * grad[0, corrupt_at]).sum())
    return p_clean, p.item(), p_patched, estimate


def test_patching_by_role_equals_the_source_model_patched_at_the_aligned_positions(tokenizer, gpt2):
    source, model = gpt2
    prompts = tokenize_pairs(tokenizer, PAIRS)
    sites = site_grid(model, ["blocks.{l}.hook_resid_pre"], ["IO", "S1", "S2", "END"])
    exact = interchange(model, prompts.clean, prompts.corrupt, sites, min_effect=0.0, progress=False)
    estimate = attribute(model, prompts.clean, prompts.corrupt, sites, min_effect=0.0, progress=False)
    assert exact.n_run > 0
    for s, site in enumerate(sites):
        for b, pair in enumerate(PAIRS):
            clean_at, corrupt_at = (int(batch.roles[site.position][b]) for batch in (prompts.clean, prompts.corrupt))
            p_clean, p_corrupt, p_patched, first_order = hand_patched(
                source, tokenizer, pair, site.layer, clean_at, corrupt_at, int(prompts.answers[b]))
            assert exact.p_clean[b] == pytest.approx(p_clean, abs=1e-6)
            assert exact.p_corrupt[b] == pytest.approx(p_corrupt, abs=1e-6)
            assert exact.p_patched[s, b] == pytest.approx(p_patched, abs=1e-6), (site.label, b)
            assert estimate.p_patched[s, b] == pytest.approx(first_order, abs=1e-6), (site.label, b)
    moved = [(int(prompts.clean.roles[r][b]), int(prompts.corrupt.roles[r][b])) for r in ROLES for b in (0, 1)]
    assert any(c != k for c, k in moved)   # the reference really patches across positions


def test_ioi_pairs_keep_names_of_other_token_lengths_aligned_by_role(tokenizer, gpt2):
    _, model = gpt2
    pairs = ioi_pairs(8, seed=1, names=["Mary", "John", "Christopher", "Tom", "Bartholomew"], corruption="abc")
    pairs = [replace(p, answer=ids(tokenizer, p.answer)[0], wrong_answer=ids(tokenizer, p.wrong_answer)[0])
             for p in pairs]   # a long name's first token stands for it (an answer is one token)
    prompts = tokenize_pairs(tokenizer, pairs)
    assert not torch.equal(prompts.lengths, prompts.corrupt_lengths)
    for b, pair in enumerate(pairs):
        for name, slot in (("IO", 0), ("S1", 1), ("S2", 2)):
            start, end = pair.corrupted_roles[name]
            assert int(prompts.corrupt.roles[name][b]) == position(tokenizer, pair.corrupted, pair.corrupted[start:end],
                                                                   pair.corrupted[:end].count(pair.corrupted[start:end]) - 1)
    sites = [Site("blocks.1.hook_resid_pre", "S2"), Site("blocks.0.mixer.hook_out", "END")]
    result = interchange(model, prompts.clean, prompts.corrupt, sites, min_effect=0.0, progress=False)
    assert result.p_patched.isfinite().all()


def one_line(error) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def test_position_by_position_patching_refuses_pairs_of_different_lengths(tokenizer, gpt2):
    _, model = gpt2
    prompts = tokenize_pairs(tokenizer, PAIRS)
    for site in (Site("blocks.0.hook_resid_pre", 2), Site("blocks.0.hook_resid_pre")):
        for analysis in (interchange, attribute):
            with pytest.raises(ValueError, match="patches position t from position t, but pair 1 has its clean answer "
                                                 "at position") as error:
                analysis(model, prompts.clean, prompts.corrupt, [site], min_effect=0.0, progress=False)
            assert site.label in one_line(error)
    with pytest.raises(ValueError, match="pair 1 has its clean answer at position") as error:
        eap(model, prompts.clean, prompts.corrupt, progress=False)
    assert "give it position groups with the roles (interp circuit --positions END,IO,S1,S2)" in one_line(error)
    same = tokenize_pairs(tokenizer, [SAME, SWAPPED])   # one length each: position-by-position patching runs
    interchange(model, same.clean, same.corrupt, [Site("blocks.0.hook_resid_pre", 2)], min_effect=0.0, progress=False)
    with pytest.raises(ValueError, match="pair 1 has role 'IO' at position\\(s\\) 1 of the clean prompt and 3 of "
                                         "the corrupted one; a circuit over every position") as error:
        eap(model, same.clean, same.corrupt, progress=False)
    one_line(error)
    for pair in (same, prompts):  # a positional circuit joins each role to its position: it runs
        scores = eap(model, pair.clean, pair.corrupt, graph=build_graph(model, positions=["IO", "S1", "S2", "END"]),
                     progress=False)
        assert bool(scores.per_example.isfinite().all()) and float(scores.per_example.abs().max()) > 0


@pytest.mark.parametrize("corrupted_roles, message", [
    ({"IO": "Mary", "S1": "John", "S2": ["Mary", 1]}, "role 'END' is in 'roles' but not in 'corrupted_roles'"),
    ({**SWAPPED.corrupted_roles, "X": 0}, "role 'X' is in 'corrupted_roles' but not in 'roles'"),
    (["IO"], "field 'corrupted_roles' must be an object of role name -> position; got ['IO']"),
    ({**SWAPPED.corrupted_roles, "IO": "Zoe"}, "corrupted role 'IO': 'Zoe' does not occur 1 time(s) in the corrupted "
                                               "prompt"),
    ({**SWAPPED.corrupted_roles, "END": 40}, "corrupted role 'END' token position 40 is outside the prompt's 14 tokens"),
    ({**SWAPPED.corrupted_roles, "S2": ["Mary", True]}, "corrupted role 'S2' must be a substring"),
])
def test_a_malformed_corrupted_roles_entry_is_one_line_naming_the_line_and_role(tokenizer, tmp_path, corrupted_roles,
                                                                               message):
    row = {"clean": SWAPPED.clean, "corrupted": SWAPPED.corrupted, "answer": " Mary", "wrong_answer": " John",
           "roles": ROLES}
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(row) + "\n" + json.dumps({**row, "corrupted_roles": corrupted_roles}) + "\n")
    with pytest.raises(ValueError) as error:
        tokenize_pairs(tokenizer, read_prompts(path))
    assert one_line(error).startswith(f"{path} line 2: ") and message in str(error.value)


def test_prompt_files_carry_corrupted_roles_and_a_length_change_without_them_is_refused(tokenizer, tmp_path):
    path = tmp_path / "pairs.json"
    rows = [{"clean": p.clean, "corrupted": p.corrupted, "answer": p.answer, "wrong_answer": p.wrong_answer,
             "roles": p.roles, **({"corrupted_roles": p.corrupted_roles} if p.corrupted_roles else {})} for p in PAIRS]
    path.write_text(json.dumps(rows))
    read, direct = tokenize_pairs(tokenizer, read_prompts(path)), tokenize_pairs(tokenizer, PAIRS)
    for name in ROLES:
        assert torch.equal(read.corrupt.roles[name], direct.corrupt.roles[name])
    del rows[1]["corrupted_roles"]
    path.write_text(json.dumps(rows))
    lengths = f"{int(direct.lengths[1])} and {int(direct.corrupt_lengths[1])} tokens"
    with pytest.raises(ValueError, match=f"item 1: clean and corrupted prompts tokenize to {lengths}; .* or "
                                         "give 'corrupted_roles' to align them by role") as error:
        tokenize_pairs(tokenizer, read_prompts(path))
    one_line(error)
