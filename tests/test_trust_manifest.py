"""Committed results carry a manifest (issue 38 item 4): `interp reproduce --results DIR` refuses a committed
run whose files were edited after the commit, naming the file, and measures an edited measurement cache
again, so the verdict printed is the one the runs give. Every case works on a copy of the repository's
committed pfsa-cpu runs in tmp_path; the repository's results/ is only read."""

from __future__ import annotations

import json
import shutil

import pytest

from interp.cli import main
from interp.reproduce import manifest
from interp.reproduce import results as committed

COMMITTED = committed.results_dir("pfsa", "cpu")
LINEAR, UNFIT = "deltanet-1_1-s0", "tanh_rnn-s0"     # the DeltaNet the trained claim rests on; a run that did not fit


def run_reproduce(results, out, capsys) -> tuple[int, str, list[str]]:
    """(exit status, stdout, stderr lines) of `interp reproduce pfsa --no-train --results results`."""
    status = main(["reproduce", "pfsa", "--no-train", "--no-progress", "--results", str(results), "--out", str(out)])
    captured = capsys.readouterr()
    return status, captured.out, [line for line in captured.err.splitlines() if line.strip()]


def verdicts(out) -> list[str]:
    return [claim["verdict"] for claim in json.loads((out / "claims.json").read_text())["claims"]]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """The committed pfsa-cpu runs copied once, and the verdicts `interp reproduce` gives from them."""
    if not all((COMMITTED / label / committed.OUTCOME).is_file() for label in (LINEAR, UNFIT)):
        pytest.skip("the committed pfsa-cpu runs are not in this checkout")
    root = tmp_path_factory.mktemp("manifest")
    shutil.copytree(COMMITTED, root / "results")
    status = main(["reproduce", "pfsa", "--no-train", "--no-progress", "--results", str(root / "results"),
                   "--out", str(root / "out")])
    assert status == 0
    return root / "results", verdicts(root / "out")


@pytest.fixture
def results(pristine, tmp_path):
    shutil.copytree(pristine[0], tmp_path / "results")
    return tmp_path / "results"


def edit_json(path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def flip_last_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))


def drop_weights_digest(config) -> None:
    del config["weights_sha256"]


EDITS = {
    "outcome.json": lambda run: edit_json(run / "outcome.json", lambda o: o.update(status="fit", in_distribution=0.999)),
    "config.json": lambda run: edit_json(run / "config.json", drop_weights_digest),
    "metrics.jsonl": lambda run: (run / "metrics.jsonl").write_text((run / "metrics.jsonl").read_text() + "{}\n"),
    "model.safetensors": lambda run: (flip_last_byte(run / "model.safetensors"),
                                      edit_json(run / "config.json", drop_weights_digest)),
    "early_stop.json": lambda run: (run / "early_stop.json").write_text('{"step": 1}'),
    "manifest.json": lambda run: (run / "manifest.json").unlink(),
}


@pytest.mark.parametrize("name", sorted(EDITS))
def test_an_edited_committed_file_is_refused_naming_it(name, results, tmp_path, capsys):
    """outcome.json turned 'fit, 0.999', weights_sha256 deleted (with the weights flipped or not), a line
    added to the metrics, a file added, the manifest deleted: one line naming the file; no report."""
    EDITS[name](results / UNFIT)
    status, _out, err = run_reproduce(results, tmp_path / "out", capsys)
    assert status == 2 and len(err) == 1, err
    assert f"{UNFIT}/" in err[0] and name in err[0] and "Traceback" not in err[0], err
    assert not (tmp_path / "out" / "report.html").exists()


def test_flipped_weights_without_a_digest_are_refused_even_under_a_regenerated_manifest(results, tmp_path, capsys):
    """Whoever edits a run can write its manifest again (a manifest does not authenticate); a config
    without the weights' digest is still refused."""
    EDITS["model.safetensors"](results / LINEAR)
    manifest.write_manifest(results / LINEAR)
    status, _out, err = run_reproduce(results, tmp_path / "out", capsys)
    assert status == 2 and len(err) == 1 and f"{LINEAR}/config.json records no weights_sha256" in err[0], err


def test_a_removed_outcome_is_refused_not_taken_for_a_run_never_committed(results, tmp_path, capsys):
    (results / UNFIT / "outcome.json").unlink()
    status, _out, err = run_reproduce(results, tmp_path / "out", capsys)
    assert status == 2 and len(err) == 1 and f"{UNFIT}/outcome.json does not match" in err[0] and "missing" in err[0]


def test_a_linked_committed_file_is_refused(results, tmp_path, capsys):
    outside = tmp_path / "elsewhere.json"
    shutil.move(results / UNFIT / "outcome.json", outside)
    (results / UNFIT / "outcome.json").symlink_to(outside)
    status, _out, err = run_reproduce(results, tmp_path / "out", capsys)
    assert status == 2 and len(err) == 1 and "outcome.json is a symbolic link" in err[0], err


def lower_late_agreement(cache) -> None:
    """The DeltaNet's agreement at the last partial-reveal counts k set to 0.5: its drop from the first k
    becomes large, which would turn the trained claim from 'does not reproduce' to 'partly reproduces'."""
    by_k = cache["measures"]["no full reveal"]["by_k"]
    for k in sorted(by_k, key=int)[-3:]:
        by_k[k]["agreement"] = 0.5


def test_an_edited_measurement_cache_is_measured_again(pristine, results, tmp_path, capsys):
    """The issue's edit: agreement values in a committed reproduce.json. The cache is measured again, the
    verdicts are those of the unedited runs, and the new cache equals the committed one."""
    true_verdicts = pristine[1]
    original = json.loads((results / LINEAR / "reproduce.json").read_text())
    edit_json(results / LINEAR / "reproduce.json", lower_late_agreement)
    status, out, err = run_reproduce(results, tmp_path / "out", capsys)
    assert status == 0 and not err, err
    assert f"{LINEAR}/reproduce.json does not match the run's manifest; measuring again" in out
    assert verdicts(tmp_path / "out") == true_verdicts
    again = json.loads((tmp_path / "out" / "runs" / LINEAR / "reproduce.json").read_text())
    assert again["key"] == original["key"]
    for k, row in original["measures"]["no full reveal"]["by_k"].items():
        assert again["measures"]["no full reveal"]["by_k"][k]["agreement"] == pytest.approx(row["agreement"], abs=1e-6)

    manifest.write_manifest(results / LINEAR)      # the editor also rewrites the manifest: trusted, and it shows
    status, _out, err = run_reproduce(results, tmp_path / "forged", capsys)
    assert status == 0 and verdicts(tmp_path / "forged")[-1] != true_verdicts[-1] == "does not reproduce"


def test_the_repositorys_committed_manifests_match(capsys):
    """Every committed run, unfinished copy and sweep table under results/reproduce has a manifest its
    files match (`python -m interp.reproduce check`); rerun `write` after committing new results."""
    from interp.reproduce.__main__ import main as maintenance

    found = committed.committed_directories(committed.RESULTS)
    assert found and all((d / manifest.MANIFEST).is_file() for d in found)
    assert maintenance(["check"]) == 0, capsys.readouterr().out


def test_a_manifest_names_every_file_and_each_kind_of_change(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints" / "step-1").mkdir(parents=True)
    (run / "a.json").write_text("1")
    (run / "checkpoints" / "step-1" / "w.bin").write_bytes(b"\0" * 9)
    saved = json.loads(manifest.write_manifest(run).read_text())["sha256"]
    assert saved == {"a.json": manifest.sha256_of(run / "a.json"),
                     "checkpoints/step-1/w.bin": manifest.sha256_of(run / "checkpoints" / "step-1" / "w.bin")}
    assert manifest.changed_files(run) == {} and manifest.check_manifest(run) == []
    (run / "a.json").write_text("2")
    (run / "checkpoints" / "step-1" / "w.bin").unlink()
    (run / "b.json").write_text("{}")
    problems = manifest.changed_files(run)
    assert set(problems) == {"a.json", "b.json", "checkpoints/step-1/w.bin"}
    assert "missing" in problems["checkpoints/step-1/w.bin"] and "not in the manifest" in problems["b.json"]
    assert manifest.check_manifest(run, allowed=tuple(problems)) == sorted(problems)
    with pytest.raises(manifest.EditedResults, match=r"a\.json does not match .*so do b\.json"):
        manifest.check_manifest(run, allowed=("checkpoints/step-1/w.bin",))


def test_the_results_flag_must_be_a_directory(tmp_path, capsys):
    status = main(["reproduce", "pfsa", "--no-train", "--results", str(tmp_path / "nowhere"), "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "argument --results" in err[0] and "not a directory" in err[0], err


def test_an_edited_unfinished_copy_or_sweep_table_is_refused(tmp_path):
    """The other committed directories: an unfinished run's checkpoint copy (resumed by a later session)
    and a sweep table (rows a sweep skips): one byte changed is refused, naming the file."""
    from interp.reproduce import claim_module, committed_sweeps

    unfinished = committed.results_dir("error-control", "medium") / committed.UNFINISHED
    sweep = committed.results_dir("sample-efficiency", "medium") / "budget"
    if not unfinished.is_dir() or not (sweep / "results.jsonl").is_file():
        pytest.skip("no committed unfinished copy or sweep table in this checkout")
    label = sorted(p.name for p in unfinished.iterdir())[0]
    shutil.copytree(unfinished / label, tmp_path / "results" / committed.UNFINISHED / label)
    run = next(r for r in claim_module("error-control").plan("medium").runs if r.label == label)
    weights = next((tmp_path / "results" / committed.UNFINISHED / label).rglob("model.safetensors"))
    flip_last_byte(weights)
    with pytest.raises(manifest.EditedResults, match=r"checkpoints/.*model\.safetensors does not match"):
        committed.resume_unfinished(run, tmp_path / "results", tmp_path / "runs" / label, log=lambda _line: None)
    assert not (tmp_path / "runs").exists()

    shutil.copytree(sweep, tmp_path / "budget")
    rows = (tmp_path / "budget" / "results.jsonl").read_text()
    assert committed_sweeps.committed_rows(tmp_path / "budget")
    (tmp_path / "budget" / "results.jsonl").write_text(rows.replace('"converged": false', '"converged": true', 1)
                                                       if '"converged": false' in rows else rows + "\n")
    with pytest.raises(manifest.EditedResults, match=r"budget/results\.jsonl does not match"):
        committed_sweeps.seed_table(tmp_path / "budget", tmp_path / "out")
