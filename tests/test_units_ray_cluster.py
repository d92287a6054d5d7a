"""A grid across a real multi-node Ray cluster on one machine (ray.cluster_utils.Cluster: a head and
two worker nodes, each its own raylet, 1 CPU each, every node on 127.0.0.1): the merged interchange
grid equals the in-process run of the same chunk bit for bit and every listening socket of the
cluster is on the loopback interface; units that outlast a worker's start run on several nodes;
removing a worker node mid-grid still finishes with the same result; actors stay for the next grid
on the same weights."""

import os
import threading
import time
from pathlib import Path

import pytest  # noqa: E402
import torch  # noqa: E402

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

import models  # noqa: E402
from interp.analysis.interventions import corrupt_ar, interchange, site_grid  # noqa: E402
from interp.sweep.executors import make_executor  # noqa: E402
from interp.sweep.ray_executor import _loopback_node  # noqa: E402
from interp.tasks.recall import AssociativeRecall  # noqa: E402
from test_trust_ray import is_loopback, listeners  # noqa: E402

CHUNK = (6, 8)


@pytest.fixture(scope="module")
def cluster():
    if ray.is_initialized():
        pytest.skip("Ray is already initialised in this process")
    local = {"node_ip_address": "127.0.0.1", "num_cpus": 1}
    # Ray swaps 127.0.0.1 for the machine's address unless its cluster flag is off while the nodes
    # start (what RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 sets at import; not set here, so that other
    # test modules collected in this process see Ray's default)
    with _loopback_node():
        made = cluster_utils.Cluster(initialize_head=True, head_node_args={**local, "include_dashboard": False})
        workers = [made.add_node(**local) for _ in range(2)]
        made.wait_for_nodes()
        tests = Path(__file__).resolve().parent   # the workers import this folder's unit functions
        ray.init(address=made.address, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(tests.parent), str(tests)])}})
    try:
        yield made, workers
    finally:
        ray.shutdown()
        made.shutdown()


@pytest.fixture(scope="module")
def grid():
    task = AssociativeRecall()
    model = models.build("mamba", vocab_size=task.vocab_size, d_model=16, n_layers=2).eval()
    clean = task.sample(16, 10, seed=0)
    corrupt = corrupt_ar(clean, task, seed=1)
    sites = site_grid(model, ["blocks.{l}.hook_resid_pre", "blocks.{l}.mixer.hook_out"], list(range(10)))
    here = interchange(model, clean, corrupt, sites, chunk=CHUNK, progress=False)
    return model, clean, corrupt, sites, here


def nodes_of(out) -> set[str]:
    from safetensors import safe_open

    return {safe_open(str(f), "pt").metadata()["node"] for f in (out / "units").glob("*.safetensors")}


def test_a_grid_across_three_nodes_equals_one_process_and_listens_on_loopback(cluster, grid, tmp_path):
    made, _ = cluster
    model, clean, corrupt, sites, here = grid
    assert {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]} == {"127.0.0.1"}
    assert sum(n["Alive"] for n in ray.nodes()) == 3
    executor = make_executor("ray", workers=3, address=made.address)
    got = interchange(model, clean, corrupt, sites, chunk=CHUNK, executor=executor, out=tmp_path, progress=False)
    executor.close()
    assert torch.equal(got.p_patched, here.p_patched) and torch.equal(got.p_clean, here.p_clean)
    exposed = [(name, address) for name, address in listeners() if not is_loopback(address)]
    assert not exposed, f"listening beyond localhost: {exposed}"


def slow_grid(seconds: float = 1.0):
    """12 units of one row through a small linear map, each taking `seconds` (longer than a
    worker's start, so that every worker gets some); the in-process result."""
    import unit_grids
    from interp.analysis.units import Unit, UnitWork, chunks, run_units

    torch.manual_seed(0)
    inputs = {"x": torch.randn(12, 6, dtype=torch.float64), "seconds": seconds}
    work = UnitWork(torch.nn.Linear(6, 3).double(), unit_grids.slow_unit, inputs, name="slow")
    units = [Unit(f"r{a:03d}", {"rows": [a, b]}) for a, b in chunks(12, 1)]
    here = run_units(UnitWork(work.model, unit_grids.linear_unit, inputs), units, progress=False)
    return work, units, torch.cat([here[u.key]["y"] for u in units])


def test_units_spread_over_the_nodes(cluster, tmp_path):
    """One actor per node (1 CPU each): units that take a second run on at least two nodes."""
    from interp.analysis.units import run_units

    made, _ = cluster
    work, units, here = slow_grid()
    executor = make_executor("ray", workers=3, address=made.address)
    try:
        got = run_units(work, units, executor=executor, out=tmp_path, progress=False)
    finally:
        executor.close()
    assert torch.equal(torch.cat([got[u.key]["y"] for u in units]), here)
    assert len(nodes_of(tmp_path)) >= 2


def test_removing_a_worker_node_mid_grid_still_gives_the_same_result(cluster, tmp_path):
    from interp.analysis.units import run_units

    made, workers = cluster
    work, units, here = slow_grid()
    removed = []

    def remove_when_started() -> None:   # once a unit has landed, take a worker node away
        deadline = time.time() + 120
        while time.time() < deadline and not list((tmp_path / "units").glob("*.safetensors")):
            time.sleep(0.05)
        made.remove_node(workers[0])
        removed.append(len(list((tmp_path / "units").glob("*.safetensors"))))

    remover = threading.Thread(target=remove_when_started)
    remover.start()
    executor = make_executor("ray", workers=3, address=made.address, max_retries=3)
    try:
        got = run_units(work, units, executor=executor, out=tmp_path, progress=False)
    finally:
        executor.close()
        remover.join()
    assert removed and removed[0] < len(units), removed   # the node went while units were left
    assert sum(n["Alive"] for n in ray.nodes()) == 2
    assert torch.equal(torch.cat([got[u.key]["y"] for u in units]), here)


def test_actors_stay_for_the_next_grid_on_the_same_weights_and_go_for_others(cluster, grid):
    made, _ = cluster
    model, clean, corrupt, sites, here = grid
    executor = make_executor("ray", workers=2, address=made.address)
    try:
        first = interchange(model, clean, corrupt, sites, chunk=CHUNK, executor=executor, progress=False)
        actors = {a._actor_id for a in executor._actors.idle}
        again = interchange(model, clean, corrupt, sites[:12], chunk=CHUNK, executor=executor, progress=False)
        assert actors and actors <= {a._actor_id for a in executor._actors.idle}   # (a second may join late)
        assert torch.equal(first.p_patched, here.p_patched)
        assert torch.equal(again.p_patched, here.p_patched[:12])   # 12 sites: the first two units of 6
        changed = models.build("mamba", vocab_size=model.cfg.vocab_size, d_model=16, n_layers=2).eval()
        changed.load_state_dict(model.state_dict())
        with torch.no_grad():
            changed.blocks[1].mixer.out_proj.weight.mul_(0.5)
        other = interchange(changed, clean, corrupt, sites, chunk=CHUNK, executor=executor, progress=False)
        assert not (actors & {a._actor_id for a in executor._actors.idle})   # other weights: new actors
        assert not torch.equal(other.p_patched, here.p_patched)
    finally:
        executor.close()
