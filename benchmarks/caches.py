"""Caches at real size: run_with_cache on Mamba-2 130M (benchmarks/real_configs.py, random weights)
at B = 1, T = 512, each case in a fresh process, one torch thread, under torch.no_grad():

    plain        the forward without hooks (the reference time)
    plan         model.cache_plan(tokens) of every hook: the estimate and its time
    all          run_with_cache of every hook under the default budget (refused, or its time)
    state        every layer's hook_state (refused, or its time)
    state_pos    every layer's hook_state at positions [0, 255, 511] (the fast kernels to each step)
    disk         every hook streamed to disk (to_disk), then every entry of the reopened cache read

    python benchmarks/caches.py [--cases plain plan all state state_pos disk] [--dir /tmp/caches-bench]
                                [--max-memory 10GB]

Per case: wall time (the best of --repeat runs for plain, one run otherwise), its ratio to the plain
forward, and the peak resident memory above the process's memory after setup (VmHWM after
clear_refs, Linux), with the load average. The disk case writes under --dir (removed after).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

CASES = ("plain", "plan", "all", "state", "state_pos", "disk")


def rss(field: str) -> int:
    """VmRSS / VmHWM of this process in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def run_case(case: str, directory: str, repeat: int, max_memory: str | None) -> dict:
    import torch

    import models
    from benchmarks.real_configs import build_source, tokens
    from models.memory import MemoryRefused, budget_bytes

    torch.set_num_threads(1)
    model = models.from_pretrained(build_source("mamba2")).eval()
    ids = tokens("mamba2", 1, 512)
    states = [f"blocks.{l}.mixer.hook_state" for l in range(len(model.blocks))]
    with torch.no_grad():
        model(ids[:, :8])  # warm-up: native kernels compiled / loaded
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # reset VmHWM to the current RSS
    base = rss("VmRSS")
    out = {"case": case, "budget": budget_bytes(max_memory)}
    start = time.perf_counter()
    with torch.no_grad():
        try:
            if case == "plain":
                times = []
                for _ in range(repeat):
                    begin = time.perf_counter()
                    model(ids)
                    times.append(time.perf_counter() - begin)
                out["seconds"] = min(times)
            elif case == "plan":
                plan = model.cache_plan(ids)
                out.update(estimate=plan.total, hooks=len(plan.entries), largest=plan.largest_entry,
                           states=sum(plan.entries[n] for n in states), summary=plan.summary())
            elif case == "all":
                _, cache = model.run_with_cache(ids, max_memory=max_memory)
                out["cached"] = sum(v.nbytes for v in cache.values())
            elif case == "state":
                _, cache = model.run_with_cache(ids, states, max_memory=max_memory)
                out["cached"] = sum(v.nbytes for v in cache.values())
            elif case == "state_pos":
                _, cache = model.run_with_cache(ids, states, positions=[0, 255, 511], max_memory=max_memory)
                out["cached"] = sum(v.nbytes for v in cache.values())
            elif case == "disk":
                _, cache = model.run_with_cache(ids, to_disk=directory, max_memory=max_memory)
                out["write_seconds"] = time.perf_counter() - start
                out["on_disk"] = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory))
                begin = time.perf_counter()
                reopened = models.Cache.open(directory, model)
                for name in reopened:  # every entry read from its file once
                    reopened[name].sum()
                out["read_seconds"] = time.perf_counter() - begin
        except MemoryRefused as refused:
            out["refused"] = str(refused)
    out.setdefault("seconds", time.perf_counter() - start)
    out["peak_above_setup"] = rss("VmHWM") - base
    out["setup_rss"] = base
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--dir", default="/tmp/caches-bench")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--max-memory", default=None, help="run_with_cache's max_memory (default: its default budget)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_case(args.one, args.dir, args.repeat, args.max_memory)))
        return
    rows = []
    for case in args.cases:
        shutil.rmtree(args.dir, ignore_errors=True)
        limit = [] if args.max_memory is None else ["--max-memory", args.max_memory]
        done = subprocess.run([sys.executable, __file__, "--one", case, "--dir", args.dir, "--repeat", str(args.repeat),
                               *limit],
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
        if done.returncode:
            print(done.stderr[-3000:], file=sys.stderr)
            continue
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        shutil.rmtree(args.dir, ignore_errors=True)
    plain = next((r["seconds"] for r in rows if r["case"] == "plain"), None)
    for row in rows:
        ratio = f"{row['seconds'] / plain:.2f}x" if plain else "-"
        print(f"{row['case']:10s} {row['seconds']:8.3f} s  {ratio:>7s}  peak +{row['peak_above_setup'] / 1e9:.2f} GB  "
              + json.dumps({k: v for k, v in row.items() if k not in ("case", "seconds", "peak_above_setup")}))
    print("load", open("/proc/loadavg").read().strip())


if __name__ == "__main__":
    main()
