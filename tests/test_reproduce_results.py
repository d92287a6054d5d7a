"""Committed runs (interp.reproduce.results): a run committed under the results folder is loaded by
`interp reproduce` and never retrained nor re-measured; a committed run with another config, or
with weights that do not match their digest, is not used; only trained runs can be committed."""

import json

import pytest
import torch

from interp.reproduce import claim_module, engine, reproduce
from interp.reproduce import results as committed
from interp.reproduce.manifest import changed_files, write_manifest


def quiet(_line):
    pass


@pytest.fixture(scope="module")
def committed_parity(tmp_path_factory):
    """The parity --quick runs trained once into out/ and committed into results/."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("committed")
    reproduce("parity", "quick", root / "out", progress=False, log=quiet, results=root / "none")
    labels = engine.commit_finished(claim_module("parity"), "quick", root / "out", root / "results",
                                       extra={"deltanet-1_1-s0": {"cpu_seconds": 1.5}})
    return root, labels


def never_train(*_args, **_kwargs):
    raise AssertionError("a committed run must not be trained")


def test_committed_runs_are_loaded_not_retrained(committed_parity, tmp_path, monkeypatch):
    root, labels = committed_parity
    module = claim_module("parity")
    assert sorted(labels) == sorted(r.label for r in module.plan("quick").runs)
    kept = root / "results" / labels[0]
    assert {p.name for p in kept.iterdir()} >= {"config.json", "model.safetensors", "metrics.jsonl", "outcome.json",
                                                "reproduce.json"}
    assert not (kept / "checkpoints").exists() and not (kept / "optimizer.safetensors").exists()
    assert changed_files(kept) == {} and set(json.loads((kept / "manifest.json").read_text())["sha256"]) == \
        {p.name for p in kept.iterdir()} - {"manifest.json"}
    assert json.loads((root / "results" / "deltanet-1_1-s0" / "outcome.json").read_text())["cpu_seconds"] == 1.5

    monkeypatch.setattr(engine, "train_run", never_train)
    monkeypatch.setattr(module, "measure", never_train)      # the measurements come from the committed cache
    lines = []
    reproduce("parity", "quick", tmp_path / "fresh", progress=False, log=lines.append, results=root / "results")
    assert sum("committed in" in line for line in lines) == len(labels)
    before = json.loads((root / "out" / "claims.json").read_text())
    after = json.loads((tmp_path / "fresh" / "claims.json").read_text())
    assert [c["verdict"] for c in after["claims"]] == [c["verdict"] for c in before["claims"]]
    for old, new in zip(before["runs"], after["runs"]):
        assert (old["run"], old["status"], old["in-dist acc"], old["measures"]) == \
               (new["run"], new["status"], new["in-dist acc"], new["measures"])
    assert not list((tmp_path / "fresh").rglob("*.safetensors"))                    # nothing was trained there


def test_committed_weights_are_the_trained_weights(committed_parity):
    root, labels = committed_parity
    run = next(r for r in claim_module("parity").plan("quick").runs if r.label == labels[0])
    outcome = committed.committed_outcome(run, root / "results", root / "again", log=quiet)
    trained = engine.train_run(run, root / "out" / "runs", progress=False)
    for (name, a), (_, b) in zip(outcome.model.state_dict().items(), trained.model.state_dict().items()):
        assert torch.equal(a, b), name
    assert outcome.committed == root / "results" / labels[0] and outcome.status == trained.status


def test_a_committed_run_with_another_config_trains(committed_parity, tmp_path, monkeypatch):
    root, labels = committed_parity
    results = tmp_path / "results"
    for label in labels:
        committed.shutil.copytree(root / "results" / label, results / label)
    config = json.loads((results / labels[0] / "config.json").read_text())
    config["train"]["steps"] += 1
    (results / labels[0] / "config.json").write_text(json.dumps(config))
    write_manifest(results / labels[0])     # committed as it is: a run of another config, not an edit
    monkeypatch.setattr(engine, "train_run", never_train)
    lines = []
    with pytest.raises(AssertionError, match="must not be trained"):
        reproduce("parity", "quick", tmp_path / "out", progress=False, log=lines.append, results=results)
    assert any("another config" in line and "train.steps" in line for line in lines)


def test_tampered_weights_and_diverged_runs_are_refused(committed_parity, tmp_path):
    root, labels = committed_parity
    target = tmp_path / labels[0]
    committed.shutil.copytree(root / "results" / labels[0], target)
    data = bytearray((target / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (target / "model.safetensors").write_bytes(bytes(data))
    run = next(r for r in claim_module("parity").plan("quick").runs if r.label == labels[0])
    with pytest.raises(ValueError, match="sha256|digest"):
        committed.committed_outcome(run, tmp_path, tmp_path / "out", log=quiet)
    diverged = engine.Outcome(run, "diverged", None, 1e-3, 0, None, ["diverged"], 1.0)
    with pytest.raises(ValueError, match="only a trained run"):
        committed.commit_run(diverged, tmp_path / "elsewhere")


def test_default_results_folder_is_in_the_repository():
    assert committed.results_dir("error-control", "medium") == committed.RESULTS / "error-control-medium"
    assert committed.RESULTS.parent.parent == engine.Path(engine.__file__).resolve().parents[2]


def test_train_false_reports_the_committed_runs_and_lists_the_rest(committed_parity, tmp_path, monkeypatch):
    root, labels = committed_parity
    results = tmp_path / "results"
    for label in labels[:2]:
        committed.shutil.copytree(root / "results" / label, results / label)
    monkeypatch.setattr(engine, "train_run", never_train)
    reproduce("parity", "quick", tmp_path / "out", progress=False, log=quiet, results=results, train=False)
    saved = json.loads((tmp_path / "out" / "claims.json").read_text())
    assert [r["run"] for r in saved["runs"]] == labels[:2] and saved["pending"] == labels[2:]
    assert "not trained yet" in (tmp_path / "out" / "report.html").read_text()


def _partly_trained(run, run_dir, steps: int):
    """Train `run` as the engine would, stopping (with a checkpoint) after `steps` steps."""
    task = run.task_object()
    config = engine.models.preset_config(run.preset, vocab_size=task.vocab_size, **run.model)
    cfg = engine.train_config(run, float(run.train["lr"]), "cpu")
    return engine.train(config, task, cfg, run_dir, resume=True, stop_at=steps, progress=False)


def test_an_unfinished_run_copied_into_results_resumes_bit_for_bit_elsewhere(committed_parity, tmp_path):
    root, labels = committed_parity
    module = claim_module("parity")
    run = next(r for r in module.plan("quick").runs if r.label == labels[0])
    half = run.train["steps"] // 2
    _partly_trained(run, tmp_path / "first" / "runs" / run.label, half)
    results = tmp_path / "results"
    assert committed.commit_unfinished(module, "quick", tmp_path / "first", results) == [run.label]
    kept = results / committed.UNFINISHED / run.label
    assert json.loads((kept / "checkpoint.json").read_text())["step"] == half and changed_files(kept) == {}

    lines = []      # a fresh machine: nothing under out/, the copy in results/
    fresh = tmp_path / "second" / "runs" / run.label
    assert committed.resume_unfinished(run, results, fresh, log=lines.append)
    assert any(f"step {half}" in line for line in lines)
    resumed = engine.train_run(run, fresh.parent, progress=False)
    straight = engine.train_run(run, root / "out" / "runs", progress=False)    # trained without a stop
    for (name, a), (_, b) in zip(resumed.model.state_dict().items(), straight.model.state_dict().items()):
        assert torch.equal(a, b), name
    assert not committed.resume_unfinished(run, results, fresh, log=quiet)      # the run directory is further along

    assert engine.commit_finished(module, "quick", tmp_path / "second", results, labels=[run.label]) == [run.label]
    assert not kept.exists() and (results / run.label / "outcome.json").is_file()


def test_an_unfinished_copy_of_another_config_is_not_used(committed_parity, tmp_path):
    _root, labels = committed_parity
    module = claim_module("parity")
    run = next(r for r in module.plan("quick").runs if r.label == labels[0])
    _partly_trained(run, tmp_path / "out" / "runs" / run.label, 2)
    committed.commit_unfinished(module, "quick", tmp_path / "out", tmp_path / "results")
    config_path = tmp_path / "results" / committed.UNFINISHED / run.label / "config.json"
    config = json.loads(config_path.read_text())
    config["train"]["lr"] *= 2
    config_path.write_text(json.dumps(config))
    write_manifest(config_path.parent)      # committed as it is: a copy of another config, not an edit
    lines = []
    assert not committed.resume_unfinished(run, tmp_path / "results", tmp_path / "new" / run.label, log=lines.append)
    assert any("another config" in line and "train.lr" in line for line in lines)
    assert not (tmp_path / "new").exists()


def test_reproduce_resumes_an_unfinished_run_from_the_results_folder(committed_parity, tmp_path):
    root, labels = committed_parity
    module = claim_module("parity")
    run = next(r for r in module.plan("quick").runs if r.label == labels[0])
    _partly_trained(run, tmp_path / "first" / "runs" / run.label, 3)
    results = tmp_path / "results"
    committed.commit_unfinished(module, "quick", tmp_path / "first", results)
    for label in labels[1:]:
        committed.shutil.copytree(root / "results" / label, results / label)
    lines = []
    reproduce("parity", "quick", tmp_path / "out", progress=False, log=lines.append, results=results)
    assert any(line.startswith(f"{run.label}: resuming from the unfinished run") and "step 3" in line for line in lines)
    metrics = [json.loads(line) for line in (tmp_path / "out" / "runs" / run.label / "metrics.jsonl").open()]
    assert metrics[-1]["step"] == run.train["steps"]


def test_keep_unfinished_copies_the_checkpoint_after_every_chunk_until_the_run_finishes(committed_parity, tmp_path,
                                                                                        monkeypatch):
    _root, labels = committed_parity
    run = next(r for r in claim_module("parity").plan("quick").runs if r.label == labels[0])
    run = engine.dataclasses.replace(run, train={**run.train, "steps": 8, "eval_every": 2})
    copies = []
    keep = committed.keep_unfinished

    def recording_keep(run_, run_dir, results):
        assert keep(run_, run_dir, results)
        copies.append(json.loads((results / "unfinished" / run.label / "checkpoint.json").read_text())["step"])
        return True

    monkeypatch.setattr(committed, "keep_unfinished", recording_keep)
    never = {"accuracy": 1.0, "evals": 100}     # a rule no 8-step run meets: it trains in chunks of 2 to the end
    outcome = engine.train_run(run, tmp_path / "runs", progress=False, early_stop=never,
                               kept=tmp_path / "results", keep=True)
    assert copies == [2, 4, 6] and outcome.steps == 8
    assert not keep(run, tmp_path / "runs" / run.label, tmp_path / "results")   # finished


def test_a_collapsed_run_and_its_retry_are_kept_and_resumed_elsewhere(committed_parity, tmp_path, monkeypatch):
    """The first attempt collapses after its first chunk: its kept copy carries the marker, the retry at
    lr / 3 is kept as unfinished/<label>-lr<lr>; a fresh machine skips the first attempt without
    training it and resumes the retry from its copy, to the same weights bit for bit."""
    _root, labels = committed_parity
    run = next(r for r in claim_module("parity").plan("quick").runs if r.label == labels[0])
    run = engine.dataclasses.replace(run, train={**run.train, "steps": 8, "eval_every": 2})
    never = {"accuracy": 1.0, "evals": 100}
    verdicts = iter(["collapsed: a test"])      # the first chunk collapses, nothing after it
    monkeypatch.setattr(engine, "collapse", lambda metrics: next(verdicts, None))
    results = tmp_path / "results"
    straight = engine.train_run(run, tmp_path / "first", progress=False, early_stop=never, kept=results, keep=True)
    retry = f"{run.label}-lr{run.train['lr'] / engine.LR_RETRY_FACTOR:.3g}"
    assert straight.run_dir.name == retry and "collapsed: a test" in straight.retries[0]
    assert (results / "unfinished" / run.label / "collapsed.json").is_file()
    assert json.loads((results / "unfinished" / retry / "checkpoint.json").read_text())["step"] == 6
    assert changed_files(results / "unfinished" / retry) == {}

    trained = []
    train = engine.train
    monkeypatch.setattr(engine, "train", lambda config, task, cfg, out, **kw: trained.append(out.name) or
                        train(config, task, cfg, out, **kw))
    lines = []
    resumed = engine.train_run(run, tmp_path / "second", progress=False, early_stop=never, kept=results,
                               log=lines.append)
    assert set(trained) == {retry} and any(f"{retry}" in line and "step 6" in line for line in lines)
    for (name, a), (_, b) in zip(resumed.model.state_dict().items(), straight.model.state_dict().items()):
        assert torch.equal(a, b), name
    # committed, the finished retry keeps the collapsed attempt's record beside it (attempts/<its directory>)
    target = committed.commit_run(resumed, tmp_path / "committed")
    kept = target / committed.ATTEMPTS / run.label
    assert (kept / "collapsed.json").is_file() and (kept / "metrics.jsonl").read_bytes() == \
        (tmp_path / "first" / run.label / "metrics.jsonl").read_bytes()
    assert json.loads((target / "outcome.json").read_text())["trained_in"] == retry and changed_files(target) == {}


@pytest.mark.parametrize("name", ["error-control", "reveal-gap"])
def test_committed_medium_runs_are_loaded_not_trained_or_measured_again(name, tmp_path, monkeypatch):
    """Every run committed under results/reproduce/NAME-medium is one the plan (or its study) trains, and its
    measurement cache is under the plan's current settings: a fresh `interp reproduce NAME --scale medium
    --no-train` trains and measures nothing (a settings change must re-measure and re-commit the caches)."""
    module = claim_module(name)
    kept = committed.results_dir(name, "medium")
    labels = sorted(p.name for p in kept.iterdir() if (p / committed.OUTCOME).is_file()) if kept.is_dir() else []
    if not labels:
        pytest.skip(f"no {name} medium run committed yet")
    study = module.study_runs("medium") if hasattr(module, "study_runs") else []
    assert set(labels) <= {r.label for r in module.plan("medium").runs + study}

    def never(*_args, **_kwargs):
        raise AssertionError("a committed medium run must be loaded, not trained or re-measured")

    monkeypatch.setattr(engine, "train_run", never)
    monkeypatch.setattr(module, "train_run", never, raising=False)
    monkeypatch.setattr(module, "measure", never)
    reproduce(name, "medium", tmp_path / "out", progress=False, log=lambda _line: None, train=False)
    saved = json.loads((tmp_path / "out" / "claims.json").read_text())
    assert {r["run"] for r in saved["runs"]} >= set(labels) - {r.label for r in study}
    assert not list((tmp_path / "out").rglob("*.safetensors"))
