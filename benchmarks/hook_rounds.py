"""What the causal reading of hook functions on hook_state costs (issue 39): a hook function that
changes a row's state at several steps is applied in step order, each change on the state the
earlier ones left, by re-running the layer's scan with the settled steps pinned. A hook that sets
states (zeroes two steps) settles in one extra round; a hook that changes the state relative to
what it sees (scales it) at every step settles one step a round: T re-runs, O(T^2).

Each case runs in a fresh process (one torch thread, CPU seconds of the second of two calls, no
gradient), the source trees given by --trees interleaved case by case, so that the code before the
change (a worktree of its commit) and after it are timed side by side:

    python benchmarks/hook_rounds.py --trees /path/to/old-checkout,. [--lengths 32,128,256]

Model: a 2-layer Mamba, d_model 64, B 4; the hook on blocks.0.mixer.hook_state.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

CASE = """
import sys, time, torch
torch.set_num_threads(1)
import models
torch.manual_seed(0)
T, kind = int(sys.argv[1]), sys.argv[2]
model = models.build("mamba", vocab_size=32, d_model=64, n_layers=2).eval()
tokens = torch.randint(0, 32, (4, T))
def scale(x, hook):          # relative, at every step
    return x * 0.9
def zero_two(x, hook):       # sets the state at two steps
    x = x.clone(); x[:, 3] = 0; x[:, T // 2] = 0; return x
hook = [("blocks.0.mixer.hook_state", {"scale": scale, "zero2": zero_two}[kind])]
with torch.no_grad():
    model.run_with_hooks(tokens, fwd_hooks=hook)
    start = time.process_time()
    model.run_with_hooks(tokens, fwd_hooks=hook)
    print(time.process_time() - start)
"""


def seconds(tree: Path, length: int, kind: str) -> float:
    env = dict(os.environ, PYTHONPATH=str(tree.resolve()), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", CASE, str(length), kind], env=env, capture_output=True, text=True,
                          timeout=3600, check=True, cwd=tree)   # (-c puts the working directory first on sys.path)
    return float(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", default=".", help="comma-separated source trees, timed interleaved")
    parser.add_argument("--lengths", default="32,128,256")
    args = parser.parse_args(argv)
    trees = [Path(t) for t in args.trees.split(",")]
    print("| hook | T | " + " | ".join(f"{t} (CPU s)" for t in trees) + (" | ratio |" if len(trees) == 2 else " |"))
    for length in (int(n) for n in args.lengths.split(",")):
        for kind in ("zero2", "scale"):
            times = [seconds(tree, length, kind) for tree in trees]
            ratio = f" {times[1] / times[0]:.1f}x |" if len(times) == 2 else ""
            print(f"| {kind} | {length} | " + " | ".join(f"{t:.3f}" for t in times) + " |" + ratio, flush=True)


if __name__ == "__main__":
    main()
