"""Workers for grids of units (interp.analysis.units): each builds the model once, then runs units.

    pool_map_units(work, units, on_result, workers, max_retries)      spawned processes on this machine
    ActorPool(ray, workers, ...).map_units(work, units, on_result)     Ray actors (interp.sweep.unit_actors)

Both call on_result(unit, tensors, node) in the driver as each unit ends, in any order; the
driver (run_units) writes it and merges by key. The model and the inputs travel once per worker:
a process gets them in its initializer (torch shares the tensors' memory with spawned processes),
a Ray actor gets them from the object store (`ray.put` once; each node fetches the object once and
each actor on it deserialises it once) and keeps them for every unit it runs.

Failures. A unit whose function raises fails the grid at once (GridFailed naming the worker's
exception, its traceback in .traceback: it would fail again). A worker that dies (killed, out of memory, its node removed from
the cluster) loses only the unit it was running: that unit is queued again, up to `max_retries`
times, and a fresh worker replaces the dead one (a Ray actor is placed wherever the cluster has
room; the others carry on meanwhile). In a local pool a dead process breaks the whole pool: every
unit in flight is queued again and charged one attempt.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

from interp.analysis.units import GridFailed, Unit, UnitWork, compute_unit
from interp.sweep.jobs import one_thread, worker_start

OnResult = Callable[[Unit, dict, str], None]
_WORK: UnitWork | None = None   # a pool worker's grid, set by its initializer


def charge(attempts: collections.Counter, unit: Unit, max_retries: int, why: str) -> None:
    attempts[unit.key] += 1
    if attempts[unit.key] > max_retries:
        raise GridFailed(f"unit {unit.key}: its worker died {attempts[unit.key]} times (max_retries={max_retries}); "
                           f"last: {why}")


def raised(unit: Unit, trace: str) -> GridFailed:
    """GridFailed naming the unit and the worker's exception (its last traceback line); the whole
    traceback in .traceback."""
    error = GridFailed(f"unit {unit.key} raised in its worker: {trace.strip().splitlines()[-1]}")
    error.traceback = trace
    return error


# ----------------------------------------------------------------------------- local processes


def _pool_start(work: UnitWork, parent: int) -> None:
    global _WORK
    worker_start(parent)
    _WORK = work


def _pool_run(spec: dict) -> tuple[str, object]:
    """("ok", the unit's tensors as safetensors bytes: one buffer through the pipe, where torch's
    own pickling would open a shared-memory file per tensor) or ("error", traceback)."""
    from safetensors.torch import save

    try:
        return "ok", save(compute_unit(_WORK, spec))
    except Exception:  # noqa: BLE001 - sent to the driver, which fails the grid with it
        return "error", traceback.format_exc()


def pool_map_units(work: UnitWork, units: Sequence[Unit], on_result: OnResult, workers: int,
                   max_retries: int) -> None:
    """Run units on `workers` spawned processes (module docstring)."""
    from safetensors.torch import load

    pending, attempts = collections.deque(units), collections.Counter()
    context = multiprocessing.get_context("spawn")

    def fresh() -> ProcessPoolExecutor:
        return ProcessPoolExecutor(workers, mp_context=context, initializer=_pool_start, initargs=(work, os.getpid()))

    pool, inflight = fresh(), {}
    try:
        while pending or inflight:
            while pending and len(inflight) < workers:
                unit = pending.popleft()
                inflight[pool.submit(_pool_run, unit.spec)] = unit
            finished, _ = wait(list(inflight), return_when=FIRST_COMPLETED)
            broken = False
            for future in finished:
                unit = inflight.pop(future)
                try:
                    status, payload = future.result()
                except BrokenProcessPool as error:
                    charge(attempts, unit, max_retries, str(error))
                    pending.appendleft(unit)
                    broken = True
                    continue
                if status != "ok":
                    raise raised(unit, payload)
                on_result(unit, load(payload), "local")
            if broken:   # every unit still in flight went down with the pool
                for unit in inflight.values():
                    charge(attempts, unit, max_retries, "the process pool broke")
                    pending.appendleft(unit)
                inflight.clear()
                pool.shutdown(wait=True, cancel_futures=True)
                pool = fresh()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
