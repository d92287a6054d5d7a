"""Training speed at the demo sizes: optimizer steps/s for the tanh RNN and Mamba on S3 acot.

    python benchmarks/train.py [--steps 20] [--threads 1] [--markdown]

Each model is built with the demo's config (interp.cli.demo.plan()) and timed for `--steps` full
training steps (sample a batch, forward, masked cross-entropy, backward, clip, AdamW) at the
train length 60, the length the curriculum ends at, after 3 warm-up steps; plus one evaluation
pass (no_grad, the fast path) over the demo's evaluation (256 sequences at each of
60, 100, 200, 500, 1000). Wall time and process CPU time are both reported, since the 2-core
machine is shared and wall time depends on other jobs (the load average is printed).
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch

import models
from interp.cli.demo import FORMAT, TASK, TRAIN_LENGTH, plan
from interp.training.evaluate import evaluate_lengths
from interp.tasks import make_task
from interp.training.train import make_optimizer, masked_loss


def time_training(name: str, overrides: dict, cfg, steps: int) -> dict:
    task = make_task(TASK, format=FORMAT)
    torch.manual_seed(0)
    model = models.build(name, vocab_size=task.vocab_size, **overrides)
    optimizer = make_optimizer(model, cfg)

    def one_step(seed: int) -> None:
        batch = task.sample(cfg.batch_size, TRAIN_LENGTH, seed)
        loss, _ = masked_loss(model(batch.tokens), batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()

    for seed in range(3):
        one_step(seed)
    wall, cpu = time.perf_counter(), time.process_time()
    for seed in range(steps):
        one_step(100 + seed)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"model": name, "batch": cfg.batch_size, "params": sum(p.numel() for p in model.parameters()),
            "steps_per_s": steps / wall, "cpu_s_per_step": cpu / steps,
            "demo_steps": cfg.steps, "model_obj": model, "task": task}


def time_eval(row: dict, lengths: list[int], n: int) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    evaluate_lengths(row["model_obj"], row["task"], lengths, n=n)
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    demo = plan()
    rows = []
    for name, (overrides, cfg) in demo.models.items():
        row = time_training(name, overrides, cfg, args.steps)
        row["eval_wall_s"], row["eval_cpu_s"] = time_eval(row, demo.lengths, demo.eval_n)
        rows.append(row)
    load = os.getloadavg()[0]
    base = rows[0]["steps_per_s"]
    if args.markdown:
        print(f"Machine: {platform.machine()}, torch {torch.__version__}, {args.threads} thread(s), "
              f"load average {load:.1f}; {args.steps} timed steps at length {TRAIN_LENGTH}.\n")
        print("| model | params | batch | steps/s | CPU s/step | ratio to tanh_rnn | demo steps | est. demo train CPU s | eval wall s | eval CPU s |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['model']} | {r['params']} | {r['batch']} | {r['steps_per_s']:.1f} | "
                  f"{r['cpu_s_per_step']:.4f} | {r['steps_per_s'] / base:.2f} | {r['demo_steps']} | "
                  f"{r['demo_steps'] * r['cpu_s_per_step']:.0f} | {r['eval_wall_s']:.1f} | {r['eval_cpu_s']:.1f} |")
    else:
        for r in rows:
            print(f"{r['model']:>10}: {r['steps_per_s']:.1f} steps/s ({r['cpu_s_per_step'] * 1e3:.1f} ms CPU/step, "
                  f"batch {r['batch']}, {r['params']} params); eval {r['eval_wall_s']:.1f} s wall, "
                  f"{r['eval_cpu_s']:.1f} s CPU")
        print(f"load average {load:.1f}")


if __name__ == "__main__":
    main()
