"""Sweeps on the local executor: the table, resume after a kill, retries of dead workers, failures
listed, bad specs named, and the CLI."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import sweep_trials
from interp.cli import main
from interp.sweep.executors import LocalExecutor, make_executor
from interp.sweep.run import Sweep, TrialsFailed, run_spec
from interp.sweep.spec import load_spec
from interp.sweep.table import TIMING_COLUMNS, ResultTable, trial_id

ROOT = Path(__file__).resolve().parents[1]


def grid(trial="sweep_trials:square", xs=range(6), **extra):
    return {"kind": "grid", "trial": trial, "grid": {"x": list(xs), **extra}}


def calls(out, key):
    path = Path(out) / "runs" / key / "calls"
    return len(path.read_text().splitlines()) if path.exists() else 0


def stable(rows):
    return sorted(({k: v for k, v in r.items() if k not in TIMING_COLUMNS} for r in rows), key=lambda r: r["trial_id"])


def test_local_grid_gives_one_row_per_trial_and_resume_skips_them(tmp_path):
    spec = load_spec(grid(offset=[0, 10]))
    executor = LocalExecutor(workers=2)
    try:
        outcome = run_spec(spec, executor, tmp_path, progress=False)
        assert len(outcome.rows) == 12 and not outcome.failures
        assert sorted(r["value"] for r in outcome.rows) == sorted(x * x + o for x in range(6) for o in (0, 10))
        for row in outcome.rows:
            params = {"x": row["x"], "offset": row["offset"]}
            assert row["trial_id"] == trial_id(params) and calls(tmp_path, row["trial_id"]) == 1
        again = run_spec(spec, executor, tmp_path, progress=False)   # everything is finished: nothing runs
    finally:
        executor.close()
    assert stable(again.rows) == stable(outcome.rows)
    assert all(calls(tmp_path, r["trial_id"]) == 1 for r in again.rows)
    frame = ResultTable(tmp_path).frame()
    assert list(frame["trial_id"]) == sorted(frame["trial_id"]) and len(frame) == 12


def test_a_trial_that_kills_its_worker_is_retried_and_nothing_is_lost(tmp_path):
    spec = {"x": list(range(5))}
    trials = [{"x": x, "die": x == 2} for x in spec["x"]]
    executor = LocalExecutor(workers=2, max_retries=1)
    try:
        sweep = Sweep(tmp_path, executor, sweep_trials.dies_once, progress=False)
        rows = sweep(trials)
    finally:
        executor.close()
    assert [r["x"] for r in rows] == [0, 1, 2, 3, 4] and not sweep.failures
    died = next(r for r in rows if r["x"] == 2)
    assert (tmp_path / "runs" / died["trial_id"] / "died").exists() and died["attempts"] == 2
    assert all(calls(tmp_path, r["trial_id"]) <= r["attempts"] for r in rows)   # a start per call, no more


def test_a_trial_that_always_dies_fails_alone_after_max_retries(tmp_path):
    trials = [{"x": x, "die": x == 1} for x in range(4)]
    executor = LocalExecutor(workers=2, max_retries=1)
    try:
        sweep = Sweep(tmp_path, executor, sweep_trials.always_dies, progress=False)
        rows = sweep(trials)
    finally:
        executor.close()
    assert sorted(r["x"] for r in rows) == [0, 2, 3]
    [failure] = sweep.failures
    assert failure["params"]["x"] == 1 and "worker died 2 times" in failure["error"] and failure["attempts"] >= 2
    assert json.loads((tmp_path / "failures.jsonl").read_text())["trial_id"] == failure["trial_id"]


def test_exceptions_are_listed_not_retried_and_rerun_later(tmp_path):
    trials = [{"x": x, "bad": x == 3} for x in range(4)]
    executor = LocalExecutor(workers=1)
    try:
        sweep = Sweep(tmp_path, executor, sweep_trials.raises, progress=False)
        rows = sweep(trials)
        [failure] = sweep.failures
        assert "RuntimeError: trial 3 is broken on purpose" in failure["error"] and failure["attempts"] == 1
        assert len(rows) == 3
        with pytest.raises(TrialsFailed, match="broken on purpose"):
            Sweep(tmp_path, executor, sweep_trials.raises, progress=False, raise_on_failure=True)(trials)
    finally:
        executor.close()
    assert calls(tmp_path, trial_id(trials[3])) == 2                     # failed trials run again
    assert all(calls(tmp_path, trial_id(t)) == 1 for t in trials[:3])   # finished ones do not


def test_a_killed_sweep_resumes_to_the_uninterrupted_table(tmp_path):
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(grid("sweep_trials:slow_square", range(6), sleep=[0.3])))
    whole, split = tmp_path / "whole", tmp_path / "split"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    command = [sys.executable, "-c", "import sys; from interp.cli import main; sys.exit(main(sys.argv[1:]))",
               "sweep", str(spec_path), "--workers", "1", "--no-progress", "--out"]
    executor = LocalExecutor(workers=1)
    try:
        run_spec(load_spec(spec_path), executor, whole, progress=False)
    finally:
        executor.close()
    process = subprocess.Popen(command + [str(split)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    deadline = time.time() + 120
    while len(ResultTable(split).rows()) < 3 and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    done_before = set(ResultTable(split).rows())
    assert 3 <= len(done_before) < 6
    subprocess.run(command + [str(split)], env=env, check=True, capture_output=True)
    assert stable(ResultTable(split).rows().values()) == stable(ResultTable(whole).rows().values())
    assert all(calls(split, key) == 1 for key in done_before)           # finished trials were skipped


def test_a_torn_last_line_is_ignored(tmp_path):
    table = ResultTable(tmp_path)
    table.append({"trial_id": "a", "v": 1})
    with open(table.path, "a") as handle:
        handle.write('{"trial_id": "b", "v"')                             # a writer killed mid-line
    with pytest.warns(UserWarning, match="skipped 1 torn line"):
        assert set(table.rows()) == {"a"}
    table.append({"trial_id": "c", "v": 3})
    with pytest.warns(UserWarning, match="skipped 1 torn line"):
        assert set(table.rows()) == {"a", "c"}


@pytest.mark.parametrize("change,message", [
    ({"grid": {"model": ["lstmm"]}}, r"spec.grid.model: unknown model 'lstmm'"),
    ({"grid": {"task": ["Q7"]}}, r"spec.grid.task: unknown task 'Q7'"),
    ({"grid": {"task": ["AR"]}}, r"spec.grid.task: task 'AR' is not a group word problem"),
    ({"grid": {"format": ["cott"]}}, r"spec.grid.format: unknown format 'cott'.*did you mean 'cot'"),
    ({"grid": {"n": []}}, r"spec.grid.n is empty"),
    ({"grid": {"n": [0, 4]}}, r"spec.grid.n: 0 is not allowed; expected positive ints \(N > 0\)"),
    ({"grid": {"length": ["joint"]}, "max_length": None}, r"spec.max_length is needed"),
    ({"train": {"val_threshold": 0}}, r"spec.train.val_threshold must be a positive number; got 0"),
    ({"train": {"val_threshold": -0.5}}, r"spec.train.val_threshold must be a positive number"),
    ({"train": {"stepz": 10}}, r"spec.train: unknown field 'stepz'.*did you mean 'steps'"),
    ({"train": {"batch_size": 0}}, r"spec.train: TrainConfig.batch_size must be a positive int"),
    ({"grid": None}, r"spec.grid must be a non-empty mapping"),
    ({"kind": "gird"}, r"spec.kind must be one of grid, n_star; got 'gird'"),
    ({"trial": "nowhere:fn"}, r"spec.trial 'nowhere:fn' cannot be imported"),
    ({"model_options": {"lstm": {"d_modle": 3}}}, r"spec.model_options.lstm: unknown config overrides"),
])
def test_bad_grid_specs_name_the_field(change, message):
    spec = {"kind": "grid", "grid": {"model": ["lstm"], "task": ["Z5"], "format": ["acot"], "length": [3],
                                     "n": [16], "lr": [1e-3], "seed": [0]}, "max_length": 4}
    for key, value in change.items():
        if key == "grid" and isinstance(value, dict):
            spec["grid"] = {**spec["grid"], **value}
        elif value is None and key != "grid":
            spec.pop(key)
        else:
            spec[key] = value
    with pytest.raises(ValueError, match=message):
        load_spec(spec)


@pytest.mark.parametrize("change,message", [
    ({"models": ["lstm", "gpt9"]}, r"spec.models: unknown model 'gpt9'"),
    ({"tasks": []}, r"spec.tasks is empty"),
    ({"formats": ["aligned"]}, r"spec.formats: unknown format 'aligned'"),
    ({"search": {"n0": 0}}, r"spec.search: n0 must be a positive int; got 0"),
    ({"search": {"n_max": -4}}, r"spec.search: n_max must be a positive int"),
    ({"lrs": [0.0]}, r"spec.lrs: 0.0 is not allowed"),
    ({"max_length": 1}, r"spec.max_length \(1\) must be >= spec.min_length \(2\)"),
    ({"train": {"val_threshold": 0.0}}, r"spec.train.val_threshold must be a positive number"),
])
def test_bad_n_star_specs_name_the_field(change, message):
    spec = {"kind": "n_star", "models": ["lstm"], "tasks": ["Z5"], "formats": ["acot"], "max_length": 3,
            "lrs": [1e-3], "seeds": [0], **change}
    with pytest.raises(ValueError, match=message):
        load_spec(spec)


def test_spec_files_json_yaml_and_python_agree(tmp_path):
    data = {"kind": "n_star", "models": ["lstm"], "tasks": ["S5"], "formats": ["cot"], "max_length": 3,
            "lrs": [0.001], "seeds": [0, 1], "search": {"n0": 8}}
    (tmp_path / "s.json").write_text(json.dumps(data))
    (tmp_path / "s.yaml").write_text("kind: n_star\nmodels: [lstm]\ntasks: [S5]\nformats: [cot]\nmax_length: 3\n"
                                     "lrs: [0.001]\nseeds: [0, 1]\nsearch: {n0: 8}\n")
    (tmp_path / "s.py").write_text(f"SPEC = {data!r}\n")
    loaded = [load_spec(tmp_path / f"s.{suffix}") for suffix in ("json", "yaml", "py")]
    assert all(spec.data == data for spec in loaded)
    assert [c["length"] for c in loaded[0].conditions()] == [2, 3, "joint"] and len(loaded[0].configs()) == 2
    with pytest.raises(ValueError, match="allowed suffixes"):
        (tmp_path / "s.txt").write_text("{}")
        load_spec(tmp_path / "s.txt")


def test_grid_trials_of_the_default_trial_carry_the_condition():
    spec = load_spec({"kind": "grid", "max_length": 4, "train": {"steps": 50},
                      "model_options": {"transformer": {"n_layers": 6}},
                      "grid": {"model": ["transformer"], "task": ["Z5"], "format": ["cot"], "length": [3, "joint"],
                               "n": [32, 64], "lr": [1e-3], "seed": [0]}})
    trials = spec.trials()
    assert len(trials) == 4 and {t["n"] for t in trials} == {32, 64}
    joint = next(t for t in trials if t["length"] == "joint")
    assert joint["lengths"] == [2, 3, 4] and joint["ood_lengths"] == [8, 16] and joint["steps"] == 50
    assert joint["model_options"] == {"n_layers": 6}


def test_cli_sweep_runs_lists_failures_and_rejects_bad_specs(tmp_path, capsys):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(grid("sweep_trials:raises", range(3), bad=[False])))
    assert main(["sweep", str(good), "--out", str(tmp_path / "a"), "--workers", "1", "--no-progress"]) == 0
    assert "3 trial rows" in capsys.readouterr().out
    bad_trial = tmp_path / "bad_trial.json"
    bad_trial.write_text(json.dumps(grid("sweep_trials:raises", range(2), bad=[True])))
    assert main(["sweep", str(bad_trial), "--out", str(tmp_path / "b"), "--no-progress"]) == 1
    assert "2 trial(s) failed" in capsys.readouterr().out
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"kind": "grid", "grid": {"x": []}, "trial": "sweep_trials:square"}))
    assert main(["sweep", str(broken), "--out", str(tmp_path / "c")]) == 2
    assert "spec.grid.x is empty" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    assert "--executor" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["sample-efficiency", "--help"])
    assert "--max-length" in capsys.readouterr().out
    assert main(["sample-efficiency", "--max-length", "4", "--models", "lstmm", "--out", str(tmp_path / "d")]) == 2
    assert "spec.models: unknown model 'lstmm'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="executor must be one of local, ray"):
        make_executor("dask")


def test_cli_runs_an_n_star_spec_to_kappa_and_the_report(tmp_path, capsys):
    spec = tmp_path / "study.json"
    spec.write_text(json.dumps({"kind": "n_star", "trial": "sweep_trials:n_star_fake", "models": ["lstm"],
                                "tasks": ["S5"], "formats": ["acot"], "max_length": 3, "lrs": [0.01],
                                "seeds": [0, 1], "search": {"n0": 4, "resolution": 0}}))
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "--out", str(out), "--workers", "2", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    [kappa] = [json.loads(line) for line in (out / "kappa.jsonl").read_text().splitlines()]
    assert kappa["kappa"] == pytest.approx((20 + 30) / 15) and kappa["ood_acc_6"] == pytest.approx(0.9)
    assert "kappa 3.33" in printed and (out / "report.html").is_file()
    n_stars = {json.loads(line)["length"]: json.loads(line)["n_star"] for line in (out / "n_star.jsonl").read_text().splitlines()}
    assert n_stars == {2: 20, 3: 30, "joint": 15}
    rows = len(ResultTable(out).rows())
    assert main(["sweep", str(spec), "--out", str(out), "--no-progress", "--no-report"]) == 0   # resumed: no new trial
    assert len(ResultTable(out).rows()) == rows
