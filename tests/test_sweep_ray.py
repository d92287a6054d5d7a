"""Sweeps on Ray (a local 2-CPU cluster, started once for the module): the same rows as the local
executor, bit for bit, and a trial that kills its worker is retried by Ray."""

import pytest

ray = pytest.importorskip("ray")

import sweep_trials  # noqa: E402
from interp.analysis import sample_efficiency as se  # noqa: E402
from interp.sweep.executors import LocalExecutor, make_executor  # noqa: E402
from interp.sweep.run import Sweep  # noqa: E402
from interp.sweep.table import TIMING_COLUMNS  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    executor = make_executor("ray", workers=2, max_retries=2)
    executor._connect()
    yield executor
    executor.close()


def stable(rows):
    return [{k: v for k, v in r.items() if k not in TIMING_COLUMNS} for r in rows]


def tiny_trials():
    conditions = se.conditions(["lstm"], ["Z3"], ["acot"], 3, model_options={"lstm": {"d_model": 8}},
                               train={"steps": 10, "batch_size": 8, "val_size": 8, "eval_every": 5})
    return [{**c, "n": 12, "lr": 1e-2, "seed": 1} for c in conditions if c["length"] in (3, "joint")]


def test_local_and_ray_give_identical_rows(tmp_path, cluster):
    trials = tiny_trials()
    local = LocalExecutor(workers=1)
    try:
        local_rows = Sweep(tmp_path / "local", local, se.train_trial, progress=False)(trials)
    finally:
        local.close()
    ray_sweep = Sweep(tmp_path / "ray", cluster, se.train_trial, progress=False)
    ray_rows = ray_sweep(trials)
    assert not ray_sweep.failures and len(ray_rows) == len(trials) == 2
    assert stable(ray_rows) == stable(local_rows)            # val losses, OOD accuracies: the same bits
    assert {"ood_acc_6", "val_loss"} <= set(ray_rows[1]) and ray_rows[0]["val_loss"] != ray_rows[1]["val_loss"]


def test_ray_retries_a_trial_that_kills_its_worker(tmp_path, cluster):
    trials = [{"x": x, "die": x == 1} for x in range(3)]
    sweep = Sweep(tmp_path, cluster, sweep_trials.dies_once, progress=False)
    rows = sweep(trials)
    assert [r["x"] for r in rows] == [0, 1, 2] and not sweep.failures
    assert rows[1]["value"] == 1 and (tmp_path / "runs" / rows[1]["trial_id"] / "died").exists()


def test_ray_reports_trial_exceptions_and_deaths_past_max_retries(tmp_path, cluster):
    sweep = Sweep(tmp_path, cluster, sweep_trials.raises, progress=False)
    rows = sweep([{"x": 0}, {"x": 1, "bad": True}])
    [failure] = sweep.failures
    assert len(rows) == 1 and "broken on purpose" in failure["error"]
    dying = Sweep(tmp_path / "dying", cluster, sweep_trials.always_dies, progress=False)
    assert dying([{"x": 5, "die": True}]) == []
    assert "WorkerCrashedError" in dying.failures[0]["error"] or "died" in dying.failures[0]["error"]
