"""`interp patch / interp circuit MODEL_DIR --prompts FILE`: your own prompt pairs from the command
line, on a transformers checkpoint directory (its tokenizer beside it), a saved model directory
(`model.save` writes the imported model's tokenizer with it) or one saved without a tokenizer
given --tokenizer; bad prompt files and missing tokenizers are one-line errors; a filter that keeps
no example stops before any patched pass."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

import models
from interp.analysis.circuits import build_graph, eap
from interp.analysis.interventions import interchange, site_grid
from interp.cli import main
from interp.prompts import ioi_pairs, read_prompts, tokenize_pairs
from tests.prompt_fixtures import checkpoint_dir

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return checkpoint_dir(tmp_path_factory.mktemp("gpt2") / "tiny-gpt2")


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "ioi.jsonl"
    path.write_text("".join(json.dumps({"clean": p.clean, "corrupted": p.corrupted, "answer": p.answer,
                                        "wrong_answer": p.wrong_answer, "roles": p.roles}) + "\n"
                            for p in ioi_pairs(8, seed=0)))
    return path


def expected_prompts(checkpoint, prompt_file):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True)
    return models.from_pretrained(checkpoint).eval(), tokenize_pairs(tokenizer, read_prompts(prompt_file))


def test_patch_runs_a_prompt_file_on_a_checkpoint_as_the_python_api_does(checkpoint, prompt_file, tmp_path, capsys):
    report = tmp_path / "ioi.html"
    capsys.readouterr()
    assert main(["patch", str(checkpoint), "--prompts", str(prompt_file), "--hooks", "hook_resid_pre,mixer.hook_z",
                 "--positions", "IO,S1,S2,END", "--min-effect", "0", "--top", "3", "--no-progress",
                 "--out", str(report)]) == 0
    out = capsys.readouterr().out
    assert "on prompts ioi.jsonl" in out and "16 sites x 8 pairs" in out
    table = pd.read_csv(tmp_path / "ioi.csv")
    model, prompts = expected_prompts(checkpoint, prompt_file)
    sites = site_grid(model, ["blocks.{l}.hook_resid_pre", "blocks.{l}.mixer.hook_z"], ["IO", "S1", "S2", "END"])
    expected = interchange(model, prompts.clean, prompts.corrupt, sites, min_effect=0.0, progress=False).to_dataframe()
    exact = table[table.method == "exact"].reset_index(drop=True)
    assert exact.site.tolist() == expected.site.tolist() and exact.n_kept[0] == expected.n_kept[0] > 0
    pd.testing.assert_series_equal(exact["mean"], expected["mean"], check_names=False)
    assert "prompt pairs of" in report.read_text()


def test_circuit_runs_a_prompt_file_on_a_saved_model_with_a_tokenizer_flag(checkpoint, prompt_file, tmp_path, capsys):
    saved = models.from_pretrained(checkpoint, tokenizer=False).save(tmp_path / "saved")   # no tokenizer files
    report = tmp_path / "circuit.html"
    capsys.readouterr()
    assert main(["circuit", str(saved), "--prompts", str(prompt_file), "--tokenizer", str(checkpoint), "--steps", "2",
                 "--rescore", "5", "--no-progress", "--out", str(report)]) == 0
    assert "on prompts ioi.jsonl" in capsys.readouterr().out
    table = pd.read_csv(tmp_path / "circuit.csv")
    model, prompts = expected_prompts(checkpoint, prompt_file)
    expected = eap(model, prompts.clean, prompts.corrupt)
    assert table.edge.tolist() == expected.graph.edge_names()
    assert torch.allclose(torch.tensor(table.eap.values), expected.scores, atol=1e-6)


@pytest.mark.parametrize("content, message", [
    ('{"clean": "When Mary and John", "corrupted": "x"}\n', "ioi.jsonl line 1: field 'answer' is missing"),
    ("\n" + json.dumps({"clean": "a", "corrupted": "b", "answer": " a", "wrong_answer": " b", "role": {}}) + "\n",
     "line 2: unknown field 'role' (did you mean 'roles'?)"),
    ('{"clean": "When Mary"\n', "ioi.jsonl line 1: not a JSON object"),
])
def test_bad_prompt_files_are_one_line_errors_naming_line_and_field(checkpoint, tmp_path, content, message, capsys):
    bad = tmp_path / "ioi.jsonl"
    bad.write_text(content)
    capsys.readouterr()
    assert main(["patch", str(checkpoint), "--prompts", str(bad), "--out", str(tmp_path / "p.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("interp patch: error:") and message in err


def test_a_tokenizer_without_prompts_is_a_one_line_error(checkpoint, tmp_path, capsys):
    capsys.readouterr()
    assert main(["patch", str(checkpoint), "--tokenizer", str(checkpoint), "--out", str(tmp_path / "p.html")]) == 2
    assert capsys.readouterr().err.strip() == "interp patch: error: --tokenizer is used with --prompts only"


def test_a_model_directory_without_a_tokenizer_is_a_one_line_error_naming_both_options(checkpoint, prompt_file,
                                                                                      tmp_path, capsys):
    saved = models.from_pretrained(checkpoint, tokenizer=False).save(tmp_path / "saved")
    assert models.load(saved).tokenizer is None
    capsys.readouterr()
    assert main(["patch", str(saved), "--prompts", str(prompt_file), "--out", str(tmp_path / "p.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"interp patch: error: no tokenizer: RUN_DIR {str(saved)!r} holds none")
    assert "no --tokenizer DIR is given" in err and "model.save of a model that has one" in err
    assert main(["patch", str(checkpoint), "--prompts", str(prompt_file), "--tokenizer", str(saved),
                 "--out", str(tmp_path / "p.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"--tokenizer {str(saved)!r} holds no tokenizer" in err and "RUN_DIR's own" in err


def test_the_tokenizer_travels_with_the_model_into_its_saved_directory(checkpoint, prompt_file, tmp_path, capsys):
    from transformers import AutoTokenizer

    victim = tmp_path / "victim.json"
    victim.write_text("precious")
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "tokenizer.json").symlink_to(victim)   # replaced, never written through
    saved = models.from_pretrained(checkpoint).save(tmp_path / "saved")
    assert victim.read_text() == "precious" and not (saved / "tokenizer.json").is_symlink()
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in saved.iterdir()}
    assert not [p for p in saved.iterdir() if p.name.endswith(".tmp")]
    original = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True)
    loaded = models.load(saved)
    texts = [p.clean for p in read_prompts(prompt_file)] + [" Mary", "<|endoftext|>x"]
    assert [loaded.tokenizer(t)["input_ids"] for t in texts] == [original(t)["input_ids"] for t in texts]
    assert loaded.tokenizer.eos_token == original.eos_token
    report, again = tmp_path / "saved.html", tmp_path / "checkpoint.html"
    for directory, out in ((saved, report), (checkpoint, again)):
        capsys.readouterr()
        assert main(["patch", str(directory), "--prompts", str(prompt_file), "--hooks", "hook_resid_pre",
                     "--positions", "IO,END", "--method", "exact", "--min-effect", "0", "--no-progress",
                     "--out", str(out)]) == 0
    ours, theirs = pd.read_csv(report.with_suffix(".csv")), pd.read_csv(again.with_suffix(".csv"))
    assert ours.site.tolist() == theirs.site.tolist() and ours.n_kept[0] > 0
    pd.testing.assert_series_equal(ours["mean"], theirs["mean"])
    resaved = loaded.save(tmp_path / "resaved")   # a loaded model carries its tokenizer on
    assert (resaved / "tokenizer.json").read_bytes() == (saved / "tokenizer.json").read_bytes()


def test_a_filter_that_keeps_nothing_stops_before_any_patched_pass(checkpoint, prompt_file, tmp_path, capsys):
    capsys.readouterr()
    assert main(["patch", str(checkpoint), "--prompts", str(prompt_file), "--method", "exact", "--min-effect", "0.9",
                 "--no-progress", "--out", str(tmp_path / "none.html")]) == 0
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("interchange: none of the 8 examples")
    assert "no (site, example) pair is run" in lines[0] and "0 kept" in captured.out
    assert pd.read_csv(tmp_path / "none.csv")["mean"].isna().all()


def test_the_recipe_ranks_heads_by_exact_restoration_beside_attribution_and_attention(checkpoint, capsys):
    from tests.prompt_fixtures import RECIPE

    out = RECIPE.run(RECIPE.parse_args([str(checkpoint), "--n", "8", "--top", "8"]))
    assert len(out["heads"]) == 8 and len(out["edges"]) == 8   # 2 layers x 4 heads, all ranked
    exact = [row[0] for row in out["heads"].values()]
    assert exact == sorted(exact, reverse=True) and all(0 <= row[2] <= 1 for row in out["heads"].values())
    assert "logit(IO) - logit(S)" in capsys.readouterr().out


def test_a_prompt_file_whose_corrupted_prompts_differ_in_length_patches_by_role_only(checkpoint, tmp_path, capsys):
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({
        "clean": "When Kate and Tom went to the park, Tom gave a ball to",
        "corrupted": "When Christopher and Tom went to the park, Christopher gave a ball to",
        "answer": " Kate", "wrong_answer": " Tom", "roles": {"IO": "Kate", "S2": ["Tom", 1], "END": -1},
        "corrupted_roles": {"IO": "Christopher", "S2": ["Christopher", 1], "END": -1}}) + "\n")
    capsys.readouterr()
    common = ["--prompts", str(path), "--no-progress"]
    assert main(["patch", str(checkpoint), *common, "--min-effect", "0", "--out", str(tmp_path / "all.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "patches position t from position t, but pair 0 has its clean answer at" in err
    assert main(["circuit", str(checkpoint), *common, "--steps", "2", "--out", str(tmp_path / "c.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "pair 0 has its clean answer at position" in err and "--positions END,IO,S2" in err
    assert main(["circuit", str(checkpoint), *common, "--steps", "2", "--positions", "IO,S2,END",
                 "--out", str(tmp_path / "roles-circuit.html")]) == 0   # a positional circuit aligns it by role
    from transformers import AutoTokenizer

    model = models.from_pretrained(checkpoint).eval()
    prompts = tokenize_pairs(AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True), read_prompts(path))
    expected = eap(model, prompts.clean, prompts.corrupt, graph=build_graph(model, positions=["IO", "S2", "END"]))
    table = pd.read_csv(tmp_path / "roles-circuit.csv")
    assert table.edge.tolist() == expected.graph.edge_names()
    assert torch.allclose(torch.tensor(table.eap.values), expected.scores, atol=1e-6)
    assert main(["patch", str(checkpoint), *common, "--min-effect", "0", "--positions", "IO,S2,END", "--hooks",
                 "hook_resid_pre", "--out", str(tmp_path / "roles.html")]) == 0
    table = pd.read_csv(tmp_path / "roles.csv")   # the values by role: tests/test_prompt_roles.py
    assert set(table.site) == {f"blocks.{l}.hook_resid_pre@{r}" for l in (0, 1) for r in ("IO", "S2", "END")}
