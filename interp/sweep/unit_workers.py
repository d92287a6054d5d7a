"""Workers for grids of units (interp.analysis.units): each builds the model once, then runs units.

    ProcessPool(workers, max_retries).map_units(work, units, on_result)   spawned processes on this machine
    ActorPool(ray, workers, ...).map_units(work, units, on_result)        Ray actors (interp.sweep.unit_actors)

Both call on_result(unit, tensors, node) in the driver as each unit ends, in any order; the
driver (run_units) writes it and merges by key. The model travels once per worker and stays for
the next grid on the same weights: a process gets it in its initializer (torch shares the tensors'
memory with spawned processes), a Ray actor from the object store; each grid's function and inputs
are pickled once and unpickled once per worker.

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
import pickle
import traceback
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

from interp.analysis.units import GridFailed, Unit, UnitWork, compute_unit, weights_digest
from interp.sweep.jobs import one_thread, worker_start

OnResult = Callable[[Unit, dict, str], None]
_MODEL = None              # a pool worker's model, set by its initializer
_GRID: tuple = (None, None)  # (grid id, UnitWork) of the grid a pool worker runs now


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


def _pool_start(model, parent: int) -> None:
    global _MODEL
    worker_start(parent)
    _MODEL = model


def _pool_run(grid: str, shared: bytes, spec: dict) -> tuple[str, object]:
    """("ok", the unit's tensors as safetensors bytes: one buffer through the pipe, where torch's
    own pickling would open a shared-memory file per tensor) or ("error", traceback). shared: the
    grid's pickled (compute, inputs, pinned, name), unpickled once per process and grid."""
    global _GRID
    from safetensors.torch import save

    try:
        if _GRID[0] != grid:
            compute, inputs, pinned, name = pickle.loads(shared)
            _GRID = (grid, UnitWork(_MODEL, compute, inputs, name=name, pinned=pinned))
        return "ok", save(compute_unit(_GRID[1], spec))
    except Exception:  # noqa: BLE001 - sent to the driver, which fails the grid with it
        return "error", traceback.format_exc()


class ProcessPool:
    """`workers` spawned processes holding one model (module docstring); kept for the next grid
    on the same weights (the sha256 of the state), replaced for other weights."""

    def __init__(self, workers: int, max_retries: int) -> None:
        self.workers, self.max_retries = workers, max_retries
        self.pool, self.model, self.model_key = None, None, None

    def _fresh(self) -> ProcessPoolExecutor:
        self.close_pool()
        context = multiprocessing.get_context("spawn")
        self.pool = ProcessPoolExecutor(self.workers, mp_context=context, initializer=_pool_start,
                                        initargs=(self.model, os.getpid()))
        return self.pool

    def _adopt(self, model) -> ProcessPoolExecutor:
        key = weights_digest(model)
        if key != self.model_key or self.pool is None:
            self.model, self.model_key = model, key
            self._fresh()
        return self.pool

    def map_units(self, work: UnitWork, units: Sequence[Unit], on_result: OnResult) -> None:
        from safetensors.torch import load

        pool = self._adopt(work.model)
        shared, grid = pickle.dumps((work.compute, work.inputs, work.pinned, work.name)), uuid.uuid4().hex
        pending, attempts, inflight = collections.deque(units), collections.Counter(), {}
        try:
            while pending or inflight:
                broken = False
                while pending and len(inflight) < self.workers:
                    unit = pending.popleft()
                    try:
                        inflight[pool.submit(_pool_run, grid, shared, unit.spec)] = unit
                    except BrokenProcessPool:   # a worker died before its future said so: not this unit's fault
                        pending.appendleft(unit)
                        broken = True
                        break
                finished = wait(list(inflight), return_when=FIRST_COMPLETED)[0] if inflight else set()
                for future in finished:
                    unit = inflight.pop(future)
                    try:
                        status, payload = future.result()
                    except BrokenProcessPool as error:
                        charge(attempts, unit, self.max_retries, str(error))
                        pending.appendleft(unit)
                        broken = True
                        continue
                    if status != "ok":
                        raise raised(unit, payload)
                    on_result(unit, load(payload), "local")
                if broken:   # every unit still in flight went down with the pool
                    for unit in inflight.values():
                        charge(attempts, unit, self.max_retries, "the process pool broke")
                        pending.appendleft(unit)
                    inflight.clear()
                    pool = self._fresh()
        except BaseException:
            self.close()
            raise

    def close_pool(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None

    def close(self) -> None:
        self.close_pool()
        self.model, self.model_key = None, None
