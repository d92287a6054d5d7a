"""What the causal reading of changes on hook_state costs (issue 39): a hook function that changes
a row's state at several steps, and a StatePatch at several steps of a row under grad, apply in
step order, each change on the state the earlier ones left. A hook that sets states (zeroes two
steps) settles in one extra round; one that changes the state relative to what it sees (scales it)
at every step was settled one step a re-run (O(T^2)) and is now called on one window a step, each
scanned from the state the earlier changes left (one pass); StatePatch(fn) at every step under a
gradient was settled by re-runs too and now finds its pins in one pass (pinned_forward).

Cases, each in a fresh process (one torch thread, CPU seconds of the second of two calls, and the
process's peak RSS), the source trees given by --trees interleaved case by case, so that the code
before a change (a worktree of its commit) and after it are timed side by side:

    zero2     a hook zeroing every row's state at steps 3 and T // 2, no gradient
    scale     a hook scaling every state by 0.9 (relative, every step), no gradient
    fn+bwd    StatePatch(rows, times, fn=lambda c: c * 0.9) over every (row, step), then
              backward() of a loss of the logits
    plain+bwd the same forward and backward without a patch (the fast path), for scale

    python benchmarks/hook_rounds.py --trees /path/to/old-checkout,. [--hook-lengths 32,128,256]
        [--grad-lengths 32,64,256] [--skip /path/to/old-checkout:fn+bwd:256,...]

(zero2 and scale at the hook lengths, fn+bwd and plain+bwd at the gradient lengths; --skip names
cases not run, such as the re-run settle's fn+bwd at T 256, killed at 24 GB.)

Model: a 2-layer Mamba, d_model 64, B 4; the hook on blocks.0.mixer.hook_state.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

CASE = """
import resource, sys, time, torch
torch.set_num_threads(1)
import models
from models import StatePatch
torch.manual_seed(0)
T, kind = int(sys.argv[1]), sys.argv[2]
model = models.build("mamba", vocab_size=32, d_model=64, n_layers=2).eval()
tokens = torch.randint(0, 32, (4, T))
def scale(x, hook):          # relative, at every step
    return x * 0.9
def zero_two(x, hook):       # sets the state at two steps
    x = x.clone(); x[:, 3] = 0; x[:, T // 2] = 0; return x
every = StatePatch([b for b in range(4) for _ in range(T)], [t for _ in range(4) for t in range(T)],
                   fn=lambda c: c * 0.9)
site = "blocks.0.mixer.hook_state"
def once():
    if kind in ("scale", "zero2"):
        with torch.no_grad():
            model.run_with_hooks(tokens, fwd_hooks=[(site, {"scale": scale, "zero2": zero_two}[kind])])
    else:
        hooks = [(site, every)] if kind == "fn+bwd" else []
        model.run_with_hooks(tokens, fwd_hooks=hooks).square().mean().backward()
        model.zero_grad(set_to_none=True)
once()
start = time.process_time()
once()
print(time.process_time() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def measure(tree: Path, length: int, kind: str) -> tuple[float, float]:
    """(CPU seconds, peak RSS in MB) of one case in a fresh process on the source tree."""
    env = dict(os.environ, PYTHONPATH=str(tree.resolve()), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", CASE, str(length), kind], env=env,
                          capture_output=True, text=True, timeout=3600, check=True,
                          cwd=tree)   # (-c puts the working directory first on sys.path)
    seconds, megabytes = done.stdout.strip().splitlines()[-1].split()
    return float(seconds), float(megabytes)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", default=".", help="comma-separated source trees, timed interleaved")
    parser.add_argument("--hook-lengths", default="32,128,256", help="T of the zero2 and scale cases")
    parser.add_argument("--grad-lengths", default="32,64,256", help="T of the fn+bwd and plain+bwd cases")
    parser.add_argument("--skip", default="", help="comma-separated TREE:KIND:T cases not run (too slow or big)")
    args = parser.parse_args(argv)
    trees = [Path(t) for t in args.trees.split(",")]
    skip = set(args.skip.split(",")) if args.skip else set()
    cases = [(kind, int(n)) for n in args.hook_lengths.split(",") for kind in ("zero2", "scale")]
    cases += [(kind, int(n)) for n in args.grad_lengths.split(",") for kind in ("fn+bwd", "plain+bwd")]
    print("| case | T | " + " | ".join(f"{t} (CPU s, peak MB)" for t in trees) + " |"
          + "".join(f" last / {t} (s) |" for t in trees[:-1]))
    for kind, length in cases:
        found = [None if f"{tree}:{kind}:{length}" in skip else measure(tree, length, kind) for tree in trees]
        cells = ["not run" if f is None else f"{f[0]:.3f}, {f[1]:.0f}" for f in found]
        ratios = ["-" if f is None or found[-1] is None else f"{found[-1][0] / f[0]:.2f}x" for f in found[:-1]]
        print(f"| {kind} | {length} | " + " | ".join(cells + ratios) + " |", flush=True)


if __name__ == "__main__":
    main()
