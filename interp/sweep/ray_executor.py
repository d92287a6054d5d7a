"""The Ray executor: each trial one Ray core task (`pip install interp-seq[ray]`).

    RayExecutor(workers=2)                       ray.init(num_cpus=2): a local cluster on this machine
    RayExecutor(address="ray://head:10001")      join an existing cluster (or address="auto")
    num_cpus / num_gpus                          resources of each trial's task (Ray schedules them)

A local cluster listens on the loopback interface only: its node address is 127.0.0.1 (Ray on
Linux would otherwise swap 127.0.0.1 for the machine's network address, and its gcs_server,
raylet, agents, driver and workers would listen on every interface), the dashboard is off, and a
cluster that comes up on another address is shut down again with an error. `address=` joins an
existing cluster as that cluster is configured (its own bind addresses).

Ray starts one worker process per concurrent task and retries a task whose worker died
(`max_retries`; exceptions raised by the trial are not retried, `retry_exceptions=False`). A local
cluster is started only when Ray is not initialised yet, and shut down by `close()` only if this
executor started it. Workers of a local cluster find this source tree through PYTHONPATH (the
driver's sys.path); on a remote cluster the package must be installed on every node.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from interp.sweep.jobs import Job, Outcome, execute

LOOPBACK = "127.0.0.1"


def ray_module():
    try:
        import ray
    except ImportError:
        raise ValueError("the ray executor needs Ray: pip install 'interp-seq[ray]' (or ray>=2.9)") from None
    return ray


def start_local_cluster(ray, **options) -> None:
    """ray.init of a one-node cluster bound to 127.0.0.1, dashboard off (see the module docstring);
    RuntimeError (after shutting it down) when Ray reports another node address."""
    with _loopback_node():
        # address="local": always a new instance; without it ray.init joins a cluster that another
        # process started on this machine (`ray start`, a test's Cluster) and refuses num_cpus
        ray.init(address="local", include_dashboard=False, log_to_driver=False, _node_ip_address=LOOPBACK, **options)
    address = ray.util.get_node_ip_address()
    if address != LOOPBACK:
        ray.shutdown()
        raise RuntimeError(f"the local Ray cluster came up on {address}, not {LOOPBACK}: refusing to run "
                           "trials on a cluster reachable from the network (pass --address to join one "
                           "on purpose)")


@contextmanager
def _loopback_node() -> Iterator[None]:
    """Keep 127.0.0.1 as the node address while a local cluster starts: Ray replaces a loopback
    address by the machine's network address unless its ENABLE_RAY_CLUSTER flag is off
    (ray._private.services.resolve_ip_for_localhost; the flag is what RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER
    sets when ray is imported)."""
    try:
        constants = importlib.import_module("ray._private.ray_constants")
    except ImportError:  # another Ray layout: start_local_cluster checks the address it got
        constants = None
    if not hasattr(constants, "ENABLE_RAY_CLUSTER"):
        yield
        return
    saved = constants.ENABLE_RAY_CLUSTER
    constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        constants.ENABLE_RAY_CLUSTER = saved


class RayExecutor:
    def __init__(self, workers: int = 1, max_retries: int = 2, *, address: str | None = None,
                 num_cpus: float = 1, num_gpus: float = 0) -> None:
        for name, value, low in (("workers", workers, 1), ("max_retries", max_retries, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}; got {value!r}")
        for name, value in (("num_cpus", num_cpus), ("num_gpus", num_gpus)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name} must be a non-negative number; got {value!r}")
        self.workers, self.max_retries, self.address = workers, max_retries, address
        self.num_cpus, self.num_gpus = num_cpus, num_gpus
        self._started = False
        self._actors = None   # the grids' actors (interp.sweep.unit_actors), kept across grids of one model

    def _connect(self):
        ray = ray_module()
        if not ray.is_initialized():
            path = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
            runtime_env = {"env_vars": {"PYTHONPATH": path, "OMP_NUM_THREADS": "1"}}
            if self.address is None:
                start_local_cluster(ray, num_cpus=self.workers, runtime_env=runtime_env)
            else:
                ray.init(address=self.address, log_to_driver=False)
            self._started = True
        return ray

    def run(self, fn: Callable, jobs: Sequence[Job], on_done: Callable[[Outcome], None]) -> None:
        ray = self._connect()
        task = ray.remote(execute).options(num_cpus=self.num_cpus, num_gpus=self.num_gpus,
                                            max_retries=self.max_retries, retry_exceptions=False)
        fn_ref = ray.put(fn)
        refs = {task.remote(fn_ref, job.params, job.run_dir): job for job in jobs}
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=1)
            for ref in ready:
                job = refs.pop(ref)
                try:
                    status, payload = ray.get(ref)
                except ray.exceptions.RayError as error:   # worker died past max_retries, node lost, ...
                    on_done(Outcome(job, None, f"{type(error).__name__}: {error}", self.max_retries + 1))
                    continue
                on_done(Outcome(job, payload, None) if status == "ok" else Outcome(job, None, payload))

    def map_units(self, work, units, on_result) -> None:
        """A grid's units (interp.analysis.units) on `workers` Ray actors of num_cpus / num_gpus
        each, the model put in the object store once and built once per actor; the actors stay
        for the next grid on the same weights (interp.sweep.unit_actors)."""
        from interp.sweep.unit_actors import ActorPool

        if self._actors is None:
            self._actors = ActorPool(self._connect(), self.workers, self.num_cpus, self.num_gpus, self.max_retries)
        self._actors.map_units(work, units, on_result)

    def close(self) -> None:
        if self._actors is not None:
            self._actors.close()
            self._actors = None
        if self._started:
            ray_module().shutdown()
            self._started = False
