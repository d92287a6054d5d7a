"""Ray actors for grids of units (interp.analysis.units): the model travels once, and stays.

    pool = ActorPool(ray, workers=8, num_cpus=1, num_gpus=0, max_retries=2)
    pool.map_units(work, units, on_result)      on_result(unit, tensors, node) in the driver, any order
    pool.close()

The model is put in the object store once (`ray.put`; each node fetches it once, each actor
deserialises it once and moves it to the GPU Ray gave it, if any) and the actors keep it: later
grids on the same weights (an interp circuit's EAP-IG, re-scoring and faithfulness grids, say) reuse
the running actors, and only each grid's function and inputs travel (put once, fetched once per
actor). A grid on other weights (the sha256 of the state differs: a model changed in place counts
as another) replaces the actors.

Failures. A unit whose function raises fails the grid at once (GridFailed naming the worker's
exception; the traceback in .traceback). An actor that dies (killed, out of memory, its node removed)
loses only the unit it was running: the unit is queued again, up to max_retries times, and a new
actor is asked for; it starts wherever the cluster has room while the others carry on. Actors that
cannot start (no room within start_timeout, or dying as they start more than max_retries + 1 times)
fail the grid in one line.
"""

from __future__ import annotations

import collections
import traceback
import uuid
from collections.abc import Sequence

from interp.analysis.units import GridFailed, Unit, UnitWork, compute_unit, weights_digest
from interp.sweep.jobs import one_thread
from interp.sweep.unit_workers import OnResult, charge, raised


class UnitActor:
    """One Ray worker: the model, and the grid it runs now."""

    def __init__(self, model, device: str) -> None:
        one_thread()
        import ray

        self.model = model if device == "cpu" else model.to(device)
        self.node, self.grid = ray.get_runtime_context().get_node_id(), (None, None)

    def ready(self) -> str:
        return self.node

    def run(self, grid: str, shared: list, spec: dict) -> tuple[str, object, str]:
        """One unit of grid `grid`; shared = [ObjectRef of (compute, inputs, pinned, name)] (in a
        list so that Ray hands over the reference, fetched here once per grid)."""
        import ray

        try:
            if self.grid[0] != grid:
                compute, inputs, pinned, name = ray.get(shared[0])
                self.grid = (grid, UnitWork(self.model, compute, inputs, name=name, pinned=pinned))
            return "ok", compute_unit(self.grid[1], spec), self.node
        except Exception:  # noqa: BLE001 - sent to the driver, which fails the grid with it
            return "error", traceback.format_exc(), self.node


class ActorPool:
    def __init__(self, ray, workers: int, num_cpus: float, num_gpus: float, max_retries: int,
                 start_timeout: float = 600.0) -> None:
        self.ray, self.workers, self.max_retries, self.start_timeout = ray, workers, max_retries, start_timeout
        self.resources = (num_cpus, num_gpus)
        self.device = "cuda" if num_gpus > 0 else "cpu"
        self.actor_class = ray.remote(UnitActor).options(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0)
        self.model_key, self.model_ref, self.idle = None, None, []

    def _adopt(self, model) -> None:
        """Keep the actors when they hold these weights; else replace the model (module docstring)."""
        key = weights_digest(model)
        if key != self.model_key:
            self.close()
            self.model_key, self.model_ref = key, self.ray.put(model)

    def map_units(self, work: UnitWork, units: Sequence[Unit], on_result: OnResult) -> None:
        ray = self.ray
        self._adopt(work.model)
        shared = [ray.put((work.compute, work.inputs, work.pinned, work.name))]
        grid = uuid.uuid4().hex
        pending, attempts, failed_starts = collections.deque(units), collections.Counter(), 0
        starting: dict = {}   # ready() ref -> an actor not yet known to be up
        running: dict = {}    # run() ref -> (actor, unit)

        def start() -> None:
            actor = self.actor_class.remote(self.model_ref, self.device)
            starting[actor.ready.remote()] = actor

        for _ in range(min(self.workers, len(pending)) - len(self.idle)):
            start()
        try:
            while pending or running:
                while pending and self.idle:
                    actor, unit = self.idle.pop(), pending.popleft()
                    running[actor.run.remote(grid, shared, unit.spec)] = (actor, unit)
                ready, _ = ray.wait([*starting, *running], num_returns=1, timeout=self.start_timeout)
                if not ready:
                    if not running:
                        raise GridFailed(f"no Ray worker started within {self.start_timeout:.0f} s (each asks for "
                                         f"num_cpus={self.resources[0]}, num_gpus={self.resources[1]}); does the "
                                         "cluster have room?")
                    continue
                ref = ready[0]
                if ref in starting:
                    failed_starts += self._started(ref, starting.pop(ref))
                    if failed_starts > self.max_retries + 1:
                        raise GridFailed(f"{failed_starts} Ray workers died as they started (building the model)")
                    if len(self.idle) + len(running) + len(starting) < min(self.workers, len(pending) + len(running)):
                        start()
                    continue
                actor, unit = running.pop(ref)
                try:
                    status, payload, node = ray.get(ref)
                except ray.exceptions.RayError as error:   # the actor or its node died
                    charge(attempts, unit, self.max_retries, type(error).__name__)
                    pending.appendleft(unit)
                    ray.kill(actor, no_restart=True)
                    start()
                    continue
                if status != "ok":
                    raise raised(unit, payload)
                self.idle.append(actor)
                on_result(unit, payload, node)
        except BaseException:
            self.idle += [actor for actor, _ in running.values()]
            self.close()
            raise
        finally:
            for actor in starting.values():   # asked for but not needed any more
                ray.kill(actor, no_restart=True)

    def _started(self, ref, actor) -> int:
        """1 when the actor died starting, else 0 (it joins the idle ones)."""
        try:
            self.ray.get(ref)
        except self.ray.exceptions.RayError:
            return 1
        self.idle.append(actor)
        return 0

    def close(self) -> None:
        for actor in self.idle:
            self.ray.kill(actor, no_restart=True)
        self.idle, self.model_key, self.model_ref = [], None, None
