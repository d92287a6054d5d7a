"""`interp patch RUN_DIR`: the interchange grid of a run trained on a retrieval task (AR, MQAR, ATR).

Clean examples of the run's task at its training length, each corrupted (`--corrupt key`: the
queried key swapped out of the context; `value`: the queried value swapped, AR / MQAR), and
every site of hooks x positions x layers patched from the clean run: exactly (`interchange`),
to first order (`attribute`: one clean forward, one corrupted forward and one backward), or
both side by side with their agreement (`agreement`). Prints the sites of largest mean
restoration; writes an HTML report (default RUN_DIR/patch.html) and the per-site table as CSV
beside it. Kept free of heavy imports so `interp --help` stays fast.

Your own prompts: `interp patch MODEL_DIR --prompts FILE.jsonl [--tokenizer DIR]` patches clean /
corrupted prompt pairs of a prompt file (interp.prompts: one JSON object per line with "clean",
"corrupted", "answer", "wrong_answer" and optional "roles", "corrupted_roles") on a model directory
(`model.save`, `interp train`) or a transformers checkpoint directory (imported with
models.from_pretrained), tokenized by the tokenizer saved in DIR (default MODEL_DIR's own, which
`model.save` writes for a model with a tokenizer; local files only, no remote code).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from interp.cli.args import (add_scale_out_arguments, check_out, check_workload, device_name, executor_from_args,
                            MAX_SEQUENCES, count, fail, fraction, length_count, output_path, run_directory,
                            seed_value, sequence_count)

MAX_SITES = 1 << 20   # hooks x positions x layers: past any grid's sites
TOP = count(MAX_SITES, "the sites of the largest grid (hooks x positions x layers)")

METHODS = ("both", "exact", "attribution")
DEFAULT_HOOKS = ("hook_resid_pre", "mixer.hook_out", "mixer.hook_state")  # those the model has


def comma_list(text: str) -> list[str]:
    values = [part.strip() for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"must be a comma-separated list; got {text!r}")
    return values


def add_parser(sub) -> None:
    patch = sub.add_parser(
        "patch", help="interchange grid (exact and / or attribution patching) of a retrieval run",
        description="Patch every site (hook x position x layer) of a run trained on AR, MQAR or ATR from "
                    "clean into corrupted examples; report restoration per site, exactly and / or to "
                    "first order, with their agreement. Writes an HTML report and a CSV of site means.")
    patch.add_argument("run_dir", type=run_directory, help="a run directory written by `interp train` (task AR, MQAR or ATR)")
    patch.add_argument("--method", choices=METHODS, default="both",
                       help="exact (interchange), attribution (first-order estimate) or both side by side")
    patch.add_argument("--hooks", type=comma_list, default=None,
                       help="comma-separated hooks: block-relative names (mixer.hook_out), taken in every "
                            "layer, or full names (default: hook_resid_pre, mixer.hook_out and "
                            "mixer.hook_state where the mixer has one)")
    patch.add_argument("--positions", type=comma_list, default="all",
                       help="'all' (every position), or comma-separated roles (key, value, query, answer, "
                            "bos, eos) and integer positions")
    patch.add_argument("--corrupt", choices=("key", "value"), default="key",
                       help="what the corrupted example changes: the queried key (out of context) or its value")
    patch.add_argument("--n", type=sequence_count, default=256, help="clean / corrupted pairs")
    patch.add_argument("--length", type=length_count, default=None,
                       help="key-value pairs per example (default: the run's training length)")
    patch.add_argument("--seed", type=seed_value, default=2, help="seed of the clean examples")
    patch.add_argument("--min-effect", type=fraction, default=0.01,
                       help="keep examples with p_clean - p_corrupt above this")
    patch.add_argument("--top", type=TOP, default=None,
                       help="sites printed, and the k of the screen's top-k recall (default: 8 or every site if fewer)")
    patch.add_argument("--device", type=device_name, default="cpu", help="torch device")
    patch.add_argument("--out", type=output_path, default=None, help="HTML report (default RUN_DIR/patch.html)")
    patch.add_argument("--max-memory", default=None,
                       help="memory budget such as 8GB or 512MiB (default: half the memory available; at most "
                            "the memory available, or the plan would not fit); the grid is planned to fit it and "
                            "refused up front when it cannot")
    patch.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_scale_out_arguments(patch, unit="unit (a chunk of sites x a chunk of examples)")
    patch.add_argument("--chunk", type=chunk_pair, default=None,
                       help="SITES,EXAMPLES per unit of the exact grid (default 128,256); with --executor each "
                            "finished unit is kept in REPORT.units/ beside the report and a rerun skips it")
    add_prompt_arguments(patch)
    patch.set_defaults(func=run)


def add_prompt_arguments(parser) -> None:
    """--prompts, --tokenizer (also `interp circuit`)."""
    parser.add_argument("--prompts", type=run_directory, default=None, metavar="FILE",
                        help="your own clean / corrupted prompt pairs instead of the run's task: a JSONL file, one "
                             "object per line with clean, corrupted, answer, wrong_answer and optional roles, "
                             "corrupted_roles (see interp.prompts); RUN_DIR may then be any model directory or a transformers checkpoint "
                             "directory, and --n, --length, --seed, --corrupt are not used")
    parser.add_argument("--tokenizer", type=run_directory, default=None, metavar="DIR",
                        help="with --prompts: a directory holding a transformers tokenizer (tokenizer.json, ...; "
                             "local files only, no remote code) (default: RUN_DIR's own, which model.save writes "
                             "for a model with a tokenizer)")


def chunk_pair(text: str) -> tuple[int, int]:
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise argparse.ArgumentTypeError(f"must be two positive integers SITES,EXAMPLES; got {text!r}")
    sites, examples = int(parts[0]), int(parts[1])
    if sites > MAX_SITES or examples > MAX_SEQUENCES:
        raise argparse.ArgumentTypeError(f"{text!r} is past the sanity bounds {MAX_SITES},{MAX_SEQUENCES}; "
                                         f"{chunk_pair.limit}")
    return sites, examples


chunk_pair.limit = (f"at most {MAX_SITES},{MAX_SEQUENCES}: a unit's sites and examples past the sites of the "
                    "largest grid (hooks x positions x layers) and the examples bound")


def corruption(task_name: str, how: str):
    """The corruption function of interp.analysis.interventions for this task, or ValueError."""
    from interp.analysis.interventions import corrupt_ar, corrupt_ar_value, corrupt_atr

    table = {("AR", "key"): corrupt_ar, ("MQAR", "key"): corrupt_ar, ("ATR", "key"): corrupt_atr,
             ("AR", "value"): corrupt_ar_value, ("MQAR", "value"): corrupt_ar_value}
    if (task_name, how) not in table:
        allowed = ", ".join(f"{t} with --corrupt {c}" for t, c in table)
        raise ValueError(f"the run's task {task_name!r} has no '--corrupt {how}'; interp patch supports {allowed}")
    return table[(task_name, how)]


def grid(model, hooks: list[str] | None, positions: list[str], batch):
    """The sites of hooks x positions x layers (site_grid checks every hook name; roles are
    checked against the batch's)."""
    from interp.analysis.interventions import site_grid

    names = set(model.hook_names())
    hooks = [h for h in DEFAULT_HOOKS if f"blocks.0.{h}" in names] if hooks is None else hooks
    templates = [h if h in names or "{l}" in h else "blocks.{l}." + h for h in hooks]
    if positions == ["all"]:
        return site_grid(model, templates, list(range(batch.tokens.shape[1])))
    where = [int(p) if p.lstrip("-").isdigit() else p for p in positions]
    unknown = [p for p in where if isinstance(p, str) and p not in batch.roles]
    if unknown:
        raise ValueError(f"--positions: unknown role(s) {unknown}; the task's roles are {sorted(batch.roles)}, "
                         "or give 'all' or integer positions")
    return site_grid(model, templates, where)


def load_pair(args: argparse.Namespace):
    """(run config, pairs, model, clean, corrupt) of a retrieval run: args.n clean examples at
    args.length pairs (default the training length), seed args.seed, corrupted per args.corrupt
    (also read by `interp circuit`); with --prompts, load_prompt_pair's."""
    if args.prompts is not None:
        return load_prompt_pair(args)
    if args.tokenizer is not None:
        raise ValueError("--tokenizer is used with --prompts only")
    import models
    from interp.tasks import make_task
    from interp.training import checkpoint as ckpt

    config = ckpt.read_config(args.run_dir)
    task_name = config["task"]["name"]
    corrupt_fn = corruption(task_name, args.corrupt)
    task = make_task(task_name, **config["task"].get("options", {}))
    pairs = args.length or config["train"]["train_length"]
    check_workload(task, args.n, pairs, "--n", "--length" if args.length else None)
    model = models.load(args.run_dir, device=args.device).eval()
    clean = task.sample(args.n, pairs, seed=args.seed)
    corrupt = corrupt_fn(clean, task, seed=args.seed + 1)
    return config, pairs, model, clean.to(args.device), corrupt.to(args.device)


def load_prompt_pair(args: argparse.Namespace):
    """(facts as a run config has them, number of pairs, model, clean, corrupt) of --prompts: every
    pair of the file, tokenized by --tokenizer's (default RUN_DIR's) tokenizer; args.n is set to
    the number of pairs."""
    from interp.prompts import read_prompts, tokenize_pairs

    pairs = read_prompts(args.prompts)
    tokenizer = load_tokenizer(args.run_dir, args.tokenizer)
    prompts = tokenize_pairs(tokenizer, pairs)
    model = load_model(args.run_dir, args.device)
    vocab = model.cfg.vocab_size
    largest = max(int(prompts.clean.tokens.max()), int(prompts.answers.max()), int(prompts.wrong_answers.max()))
    if largest >= vocab:
        raise ValueError(f"--prompts: the tokenizer gives token ids beyond the model's vocabulary of {vocab}; is it "
                         "the model's tokenizer?")
    args.n = len(pairs)
    config = {"model": {"mixer": model.cfg.mixer}, "task": {"name": f"prompts {args.prompts.name}"}}
    return config, len(pairs), model, prompts.clean.to(args.device), prompts.corrupt.to(args.device)


def load_tokenizer(run_dir: Path, flag: Path | None):
    """The tokenizer saved in --tokenizer's directory `flag`, else in RUN_DIR
    (models.tl.surface.directory_tokenizer: no download, no remote code, file sizes bounded); one
    line naming both options when the one read has none."""
    from models.tl.surface import TOKENIZER_FILES, directory_tokenizer

    directory = run_dir if flag is None else flag
    tokenizer = directory_tokenizer(directory) if directory.is_dir() else None
    if tokenizer is not None:
        return tokenizer
    files = f"(none of {list(TOKENIZER_FILES)})"
    if flag is not None:
        raise ValueError(f"--tokenizer {str(flag)!r} holds no tokenizer {files}; give a directory written by "
                         "tokenizer.save_pretrained, or leave --tokenizer out to read RUN_DIR's own")
    raise ValueError(f"no tokenizer: RUN_DIR {str(run_dir)!r} holds none {files} and no --tokenizer DIR is given; give "
                     "--tokenizer DIR (a directory written by tokenizer.save_pretrained), or save the model with its "
                     "tokenizer (model.save of a model that has one, e.g. models.from_pretrained of a checkpoint "
                     "with tokenizer files)")


def load_model(directory: Path, device: str):
    """A model directory (config.json with a "model" entry: models.load) or a transformers
    checkpoint directory (config.json with a "model_type": models.from_pretrained)."""
    import json

    import models

    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        config = None
    if isinstance(config, dict) and "model_type" in config and "model" not in config:
        return models.from_pretrained(directory).to(device).eval()
    return models.load(directory, device=device).eval()


def units_dir(args: argparse.Namespace) -> Path | None:
    """Where the exact grid keeps its units: REPORT.units/interchange beside the report, when the
    grid runs as units (--executor or --chunk); None otherwise."""
    from models.storage.paths import inside

    if args.executor is None and args.chunk is None:
        return None
    report = args.out or args.run_dir / "patch.html"
    return inside(report.parent, f"{report.stem}.units", "interchange")


def measure(args: argparse.Namespace, executor=None) -> tuple[dict, dict, object]:
    """(setup facts, {method: InterchangeResult}, the clean Batch) of the run; ValueError etc. on bad input."""
    from functools import partial

    from interp.analysis.interventions import attribute, interchange

    check_budget(args.max_memory)
    config, pairs, model, clean, corrupt = load_pair(args)
    task_name = config["task"]["name"]
    sites = grid(model, args.hooks, args.positions, clean)
    top = min(8, len(sites)) if args.top is None else args.top
    if top > len(sites):
        raise ValueError(f"--top must be at most the number of sites ({len(sites)}); got {top}")
    methods = {"exact": partial(interchange, executor=executor, out=units_dir(args), chunk=args.chunk),
               "attribution": attribute}
    chosen = list(methods) if args.method == "both" else [args.method]
    results = {m: methods[m](model, clean, corrupt, sites, min_effect=args.min_effect, metrics=["logit_diff"],
                             max_memory=args.max_memory, progress=not args.no_progress)
               for m in chosen}
    setup = {"mixer": config["model"]["mixer"], "task": task_name, "pairs": pairs, "T": clean.tokens.shape[1],
             "sites": len(sites), "top": top, "prompts": args.prompts}
    return setup, results, clean


def check_budget(max_memory: str | None) -> None:
    """ValueError naming --max-memory when it is not a size, or more than the memory available."""
    from models.memory import available_bytes, budget_bytes, format_bytes

    if max_memory is not None and budget_bytes(max_memory) > available_bytes():
        raise ValueError(f"argument --max-memory: {max_memory} is more than the {format_bytes(available_bytes())} of "
                         "memory available; a plan to that budget would not fit")


def report(args: argparse.Namespace, setup: dict, results: dict, clean) -> Path:
    """The HTML report (interp.report.patch) and its CSV of site means; the report's path."""
    import pandas as pd

    from interp.report.patch import write_patch_report
    from models.storage.writer import write_text

    facts = {**setup, "run_dir": args.run_dir, "n": args.n, "seed": args.seed, "corrupt": args.corrupt,
             "min_effect": args.min_effect}
    path = write_patch_report(args.out or args.run_dir / "patch.html", facts, results, clean,
                              f"Interchange grid: {args.run_dir.name}")
    table = pd.concat([r.to_dataframe().assign(method=m) for m, r in results.items()])
    write_text(path.with_suffix(".csv"), table.to_csv(index=False))   # a link there is replaced, not followed
    return path


def run(args: argparse.Namespace) -> int:
    refused = check_out("patch", args.out or args.run_dir / "patch.html", file=True,
                        flag="--out" if args.out else "run_dir")
    if refused is not None:
        return refused
    from interp.analysis.units import GridFailed
    from models.storage.paths import DirectoryLocked

    executor = None
    try:
        executor = executor_from_args(args, "patch")
        setup, results, clean = measure(args, executor)
        path = report(args, setup, results, clean)
    except (ValueError, TypeError, KeyError, FileNotFoundError, OSError, MemoryError, GridFailed, DirectoryLocked) as error:
        return fail("patch", error)
    finally:
        if executor is not None:
            executor.close()
    first = next(iter(results.values()))
    print(f"{setup['mixer']} on {setup['task']} ({setup['pairs']} pairs, T {setup['T']}): {setup['sites']} sites x "
          f"{args.n} pairs, {first.n_kept} kept (p_clean - p_corrupt > {args.min_effect})")
    for method, result in results.items():
        means = result.mean()
        print(f"{method}: largest mean restoration of p(y)")
        for i in means.nan_to_num(nan=float("-inf")).argsort(descending=True)[:setup["top"]].tolist():
            print(f"  {result.sites[i].label:<40} {float(means[i]):8.3f}")
    print(f"wrote {path} and {path.with_suffix('.csv')}")
    return 0
