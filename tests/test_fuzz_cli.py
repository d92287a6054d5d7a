"""Hostile paths and random argument vectors for every `interp` subcommand, in process (issue 27 item 8).

Each case calls `interp.cli.main(argv)` with the command's valid arguments, of which one to three
are replaced by something hostile: a path that is an existing file where a directory is wanted, a
directory under a file, on a read-only file system (/proc, /sys), a dangling link, a link loop, a
name longer than the file system allows, a path past PATH_MAX, empty, blank or with a NUL, a FIFO
or a device; a run directory whose config.json / checkpoint.json / metrics.jsonl / checkpoints/ /
weights are links out of it, FIFOs or /dev/zero, a pointer that climbs out, a corrupt config; a
number such as 1e8, 1e9, 1e12, -1, nan, inf, 2**66, 0x10; or a flag that does not exist. Issue 38's
categories (each case is counted under the first that applies): `edited_results` (`interp reproduce
parity --quick --no-train --results R` on committed runs with one edit: outcome.json, reproduce.json,
config.json, flipped weights without their digest, metrics, an added or linked file), `hostile_config`
(a run's d_model / vocab_size / max_len / n_layers 10**12, 10**6, 2**66, -1, 0, 1.5, "8", ...; its
deadline is SIZE_DEADLINE_S), `nan_weights` (one checkpoint tensor NaN, its digest updated),
`linked_output` (circuit.csv, patch.csv, eval.json, drift.json, the HTML reports, demo's report.html
a link to a victim outside) and `huge_flag` (a number flag of 1e8 or more). A case passes when `main`
returns or exits with at most one line on stderr, and fails when an exception escapes it (a raw
traceback), stderr has more than one line, it runs past its deadline (`DeadlinePassed`, which no
`except` of the CLI catches), a file outside the case's directory (the targets of the links)
changed, or ("silent") an edited-results case exits 0 with a claims.json other than the unedited
runs'. The process's address space is capped (MEMORY_CAP) while the cases run.

The work itself is cut short where it would take long, so that a case takes a fraction of a
second: training stops after one step (`interp.training.train._train` with stop_at=1), sweep
trials run in this process (an inline executor after the real one has checked its arguments),
and `interp reproduce` stops where the reproduction would start (edited-results cases, with
--no-train, run it in full on the committed runs).

    python tests/test_fuzz_cli.py 3000 [seed]     the long run (prints the counts per category and each failure)

Issue 27's target: zero failures in 3,000 cases. Seed 0, load 10-12, 2 cores: on main before
these fixes (fac729a) 3,000 cases gave 42 raw tracebacks (22 a --out past PATH_MAX, 14 an --out on
/sys that os.access calls writable for root, 5 a name past NAME_MAX, 1 --max-length 2**66), 7
multi-line errors (a path with a newline) and 6 runs past 120 s (--lengths / --n / --n-drift 1e8,
--max-length 1e8), in 1,694 s; after them 1 traceback (--max-length 2**66, since bounded) in 634 s;
at c6d42f3 none: 3,000 of 3,000 pass with seed 0 (283 s) and with seed 5 (324 s, load 9). The
suite runs FAST_CASES of seed 1 (about 15 s).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import io
import json
import os
import random
import shutil
import signal
import stat
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

FAST_CASES = 80
DEADLINE_S = 120
NUMBERS = ["-1", "0", "nan", "inf", "-inf", "1e8", "1e9", "100000000", "73786976294838206464", "1.5", "0x10",
           "1_0", "", " ", "abc", "1", "2", "3", "1000000000", "1000000000000", "1e12"]
SIZE_FIELDS = ("d_model", "vocab_size", "max_len", "n_layers")   # a run config's fields that size the model
HOSTILE_SIZES = [10 ** 12, 10 ** 10, 2 ** 66, 10 ** 6, -1, 0, 1.5, 1e10, "8", None, True, [8]]
SIZE_DEADLINE_S = 30      # a hostile run config must be refused at once, not after building 10**6 layers
MEMORY_CAP = 16 << 30     # address space of the fuzz process: a huge allocation fails instead of filling the machine
OUTPUTS = {"eval": ["eval.json"], "drift": ["drift.json", "drift.html"], "heads": ["heads.html"],
           "patch": ["patch.csv", "patch.html"], "circuit": ["circuit.csv", "circuit.html"]}
RUN_OF = {"heads": "repl", "patch": "ar", "circuit": "ar"}   # the pristine run each command needs (else c2)
TINY = ["--d-model", "8", "--batch-size", "4", "--train-length", "4", "--eval-every", "1"]
RUN_ARGS = {
    "eval": ["--lengths", "4,6", "--n", "4"],
    "drift": ["--lengths", "4,6", "--n", "4", "--n-fit", "8", "--n-drift", "4", "--no-calibrate"],
    "heads": ["--n", "4"],
    "patch": ["--n", "4", "--length", "2", "--no-progress"],
    "circuit": ["--n", "4", "--steps", "2", "--rescore", "2", "--length", "2", "--no-progress"],
}
FLAGS = {  # command -> {flag: "number" | "path" | "text" | "run" | "flag"}
    "demo": {"--out": "path", "--quick": "flag", "--no-progress": "flag"},
    "train": {"--model": "text", "--task": "text", "--format": "text", "--train-length": "number",
              "--steps": "number", "--out": "path", "--batch-size": "number", "--lr": "number",
              "--weight-decay": "number", "--warmup": "number", "--grad-clip": "number", "--seed": "number",
              "--eval-every": "number", "--checkpoint-every": "number", "--device": "text", "--resume": "flag",
              "--d-model": "number", "--n-layers": "number", "--d-hidden": "number", "--d-state": "number",
              "--n-heads": "number", "--expand": "number", "--d-conv": "number", "--curriculum": "flag"},
    "eval": {"run_dir": "run", "--lengths": "number", "--n": "number", "--seed": "number",
             "--threshold": "number", "--device": "text"},
    "drift": {"run_dir": "run", "--lengths": "number", "--n": "number", "--n-fit": "number",
              "--n-drift": "number", "--tau": "number", "--reference-step": "number", "--statistic": "number",
              "--site": "text", "--seed": "number", "--out": "path", "--definition": "text", "--normalize": "flag"},
    "heads": {"run_dir": "run", "--n": "number", "--length": "number", "--seed": "number", "--impl": "text",
              "--out": "path"},
    "patch": {"run_dir": "run", "--n": "number", "--length": "number", "--seed": "number",
              "--min-effect": "number", "--top": "number", "--hooks": "text", "--positions": "text",
              "--out": "path", "--max-memory": "text", "--method": "text", "--corrupt": "text"},
    "circuit": {"run_dir": "run", "--corrupt": "text", "--metric": "text", "--n": "number", "--length": "number",
                "--steps": "number", "--fraction": "number", "--rescore": "number", "--positions": "text",
                "--channel-groups": "number", "--seed": "number", "--out": "path", "--conv-nodes": "flag"},
    "sweep": {"spec": "spec", "--out": "path", "--workers": "number", "--max-retries": "number",
              "--cpus-per-trial": "number", "--executor": "text"},
    "sample-efficiency": {"--models": "text", "--tasks": "text", "--formats": "text", "--max-length": "number",
                          "--lrs": "number", "--seeds": "number", "--steps": "number", "--batch-size": "number",
                          "--val-size": "number", "--n0": "number", "--resolution": "number",
                          "--n-max": "number", "--out": "path", "--n-layers": "number"},
    "reproduce": {"name": "text", "--scale": "text", "--out": "path", "--device": "text", "--quick": "flag",
                  "--results": "path"},
}
TEXTS = ["", " ", "x", "tanh_rnn", "S3", "AR", "cuda", "cuda:7", "gpu", "mean", "101", "calibrated", "all",
         "key,value", "blocks.9.hook_resid_pre", "hook_resid_pre", "8GB", "-1GB", "1e99TB", "ray", "local",
         "parity", "quick", "paper", "Z5", "lstm", "acot", "triton", "naive", "é\u2028", "a\0b", "--", "-", "%s{}",
         "logit_diff", "kl", "key", "value"]


class Sandbox:
    """The pristine runs (a C2 and an AR tanh RNN, a REPL DeltaNet; 1-3 steps each), a spec and committed
    parity --quick runs, made once."""

    def __init__(self, root: Path) -> None:
        from interp.cli import main

        self.root = root
        self.runs = {}
        for name, model, task in (("c2", "tanh_rnn", "C2"), ("ar", "tanh_rnn", "AR"), ("repl", "deltanet", "REPL")):
            self.runs[name] = root / "pristine" / name
            with contextlib.redirect_stdout(io.StringIO()):
                status = main(["train", "--model", model, "--task", task, "--steps", "2", "--out",
                               str(self.runs[name]), "--no-progress", *TINY])
            assert status == 0, name
        self.spec = root / "pristine" / "spec.json"
        self.spec.write_text(json.dumps({"kind": "grid", "trial": "sweep_trials:square", "grid": {"x": [1, 2]}}))
        self.results, self.truth = self._commit_parity(root / "pristine" / "parity")

    @staticmethod
    def _commit_parity(base: Path) -> tuple[Path, dict]:
        """(results, truth): the parity --quick runs trained and committed, and what claims.json of
        `interp reproduce parity --quick --no-train` on them must say (`truthful`)."""
        from interp.reproduce import claim_module, reproduce
        from interp.reproduce.engine import commit_finished

        reproduce("parity", "quick", base / "out", progress=False, log=lambda _line: None, results=base / "none")
        commit_finished(claim_module("parity"), "quick", base / "out", base / "results")
        reproduce("parity", "quick", base / "check", progress=False, log=lambda _line: None, results=base / "results",
                  train=False)
        return base / "results", truthful(json.loads((base / "check" / "claims.json").read_text()))


def truthful(claims: dict) -> dict:
    """What an edit of committed results must not change in claims.json: the verdicts and every run's row
    and measures (not the wall time of the reproduction itself)."""
    return {"claims": claims["claims"], "runs": claims["runs"], "pending": claims["pending"]}


def hostile_path(rng: random.Random, case: Path) -> str:
    """A path an adversary would give for a file or directory to write (made inside `case`)."""
    (case / "afile").write_text("x")
    kind = rng.choice(["fresh", "file", "under_file", "proc", "sys", "dangling", "loop", "long_name", "long_path",
                       "empty", "blank", "nul", "dash", "dot", "devnull", "fifo", "link_dir", "unwritable",
                       "tilde", "nested_fresh", "newline"])
    made = {"dangling": lambda: (case / "dangling").symlink_to(case / "nowhere"),
            "loop": lambda: (case / "loop").symlink_to(case / "loop"),
            "fifo": lambda: os.mkfifo(case / "fifo"),
            "link_dir": lambda: ((case / "elsewhere").mkdir(), (case / "link_dir").symlink_to(case / "elsewhere")),
            "unwritable": lambda: ((case / "ro").mkdir(), (case / "ro").chmod(0o500))}
    if kind in made and not os.path.lexists(case / {"unwritable": "ro"}.get(kind, kind)):
        made[kind]()
    return {"fresh": "out", "file": "afile", "under_file": "afile/sub", "proc": "/proc/self/fuzz-out",
            "sys": "/sys/fuzz-out", "dangling": "dangling", "loop": "loop/x", "long_name": "n" * 300,
            "long_path": "/".join(["p" * 200] * 25), "empty": "", "blank": "  ", "nul": "a\0b", "dash": "-",
            "dot": ".", "devnull": "/dev/null", "fifo": "fifo", "link_dir": "link_dir/run", "unwritable": "ro/run",
            "tilde": "~/run", "nested_fresh": "a/b/c/run", "newline": "line\nbreak"}[kind]


NEW_KINDS = ("hostile_config", "nan_weights", "linked_output")   # issue 38's run-directory categories


def nan_weights(weights: Path, state: Path, rng: random.Random) -> None:
    """One floating tensor of a checkpoint set to NaN, its digest in trainer_state.json updated (so that
    only the values are hostile, not the file's integrity)."""
    from safetensors.torch import load_file, save_file

    from models.storage.paths import sha256_of

    tensors = load_file(weights)
    name = rng.choice(sorted(k for k, v in tensors.items() if v.is_floating_point()))
    tensors[name] = tensors[name].clone().fill_(float("nan"))
    save_file(tensors, weights, metadata={"format": "pt"})
    saved = json.loads(state.read_text())
    saved["sha256"]["model.safetensors"] = sha256_of(weights)
    state.write_text(json.dumps(saved))


def link_output(path: Path, outside: Path) -> None:
    """path (an output a command writes) made a link to a victim file in outside/."""
    victim = outside / f"victim-{path.name}"
    victim.write_text("the victim: an output written through a link would change it")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(victim)


def hostile_run(rng: random.Random, case: Path, sandbox: Sandbox, command: str, categories: list) -> str:
    """A run directory (a copy of the pristine one that fits the command) with one hostile change,
    or a hostile path; links point into case/outside. Appends the change's category to `categories`."""
    if rng.random() < 0.4:
        categories.append("path")
        return hostile_path(rng, case)
    source = sandbox.runs[RUN_OF.get(command, "c2")]
    label = f"run{len(list(case.glob('run*')))}"
    run = case / label
    shutil.copytree(source, run, symlinks=True)
    outside = case / "outside" / label
    outside.mkdir(parents=True)
    step = next((run / "checkpoints").iterdir())
    targets = {"config": run / "config.json", "pointer": run / "checkpoint.json", "metrics": run / "metrics.jsonl",
               "state": step / "trainer_state.json", "weights": step / "model.safetensors"}
    kind = rng.choice(NEW_KINDS) if rng.random() < 0.35 else \
        rng.choice(["intact", "link_file", "link_checkpoints", "fifo", "devzero", "climbing", "absolute", "corrupt",
                    "missing", "empty_dir", "run_link", "truncated_weights", "directory"])
    categories.append(kind if kind in NEW_KINDS else "run")
    name = rng.choice(sorted(targets))
    if kind == "hostile_config":
        config = json.loads(targets["config"].read_text())
        config["model"][rng.choice(SIZE_FIELDS)] = rng.choice(HOSTILE_SIZES)
        targets["config"].write_text(json.dumps(config))
    elif kind == "nan_weights":
        nan_weights(targets["weights"], targets["state"], rng)
    elif kind == "linked_output":
        link_output(run / rng.choice(OUTPUTS.get(command, ["report.html"])), outside)
    elif kind == "link_file":
        shutil.move(targets[name], outside / name)
        targets[name].symlink_to(outside / name)
    elif kind == "link_checkpoints":
        shutil.move(run / "checkpoints", outside / "checkpoints")
        (run / "checkpoints").symlink_to(outside / "checkpoints")
    elif kind == "fifo":
        targets[name].unlink()
        os.mkfifo(targets[name])
    elif kind == "devzero":
        targets[name].unlink()
        targets[name].symlink_to("/dev/zero")
    elif kind in ("climbing", "absolute"):
        copy = outside / "copy"
        shutil.copytree(source, copy)
        target = next((copy / "checkpoints").iterdir())
        path = os.path.relpath(target, run) if kind == "climbing" else str(target)
        (run / "checkpoint.json").write_text(json.dumps({"step": 2, "path": path}))
    elif kind == "corrupt":
        targets[name].write_bytes(rng.choice([b"", b"{", b"\xff\xfe", b"[]", b'{"model": 3}', b"null"]))
    elif kind == "missing":
        targets[name].unlink()
    elif kind == "empty_dir":
        shutil.rmtree(run)
        run.mkdir()
    elif kind == "run_link":
        shutil.move(run, case / f"real_{label}")
        run.symlink_to(case / f"real_{label}")
    elif kind == "truncated_weights":
        data = targets["weights"].read_bytes()
        targets["weights"].write_bytes(data[:len(data) // 2])
    elif kind == "directory":
        targets[name].unlink()
        targets[name].mkdir()
    return label


def base_argv(command: str, sandbox: Sandbox) -> list[str]:
    return {
        "demo": ["demo", "--quick", "--no-progress", "--out", "out"],
        "train": ["train", "--model", "tanh_rnn", "--task", "C2", "--steps", "2", "--out", "out", "--no-progress",
                  *TINY],
        "sweep": ["sweep", str(sandbox.spec), "--out", "out", "--no-progress", "--no-report"],
        "sample-efficiency": ["sample-efficiency", "--models", "lstm", "--tasks", "Z5", "--formats", "acot",
                              "--max-length", "2", "--lrs", "0.01", "--seeds", "0", "--steps", "1", "--n0", "2",
                              "--n-max", "4", "--batch-size", "2", "--val-size", "2", "--out", "out",
                              "--no-progress", "--no-report"],
        "reproduce": ["reproduce", "parity", "--quick", "--no-progress", "--out", "out"],
    }.get(command, [command, "run", *RUN_ARGS.get(command, [])])


def replace(argv: list[str], flag: str, value: str | None) -> list[str]:
    """argv with flag's value set (appended when absent), or the flag alone (value None)."""
    if flag in argv and value is not None and argv.index(flag) + 1 < len(argv) \
            and not argv[argv.index(flag) + 1].startswith("--"):
        argv = list(argv)
        argv[argv.index(flag) + 1] = value
        return argv
    return [*argv, flag] if value is None else [*argv, flag, value]


HUGE = {"1e8", "1e9", "100000000", "73786976294838206464", "1000000000", "1000000000000", "1e12"}
PRIORITY = ("edited_results", "hostile_config", "nan_weights", "linked_output", "huge_flag")   # issue 38's categories


@dataclasses.dataclass
class Case:
    """One argv, the categories of its hostile parts, its deadline and, for a case whose exit 0 may hide
    a wrong answer, check(case_dir) -> what is wrong (None: nothing)."""

    argv: list[str]
    categories: list[str]
    deadline: int = DEADLINE_S
    check: Callable[[Path], str | None] | None = None

    @property
    def category(self) -> str:
        return next((c for c in PRIORITY if c in self.categories), "other")


def make_case(rng: random.Random, case: Path, sandbox: Sandbox) -> Case:
    """One hostile argv: the command's valid arguments with 1-3 replaced, sometimes one unknown flag,
    sometimes a --resume of a copied run, a linked output, or (reproduce) edited committed results."""
    command = rng.choice(sorted(FLAGS))
    if command == "reproduce" and rng.random() < 0.4:
        return edited_results_case(rng, case, sandbox)
    categories: list[str] = []
    argv = base_argv(command, sandbox)
    if "run" in argv:
        argv[1] = hostile_run(rng, case, sandbox, command, categories) if rng.random() < 0.7 else \
            shutil.copytree(sandbox.runs[RUN_OF.get(command, "c2")], case / "run").name
    if command == "demo" and rng.random() < 0.3:
        (case / "outside" / "demo").mkdir(parents=True)
        link_output(case / "out" / rng.choice(["report.html", "summary.json"]), case / "outside" / "demo")
        categories.append("linked_output")
    if command == "train" and rng.random() < 0.2:   # resume or extend a copied run
        shutil.copytree(sandbox.runs["c2"], case / "out")
        argv = [*argv, "--resume"] if rng.random() < 0.5 else replace([*argv, "--resume"], "--steps", "3")
    hostile_run_only = any(c in NEW_KINDS for c in categories) and rng.random() < 0.7   # the run is the attack
    for _ in range(0 if hostile_run_only else rng.randint(1, 3)):
        flag, kind = rng.choice(sorted(FLAGS[command].items()))
        value = {"number": lambda: rng.choice(NUMBERS), "path": lambda: hostile_path(rng, case),
                 "text": lambda: rng.choice(TEXTS),
                 "run": lambda: hostile_run(rng, case, sandbox, command, categories),
                 "spec": lambda: rng.choice([hostile_path(rng, case), str(sandbox.spec)]),
                 "flag": lambda: None}[kind]()
        if flag in ("run_dir", "spec", "name"):
            argv = [argv[0], value, *argv[2:]] if value is not None else argv
        elif kind == "number" and flag in ("--lengths", "--lrs", "--seeds") and rng.random() < 0.5:
            value = f"{rng.choice(NUMBERS)},{rng.choice(NUMBERS)}"
            argv = replace(argv, flag, value)
        else:
            argv = replace(argv, flag, value)
        if kind == "number" and any(part in HUGE for part in str(value).split(",")):
            categories.append("huge_flag")
    if rng.random() < 0.1:
        argv = [*argv, rng.choice(["--stpes", "--outt", "--bogus", "--lenghts", "-x", "--out=" + "q" * 300])]
    return Case(argv, categories, SIZE_DEADLINE_S if "hostile_config" in categories else DEADLINE_S)


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def number_leaves(data, path=()) -> list[tuple]:
    """The key paths of every number (not a bool) inside nested dicts and lists."""
    if isinstance(data, dict):
        return [leaf for key, value in data.items() for leaf in number_leaves(value, (*path, key))]
    if isinstance(data, list):
        return [leaf for index, value in enumerate(data) for leaf in number_leaves(value, (*path, index))]
    return [path] if isinstance(data, (int, float)) and not isinstance(data, bool) else []


def nudge_measure(cache: dict, rng: random.Random) -> None:
    """One number of a measurement cache moved by 0.5 (an agreement, an accuracy, a restoration ...)."""
    *parents, last = rng.choice(number_leaves(cache["measures"]))
    holder = cache["measures"]
    for key in parents:
        holder = holder[key]
    holder[last] += 0.5


def flip_weights(run: Path) -> None:
    data = bytearray((run / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (run / "model.safetensors").write_bytes(bytes(data))
    edit_json(run / "config.json", lambda config: config.pop("weights_sha256", None))


def link_outcome(run: Path, outside: Path) -> None:
    shutil.move(run / "outcome.json", outside / "outcome.json")
    edit_json(outside / "outcome.json", lambda o: o.update(in_distribution=0.999))
    (run / "outcome.json").symlink_to(outside / "outcome.json")


RESULT_EDITS = {  # name -> edit(committed run directory, outside, rng): what an adversary changes after the commit
    "outcome_status": lambda run, _o, _r: edit_json(run / "outcome.json", lambda o: o.update(
        status="did not fit" if o["status"] == "fit" else "fit", in_distribution=0.999)),
    "outcome_length": lambda run, _o, _r: edit_json(run / "outcome.json", lambda o: o.update(
        length_reached=o["length_reached"] + 1)),
    "measures": lambda run, _o, rng: edit_json(run / "reproduce.json", lambda cache: nudge_measure(cache, rng)),
    "weights_digest": lambda run, _o, _r: edit_json(run / "config.json", lambda c: c.pop("weights_sha256", None)),
    "flipped_weights": lambda run, _o, _r: flip_weights(run),
    "config_lr": lambda run, _o, _r: edit_json(run / "config.json", lambda c: c["train"].update(lr=c["train"]["lr"] * 2)),
    "metrics": lambda run, _o, _r: (run / "metrics.jsonl").write_text((run / "metrics.jsonl").read_text() + "{}\n"),
    "added_file": lambda run, _o, _r: (run / "early_stop.json").write_text(json.dumps({"step": 1})),
    "linked_outcome": lambda run, outside, _r: link_outcome(run, outside),
}


def edited_results_case(rng: random.Random, case: Path, sandbox: Sandbox) -> Case:
    """`interp reproduce parity --quick --no-train --results R` on a copy of committed runs with one edit:
    it must refuse in one line or print what the unedited runs give (claims.json compared)."""
    results, truth = sandbox.results, sandbox.truth
    copy = Path(shutil.copytree(results, case / "results"))
    outside = case / "outside" / "results"
    outside.mkdir(parents=True)
    label, edit = rng.choice(sorted(p.name for p in copy.iterdir())), rng.choice(sorted(RESULT_EDITS))
    RESULT_EDITS[edit](copy / label, outside, rng)

    def check(case_dir: Path) -> str | None:
        saved = case_dir / "out" / "claims.json"
        if not saved.is_file():
            return f"exit 0 after the edit {edit} of {label} but no claims.json"
        if truthful(json.loads(saved.read_text())) != truth:
            return f"the edit {edit} of {label} was accepted: claims.json differs from the unedited runs'"
        return None

    argv = ["reproduce", "parity", "--quick", "--no-train", "--no-progress", "--out", "out", "--results", "results"]
    return Case(argv, ["edited_results"], DEADLINE_S, check)


class Reached(Exception):
    """`interp reproduce` got as far as starting the reproduction."""


class InlineExecutor:
    """The sweep executor of the fuzz: every trial in this process, one after another."""

    def run(self, fn, jobs, on_done) -> None:
        from interp.sweep.executors import Outcome, execute

        for job in jobs:
            status, payload = execute(fn, job.params, job.run_dir)
            on_done(Outcome(job, payload, None) if status == "ok" else Outcome(job, None, payload))

    def close(self) -> None:
        pass


@contextlib.contextmanager
def stubbed():
    """Training stops after one step, sweeps run inline, reproductions stop before they start."""
    import interp.cli.reproduce as cli_reproduce
    import interp.reproduce as reproduce_package
    from interp.sweep import executors
    from interp.training import train as train_module

    patch = pytest.MonkeyPatch()
    real_train, real_executor = train_module._train, executors.make_executor

    def one_step(model_config, task, cfg, run_dir, resume, stop_at, progress, label):
        return real_train(model_config, task, cfg, run_dir, resume, 1, progress, label)

    def inline(name, workers=1, max_retries=2, **options):
        real_executor("local" if name == "ray" else name, workers, max_retries)   # its checks
        return InlineExecutor()

    real_reproduce = reproduce_package.reproduce

    def reached(*args, **kwargs):
        if kwargs.get("results") is not None and kwargs.get("train") is False:
            return real_reproduce(*args, **kwargs)    # an edited-results case: committed runs only, quick
        raise Reached

    patch.setattr(train_module, "_train", one_step)
    patch.setattr(executors, "make_executor", inline)
    patch.setattr(reproduce_package, "reproduce", reached)
    if hasattr(cli_reproduce, "reproduce"):
        patch.setattr(cli_reproduce, "reproduce", reached)
    try:
        yield
    finally:
        patch.undo()


def snapshot(directory: Path) -> list:
    """What an escape would change: every file's path, size, mtime and mode (links not followed)."""
    if not directory.exists():
        return []
    return sorted((str(p), p.lstat().st_size, p.lstat().st_mtime_ns, p.lstat().st_mode) for p in directory.rglob("*"))


class DeadlinePassed(BaseException):
    """A case ran past its deadline. A BaseException: the CLI's `except OSError` (which TimeoutError is)
    or `except Exception` must not turn a hang into a one-line error."""


@contextlib.contextmanager
def deadline(seconds: int):
    def expired(*_):
        raise DeadlinePassed(f"past the {seconds} s deadline")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run_case(spec: Case, case: Path) -> tuple[str, str]:
    """(outcome, detail): outcome "ok", "traceback", "lines", "hang", "escape" or "silent" (an exit 0
    whose output the case's check finds wrong; "harness" when the case could not be made)."""
    from interp.cli import main

    before = snapshot(case / "outside")
    stderr = io.StringIO()
    cwd = os.getcwd()
    os.chdir(case)
    status = None
    try:
        with deadline(spec.deadline), contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            try:
                status = main(spec.argv)
            except SystemExit as exit:
                status = exit.code
            except Reached:
                pass
    except DeadlinePassed as error:
        return "hang", str(error)
    except Exception as error:  # noqa: BLE001 - what the fuzz counts
        frames = traceback.extract_tb(error.__traceback__)
        where = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(frames) if "/interp/" in f.filename
                      or "/models/" in f.filename), "?")
        return "traceback", f"{type(error).__name__} at {where}: {str(error)[:200]}"
    finally:
        os.chdir(cwd)
    lines = [line for line in stderr.getvalue().splitlines() if line.strip()]
    if any("Traceback (most recent call last)" in line for line in lines):
        return "traceback", "printed: " + lines[-1][:200]
    if len(lines) > 1:
        return "lines", " | ".join(line[:120] for line in lines[:3])
    if snapshot(case / "outside") != before:
        return "escape", "a file outside the case's run changed"
    wrong = spec.check(case) if spec.check is not None and status == 0 else None
    if wrong:
        return "silent", wrong
    return "ok", lines[0][:200] if lines else ""


@contextlib.contextmanager
def memory_cap(limit: int):
    """The process's address space capped at `limit` bytes (a huge allocation fails, as it would on a
    small machine, instead of filling this one), restored after."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    capped = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (capped, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def fuzz(n: int, seed: int = 0, root: Path | None = None, log=None) -> collections.Counter:
    """Run n cases; returns the count of each (category, outcome) (log(case, case spec, outcome, detail)
    for each failure)."""
    os.environ["INTERP_PROGRESS"] = "0"
    root = Path(tempfile.mkdtemp(prefix="interp-fuzz-")) if root is None else root
    counts: collections.Counter = collections.Counter()
    try:
        sandbox = Sandbox(root)
        rng = random.Random(seed)
        with stubbed(), memory_cap(MEMORY_CAP):
            for index in range(n):
                case = root / f"case-{index}"
                case.mkdir()
                try:
                    spec = make_case(rng, case, sandbox)
                except OSError as error:   # the harness's own mistake: counted apart, never as the CLI's
                    spec, (outcome, detail) = Case([], ["harness"]), ("harness", repr(error))
                else:
                    outcome, detail = run_case(spec, case)
                counts[spec.category, outcome] += 1
                if outcome != "ok" and log is not None:
                    log(index, spec, outcome, detail)
                _remove(case)
    finally:
        _remove(root)
    return counts


def by_outcome(counts: collections.Counter) -> dict[str, int]:
    totals: collections.Counter = collections.Counter()
    for (_category, outcome), count in counts.items():
        totals[outcome] += count
    return dict(totals)


def _remove(path: Path) -> None:
    for directory in [path, *path.rglob("*")] if path.exists() else []:
        if directory.is_dir() and not directory.is_symlink():
            directory.chmod(stat.S_IRWXU)
    shutil.rmtree(path, ignore_errors=True)


def one_line_status(argv, capsys) -> tuple[int, str]:
    """(exit status, the one stderr line) of main(argv) within 60 s; fails on more lines or none."""
    from interp.cli import main

    try:
        with deadline(60):
            status = main(argv)
    except SystemExit as exit:
        status = exit.code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, (status, err)
    return status, err[0]


def one_line_error(argv, capsys, *expected) -> None:
    """main(argv) ends with exit status 2 and one stderr line containing every `expected`."""
    status, line = one_line_status(argv, capsys)
    assert status == 2, (status, line)
    assert all(text in line for text in expected), line


@pytest.fixture(scope="module")
def c2_run(tmp_path_factory):
    from interp.cli import main

    out = tmp_path_factory.mktemp("fuzz-cli") / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["train", "--model", "tanh_rnn", "--task", "C2", "--steps", "1", "--out", str(out),
                     "--no-progress", *TINY]) == 0
    return out


LONG_PATH = "/".join(["p" * 200] * 25)   # every name allowed, the whole past PATH_MAX


@pytest.mark.parametrize("argv", [["train", "--model", "tanh_rnn", "--task", "C2", "--steps", "1"],
                                  ["demo", "--quick"], ["reproduce", "parity", "--quick"]])
def test_a_path_past_path_max_is_one_line(argv, tmp_path, capsys, monkeypatch):
    """Found by the fuzz: an OSError 'File name too long' from the --out preflight."""
    monkeypatch.chdir(tmp_path)
    one_line_error([*argv, "--out", LONG_PATH], capsys, "argument --out", "longer than the 4096")


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.isdir("/sys/kernel"), reason="needs root and sysfs")
def test_out_on_a_read_only_file_system_is_one_line(tmp_path, capsys):
    """Found by the fuzz: as root, os.access says /sys is writable; demo and sweep then ended in a raw
    PermissionError when they made the directory."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"kind": "grid", "trial": "sweep_trials:square", "grid": {"x": [1]}}))
    one_line_error(["demo", "--quick", "--out", "/sys/interp-fuzz"], capsys, "argument --out", "/sys/interp-fuzz")
    one_line_error(["sweep", str(spec), "--out", "/sys/interp-fuzz"], capsys, "argument --out", "/sys/interp-fuzz")


@pytest.mark.parametrize("command", ["eval", "drift", "heads", "patch"])
@pytest.mark.parametrize("run_dir", ["n" * 300, LONG_PATH, "a\0b", ""])
def test_a_hostile_run_dir_is_one_line_naming_it(command, run_dir, capsys):
    """Found by the fuzz: a run directory named past NAME_MAX or PATH_MAX was an OSError from the
    first stat (the lock check, or config.json's is_file before); empty or with a NUL it is refused
    while parsing."""
    one_line_error([command, run_dir], capsys, "argument run_dir")


@pytest.mark.parametrize("argv", [["train", "--model", "tanh_rnn", "--task", "C2", "--steps", "1", "--out", "x"],
                                  ["sample-efficiency", "--models", "lstm", "--tasks", "Z5", "--max-length", "2",
                                   "--out", "x"]])
def test_n_layers_past_an_index_is_one_line(argv, capsys, tmp_path, monkeypatch):
    """Found by the fuzz: --n-layers 2**66 was an OverflowError inside ModelConfig (the bounds were
    checked only after the config was built)."""
    monkeypatch.chdir(tmp_path)
    one_line_error([*argv, "--n-layers", str(2 ** 66)], capsys, "argument --n-layers: ", "past the sanity bound 4096")
    assert not (tmp_path / "x").exists()


def test_a_spec_name_too_long_is_one_line(capsys):
    """Found by the fuzz: the spec's is_file() raised OSError 'File name too long'."""
    one_line_error(["sweep", "n" * 300, "--out", "x"], capsys, "spec 'nnn", "cannot be read: File name too long")


@pytest.mark.parametrize("argv,expected", [
    (["eval", "RUN", "--lengths", "100000000", "--n", "2"], "argument --lengths: 100000000 is past the sanity bound"),
    (["eval", "RUN", "--lengths", "60", "--n", "100000000"], "argument --n: 100000000 is past the sanity bound"),
    (["eval", "RUN", "--lengths", "1000", "--n", "10000000"], "argument --n/--lengths: 10000000 sequences of length "
                                                              "1000 need at least 320 GB for their tokens alone"),
    (["drift", "RUN", "--lengths", "4,1000", "--n-drift", "10000000"], "argument --n-drift/--lengths: 10000000 seq"),
])
def test_analysis_sizes_past_memory_are_refused_up_front(c2_run, argv, expected, capsys):
    """Found by the fuzz: `eval --lengths 100000000` ran past its 120 s deadline (and --n 1e8 would end
    in numpy's MemoryError): now refused before anything is sampled."""
    started = time.perf_counter()
    one_line_error([str(c2_run) if a == "RUN" else a for a in argv], capsys, expected)
    assert time.perf_counter() - started < 30


@pytest.mark.fuzz
def test_hostile_cli_cases_end_in_one_line(tmp_path):
    failures = []
    counts = fuzz(FAST_CASES, seed=1, root=tmp_path / "fuzz", log=lambda *case: failures.append(case))
    assert by_outcome(counts).get("ok") == FAST_CASES, (dict(counts), failures[:5])


if __name__ == "__main__":
    cases, seed = int(sys.argv[1]) if len(sys.argv) > 1 else 3000, int(sys.argv[2]) if len(sys.argv) > 2 else 0
    sys.path.insert(0, str(Path(__file__).parent))   # sweep_trials
    started = time.perf_counter()
    found = fuzz(cases, seed, log=lambda index, spec, outcome, detail: print(
        f"case {index} [{spec.category}] {outcome}: {detail[:300]}\n    argv "
        f"{[a if len(a) < 60 else a[:40] + '...' for a in spec.argv]!r}", flush=True))
    print(f"{cases} cases in {time.perf_counter() - started:.0f} s: {by_outcome(found)}")
    for category in sorted({c for c, _ in found}):
        print(f"  {category}: {dict((o, n) for (c, o), n in sorted(found.items()) if c == category)}")
