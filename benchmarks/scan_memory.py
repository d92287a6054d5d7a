"""Forward + backward of the real-size Mamba configs, ours against transformers': time and peak
resident memory, each measurement in a fresh subprocess, one thread.

    PYTHONPATH=$PWD python benchmarks/scan_memory.py mamba2 512        # both sides
    PYTHONPATH=$PWD python benchmarks/scan_memory.py mamba 2048 ours   # one side

Each run builds the random-weight transformers model (benchmarks/real_configs.py), converts it
(ours) or keeps it (hf), runs one untimed forward + backward at T = 8 (warm-up: kernels built,
allocator primed), resets the process's peak RSS (/proc/self/clear_refs 5), then times one
forward + backward of sum(logits) over `tokens(name, B, T)` and reports the seconds and the
peak RSS above the RSS just before it (VmHWM - VmRSS, GB).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

SIDES = ("ours", "hf")


def _status(field: str) -> int:
    """A /proc/self/status field in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _measure(name: str, length: int, side: str, batch: int = 1) -> dict:
    """One side's forward + backward (run inside the fresh subprocess)."""
    import torch

    import models
    from benchmarks.real_configs import build_source, tokens

    torch.set_num_threads(1)
    model = build_source(name)
    if side == "ours":
        model = models.from_pretrained(model)

    def step(ids):
        out = model(ids)
        logits = out if isinstance(out, torch.Tensor) else out.logits
        logits.float().sum().backward()
        model.zero_grad(set_to_none=True)

    step(tokens(name, batch, 8))
    ids = tokens(name, batch, length)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = _status("VmRSS")
    start = time.perf_counter()
    step(ids)
    seconds = time.perf_counter() - start
    return {"name": name, "T": length, "side": side, "seconds": round(seconds, 2),
            "peak_gb": round((_status("VmHWM") - before) / 1e9, 2)}


def run(name: str, length: int, side: str) -> dict:
    """_measure in a fresh interpreter (so earlier runs leave no pages behind)."""
    code = f"from benchmarks.scan_memory import _measure; import json; print(json.dumps(_measure({name!r}, {length}, {side!r})))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"name": name, "T": length, "side": side, "error": done.stderr.strip()[-500:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    name, length = sys.argv[1], int(sys.argv[2])
    for side in sys.argv[3:] or SIDES:
        print(json.dumps(run(name, length, side)), flush=True)
