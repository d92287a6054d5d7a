"""The unit engine (interp.analysis.units): a grid's units run in this process, on spawned
processes or on Ray actors give the same bits whatever the workers and the completion order; a
rerun skips finished units; a driver killed mid-grid loses only the units in flight; a dead worker's
unit is retried; an out directory of another model, input or grid is refused in one line; exact
interchange on units equals the in-process run of the same chunk bit for bit, and one unit
covering the whole grid equals the plain call."""

import json
import os
import random

import pytest
import torch

import models
import unit_grids
from interp.analysis.interventions import corrupt_ar, interchange, site_grid
from interp.analysis.units import Unit, UnitWork, chunks, run_units
from interp.sweep.executors import make_executor
from interp.tasks.recall import AssociativeRecall


class Shuffled:
    """An executor that runs the units here in a shuffled order (completion order must not matter)."""

    def __init__(self, seed: int = 0, stop_after: int | None = None) -> None:
        self.rng, self.stop_after = random.Random(seed), stop_after

    def map_units(self, work, units, on_result):
        from interp.analysis.units import compute_unit

        order = list(units)
        self.rng.shuffle(order)
        for count, unit in enumerate(order):
            if self.stop_after is not None and count == self.stop_after:
                raise KeyboardInterrupt("driver killed")
            on_result(unit, compute_unit(work, unit.spec), "here")


def linear_work(tmp_path, n=24, die_at=None, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(6, 3).double()
    x = torch.randn(n, 6, dtype=torch.float64)
    inputs = {"x": x, "die_at": die_at, "marker": str(tmp_path / "marker")}
    units = [Unit(f"r{a:03d}", {"rows": [a, b]}) for a, b in chunks(n, 5)]
    return UnitWork(model, unit_grids.linear_unit, inputs, name="linear"), units


def merged(results, units):
    return torch.cat([results[u.key]["y"] for u in units])


def test_chunks_cover_the_range_and_refuse_bad_sizes():
    assert chunks(7, 3) == [(0, 3), (3, 6), (6, 7)]
    with pytest.raises(ValueError, match="chunk size must be a positive int; got 0"):
        chunks(7, 0)


def test_order_of_completion_does_not_change_the_result(tmp_path):
    work, units = linear_work(tmp_path)
    here = merged(run_units(work, units, progress=False), units)
    for seed in range(3):
        assert torch.equal(merged(run_units(work, units, executor=Shuffled(seed), progress=False), units), here)


def test_a_rerun_skips_finished_units_and_a_killed_driver_loses_only_units_in_flight(tmp_path):
    work, units = linear_work(tmp_path)
    out = tmp_path / "grid"
    reference = merged(run_units(work, units, progress=False), units)
    with pytest.raises(KeyboardInterrupt):
        run_units(work, units, executor=Shuffled(stop_after=2), out=out, progress=False)
    assert len(list((out / "units").glob("*.safetensors"))) == 2
    unit_grids.CALLS.clear()
    again = run_units(work, units, out=out, progress=False)
    assert len(unit_grids.CALLS) == len(units) - 2
    assert torch.equal(merged(again, units), reference)
    unit_grids.CALLS.clear()
    assert torch.equal(merged(run_units(work, units, out=out, progress=False), units), reference)
    assert unit_grids.CALLS == []
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["analysis"] == "linear" and manifest["units"]["count"] == len(units)


def test_an_out_directory_of_another_model_input_or_grid_is_refused(tmp_path):
    work, units = linear_work(tmp_path)
    out = tmp_path / "grid"
    run_units(work, units, out=out, progress=False)
    other_model, _ = linear_work(tmp_path, seed=1)
    with pytest.raises(ValueError, match=r"holds a grid of another model \(weights\)"):
        run_units(UnitWork(other_model.model, work.compute, work.inputs, name="linear"), units, out=out,
                  progress=False)
    other_input, _ = linear_work(tmp_path, n=25)
    with pytest.raises(ValueError, match="holds a grid of another input"):
        run_units(UnitWork(work.model, work.compute, other_input.inputs, name="linear"), units, out=out,
                  progress=False)
    with pytest.raises(ValueError, match="holds a grid of another unit grid"):
        run_units(work, units[:-1], out=out, progress=False)


def test_a_torn_unit_file_is_named_and_links_are_not_followed(tmp_path):
    work, units = linear_work(tmp_path)
    out = tmp_path / "grid"
    run_units(work, units, out=out, progress=False)
    (out / "units" / f"{units[0].key}.safetensors").write_bytes(b"\x00" * 7)
    with pytest.raises(ValueError, match=f"unit file .*{units[0].key}.safetensors is unreadable"):
        run_units(work, units, out=out, progress=False)
    victim = tmp_path / "victim"
    victim.mkdir()
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "units").symlink_to(victim)
    with pytest.raises(ValueError, match="is a symbolic link"):
        run_units(work, units, out=linked, progress=False)
    assert list(victim.iterdir()) == []


def test_a_raising_unit_fails_the_grid_and_a_dead_worker_is_retried(tmp_path):
    work, units = linear_work(tmp_path, die_at=10)
    reference = merged(run_units(linear_work(tmp_path)[0], units, progress=False), units)
    executor = make_executor("local", workers=2)
    try:
        got = run_units(work, units, executor=executor, out=tmp_path / "grid", progress=False)
        assert (tmp_path / "marker").exists()   # the worker of unit 10 died once
        assert torch.equal(merged(got, units), reference)
        failing = UnitWork(work.model, unit_grids.raising_unit, work.inputs)
        with pytest.raises(RuntimeError, match=r"ArithmeticError: unit \[\d+, \d+\] cannot be computed"):
            run_units(failing, units, executor=executor, progress=False)
    finally:
        executor.close()


def test_a_pool_that_breaks_between_two_submits_is_replaced(tmp_path, monkeypatch):
    """A worker can die while the driver is still submitting (the pool raises on submit before any future
    reports it): the unit is resubmitted on a fresh pool, the grid completes and equals the in-process one."""
    from concurrent.futures.process import BrokenProcessPool, ProcessPoolExecutor

    work, units = linear_work(tmp_path)
    reference = merged(run_units(work, units, progress=False), units)
    submit, calls = ProcessPoolExecutor.submit, []

    def breaks_once(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise BrokenProcessPool("a worker died")
        return submit(self, *args, **kwargs)

    monkeypatch.setattr(ProcessPoolExecutor, "submit", breaks_once)
    executor = make_executor("local", workers=2)
    try:
        got = run_units(work, units, executor=executor, progress=False)
    finally:
        executor.close()
    assert len(calls) > len(units) and torch.equal(merged(got, units), reference)


def test_run_units_refuses_what_is_not_an_executor(tmp_path):
    work, units = linear_work(tmp_path)
    with pytest.raises(TypeError, match="executor must be None or an executor"):
        run_units(work, units, executor="ray", progress=False)


@pytest.fixture(scope="module")
def ar_grid():
    task = AssociativeRecall()
    model = models.build("mamba", vocab_size=task.vocab_size, d_model=16, n_layers=2).eval()
    clean = task.sample(12, 10, seed=0)
    corrupt = corrupt_ar(clean, task, seed=1)
    sites = site_grid(model, ["blocks.{l}.hook_resid_pre", "blocks.{l}.mixer.hook_state"], list(range(10)))
    return model, clean, corrupt, sites


def same(a, b) -> bool:
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in
               ("p_patched", "p_clean", "p_corrupt", "kept", "logit_diff_patched", "logit_diff_clean", "kl_patched"))


def test_interchange_on_units_is_bit_identical_wherever_the_units_run(ar_grid, tmp_path):
    model, clean, corrupt, sites = ar_grid
    options = dict(progress=False, metrics=["logit_diff", "kl"], chunk=(7, 5))
    here = interchange(model, clean, corrupt, sites, **options)
    shuffled = interchange(model, clean, corrupt, sites, executor=Shuffled(1), **options)
    assert same(shuffled, here)
    executor = make_executor("local", workers=2)
    try:
        pooled = interchange(model, clean, corrupt, sites, executor=executor, out=tmp_path / "g", **options)
    finally:
        executor.close()
    assert same(pooled, here)
    assert (pooled.n_run, pooled.n_skipped) == (here.n_run, here.n_skipped)
    assert len(list((tmp_path / "g" / "units").iterdir())) == 6 * 3   # 42 / 7 site chunks x 12 / 5 example chunks


def test_one_unit_over_the_whole_grid_is_the_plain_call(ar_grid):
    model, clean, corrupt, sites = ar_grid
    assert torch.get_num_threads() == 1   # tests/conftest.py: the plain call then runs as a unit does
    plain = interchange(model, clean, corrupt, sites, progress=False, metrics=["logit_diff", "kl"])
    one_unit = interchange(model, clean, corrupt, sites, progress=False, metrics=["logit_diff", "kl"],
                           chunk=(len(sites), len(clean)))
    assert same(one_unit, plain) and one_unit.n_passes == plain.n_passes


def test_interchange_refuses_a_bad_chunk(ar_grid):
    model, clean, corrupt, sites = ar_grid
    with pytest.raises(ValueError, match=r"chunk must be \(sites per unit, examples per unit\)"):
        interchange(model, clean, corrupt, sites, chunk=(0, 4), progress=False)


def test_ablation_on_units_is_bit_identical_in_any_order_and_one_unit_is_the_plain_call(ar_grid):
    from interp.analysis.interventions import ablate

    model, clean, _, sites = ar_grid
    for mode in ("zero", "mean"):
        here = ablate(model, clean, sites, mode=mode, chunk=(9, 5), progress=False)
        pooled = ablate(model, clean, sites, mode=mode, chunk=(9, 5), executor=Shuffled(2), progress=False)
        assert torch.equal(pooled.p_answer, here.p_answer) and torch.equal(pooled.correct, here.correct)
        assert torch.equal(pooled.baseline_p, here.baseline_p)
        whole = ablate(model, clean, sites, mode=mode, chunk=(len(sites), len(clean)), progress=False)
        assert torch.equal(whole.p_answer, ablate(model, clean, sites, mode=mode).p_answer)


def test_a_local_pool_stays_for_the_next_grid_on_the_same_weights_only(tmp_path):
    work, units = linear_work(tmp_path)
    reference = merged(run_units(work, units, progress=False), units)
    executor = make_executor("local", workers=2)
    try:
        assert torch.equal(merged(run_units(work, units, executor=executor, progress=False), units), reference)
        pool = executor._units.pool
        assert torch.equal(merged(run_units(work, units[:2], executor=executor, progress=False), units[:2]),
                           reference[:10])
        assert executor._units.pool is pool
        with torch.no_grad():
            work.model.weight.add_(1.0)   # the same module, changed in place: other weights
        changed = merged(run_units(work, units, executor=executor, progress=False), units)
        assert executor._units.pool is not pool
        assert torch.equal(changed, merged(run_units(work, units, progress=False), units))
    finally:
        executor.close()


def test_the_weights_digest_follows_changes_in_place_and_replaced_tensors():
    from interp.analysis.units import digest, weights_digest

    model = torch.nn.Linear(3, 2)
    first = weights_digest(model)
    assert weights_digest(model) == first == digest(dict(model.state_dict()))
    with torch.no_grad():
        model.weight[0, 0] += 1.0                # in place: the version counter moves
    changed = weights_digest(model)
    assert changed != first and changed == digest(dict(model.state_dict()))
    model.bias = torch.nn.Parameter(torch.zeros(2))   # replaced
    assert weights_digest(model) == digest(dict(model.state_dict())) != changed


def test_out_must_be_a_directory_path(tmp_path):
    work, units = linear_work(tmp_path)
    (tmp_path / "a-file").write_text("kept")
    with pytest.raises(ValueError, match="exists and is not a directory"):
        run_units(work, units, out=tmp_path / "a-file", progress=False)
    assert (tmp_path / "a-file").read_text() == "kept"
    with pytest.raises(TypeError, match="out must be None or a directory path; got 3"):
        run_units(work, units, out=3, progress=False)
