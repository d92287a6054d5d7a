"""Fault injection: a training run killed at any point resumes to the uninterrupted run's result.

The run (tanh RNN, C2 with a length curriculum, 4 steps, a checkpoint every 2 steps, so a first
checkpoint and a second that replaces it) is forked into a child process that dies with os._exit
just before its k-th write boundary, for every k in turn. Boundaries: each file write (every one
goes through models.storage.writer.write_file: config.json, the three files of each checkpoint and the
pointer; and a torn write: the temporary file half written, then death), each os.fsync /
os.replace / os.rename / os.mkdir / os.rmdir / os.unlink, so the creation of the run directory (made
locked, then renamed into place), of config.json, the fsync of metrics.jsonl, the step directory,
the pointer switch and the removal of the previous checkpoint are all among them. The
run is then resumed in the parent, and its final weights, optimizer tensors, metrics.jsonl records
(less wall-clock times) and directory listing must equal the uninterrupted run's exactly.
Crash points tried: 79 (70 boundaries + 9 torn writes); all resume exactly. A crash while
config.json was first written used to leave a directory that refused both a fresh start and a
resume (found by this harness, fixed). A second test SIGKILLs a 10-step run with a checkpoint
every step at a random time (3 seeds).
"""

import os
import random
import signal
import time

import pytest
import torch

import models
from interp.tasks import make_task
from interp.training import checkpoint as ckpt
from interp.training.train import TrainConfig, train
from models.storage import writer

BOUNDARY_OPS = ("fsync", "replace", "rename", "mkdir", "rmdir", "unlink")


POINTS = 79  # crash points tried (the module docstring reports them)


def config(**overrides):
    base = dict(steps=4, batch_size=4, lr=1e-2, warmup=1, train_length=6, curriculum=True,
                curriculum_patience=1, curriculum_threshold=0.5, eval_every=2, eval_size=8, log_every=1,
                checkpoint_every=2, seed=5)
    return TrainConfig(**{**base, **overrides})


MODEL = models.preset_config("tanh_rnn", vocab_size=2, d_model=8)


def run(out, cfg, resume=False):
    return train(MODEL, make_task("C2", format="acot"), cfg, out, resume=resume, progress=False)


def in_child(body) -> int:
    """Run body() in a forked child that always ends with os._exit; returns its exit status."""
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        status = 0
        try:
            body()
        except BaseException:  # noqa: BLE001 - any failure is the child's status
            status = 3
        os._exit(status)
    _, status = os.waitpid(pid, 0)
    return status


def crash_at(k: int | None, torn: bool, kinds: list[str]):
    """Patch the boundaries in this (child) process: die just before the k-th one (torn: the k-th
    is a file write; write half of it, then die). kinds collects each boundary's name."""

    def boundary(kind: str) -> None:
        kinds.append(kind)
        if len(kinds) == k and not torn:
            os._exit(17)

    for name in BOUNDARY_OPS:
        real = getattr(os, name)

        def op(*args, _real=real, _name=name, **kwargs):
            boundary(_name)
            return _real(*args, **kwargs)

        setattr(os, name, op)
    real_write_file = writer.write_file

    def write_file(path, fill, durable=True):
        boundary("write")
        if torn and len(kinds) == k:   # the temporary file half written, then death
            def torn_fill(tmp):
                fill(tmp)
                with open(tmp, "r+b") as handle:
                    handle.truncate(os.fstat(handle.fileno()).st_size // 2)
                os._exit(17)

            return real_write_file(path, torn_fill, durable)
        return real_write_file(path, fill, durable)

    writer.write_file = write_file


def snapshot(run_dir):
    directory = ckpt.checkpoint_dir(run_dir)
    weights = models.load(run_dir).state_dict()
    optimizer = ckpt.load_file(str(directory / ckpt.OPTIMIZER))
    records = [{k: v for k, v in r.items() if k != "time"} for r in ckpt.read_metrics(run_dir)]
    listing = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*"))
    return weights, optimizer, records, listing


def assert_same(a, b, what):
    for name, (x, y) in zip(("weights", "optimizer"), ((a[0], b[0]), (a[1], b[1]))):
        assert x.keys() == y.keys(), (what, name)
        for key in x:
            assert torch.equal(x[key], y[key]), (what, name, key)
    assert a[2] == b[2], (what, "metrics")
    assert a[3] == b[3], (what, "listing")


def test_every_write_boundary_of_a_run_resumes_bit_identically(tmp_path):
    cfg = config()
    reference = tmp_path / "reference"
    run(reference, cfg)
    expected = snapshot(reference)
    counted = tmp_path / "counted"
    total = tmp_path / "total"

    def count():
        kinds = []
        crash_at(None, False, kinds)
        run(counted, cfg)
        total.write_text(" ".join(kinds))

    assert in_child(count) == 0
    kinds = total.read_text().split()
    assert_same(snapshot(counted), expected, "child without a crash")
    points = [(k, False) for k in range(1, len(kinds) + 1)]
    points += [(k, True) for k, kind in enumerate(kinds, start=1) if kind == "write"]
    for k, torn in points:
        out = tmp_path / f"crash-{k}-{int(torn)}"
        status = in_child(lambda: (crash_at(k, torn, []), run(out, cfg)))
        assert os.WEXITSTATUS(status) == 17, (k, torn, status)
        if not (out / ckpt.CONFIG).exists():
            run(out, cfg)  # died before config.json existed: a fresh start
        else:
            run(out, cfg, resume=True)
        assert_same(snapshot(out), expected, f"crash before boundary {k}{' (torn write)' if torn else ''}")
    assert (len(points), kinds.count("write"), kinds.count("replace"), kinds.count("rename")) == (POINTS, 9, 9, 1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sigkill_at_a_random_time_resumes_bit_identically(tmp_path, seed):
    cfg = config(steps=10, checkpoint_every=1)
    reference = tmp_path / "reference"
    started = time.perf_counter()
    run(reference, cfg)
    duration = time.perf_counter() - started
    out = tmp_path / "killed"
    pid = os.fork()
    if pid == 0:
        try:
            run(out, cfg)
        finally:
            os._exit(0)
    time.sleep(random.Random(seed).uniform(0.0, duration))
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    run(out, cfg, resume=(out / ckpt.CONFIG).exists())
    assert_same(snapshot(out), snapshot(reference), f"SIGKILL seed {seed}")
