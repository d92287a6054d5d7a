"""Run and sweep directories are a closed world: a symbolic link below one, or a checkpoint pointer
that climbs out of it, is refused with one line naming it, and nothing outside is written,
truncated or deleted (before: a linked metrics.jsonl was truncated, every other file of a linked
checkpoints/ directory deleted, and models.load / interp eval followed "../x" pointers)."""

import json
import os
import shutil
import types

import pytest

import models
from interp.cli import main
from interp.reproduce import engine
from interp.sweep.executors import LocalExecutor
from interp.sweep.run import Sweep
from interp.sweep.table import ResultTable
from interp.tasks import make_task
from interp.training import checkpoint as ckpt
from interp.training.train import TrainConfig, train
from models.storage.paths import PathRefused, in_place_file, inside

MODEL = models.preset_config("tanh_rnn", vocab_size=2, d_model=8)
CFG = TrainConfig(steps=4, batch_size=4, lr=1e-2, warmup=1, train_length=6, eval_every=2, eval_size=8,
                  log_every=1, checkpoint_every=2, seed=5)


def run(out, resume=False):
    return train(MODEL, make_task("C2", format="acot"), CFG, out, resume=resume, progress=False)


@pytest.fixture
def finished(tmp_path):
    out = tmp_path / "run"
    run(out)
    return out


def test_inside_refuses_links_and_climbing(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert inside(tmp_path, "real", "x") == tmp_path / "real" / "x"
    for parts in (("link", "x"), ("link",), ("..", "y"), ("real/../../y",), (str(tmp_path / "real"),)):
        with pytest.raises(PathRefused):
            inside(tmp_path, *parts)
    (tmp_path / "real" / "a").write_text("1")
    os.link(tmp_path / "real" / "a", tmp_path / "b")
    with pytest.raises(PathRefused, match="2 hard links"):
        in_place_file(tmp_path, "b")


def test_resume_refuses_a_linked_metrics_file_and_leaves_its_target_alone(finished, tmp_path):
    outside = tmp_path / "precious.jsonl"
    outside.write_text((finished / ckpt.METRICS).read_text() + '{"kind": "mine"}\n')
    before = outside.read_bytes()
    (finished / ckpt.METRICS).unlink()
    (finished / ckpt.METRICS).symlink_to(outside)
    with pytest.raises(PathRefused, match="metrics.jsonl is a symbolic link"):
        run(finished, resume=True)
    assert outside.read_bytes() == before


def test_resume_refuses_a_linked_checkpoints_directory_and_deletes_nothing(finished, tmp_path):
    outside = tmp_path / "elsewhere"
    shutil.move(finished / ckpt.CHECKPOINTS, outside)
    (outside / "notes.txt").write_text("keep me")
    (finished / ckpt.CHECKPOINTS).symlink_to(outside)
    before = sorted(p.name for p in outside.iterdir())
    with pytest.raises(PathRefused, match="checkpoints is a symbolic link"):
        run(finished, resume=True)
    assert sorted(p.name for p in outside.iterdir()) == before and (outside / "notes.txt").read_text() == "keep me"


def test_remove_stale_removes_a_linked_step_directory_not_its_target(finished, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "data").write_text("keep me")
    (finished / ckpt.CHECKPOINTS / "step-000000001").symlink_to(outside)
    ckpt.remove_stale(finished)
    assert not (finished / ckpt.CHECKPOINTS / "step-000000001").exists()
    assert (outside / "data").read_text() == "keep me"


@pytest.mark.parametrize("where", ["climbing", "absolute"])
def test_checkpoint_pointer_is_confined_for_every_reader(finished, tmp_path, where, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(finished, copy)   # a complete checkpoint outside the run: loading it must still be refused
    target = copy / ckpt.CHECKPOINTS / "step-000000004"
    path = os.path.relpath(target, finished) if where == "climbing" else str(target)
    (finished / ckpt.POINTER).write_text(json.dumps({"step": 4, "path": path}))
    with pytest.raises(PathRefused, match="checkpoint.json path"):
        models.load(finished)
    with pytest.raises(ValueError, match="checkpoint.json"):
        run(finished, resume=True)
    for command in (["eval", str(finished), "--lengths", "4", "--n", "4"],
                    ["drift", str(finished), "--lengths", "6,8", "--n", "4", "--n-fit", "8", "--n-drift", "4"]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "points outside the run directory" in err[0], err


def test_sweep_refuses_linked_results_and_runs(tmp_path):
    import sweep_trials

    outside = tmp_path / "outside.jsonl"
    outside.write_text("")
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "results.jsonl").symlink_to(outside)
    executor = LocalExecutor(workers=1)
    try:
        with pytest.raises(PathRefused, match="results.jsonl is a symbolic link"):
            Sweep(out, executor, sweep_trials.square, progress=False)([{"x": 1}])
        (out / "results.jsonl").unlink()
        (tmp_path / "trials").mkdir()
        (out / "runs").symlink_to(tmp_path / "trials")
        with pytest.raises(PathRefused, match="runs is a symbolic link"):
            Sweep(out, executor, sweep_trials.square, progress=False)([{"x": 1}])
    finally:
        executor.close()
    assert outside.read_text() == "" and not any((tmp_path / "trials").iterdir())


def test_results_line_without_trial_id_names_the_file_and_line(tmp_path):
    table = ResultTable(tmp_path)
    table.append({"trial_id": "a", "value": 1})
    with open(table.path, "a") as handle:
        handle.write('{"value": 2}\n')
    with pytest.raises(ValueError, match=r"results.jsonl line 2 is not a trial row"):
        table.rows()


def test_corrupt_reproduce_cache_names_the_file(tmp_path):
    (tmp_path / engine.CACHE).write_text('{"key": ')
    with pytest.raises(ValueError, match=str(tmp_path / engine.CACHE)):
        engine._cached(types.SimpleNamespace(run_dir=tmp_path, committed=None), {"claim": "x"})


def test_open_appending_refuses_a_link_put_there_after_the_check(tmp_path):
    from models.storage.paths import open_appending

    target = tmp_path / "target"
    target.write_text("keep")
    checked = in_place_file(tmp_path, "metrics.jsonl")    # nothing there yet: allowed
    checked.symlink_to(target)                              # a link slipped in between check and open
    with pytest.raises(PathRefused, match="symbolic link"):
        open_appending(checked, "a+b")
    with open_appending(tmp_path / "real.jsonl", "a") as handle:
        handle.write("x\n")
    assert target.read_text() == "keep" and (tmp_path / "real.jsonl").read_text() == "x\n"
