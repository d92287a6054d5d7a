"""One analysis over many runs on an executor (interp.sweep.runs; `interp eval|drift|heads RUN [RUN ...]
--executor local|ray`), and `interp reproduce --executor`: each run's result file equals, byte for
byte, what the single-run command writes in a process with one torch thread (the workers' count); a
failing run is reported without stopping the others; a reproduction trained on workers gives the
claims of an in-process one."""

import json
import os
import shutil
import time

import pytest
import torch

import models
from interp.cli import main
from interp.cli.drift import drift_job
from interp.cli.eval import eval_job
from interp.cli.heads import heads_job
from interp.reproduce import claim_module, engine, reproduce
from interp.sweep.executors import LocalExecutor, make_executor
from interp.sweep.runs import RunResult, error_line, run_each
from interp.tasks import make_task
from interp.training.train import TrainConfig, train

EVAL = dict(lengths=[4, 8], n=8, seed=1, threshold=0.9, device="cpu")
DRIFT = dict(lengths=[6, 8], n_fit=8, n_drift=4, n_eval=4, device="cpu")
HEADS = dict(n=4, length=None, seed=1, impl=None, device="cpu")
RESULT_FILES = ("eval.json", "drift.json", "drift.html", "heads.html")


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The in-process side of every comparison runs with the workers' one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """Three tiny trained runs: tanh RNNs on S3 (seeds 0, 1) and a DeltaNet on REPL (for heads)."""
    root = tmp_path_factory.mktemp("runs")
    for name, preset, task_name, seed in (("s3-a", "tanh_rnn", "S3", 0), ("s3-b", "tanh_rnn", "S3", 1),
                                          ("repl", "deltanet", "REPL", 0)):
        task = make_task(task_name)
        cfg = TrainConfig(steps=4, batch_size=4, warmup=0, train_length=4, eval_size=4, seed=seed)
        train(models.preset_config(preset, vocab_size=task.vocab_size, d_model=8), task, cfg, root / name,
              progress=False)
    return root


@pytest.fixture
def runs(pristine, tmp_path):
    shutil.copytree(pristine, tmp_path / "runs")
    return tmp_path / "runs"


@pytest.fixture(scope="module")
def local():
    executor = LocalExecutor(workers=2)
    yield executor
    executor.close()


def same(x, y) -> bool:
    """Equal values, NaN equal to NaN (a NaN that crossed a process is another object): their JSON
    texts, which write every float exactly (repr)."""
    return json.dumps(x, sort_keys=True) == json.dumps(y, sort_keys=True)


def written(run_dir):
    return {name: (run_dir / name).read_bytes() for name in RESULT_FILES if (run_dir / name).exists()}


def test_local_executor_writes_what_one_process_writes_and_a_failure_stops_nothing(runs, local, tmp_path):
    a, b, repl = runs / "s3-a", runs / "s3-b", runs / "repl"
    here = {}
    for work, params, dirs in ((eval_job, EVAL, (a, b)), (drift_job, DRIFT, (a, b)), (heads_job, HEADS, (repl,))):
        rows = run_each(work, dirs, None, **params)
        assert all(r.ok for r in rows), [r.traceback for r in rows]
        here[work.__name__] = [r.row for r in rows]
    before = {d: written(d) for d in (a, b, repl)}
    for d in (a, b, repl):
        for name in RESULT_FILES:
            (d / name).unlink(missing_ok=True)
    missing = tmp_path / "no-run"
    for work, params, dirs in ((eval_job, EVAL, (a, missing, b)), (drift_job, DRIFT, (a, b)),
                               (heads_job, HEADS, (a, repl))):
        results = run_each(work, dirs, local, **params)
        assert [r.run_dir for r in results] == [str(d) for d in dirs]   # in the order given
        good = [r for r in results if r.ok]
        assert same([r.row for r in good], here[work.__name__]), work.__name__   # the same numbers, bit for bit
        bad = [r for r in results if not r.ok]
        if work is eval_job:
            assert [r.run_dir for r in bad] == [str(missing)] and "config.json does not exist" in bad[0].error
            assert "\n" not in bad[0].error and "Traceback" in bad[0].traceback
        if work is heads_job:   # heads of a tanh RNN on S3: refused as the single-run command refuses it
            assert [r.run_dir for r in bad] == [str(a)] and "interp heads needs a DeltaNet run" in bad[0].error
    assert {d: written(d) for d in (a, b, repl)} == before               # eval.json, drift.json / .html, heads.html
    assert not missing.exists()


def test_the_cli_over_several_runs_prints_each_and_keeps_one_run_as_it_was(runs, capsys):
    a, b = runs / "s3-a", runs / "s3-b"
    argv = ["--lengths", "4,8", "--n", "8"]
    assert main(["eval", str(a), *argv]) == 0
    single = capsys.readouterr().out
    assert not single.startswith("==") and single.rstrip().endswith(f"wrote {a / 'eval.json'}")
    one = (a / "eval.json").read_bytes()
    assert main(["eval", str(a), str(b), *argv, "--executor", "local", "--workers", "1"]) == 0
    several = capsys.readouterr().out
    assert (a / "eval.json").read_bytes() == one
    assert several.startswith(f"== {a}\n") and f"== {b}\n" in several
    assert several.split(f"== {b}\n")[0].removeprefix(f"== {a}\n") == single   # each run's block as for one run
    # a bad run among several: one error line naming it, the others written, exit status 2
    (b / "eval.json").unlink()
    (b / "config.json").write_text("{}")
    assert main(["eval", str(a), str(b), *argv]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith(f"interp eval: error: {b}: ") and "'task'" in err
    assert f"== {a}" in out and not (b / "eval.json").exists()


@pytest.mark.parametrize("argv,expected", [
    (["eval", "{a}", "{a}"], "names the run directory '{a}' again"),
    (["eval", "{a}", "{missing}"], "argument run_dir: '{missing}' does not exist"),
    (["drift", "{a}", "{b}", "--out", "{out}"], "argument --out: names one report, but 2 run directories"),
    (["heads", "{a}", "--workers", "2"], "argument --workers: needs --executor local or ray"),
    (["drift", "{a}", "--executor", "local", "--address", "auto"], "argument --address: only --executor ray"),
])
def test_several_runs_refused_up_front_in_one_line(runs, tmp_path, capsys, argv, expected):
    names = dict(a=runs / "s3-a", b=runs / "s3-b", missing=tmp_path / "missing", out=tmp_path / "r.html")
    assert main([part.format(**names) for part in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected.format(**names) in err[0], err
    assert not (runs / "s3-a" / "eval.json").exists() and not (runs / "s3-a" / "drift.json").exists()


def test_error_line_drops_the_type_of_user_errors_only():
    assert error_line("Traceback ...\n  File x\nValueError: argument --n: too big\n") == "argument --n: too big"
    assert error_line("models.storage.paths.DirectoryLocked: in use by process 7") == "in use by process 7"
    assert error_line("Traceback\nZeroDivisionError: division by zero") == "ZeroDivisionError: division by zero"
    assert error_line("KeyError: 'task'").startswith("an entry 'task' is missing")
    assert RunResult("r", {"x": 1}).ok and not RunResult("r", None, "e").ok
    with pytest.raises(ValueError, match="at least one run directory"):
        run_each(eval_job, [])


def stable(claims: dict) -> dict:
    """claims.json without its timings (wall seconds of the whole run and of each run's training)."""
    return {**{k: v for k, v in claims.items() if k != "seconds"},
            "runs": [{k: v for k, v in row.items() if k != "train s"} for row in claims["runs"]]}


def weights(out):
    return {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("runs/*/checkpoints/*/model.safetensors"))}


def test_reproduce_on_the_local_executor_gives_the_in_process_claims(tmp_path, local):
    here, there, lines = tmp_path / "here", tmp_path / "there", []
    reproduce("parity", "quick", here, progress=False, log=lambda _line: None)
    reproduce("parity", "quick", there, progress=False, log=lines.append, executor=local)
    labels = [r.label for r in claim_module("parity").plan("quick").runs]
    assert sum("trained on a worker" in line for line in lines) == len(labels)
    assert weights(here) == weights(there) and len(weights(here)) == len(labels)
    saved = [json.loads((out / "claims.json").read_text()) for out in (here, there)]
    assert stable(saved[0]) == stable(saved[1])
    assert [row["run"] for row in saved[1]["runs"]] == labels and all(row["train s"] > 0 for row in saved[1]["runs"])
    # a rerun on the executor trains nothing: every run is finished
    stamps = {p: p.stat().st_mtime_ns for p in there.rglob("runs/*/checkpoints/*/model.safetensors")}
    again = []
    reproduce("parity", "quick", there, progress=False, log=again.append, executor=local)
    assert not any("on the executor" in line or "on a worker" in line for line in again)
    assert {p: p.stat().st_mtime_ns for p in there.rglob("runs/*/checkpoints/*/model.safetensors")} == stamps


def test_a_run_that_fails_on_its_worker_stops_the_reproduction_after_the_others(tmp_path, local):
    claim = claim_module("parity")
    plan = claim.plan("quick")
    first = plan.runs[0]
    (tmp_path / "runs" / first.label).mkdir(parents=True)
    (tmp_path / "runs" / first.label / "config.json").write_text("not json")   # its worker cannot resume it
    with pytest.raises(engine.TrainingFailed) as failed:
        engine.train_on(local, claim, plan, tmp_path, tmp_path / "committed", log=lambda _line: None)
    assert list(failed.value.failures) == [first.label] and first.label in str(failed.value)
    assert all(engine.committed_runs.finished(r, tmp_path / "runs" / r.label) for r in plan.runs[1:])


@pytest.fixture(scope="module")
def ray_cluster():
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    pytest.importorskip("ray")
    executor = make_executor("ray", workers=2)
    executor._connect()   # up for the whole module, whichever of its tests runs first
    yield executor
    executor.close()


def test_ray_writes_what_one_process_writes(runs, ray_cluster):
    a, b = runs / "s3-a", runs / "s3-b"
    here = [r.row for r in run_each(drift_job, (a, b), None, **DRIFT)]
    before = {d: written(d) for d in (a, b)}
    for d in (a, b):
        for name in RESULT_FILES:
            (d / name).unlink(missing_ok=True)
    started = time.perf_counter()
    results = run_each(drift_job, (a, b), ray_cluster, **DRIFT)
    assert same([r.row for r in results], here), [r.traceback for r in results]
    assert {d: written(d) for d in (a, b)} == before
    assert time.perf_counter() - started < 120


def test_cli_reproduce_on_ray_gives_the_in_process_claims(tmp_path, ray_cluster, capsys):
    """`interp reproduce --executor ray` joins the cluster Ray already has (this module's) and leaves it up."""
    reproduce("parity", "quick", tmp_path / "here", progress=False, log=lambda _line: None)
    argv = ["reproduce", "parity", "--quick", "--no-progress", "--out", str(tmp_path / "there")]
    assert main([*argv, "--executor", "ray", "--workers", "2"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("trained on a worker") == len(claim_module("parity").plan("quick").runs)
    saved = [json.loads((tmp_path / out / "claims.json").read_text()) for out in ("here", "there")]
    assert stable(saved[0]) == stable(saved[1]) and weights(tmp_path / "here") == weights(tmp_path / "there")
    import ray

    assert ray.is_initialized()
