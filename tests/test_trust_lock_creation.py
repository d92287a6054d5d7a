"""Issue 38 item 8: the run lock is taken when the run directory is created. `interp train` used to
create the directory, then lock it, so an `interp eval` / `interp drift` started in that moment was
let in and wrote eval.json / drift.json into the run being created. Now the directory is built as
a hidden sibling holding its lock and renamed into place (models.storage.paths.locked(..., create=True)):
whenever it exists, it is locked. eval and drift also hold the lock for their own writes."""

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import models
from interp.tasks import make_task
from interp.training.train import TrainConfig, train
from models.storage.paths import LOCK, DirectoryLocked, locked
from test_trust_lock import Holder

ROOT = Path(__file__).resolve().parents[1]
MAIN = "import sys; from interp.cli import main; sys.exit(main(sys.argv[1:]))"


def held_elsewhere(directory: Path) -> bool:
    """Whether some open lock of `directory` is held: a new descriptor cannot take it (flock locks
    belong to open file descriptions, so this holds within one process too)."""
    try:
        fd = os.open(directory / LOCK, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def watch_creation(monkeypatch, directory: Path) -> list[bool]:
    """After every os.mkdir / os.rename that makes `directory` appear, record whether it is locked."""
    seen = []

    def watched(real):
        def call(*args, **kwargs):
            existed = os.path.lexists(directory)
            result = real(*args, **kwargs)
            if not existed and os.path.lexists(directory):
                seen.append(held_elsewhere(directory))
            return result
        return call

    monkeypatch.setattr(os, "mkdir", watched(os.mkdir))
    monkeypatch.setattr(os, "rename", watched(os.rename))
    return seen


def test_train_creates_its_run_directory_already_locked(tmp_path, monkeypatch):
    run_dir = tmp_path / "runs" / "new"
    seen = watch_creation(monkeypatch, run_dir)
    train(models.preset_config("tanh_rnn", vocab_size=2, d_model=8), make_task("C2"),
          TrainConfig(steps=2, batch_size=4, warmup=1, train_length=6, eval_every=2, eval_size=8, seed=1),
          run_dir, progress=False)
    assert seen == [True], "the run directory existed unlocked" if seen else "the run directory was never created"
    assert not held_elsewhere(run_dir)   # released when train returns
    assert sorted(p.name for p in run_dir.parent.iterdir()) == ["new"]   # no staging directory left


def test_locked_create_makes_parents_and_falls_back_when_another_creator_wins(tmp_path, monkeypatch):
    directory = tmp_path / "a" / "b" / "run"
    seen = watch_creation(monkeypatch, directory)
    with locked(directory, "run directory", create=True) as lock:
        assert lock == directory / LOCK and held_elsewhere(directory)
        assert int(lock.read_text()) == os.getpid()
    assert seen == [True] and not held_elsewhere(directory)

    raced = tmp_path / "raced"
    real_rename = os.rename

    def another_creator_first(source, target):   # a second creator's directory appears just before ours
        os.mkdir(raced)
        (raced / "config.json").write_text("{}")
        return real_rename(source, target)

    monkeypatch.setattr(os, "rename", another_creator_first)
    with locked(raced, "run directory", create=True):
        assert held_elsewhere(raced)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "raced"]   # our staging directory removed
    assert sorted(p.name for p in raced.iterdir()) == [LOCK, "config.json"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    task = make_task("C6", format="acot")
    out = tmp_path_factory.mktemp("runs") / "run"
    train(models.preset_config("token_gated_rnn", vocab_size=task.vocab_size, d_model=8), task,
          TrainConfig(steps=4, batch_size=8, train_length=12, warmup=1, eval_every=2, eval_size=8, seed=3),
          out, progress=False)
    return out


def test_eval_and_drift_hold_the_lock_for_their_own_writes(finished_run):
    from interp.cli.drift import drift_run
    from interp.cli.eval import evaluate_run

    before = sorted(p.name for p in finished_run.iterdir())
    holder = Holder(finished_run)
    try:
        with pytest.raises(DirectoryLocked, match=f"in use by process {holder.pid}"):
            evaluate_run(finished_run, [12], n=8)
        with pytest.raises(DirectoryLocked, match=f"in use by process {holder.pid}"):
            drift_run(finished_run, [12, 20], n_fit=8, n_drift=4, n_eval=4)
    finally:
        holder.release()
    assert sorted(p.name for p in finished_run.iterdir()) == before   # no eval.json, drift.json, drift.html


def cli(*argv, **kwargs):
    """`interp ARGV` in a new process (as the console script runs it)."""
    return subprocess.Popen([sys.executable, "-c", MAIN, *map(str, argv)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, **kwargs)


def test_eval_and_drift_started_while_train_runs_are_refused_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    trainer = cli("train", "--model", "tanh_rnn", "--task", "C2", "--train-length", "6", "--steps", "1000000",
                  "--batch-size", "4", "--eval-every", "1000000", "--checkpoint-every", "1000000", "--no-progress",
                  "--out", run_dir)
    try:
        deadline = time.monotonic() + 300
        while not run_dir.exists():   # from the moment it exists it must be locked
            assert trainer.poll() is None and time.monotonic() < deadline, trainer.communicate()
            time.sleep(0.01)
        for command in ("eval", "drift"):
            done = cli(command, run_dir)
            out, err = done.communicate(timeout=300)
            assert done.returncode == 2 and out == "", (command, out, err)
            assert err.count("\n") == 1 and err.startswith(f"interp {command}: error: run directory"), err
            assert f"is in use by process {trainer.pid}" in err, err
        assert trainer.poll() is None, "train stopped before the checks ran"
    finally:
        trainer.kill()
        trainer.communicate()
    assert not {"eval.json", "drift.json", "drift.html"} & {p.name for p in run_dir.iterdir()}
