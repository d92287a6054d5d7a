"""Issue 27, what remained of item 2 and 3: files read inside a run or sweep directory are reached
without a symbolic link and only when they are regular files (before: config.json, checkpoint.json,
trainer_state.json, metrics.jsonl, results.jsonl and reproduce.json were read through a link to
anywhere, and a FIFO in their place blocked the reader forever); `interp eval` and `interp drift`
write their output under the run directory's lock (before: no lock, so they raced a training run)."""

import fcntl
import os
import shutil
import subprocess
import sys
import types

import pytest

import models
from interp.cli import main
from interp.reproduce import engine
from interp.sweep.table import ResultTable
from interp.tasks import make_task
from interp.training import checkpoint as ckpt
from interp.training.train import TrainConfig, train
from models.storage.paths import LOCK, PathRefused
from tests.test_fuzz_cli import deadline

CFG = TrainConfig(steps=2, batch_size=4, lr=1e-2, warmup=1, train_length=6, eval_every=2, eval_size=8,
                  checkpoint_every=2, seed=5)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    out = tmp_path_factory.mktemp("reads") / "run"
    train(models.preset_config("tanh_rnn", vocab_size=2, d_model=8), make_task("C2"), CFG, out, progress=False)
    return out


@pytest.fixture
def finished(pristine, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(pristine, out)
    return out


def link_out(path, tmp_path):
    """Move the file at `path` outside the run and put a symbolic link to it in its place."""
    outside = tmp_path / f"outside-{path.name}"
    shutil.move(path, outside)
    path.symlink_to(outside)
    return outside


STEP = f"{ckpt.CHECKPOINTS}/step-000000002"


@pytest.mark.parametrize("name", [ckpt.CONFIG, ckpt.POINTER, f"{STEP}/{ckpt.STATE}", f"{STEP}/{ckpt.MODEL}"])
def test_models_load_refuses_a_linked_run_file(finished, tmp_path, name):
    link_out(finished / name, tmp_path)
    with pytest.raises(PathRefused, match="symbolic link"):
        models.load(finished)


@pytest.mark.parametrize("name", [ckpt.CONFIG, ckpt.METRICS, f"{STEP}/{ckpt.STATE}", f"{STEP}/{ckpt.OPTIMIZER}"])
def test_checkpoint_readers_refuse_a_linked_run_file(finished, tmp_path, name):
    model = models.load(finished)
    link_out(finished / name, tmp_path)
    with pytest.raises(PathRefused, match="symbolic link"):
        if name == ckpt.CONFIG:
            ckpt.read_config(finished)
        elif name == ckpt.METRICS:
            ckpt.read_metrics(finished)
        else:
            from interp.training.train import make_optimizer

            ckpt.load_checkpoint(finished, model, make_optimizer(model, CFG))


@pytest.mark.parametrize("name", [ckpt.CONFIG, ckpt.POINTER, ckpt.METRICS])
def test_a_fifo_in_a_run_is_refused_not_waited_on(finished, name):
    (finished / name).unlink()
    os.mkfifo(finished / name)
    with deadline(20), pytest.raises(PathRefused, match="a FIFO, not a regular file"):
        ckpt.read_metrics(finished) if name == ckpt.METRICS else models.load(finished)


def test_eval_refuses_a_device_as_weights_in_one_line(finished, capsys):
    weights = finished / STEP / ckpt.MODEL
    weights.unlink()
    weights.symlink_to("/dev/zero")
    assert main(["eval", str(finished), "--lengths", "4", "--n", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.safetensors is a symbolic link (to '/dev/zero')" in err[0], err


def test_sweep_results_and_reproduce_cache_are_not_read_through_links(tmp_path):
    table = ResultTable(tmp_path / "sweep")
    secret = tmp_path / "secret.jsonl"
    secret.write_text('{"trial_id": "x", "value": 1}\n')
    table.path.symlink_to(secret)
    with pytest.raises(PathRefused, match="results.jsonl is a symbolic link"):
        table.rows()
    run = tmp_path / "run"
    run.mkdir()
    (run / engine.CACHE).symlink_to(secret)
    with pytest.raises(PathRefused, match="reproduce.json is a symbolic link"):
        engine._cached(types.SimpleNamespace(run_dir=run, committed=None), {"claim": "x"})


HOLD = """
import sys, time
from models.storage.paths import locked
with locked(sys.argv[1]):
    print("held", flush=True)
    time.sleep(60)
"""


@pytest.mark.parametrize("command", [["eval", "--lengths", "4", "--n", "4"],
                                     ["drift", "--lengths", "6,8", "--n", "4", "--n-fit", "8", "--n-drift", "4"]])
def test_eval_and_drift_refuse_a_run_another_process_writes(finished, command, capsys):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(finished)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main([command[0], str(finished), *command[1:]]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"is in use by process {holder.pid}" in err[0], err
        assert not (finished / f"{command[0]}.json").exists()
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("command", [["eval", "--lengths", "4", "--n", "4"],
                                     ["drift", "--lengths", "6,8", "--n", "4", "--n-fit", "8", "--n-drift", "4"]])
def test_eval_and_drift_hold_the_run_lock_while_writing(finished, command, monkeypatch):
    held = []
    write_json = ckpt.write_json

    def probing(path, data):
        fd = os.open(finished / LOCK, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # another open file: conflicts with the holder
            held.append(False)
        except BlockingIOError:
            held.append(True)
        finally:
            os.close(fd)
        write_json(path, data)

    monkeypatch.setattr(ckpt, "write_json", probing)
    assert main([command[0], str(finished), *command[1:]]) == 0
    assert held == [True] and (finished / f"{command[0]}.json").is_file()
