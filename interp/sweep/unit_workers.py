"""Workers for grids of units (interp.analysis.units): each builds the model once, then runs units.

    pool_map_units(work, units, on_result, workers, max_retries)      spawned processes on this machine
    ray_map_units(ray, work, units, on_result, workers, ...)          one Ray actor per worker

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


def _charge(attempts: collections.Counter, unit: Unit, max_retries: int, why: str) -> None:
    attempts[unit.key] += 1
    if attempts[unit.key] > max_retries:
        raise GridFailed(f"unit {unit.key}: its worker died {attempts[unit.key]} times (max_retries={max_retries}); "
                           f"last: {why}")


def _raised(unit: Unit, trace: str) -> GridFailed:
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
                    _charge(attempts, unit, max_retries, str(error))
                    pending.appendleft(unit)
                    broken = True
                    continue
                if status != "ok":
                    raise _raised(unit, payload)
                on_result(unit, load(payload), "local")
            if broken:   # every unit still in flight went down with the pool
                for unit in inflight.values():
                    _charge(attempts, unit, max_retries, "the process pool broke")
                    pending.appendleft(unit)
                inflight.clear()
                pool.shutdown(wait=True, cancel_futures=True)
                pool = fresh()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


# ----------------------------------------------------------------------------- Ray actors


class UnitActor:
    """One Ray worker of a grid: the model built once (moved to the GPU Ray gave it, if any)."""

    def __init__(self, work: UnitWork, device: str) -> None:
        one_thread()
        import ray

        self.work, self.node = work, ray.get_runtime_context().get_node_id()
        if device != "cpu":
            self.work.model.to(device)

    def ready(self) -> str:
        return self.node

    def run(self, spec: dict) -> tuple[str, object, str]:
        try:
            return "ok", compute_unit(self.work, spec), self.node
        except Exception:  # noqa: BLE001 - sent to the driver, which fails the grid with it
            return "error", traceback.format_exc(), self.node


def ray_map_units(ray, work: UnitWork, units: Sequence[Unit], on_result: OnResult, workers: int,
                  num_cpus: float, num_gpus: float, max_retries: int, start_timeout: float = 600.0) -> None:
    """Run units on `workers` Ray actors (module docstring)."""
    device = "cuda" if num_gpus > 0 else "cpu"
    actor_class = ray.remote(UnitActor).options(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0)
    work_ref = ray.put(work)
    pending, attempts = collections.deque(units), collections.Counter()
    starting: dict = {}   # ready() ref -> actor not yet known to be up
    idle: list = []
    running: dict = {}    # run() ref -> (actor, unit)

    def start() -> None:
        actor = actor_class.remote(work_ref, device)
        starting[actor.ready.remote()] = actor

    for _ in range(min(workers, len(pending))):
        start()
    try:
        while pending or running:
            while pending and idle:
                actor, unit = idle.pop(), pending.popleft()
                running[actor.run.remote(unit.spec)] = (actor, unit)
            ready, _ = ray.wait([*starting, *running], num_returns=1, timeout=start_timeout)
            if not ready:
                if not running:
                    raise GridFailed(f"no Ray worker started within {start_timeout:.0f} s (each asks for "
                                       f"num_cpus={num_cpus}, num_gpus={num_gpus}); does the cluster have room?")
                continue
            ref = ready[0]
            if ref in starting:
                actor = starting.pop(ref)
                try:
                    ray.get(ref)
                    idle.append(actor)
                except ray.exceptions.RayError:   # it died starting: try another
                    start()
                continue
            actor, unit = running.pop(ref)
            try:
                status, payload, node = ray.get(ref)
            except ray.exceptions.RayError as error:   # the actor or its node died
                _charge(attempts, unit, max_retries, f"{type(error).__name__}")
                pending.appendleft(unit)
                ray.kill(actor, no_restart=True)
                start()
                continue
            if status != "ok":
                raise _raised(unit, payload)
            idle.append(actor)
            on_result(unit, payload, node)
    finally:
        for actor in [*idle, *starting.values(), *(a for a, _ in running.values())]:
            ray.kill(actor, no_restart=True)
