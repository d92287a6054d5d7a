"""Scale-out: the real-size interchange grid on one process, on units, on Ray workers and on a
three-node local Ray cluster; the per-unit overhead of the unit engine.

    python benchmarks/scale_out.py [--models gpt2,mamba] [--step 8] [--rounds 1] [--sections grid,eap,overhead]

Grid (as benchmarks/real_size.py's interchange section): GPT-2 small 124M / Mamba-130m, random
weights (benchmarks/real_configs.py), N = 8 clean / corrupted pairs of random tokens at T = 64
(the corrupted run differs at the first position), sites hook_resid_pre x every layer x a sample
of positions (the midpoint of every --step positions: its mean cost per site is the whole grid's,
since a pass resumes at the site's position). Contenders, each in a fresh process, interleaved
round by round (the load average before and after each is recorded):

  one process   interchange(...) as a plain call, one torch thread
  units         the same grid as 8 units of sites x the 8 examples, run here (one thread)
  ray 1         the units on a local Ray cluster with 1 worker (an actor building the model once)
  ray 2         ... with 2 workers
  cluster 3     the units on ray.cluster_utils.Cluster: a head and two worker nodes, 1 CPU each,
                each its own raylet, on 127.0.0.1; 3 workers

Times are wall seconds of the interchange call (model building and imports excluded; the model's
trip through the object store and every actor's start are included). Starting the Ray cluster
itself (`ray.init` of a local one, or the three-node Cluster) is timed apart ("cluster start s"):
a researcher starts a cluster once and runs many grids on it. Every
unit-based contender must give the same p_patched bit for bit (the digest column). The eap section runs
EAP-IG (--eap-steps interpolation steps) over 64 prompts of GPT-2 124M at T 64 as 4 units of 16
prompts: here, and on Ray with 1 and 2 workers (the per_example scores' digest must agree). The
overhead section times a trivial unit (a 4 x 4 linear map on one row) many times: in-process, in-process
writing each unit to an out directory, on one spawned process and on one Ray actor: ms per unit is
the engine's own cost (scheduling, transfer, the atomic write).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")   # every Ray node on 127.0.0.1
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CONTENDERS = ("one process", "units", "ray 1", "ray 2", "cluster 3")
UNITS = 8   # the grid's units: CHUNK = (ceil(sites / UNITS), 8)
OVERHEAD_UNITS = 300
EAP_PROMPTS, EAP_CHUNK = 64, 16   # EAP-IG: 4 units of 16 prompts


def load() -> float:
    return os.getloadavg()[0]


def prompts(name: str, n: int):
    """(model, clean, corrupt): n random-token prompts at T 64, the corrupted ones differing at the
    first position, the answer the clean run's own most likely last token."""
    import torch

    import models
    from interp.tasks.base import Batch
    from real_configs import build_source, tokens

    model = models.from_pretrained(build_source(name)).eval()
    clean_tokens = tokens(name, n, 64, seed=2)
    corrupt_tokens = clean_tokens.clone()
    corrupt_tokens[:, 0] = tokens(name, n, 1, seed=3)[:, 0]
    mask = torch.zeros_like(clean_tokens, dtype=torch.bool)
    mask[:, -1] = True
    targets = torch.zeros_like(clean_tokens)
    with torch.no_grad():
        targets[:, -1] = model(clean_tokens)[:, -1].argmax(-1)   # the clean run's own answer: p_clean not tiny
    states = torch.zeros(n, 64)
    return model, Batch(clean_tokens, targets, mask, states), Batch(corrupt_tokens, targets.clone(), mask, states)


def grid(name: str, step: int):
    """(model, clean, corrupt, sites) of the benchmark grid."""
    from interp.analysis.interventions import site_grid

    model, clean, corrupt = prompts(name, 8)
    sites = site_grid(model, ["blocks.{l}.hook_resid_pre"], list(range(step // 2, 64, step)))
    return model, clean, corrupt, sites


def cluster_executor():
    import ray
    from ray.cluster_utils import Cluster

    from interp.sweep.executors import make_executor

    local = {"node_ip_address": "127.0.0.1", "num_cpus": 1}
    cluster = Cluster(initialize_head=True, head_node_args={**local, "include_dashboard": False})
    for _ in range(2):
        cluster.add_node(**local)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    return make_executor("ray", workers=3, address=cluster.address), cluster


def worker_grid(contender: str, name: str, step: int) -> dict:
    import torch

    from interp.analysis.interventions import interchange
    from interp.sweep.executors import make_executor

    torch.set_num_threads(1)
    model, clean, corrupt, sites = grid(name, step)
    executor, cluster, options = None, None, {}
    if contender != "one process":
        options["chunk"] = (math.ceil(len(sites) / UNITS), 8)
    started = time.perf_counter()   # the cluster's start, once per cluster (not per grid): timed apart
    if contender.startswith("ray"):
        executor = make_executor("ray", workers=int(contender.split()[1]))
        executor._connect()
    if contender == "cluster 3":
        executor, cluster = cluster_executor()
    start = time.perf_counter() - started
    before, started = load(), time.perf_counter()
    result = interchange(model, clean, corrupt, sites, executor=executor, progress=False, **options)
    seconds = time.perf_counter() - started
    if executor is not None:
        executor.close()
    if cluster is not None:
        import ray

        ray.shutdown()
        cluster.shutdown()
    digest = hashlib.sha256(result.p_patched.numpy().tobytes()).hexdigest()[:12]
    return {"s": seconds, "start": start, "sites": len(sites), "pairs": result.n_run, "digest": digest,
            "load": f"{before:.1f}-{load():.1f}"}


def worker_eap_ig(contender: str, steps: int) -> dict:
    """EAP-IG over EAP_PROMPTS prompts of GPT-2 124M at T 64, as units of EAP_CHUNK prompts, here
    or on Ray with 1 or 2 workers."""
    import torch

    from interp.analysis.circuits import eap_ig
    from interp.sweep.executors import make_executor

    torch.set_num_threads(1)
    model, clean, corrupt = prompts("gpt2", EAP_PROMPTS)
    executor, start = None, 0.0
    if contender != "here":
        started = time.perf_counter()
        executor = make_executor("ray", workers=int(contender.split()[1]))
        executor._connect()
        start = time.perf_counter() - started
    before, started = load(), time.perf_counter()
    scores = eap_ig(model, clean, corrupt, steps=steps, chunk=EAP_CHUNK, executor=executor, progress=False)
    seconds = time.perf_counter() - started
    if executor is not None:
        executor.close()
    digest = hashlib.sha256(scores.per_example.numpy().tobytes()).hexdigest()[:12]
    return {"s": seconds, "start": start, "edges": scores.graph.n_edges, "digest": digest,
            "load": f"{before:.1f}-{load():.1f}"}


def worker_overhead(contender: str) -> dict:
    import torch

    import unit_overhead
    from interp.analysis.units import Unit, UnitWork, run_units
    from interp.sweep.executors import make_executor

    torch.manual_seed(0)
    work = UnitWork(torch.nn.Linear(4, 4), unit_overhead.one_row, {"x": torch.randn(OVERHEAD_UNITS, 4)},
                    name="overhead")
    units = [Unit(f"u{i:04d}", {"row": i}) for i in range(OVERHEAD_UNITS)]
    executor = {"in-process": None, "in-process, written": None,
                "1 process": "local", "1 Ray actor": "ray"}[contender]
    executor = None if executor is None else make_executor(executor, workers=1)
    warm = None if executor is None else run_units(work, units[:4], executor=executor, progress=False)  # start-up
    with tempfile.TemporaryDirectory() as out:
        before, started = load(), time.perf_counter()
        run_units(work, units, executor=executor, out=out if contender != "in-process" else None, progress=False)
        seconds = time.perf_counter() - started
    if executor is not None:
        executor.close()
    del warm
    return {"ms_per_unit": 1000 * seconds / OVERHEAD_UNITS, "load": f"{before:.1f}-{load():.1f}"}


def spawn(*argv: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "INTERP_PROGRESS": "0"}
    done = subprocess.run([sys.executable, __file__, "--worker", *argv], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def markdown(rows: list[dict], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def executor_of(contender: str) -> bool:
    return contender.startswith(("ray", "cluster"))


def grid_rows(models: list[str], step: int, rounds: int, steps: dict) -> list[dict]:
    best: dict = {}
    for _ in range(rounds):
        for name in models:
            for contender in CONTENDERS:
                got = spawn("grid", contender, name, str(steps.get(name, step)))
                print(f"{name} {contender}: {got}", file=sys.stderr)
                kept = best.get((name, contender))
                if kept is None or "error" in kept or ("s" in got and got["s"] < kept["s"]):
                    best[(name, contender)] = got   # the fastest successful round
    rows = []
    for name in models:
        base, ray1 = best[(name, "one process")], best[(name, "ray 1")]
        for contender in CONTENDERS:
            got = best[(name, contender)]
            if "error" in got:
                rows.append({"model": name, "contender": contender, "seconds": got["error"]})
                continue
            rows.append({"model": name, "contender": contender, "sites x N": f"{got['sites']} x 8",
                         "pairs run": got["pairs"], "seconds": f"{got['s']:.1f}",
                         "cluster start s": f"{got['start']:.1f}" if executor_of(contender) else "-",
                         "vs one process": f"{base['s'] / got['s']:.2f}x",
                         "vs ray 1": f"{ray1['s'] / got['s']:.2f}x" if "s" in ray1 else "-",
                         "p_patched sha256": got["digest"], "load": got["load"]})
    return rows


def eap_rows(steps: int, rounds: int) -> list[dict]:
    best: dict = {}
    for _ in range(rounds):
        for contender in ("here", "ray 1", "ray 2"):
            got = spawn("eap", contender, str(steps))
            print(f"eap-ig {contender}: {got}", file=sys.stderr)
            if contender not in best or "error" in best[contender] or ("s" in got and got["s"] < best[contender]["s"]):
                best[contender] = got
    ray1 = best["ray 1"].get("s")
    return [{"contender": c, "seconds": f"{g['s']:.1f}" if "s" in g else g["error"],
             "cluster start s": f"{g['start']:.1f}" if "s" in g and c != "here" else "-",
             "vs here": f"{best['here']['s'] / g['s']:.2f}x" if "s" in g and "s" in best["here"] else "-",
             "vs ray 1": f"{ray1 / g['s']:.2f}x" if ray1 and "s" in g else "-",
             "per_example sha256": g.get("digest", "-"), "load": g.get("load", "-")} for c, g in best.items()]


def overhead_rows() -> list[dict]:
    rows = []
    for contender in ("in-process", "in-process, written", "1 process", "1 Ray actor"):
        got = spawn("overhead", contender)
        rows.append({"where": contender, "ms per unit": f"{got['ms_per_unit']:.2f}" if "ms_per_unit" in got
                     else got["error"], "load": got.get("load", "-")})
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="gpt2,mamba")
    parser.add_argument("--step", type=int, default=8, help="one site position per this many (default 8)")
    parser.add_argument("--mamba-step", type=int, default=None, help="--step for mamba (default: --step)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--sections", default="grid,eap,overhead")
    parser.add_argument("--eap-steps", type=int, default=4, help="EAP-IG interpolation steps (default 4)")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        kind, *rest = args.worker
        if kind == "grid":
            got = worker_grid(rest[0], rest[1], int(rest[2]))
        elif kind == "eap":
            got = worker_eap_ig(rest[0], int(rest[1]))
        else:
            got = worker_overhead(rest[0])
        print(json.dumps(got))
        return
    sections = args.sections.split(",")
    if "grid" in sections:
        steps = {"mamba": args.mamba_step or args.step}
        rows = grid_rows(args.models.split(","), args.step, args.rounds, steps)
        print(markdown(rows, ["model", "contender", "sites x N", "pairs run", "seconds", "cluster start s",
                              "vs one process", "vs ray 1",
                              "p_patched sha256", "load"]))
    if "eap" in sections:
        print(markdown(eap_rows(args.eap_steps, args.rounds), ["contender", "seconds", "cluster start s", "vs here",
                                                                "vs ray 1", "per_example sha256", "load"]))
    if "overhead" in sections:
        print(markdown(overhead_rows(), ["where", "ms per unit", "load"]))


if __name__ == "__main__":
    main()
