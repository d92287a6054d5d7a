"""interp.prompts: Batches from text. Tokens decode back to the prompts, roles point at the named
text, padding moves nothing a causal model reads, interchange on a prompt batch equals interchange
on the same tokens built by hand (and its logit difference is the source model's logit(answer) -
logit(wrong answer)), prompt files fail in one line naming line and field, and an interchange
whose filter keeps no example runs no pair."""

from __future__ import annotations

import json

import pytest
import torch

import models
from interp.analysis.circuits import eap
from interp.analysis.interventions import Site, attribute, interchange, site_grid
from interp.prompts import (NO_STATE, PromptPair, ioi_pairs, read_prompts, tokenize_pairs)
from interp.tasks.base import Batch
from tests.prompt_fixtures import gpt2_source, hf_tokenizer, train_tokenizer

pytest.importorskip("transformers")

PAIR = PromptPair("When Mary and John went to the store, John gave a drink to",
                  "When Mary and John went to the store, Mary gave a drink to", " Mary", " John",
                  {"IO": "Mary", "S1": ["John", 0], "S2": ["John", 1], "store": [31, 36], "END": -1})


@pytest.fixture(scope="module")
def raw_tokenizer():
    return train_tokenizer()


@pytest.fixture(scope="module")
def tokenizer(raw_tokenizer):
    return hf_tokenizer(raw_tokenizer)


@pytest.fixture(scope="module")
def gpt2(tokenizer):
    source = gpt2_source(len(tokenizer))
    return source, models.from_pretrained(source).eval()


def mamba2_source(vocab_size: int):
    import transformers as tf

    torch.manual_seed(0)
    config = tf.Mamba2Config(vocab_size=vocab_size, hidden_size=16, num_heads=4, head_dim=8, state_size=4, n_groups=2,
                             expand=2, conv_kernel=3, num_hidden_layers=2, chunk_size=16, pad_token_id=0,
                             bos_token_id=0, eos_token_id=0)
    source = tf.Mamba2ForCausalLM(config).eval()
    with torch.no_grad():
        for parameter in source.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    return source


IMPORTS = {"gpt2": (gpt2_source, ["blocks.{l}.hook_resid_pre", "blocks.{l}.mixer.hook_z"]),
           "mamba2": (mamba2_source, ["blocks.{l}.hook_resid_pre", "blocks.{l}.mixer.hook_state"])}


def word(tokenizer, batch: Batch, b: int, role: str) -> str:
    return tokenizer.decode([int(batch.tokens[b, batch.roles[role][b]])]).strip()


def test_tokens_decode_back_and_roles_point_at_the_named_text(tokenizer):
    pairs = ioi_pairs(12, seed=3)
    prompts = tokenize_pairs(tokenizer, pairs)
    clean, corrupt, lengths = prompts.clean, prompts.corrupt, prompts.lengths
    assert len({int(n) for n in lengths}) > 1   # templates of several lengths: padding is exercised
    for b, pair in enumerate(pairs):
        n = int(lengths[b])
        assert tokenizer.decode(clean.tokens[b, :n]) == pair.clean
        assert tokenizer.decode(corrupt.tokens[b, :n]) == pair.corrupted
        io, s = pair.answer.strip(), pair.wrong_answer.strip()
        assert (word(tokenizer, clean, b, "IO"), word(tokenizer, clean, b, "S1"), word(tokenizer, clean, b, "S2")) \
            == (io, s, s)
        assert word(tokenizer, corrupt, b, "S2") == io                 # "swap": the IO name at S2
        assert int(clean.roles["END"][b]) == n - 1
        assert clean.loss_mask[b].nonzero()[:, 0].tolist() == [n - 1]   # the answer position only
        assert int(clean.targets[b, n - 1]) == prompts.answers[b] == tokenizer(pair.answer)["input_ids"][0]
        assert int(corrupt.targets[b, n - 1]) == prompts.wrong_answers[b]
        assert torch.equal(clean.targets[b, : n - 1], clean.tokens[b, 1:n])   # next tokens inside the prompt
    assert (clean.states == NO_STATE).all() and clean.states.shape == clean.tokens.shape


def test_every_role_form_and_left_padding(tokenizer):
    text = "When Mary and John went to the park, John said to"
    short = PromptPair(text, text.replace(", John", ", Mary"), " Mary", 123,
                       {"IO": "Mary", "S1": ["John", 0], "S2": ["John", 1],
                        "store": [text.find("park"), text.find(",")], "END": -1})
    right, left = (tokenize_pairs(tokenizer, [PAIR, short], padding=side) for side in ("right", "left"))
    assert int(right.wrong_answers[1]) == 123   # a token id as given
    assert right.lengths.tolist() == [14, 12] and left.clean.tokens.shape == (2, 14)
    for b, place in enumerate(("store", "park")):
        n, shift = int(right.lengths[b]), 14 - int(right.lengths[b])
        assert torch.equal(left.clean.tokens[b, shift:], right.clean.tokens[b, :n])
        assert (left.clean.tokens[b, :shift] == tokenizer.eos_token_id).all()
        for role in PAIR.roles:
            assert int(left.clean.roles[role][b]) == int(right.clean.roles[role][b]) + shift
        assert left.clean.loss_mask[b, -1] and int(left.clean.loss_mask[b].sum()) == 1
        words = [word(tokenizer, right.clean, b, role) for role in ("IO", "S1", "S2", "store", "END")]
        assert words == ["Mary", "John", "John", place, "to"]
        assert int(right.clean.roles["S1"][b]) < int(right.clean.roles["S2"][b])


def test_tokenizers_of_every_kind_agree(tokenizer, raw_tokenizer):
    pairs = ioi_pairs(4, seed=1)
    reference = tokenize_pairs(tokenizer, pairs)
    fast = tokenize_pairs(raw_tokenizer, pairs)

    def with_offsets(text):
        encoding = raw_tokenizer.encode(text)
        return encoding.ids, encoding.offsets

    for other in (fast, tokenize_pairs(with_offsets, pairs)):
        assert torch.equal(other.clean.tokens, reference.clean.tokens)
        assert all(torch.equal(other.clean.roles[r], reference.clean.roles[r]) for r in reference.clean.roles)
    ids_only = [PromptPair(p.clean, p.corrupted, p.answer, p.wrong_answer, {"END": -1}) for p in pairs]
    plain = tokenize_pairs(lambda text: raw_tokenizer.encode(text).ids, ids_only)
    assert torch.equal(plain.clean.tokens, reference.clean.tokens)
    with pytest.raises(ValueError, match="role 'IO' names text, which needs the tokenizer's character offsets"):
        tokenize_pairs(lambda text: raw_tokenizer.encode(text).ids, pairs)


@pytest.mark.parametrize("change,message", [
    (dict(corrupted="When Mary and John went to the store, Mary Anne gave a drink to"),
     "pair 0: clean and corrupted prompts tokenize to 14 and 15 tokens"),
    (dict(answer=" Mary Anne"), "pair 0: field 'answer' ' Mary Anne' tokenizes to 2 tokens"),
    (dict(wrong_answer=" Mary"), "pair 0: answer and wrong_answer are the same token"),
    (dict(roles={"IO": "Zoe"}), "pair 0: role 'IO': 'Zoe' does not occur 1 time"),
    (dict(roles={"S2": ["John", 2]}), "role 'S2': 'John' does not occur 3 time"),
    (dict(roles={"END": 14}), "role 'END' token position 14 is outside the prompt's 14 tokens"),
    (dict(roles={"x": [3, 200]}), "role 'x' must be a substring"),
])
def test_bad_pairs_are_refused_in_one_line_naming_the_pair(tokenizer, change, message):
    fields = dict(clean=PAIR.clean, corrupted=PAIR.corrupted, answer=PAIR.answer, wrong_answer=PAIR.wrong_answer,
                  roles={})
    with pytest.raises(ValueError, match=message) as error:
        tokenize_pairs(tokenizer, [PromptPair(**{**fields, **change})])
    assert "\n" not in str(error.value)


def test_prompt_files_round_trip_and_fail_naming_line_and_field(tmp_path):
    good = tmp_path / "pairs.jsonl"
    rows = [{"clean": p.clean, "corrupted": p.corrupted, "answer": p.answer, "wrong_answer": p.wrong_answer,
             "roles": p.roles} for p in ioi_pairs(3, seed=0)]
    good.write_text("\n".join(json.dumps(r) for r in rows[:2]) + "\n\n" + json.dumps(rows[2]) + "\n")
    read = read_prompts(good)
    assert [(p.clean, p.roles) for p in read] == [(r["clean"], r["roles"]) for r in rows]
    assert read[2].where == f"{good} line 4"
    listed = tmp_path / "pairs.json"
    listed.write_text(json.dumps(rows))
    assert [p.clean for p in read_prompts(listed)] == [r["clean"] for r in rows]
    listed.write_text(json.dumps([rows[0], {**rows[1], "wrong_answer": -3}]))
    with pytest.raises(ValueError, match="pairs.json item 1: field 'wrong_answer' must be a non-empty string or a "
                                         "token id >= 0; got -3"):
        read_prompts(listed)
    cases = {
        '{"clean": "a"\n': "line 1: not a JSON object",
        json.dumps({**rows[0], "corrupt": "x"}): "line 1: unknown field 'corrupt' (did you mean 'corrupted'?)",
        json.dumps(rows[0]) + "\n" + json.dumps({k: v for k, v in rows[0].items() if k != "answer"}):
            "line 2: field 'answer' is missing",
        json.dumps({**rows[0], "clean": 5}): "line 1: field 'clean' must be a non-empty string; got 5",
        json.dumps({**rows[0], "answer": True}): "line 1: field 'answer' must be a non-empty string or a token id",
        json.dumps({**rows[0], "roles": ["IO"]}): "line 1: field 'roles' must be an object",
        "[1, 2]": "line 1: must be a JSON object",
        "\n\n": "holds no prompt pairs",
    }
    for text, message in cases.items():
        bad = tmp_path / "bad.jsonl"
        bad.write_text(text)
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
            read_prompts(bad)


def test_ioi_pairs_follow_the_seed_and_the_corruption():
    assert [p.clean for p in ioi_pairs(6, seed=4)] == [p.clean for p in ioi_pairs(6, seed=4)]
    assert [p.clean for p in ioi_pairs(6, seed=4)] != [p.clean for p in ioi_pairs(6, seed=5)]
    for pair in ioi_pairs(8, seed=0, corruption="abc"):
        io, s = pair.answer.strip(), pair.wrong_answer.strip()
        assert pair.clean.count(io) == 1 and pair.clean.count(s) == 2
        assert io not in pair.corrupted.split() and s not in pair.corrupted.replace(",", " ").split()
    with pytest.raises(ValueError, match="each template needs one {IO} and two {S}"):
        ioi_pairs(2, templates=["{IO} met {S}"])


def hand_built(tokenizer, pairs: list[PromptPair]) -> tuple[Batch, Batch]:
    """The same pairs as Batches written out by hand (prompts of one length, no padding)."""
    tokens = {side: torch.tensor([tokenizer(getattr(p, side))["input_ids"] for p in pairs])
              for side in ("clean", "corrupted")}
    n, length = tokens["clean"].shape
    mask = torch.zeros(n, length, dtype=torch.bool)
    mask[:, -1] = True
    batches = []
    for side, answer in (("clean", "answer"), ("corrupted", "wrong_answer")):
        targets = torch.zeros(n, length, dtype=torch.long)
        targets[:, -1] = torch.tensor([tokenizer(getattr(p, answer))["input_ids"][0] for p in pairs])
        names = [tokenizer.convert_ids_to_tokens(row) for row in tokens["clean"].tolist()]
        io = [row.index("Ġ" + p.answer.strip()) for row, p in zip(names, pairs)]
        s2 = [len(row) - 1 - row[::-1].index("Ġ" + p.wrong_answer.strip()) for row, p in zip(names, pairs)]
        batches.append(Batch(tokens[side], targets, mask.clone(), torch.zeros(n, length, dtype=torch.long),
                             {"IO": torch.tensor(io), "S2": torch.tensor(s2), "END": torch.full((n,), length - 1)}))
    return batches[0], batches[1]


@pytest.mark.parametrize("kind", sorted(IMPORTS))
def test_interchange_on_prompts_equals_the_hand_built_batch_and_measures_the_logit_difference(tokenizer, kind):
    make, hooks = IMPORTS[kind]
    source = make(len(tokenizer))
    model = models.from_pretrained(source).eval()
    template = ["When {IO} and {S} went to the store, {S} gave a drink to"]
    pairs = ioi_pairs(10, seed=2, templates=template)
    prompts = tokenize_pairs(tokenizer, pairs)
    by_hand = hand_built(tokenizer, pairs)
    sites = site_grid(model, hooks, ["IO", "S2", "END"])
    ours, theirs = (interchange(model, clean, corrupt, sites, min_effect=0.0, metrics=["logit_diff"], progress=False)
                    for clean, corrupt in ((prompts.clean, prompts.corrupt), by_hand))
    assert ours.n_run > 0
    for name in ("p_patched", "p_clean", "p_corrupt", "kept", "logit_diff_patched", "logit_diff_clean"):
        assert torch.equal(getattr(ours, name), getattr(theirs, name)), name
    with torch.no_grad():   # the metric: logit(answer) - logit(wrong answer) at the last token, by the source
        for batch, difference in ((prompts.clean, ours.logit_diff_clean), (prompts.corrupt, ours.logit_diff_corrupt)):
            last = source(batch.tokens).logits[:, -1].double()
            rows = torch.arange(len(pairs))
            expected = last[rows, prompts.answers] - last[rows, prompts.wrong_answers]
            torch.testing.assert_close(difference, expected, atol=1e-4, rtol=0)
    estimate = attribute(model, prompts.clean, prompts.corrupt, sites, min_effect=0.0, metrics=["logit_diff"],
                         progress=False)
    assert estimate.labels == ours.labels and torch.equal(estimate.kept, ours.kept)
    scores = eap(model, prompts.clean, prompts.corrupt, progress=False)
    torch.testing.assert_close(scores.setup.clean_metric, ours.logit_diff_clean, atol=1e-5, rtol=0)   # float32 paths
    assert scores.scores.isfinite().all() and scores.scores.abs().sum() > 0


@pytest.mark.parametrize("kind", sorted(IMPORTS))
def test_right_padding_changes_nothing_a_prompt_reads(tokenizer, kind):
    model = models.from_pretrained(IMPORTS[kind][0](len(tokenizer))).eval()
    pairs = ioi_pairs(12, seed=3)
    together = tokenize_pairs(tokenizer, pairs)
    sites = [Site("blocks.1.hook_resid_pre", "S2"), Site("blocks.0.mixer.hook_out", "IO")]
    mixed = interchange(model, together.clean, together.corrupt, sites, min_effect=0.0, progress=False)
    compared = 0
    for n in set(together.lengths.tolist()):
        rows = [b for b, length in enumerate(together.lengths.tolist()) if length == n]
        alone = tokenize_pairs(tokenizer, [pairs[b] for b in rows])
        assert alone.clean.tokens.shape[1] == n
        own = interchange(model, alone.clean, alone.corrupt, sites, min_effect=0.0, progress=False)
        for name in ("p_clean", "p_corrupt", "kept"):
            torch.testing.assert_close(getattr(mixed, name)[rows], getattr(own, name), atol=1e-6, rtol=0)
        if own.n_run:   # a group whose filter keeps none runs no pair (p_patched = p_corrupt there)
            torch.testing.assert_close(mixed.p_patched[:, rows], own.p_patched, atol=1e-6, rtol=0)
            compared += len(rows)
    assert compared >= 4


def test_a_filter_that_keeps_nothing_runs_no_pair_and_says_so_in_one_line(tokenizer, gpt2, capsys):
    _, model = gpt2
    prompts = tokenize_pairs(tokenizer, ioi_pairs(8, seed=0))
    sites = site_grid(model, ["blocks.{l}.hook_resid_pre"], list(range(prompts.clean.tokens.shape[1])))
    result = interchange(model, prompts.clean, prompts.corrupt, sites, min_effect=0.9, metrics=["logit_diff"])
    err = capsys.readouterr().err.strip().splitlines()
    assert result.n_kept == 0 and result.n_run == 0 and result.n_passes == 0 and result.restoration.isnan().all()
    assert torch.equal(result.p_patched, result.p_corrupt.expand_as(result.p_patched))
    assert len(err) == 1 and err[0].startswith("interchange: none of the 8 examples has p_clean - p_corrupt > "
                                               "min_effect 0.9")
    kept = interchange(model, prompts.clean, prompts.corrupt, sites, min_effect=0.0, metrics=["logit_diff"])
    assert kept.n_kept > 0 and kept.n_run > 0 and torch.equal(kept.p_clean, result.p_clean)


def test_a_prompt_of_no_tokens_is_refused(raw_tokenizer):
    def dropping_spaces(text):
        return [i for i in raw_tokenizer.encode(text).ids if text.strip()]

    with pytest.raises(ValueError, match="pair 0: field 'clean' '  ' tokenizes to no tokens"):
        tokenize_pairs(dropping_spaces, [PromptPair("  ", "  ", 5, 6)])


def test_a_filter_that_keeps_nothing_still_refuses_a_bad_head_or_subspace(tokenizer, gpt2):
    _, model = gpt2
    prompts = tokenize_pairs(tokenizer, ioi_pairs(4, seed=0))
    for site, message in ((Site("blocks.0.mixer.hook_z", "END", head=9), "head 9 does not exist"),
                          (Site("blocks.0.hook_resid_pre", "END", subspace=torch.eye(8)[:, :2]), "subspace has d=8")):
        with pytest.raises(ValueError, match=message):
            interchange(model, prompts.clean, prompts.corrupt, [site], min_effect=0.9, skip_noops=False, progress=False)
