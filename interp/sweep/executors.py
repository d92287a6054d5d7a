"""Executors: run trial functions in worker processes, one interface for every engine.

    executor.run(fn, jobs, on_done)     fn(params, run_dir) -> row, for each Job; on_done(Outcome)
                                        is called in the driver as each job ends, in any order
    make_executor("local" | "ray", workers=..., ...) -> Executor

`LocalExecutor` (the default): a `concurrent.futures.ProcessPoolExecutor` of `workers` spawned
processes, each running torch with one thread (and exiting when the driver process is gone). At most `workers` jobs are in flight. A worker that
dies (os._exit, a segfault, the OOM killer) breaks the pool: the pool is rebuilt and the jobs that
were in flight run again. When one job was in flight it is the one that killed its worker and is
charged an attempt; when several were, none is charged and they rerun one at a time until each
has finished or died alone, so a crashing trial never uses up an innocent one's retries. A job
charged more than `max_retries` times fails with the error "worker died".

`RayExecutor` (interp.sweep.ray_executor): Ray core tasks with num_cpus / num_gpus per trial;
Ray itself retries tasks whose worker died (its `max_retries`).

An exception raised by the trial function is not retried (it would most likely recur): the job
fails with the formatted traceback as its error. Failures never stop the other jobs.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

from interp.sweep.jobs import Executor, Job, Outcome, execute, worker_start

EXECUTORS = ("local", "ray")


class LocalExecutor:
    """A process pool of `workers` spawned processes (see the module docstring)."""

    def __init__(self, workers: int = 1, max_retries: int = 2) -> None:
        for name, value, low in (("workers", workers, 1), ("max_retries", max_retries, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}; got {value!r}")
        self.workers, self.max_retries = workers, max_retries
        self._pool: ProcessPoolExecutor | None = None
        self._units = None   # the grids' process pool (interp.sweep.unit_workers.ProcessPool)

    def _fresh_pool(self) -> ProcessPoolExecutor:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                         initializer=worker_start, initargs=(os.getpid(),))
        return self._pool

    def run(self, fn: Callable, jobs: Sequence[Job], on_done: Callable[[Outcome], None]) -> None:
        pending = collections.deque(jobs)
        charged: collections.Counter[str] = collections.Counter()   # deaths blamed on a job
        started: collections.Counter[str] = collections.Counter()   # times a job was started
        suspects: set[str] = set()
        inflight: dict = {}
        pool = self._pool or self._fresh_pool()
        while pending or inflight:
            limit = 1 if suspects else self.workers
            while pending and len(inflight) < limit:
                try:
                    future = pool.submit(execute, fn, pending[0].params, pending[0].run_dir)
                except BrokenProcessPool:   # broke since the last wait: its jobs in flight tell why
                    if not inflight:
                        pool = self._fresh_pool()
                        continue
                    break
                job = pending.popleft()
                started[job.key] += 1
                inflight[future] = job
            done, _ = wait(list(inflight), return_when=FIRST_COMPLETED)
            crashed = []
            for future in done:
                job = inflight.pop(future)
                try:
                    status, payload = future.result()
                except BrokenProcessPool:
                    crashed.append(job)
                    continue
                suspects.discard(job.key)
                attempts = started[job.key]
                on_done(Outcome(job, payload, None, attempts) if status == "ok" else Outcome(job, None, payload, attempts))
            if not crashed:
                continue
            crashed += list(inflight.values())   # the pool is broken: every job in flight is lost
            inflight.clear()
            pool = self._fresh_pool()
            if len(crashed) > 1:
                suspects.update(job.key for job in crashed)
                pending.extendleft(reversed(crashed))
                continue
            job = crashed[0]
            suspects.discard(job.key)
            charged[job.key] += 1
            if charged[job.key] > self.max_retries:
                on_done(Outcome(job, None, f"worker died {charged[job.key]} times (max_retries={self.max_retries})",
                                started[job.key]))
            else:
                pending.appendleft(job)

    def map_units(self, work, units, on_result) -> None:
        """A grid's units (interp.analysis.units) on `workers` spawned processes, each building the
        model once and keeping it for the next grid on the same weights (interp.sweep.unit_workers)."""
        from interp.sweep.unit_workers import ProcessPool

        if self._units is None:
            self._units = ProcessPool(self.workers, self.max_retries)
        self._units.map_units(work, units, on_result)

    def close(self) -> None:
        if self._units is not None:
            self._units.close()
            self._units = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def make_executor(name: str, workers: int = 1, max_retries: int = 2, *, address: str | None = None,
                  num_cpus: float = 1, num_gpus: float = 0) -> Executor:
    """The executor called `name`: "local" (workers processes) or "ray" (a local cluster of
    `workers` CPUs, or the cluster at `address`; num_cpus / num_gpus per trial)."""
    if name == "local":
        return LocalExecutor(workers, max_retries)
    if name == "ray":
        from interp.sweep.ray_executor import RayExecutor

        return RayExecutor(workers=workers, max_retries=max_retries, address=address,
                           num_cpus=num_cpus, num_gpus=num_gpus)
    raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}; got {name!r}")
