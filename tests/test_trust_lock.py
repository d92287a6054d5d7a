"""One writer per run or sweep directory: while one process trains into (or sweeps into) a
directory, a second one is refused at once with one line naming the holder's pid, touches nothing,
and succeeds once the holder is gone (before: two resumes interleaved metrics.jsonl and left a run
that refused every later resume; two sweeps on one --out duplicated rows)."""

import os
import time

import pytest

import models
import sweep_trials
from interp.cli import main
from interp.sweep.executors import LocalExecutor
from interp.sweep.run import Sweep
from interp.tasks import make_task
from interp.training import checkpoint as ckpt
from interp.training.train import TrainConfig, train
from models.storage.paths import LOCK, DirectoryLocked, locked

MODEL = models.preset_config("tanh_rnn", vocab_size=2, d_model=8)


def config(steps):
    return TrainConfig(steps=steps, batch_size=4, lr=1e-2, warmup=1, train_length=6, eval_every=2, eval_size=8,
                       log_every=1, checkpoint_every=2, seed=5)


def run(out, steps=4, resume=False):
    return train(MODEL, make_task("C2", format="acot"), config(steps), out, resume=resume, progress=False)


class Holder:
    """A forked process that holds `directory`'s lock until released (or killed)."""

    def __init__(self, directory):
        ready_r, ready_w = os.pipe()
        self.go_r, self.go_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:   # the child: take the lock, say so, wait for the word, exit
            status = 0
            try:
                os.close(ready_r)
                with locked(directory, "test"):
                    os.write(ready_w, b"1")
                    os.read(self.go_r, 1)
            except BaseException:  # noqa: BLE001
                status = 3
            os._exit(status)
        os.close(ready_w)
        assert os.read(ready_r, 1) == b"1"
        os.close(ready_r)

    def release(self):
        os.write(self.go_w, b"1")
        _, status = os.waitpid(self.pid, 0)
        assert os.WEXITSTATUS(status) == 0


def listing(directory):
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_a_second_resume_is_refused_while_the_run_is_locked(tmp_path, capsys):
    out = tmp_path / "run"
    run(out)
    before = listing(out)
    holder = Holder(out)
    try:
        with pytest.raises(DirectoryLocked, match=rf"run directory .* is in use by process {holder.pid}\b"):
            run(out, steps=6, resume=True)
        argv = ["train", "--model", "tanh_rnn", "--task", "C2", "--steps", "6", "--out", str(out), "--resume",
                "--no-progress", "--train-length", "6", "--batch-size", "4"]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"in use by process {holder.pid}" in err[0], err
        after = listing(out)
        after.pop(LOCK), before.pop(LOCK)
        assert after == before                              # nothing written, truncated or deleted
    finally:
        holder.release()
    result = run(out, steps=6, resume=True)                 # the holder is gone: the resume goes on
    assert result.step == 6 and [r["step"] for r in ckpt.read_metrics(out) if r["kind"] == "train"] == list(range(1, 7))


def test_the_lock_goes_with_a_killed_holder(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    holder = Holder(out)
    os.kill(holder.pid, 9)
    os.waitpid(holder.pid, 0)
    with locked(out, "run directory") as path:
        assert path.read_text().strip() == str(os.getpid())


def test_two_real_resumes_at_once_one_wins_and_the_run_stays_resumable(tmp_path):
    out = tmp_path / "run"
    run(out)
    pids = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            status = 0
            try:
                run(out, steps=40, resume=True)
            except DirectoryLocked:
                status = 5
            except BaseException:  # noqa: BLE001
                status = 3
            os._exit(status)
        pids.append(pid)
        time.sleep(0.05)
    statuses = sorted(os.WEXITSTATUS(os.waitpid(pid, 0)[1]) for pid in pids)
    assert statuses in ([0, 5], [0, 0]), statuses           # [0, 0]: the first finished before the second began
    result = run(out, steps=40, resume=True)
    records = [r["step"] for r in ckpt.read_metrics(out) if r["kind"] == "train"]
    assert result.step == 40 and records == list(range(1, 41))   # no interleaved or repeated records


def test_a_second_sweep_on_the_same_directory_is_refused(tmp_path):
    out = tmp_path / "sweep"
    out.mkdir()
    holder = Holder(out)
    executor = LocalExecutor(workers=1)
    try:
        with pytest.raises(DirectoryLocked, match=rf"sweep directory .* in use by process {holder.pid}\b"):
            Sweep(out, executor, sweep_trials.square, progress=False)([{"x": 1}])
        assert not (out / "results.jsonl").exists() and not (out / "runs").exists()
    finally:
        holder.release()
        executor.close()
    executor = LocalExecutor(workers=1)
    try:
        rows = Sweep(out, executor, sweep_trials.square, progress=False)([{"x": 3}])
    finally:
        executor.close()
    assert [r["value"] for r in rows] == [9]


def test_the_lock_is_reentrant_within_a_process(tmp_path):
    with locked(tmp_path, "sweep directory"):
        with locked(tmp_path, "sweep directory"):
            pass
        holder_refused = os.fork()
        if holder_refused == 0:   # another process is refused while this one still holds it
            try:
                with locked(tmp_path):
                    os._exit(1)
            except DirectoryLocked:
                os._exit(0)
        assert os.WEXITSTATUS(os.waitpid(holder_refused, 0)[1]) == 0


def test_demo_on_a_locked_run_is_one_line(tmp_path, capsys):
    from interp.cli.demo import plan

    first = tmp_path / "demo" / next(iter(plan(quick=True).models))
    first.mkdir(parents=True)
    holder = Holder(first)
    try:
        assert main(["demo", "--quick", "--out", str(tmp_path / "demo"), "--no-progress"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"in use by process {holder.pid}" in err[0], err
    finally:
        holder.release()
