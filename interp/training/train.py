"""Training loop: AdamW, warmup then cosine, gradient clipping, an optional length curriculum.

    train(model_config, task, TrainConfig(...), out="runs/x") -> TrainResult

Loss: cross-entropy on the batch's loss_mask positions. Accuracy (progress bar, metrics): the
fraction of loss positions predicted right.

Learning rate at step s (0-based): lr * (s + 1) / warmup during warmup, then a cosine from lr
down to 0 at `steps`: lr * (1 + cos(pi * (s - warmup) / (steps - warmup))) / 2.

Length curriculum (the error-control study): start at `curriculum_start` (2), evaluate the
final-state accuracy at the current length every `eval_every` steps, and after
`curriculum_patience` (k) consecutive evaluations at >= `curriculum_threshold` (95%) double the
length, capped at `train_length`. Off: every batch has length `train_length`.

Finite data (`dataset_size=N`, the sample-efficiency study; `interp.training.data`): N distinct
sequences drawn once (seed `data_seed`) over `lengths` (default [train_length]) in equal shares,
visited in shuffled epochs (order from `seed`) for `steps` steps or `max_epochs` epochs, and a
disjoint validation set of `val_size` sequences. Every `eval_every` steps (and at the last step)
the validation loss (mean cross-entropy over every loss position) is recorded ({"kind": "val"});
the first time it is below `val_threshold` the run has converged: it stops early, and
TrainResult.extra["converged_step"] holds that step (None when it never converged). The default
threshold, 0.01 nats per supervised token, is a probability of about 0.99 on the right answer,
far below the loss of a model unsure of even one position in twenty (ln 2 / 20 = 0.035) and under
1% of chance (ln m >= ln 2); a model past it predicts held-out sequences nearly perfectly, which is
what "learned the task from N examples" should mean. The curriculum is off with finite data.

Determinism: the weights are initialised from `seed`; the batch of step s is
`task.sample(batch_size, length, stream_seed(seed, 0, s))` (with finite data: rows s*B..s*B+B-1
of the epoch stream), so a resumed run reads exactly the
batches an uninterrupted run reads, and on the CPU resuming gives bit-identical weights.

A run directory (see `interp.training.checkpoint`) is written when `out` is given: config.json at the
start, metrics.jsonl appended as records are made, a checkpoint every `checkpoint_every` steps and
at the end (crash-safe: see the checkpoint module). A directory that already holds a run is never
overwritten: with `resume=True` training continues from its last complete checkpoint if the
configs match (metrics.jsonl truncated to that checkpoint), otherwise CheckpointError names the
differences. The run directory is locked while training writes into it (`models.storage.paths.locked`):
a second `train` on it (two resumes at once) raises DirectoryLocked naming the holder's pid. A new
run directory is created already locked (locked(..., create=True)), so an `interp eval` or
`interp drift` started in the first moments of a run is refused too, not let write into it.
Before anything is created, `interp.training.preflight` refuses sizes past sanity bounds, a run
whose estimated memory exceeds what is available, and an output path that cannot be a writable
directory (preflight.Refused, a ValueError naming the field).

Extending a run: `resume=True` with a larger `cfg.steps` (and nothing else changed) continues a
finished (or interrupted) run to the new total. The steps already taken keep the learning rates
they had; every later step s follows the schedule of the new total, learning_rate(s, cfg) with
cfg.steps = the new total (so after a finished run the rate rises from ~0 to that cosine's value
at s and decays to 0 at the new end). config.json is rewritten atomically with the new steps and
an "extensions" entry {"at_step", "from_steps", "to_steps"} before training continues; fewer steps
than before are refused.
A NaN or Inf loss (or gradient norm) stops training with TrainingDiverged; the last good
checkpoint stays on disk untouched.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from interp.training import checkpoint as ckpt
from interp.training.data import FiniteData, validation_loss
from interp.training.evaluate import TRAIN_STREAM, final_state_accuracy, stream_seed
from interp.training.preflight import preflight
from interp.tasks.base import Batch, Task
from models.storage import writer
from models.backbone import SequenceModel
from models.config import ModelConfig
from models.devices import check_device
from models.storage.paths import LOCK, locked


class TrainingDiverged(RuntimeError):
    """The loss or gradient norm became NaN or Inf."""


@dataclass
class TrainConfig:
    """Training hyperparameters (JSON round-trippable; recorded in config.json["train"])."""

    steps: int = 1000
    batch_size: int = 64
    lr: float = 3e-3
    weight_decay: float = 0.01
    warmup: int = 50
    grad_clip: float = 1.0
    train_length: int = 60
    curriculum: bool = False
    curriculum_start: int = 2
    curriculum_patience: int = 2
    curriculum_threshold: float = 0.95
    eval_every: int = 25
    eval_size: int = 256
    log_every: int = 10
    checkpoint_every: int = 500
    seed: int = 0
    device: str = "cpu"
    dataset_size: int | None = None
    val_size: int = 256
    lengths: list[int] | None = None
    data_seed: int = 0
    val_threshold: float = 0.01
    max_epochs: int | None = None

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "train_length", "curriculum_start", "curriculum_patience",
                     "eval_every", "eval_size", "log_every", "checkpoint_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"TrainConfig.{name} must be a positive int; got {value!r}")
        for name in ("warmup", "seed"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"TrainConfig.{name} must be a non-negative int; got {value!r}")
        for name in ("lr", "grad_clip"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
                raise ValueError(f"TrainConfig.{name} must be a positive finite number; got {value!r}")
        number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
        if not number(self.weight_decay) or not 0 <= self.weight_decay < math.inf:
            raise ValueError(f"TrainConfig.weight_decay must be a non-negative number; got {self.weight_decay!r}")
        if not number(self.curriculum_threshold) or not 0 < self.curriculum_threshold <= 1:
            raise ValueError(f"TrainConfig.curriculum_threshold must be in (0, 1]; got {self.curriculum_threshold!r}")
        if not isinstance(self.curriculum, bool):
            raise TypeError(f"TrainConfig.curriculum must be a bool; got {self.curriculum!r}")
        for name in ("dataset_size", "max_epochs"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"TrainConfig.{name} must be None or a positive int; got {value!r}")
        if not isinstance(self.val_size, int) or isinstance(self.val_size, bool) or self.val_size < 1:
            raise ValueError(f"TrainConfig.val_size must be a positive int; got {self.val_size!r}")
        if not isinstance(self.data_seed, int) or isinstance(self.data_seed, bool) or self.data_seed < 0:
            raise ValueError(f"TrainConfig.data_seed must be a non-negative int; got {self.data_seed!r}")
        if not number(self.val_threshold) or not 0 < self.val_threshold < math.inf:
            raise ValueError(f"TrainConfig.val_threshold must be a positive number; got {self.val_threshold!r}")
        if self.lengths is not None:
            if (not isinstance(self.lengths, (list, tuple)) or not self.lengths
                    or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in self.lengths)):
                raise ValueError(f"TrainConfig.lengths must be None or a non-empty list of positive ints; "
                                 f"got {self.lengths!r}")
            self.lengths = sorted(set(self.lengths))
        if self.dataset_size is None and (self.lengths is not None or self.max_epochs is not None):
            raise ValueError("TrainConfig.lengths and max_epochs need finite data: set dataset_size")
        if self.dataset_size is not None and self.curriculum:
            raise ValueError("TrainConfig.curriculum cannot be combined with dataset_size (finite data)")
        if self.warmup >= self.steps:
            raise ValueError(f"TrainConfig.warmup ({self.warmup}) must be smaller than steps ({self.steps})")
        check_device(self.device, "TrainConfig.device")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown TrainConfig fields {sorted(unknown)}; valid: {sorted(names)}")
        return cls(**data)


@dataclass
class TrainResult:
    model: SequenceModel
    step: int
    metrics: list[dict[str, Any]]
    run_dir: Path | None
    seconds: float = 0.0
    final_length: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    start_step: int = 0   # the step a resumed run started from (0 for a fresh run)


def learning_rate(step: int, cfg: TrainConfig) -> float:
    """Learning rate for 0-based step `step`: linear warmup, then cosine to 0 at cfg.steps."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices (dim >= 2) only, not on biases and norm gains, nor on
    parameters marked `_no_weight_decay` (SSM decay rates such as Mamba's A_log, as in mamba_ssm)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decayed = lambda p: p.dim() >= 2 and not getattr(p, "_no_weight_decay", False)  # noqa: E731
    decay = [p for p in params if decayed(p)]
    no_decay = [p for p in params if not decayed(p)]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.lr)


def masked_loss(logits: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(cross-entropy, accuracy) over loss_mask positions; logits [N, T, V]."""
    mask = batch.loss_mask
    selected, targets = logits[mask], batch.targets[mask]                      # [M, V], [M]
    loss = F.cross_entropy(selected, targets)
    accuracy = (selected.argmax(-1) == targets).float().mean()
    return loss, accuracy


def task_record(task: Task) -> dict[str, Any]:
    options = task.options() if hasattr(task, "options") else {}
    return {"name": task.name, "options": options}


def train(model_config: ModelConfig, task: Task, cfg: TrainConfig, out: str | Path | None = None, *,
          resume: bool = False, stop_at: int | None = None, progress: bool = True,
          label: str = "train") -> TrainResult:
    """Train a model built from `model_config` on `task`; see the module docstring.

    stop_at: stop (with a checkpoint) after this many steps although cfg.steps is larger; a later
    call with resume=True finishes the run as if never interrupted.
    """
    if not isinstance(model_config, ModelConfig):
        raise TypeError(f"model_config must be a ModelConfig; got {type(model_config).__name__}")
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"cfg must be a TrainConfig; got {type(cfg).__name__}")
    if model_config.vocab_size < task.vocab_size:
        raise ValueError(f"model_config.vocab_size ({model_config.vocab_size}) is smaller than the "
                         f"task's vocab_size ({task.vocab_size})")
    if stop_at is not None and (not isinstance(stop_at, int) or isinstance(stop_at, bool) or stop_at < 1):
        raise ValueError(f"stop_at must be None or a positive int; got {stop_at!r}")
    preflight(model_config, cfg, out)
    if out is None:
        return _train(model_config, task, cfg, None, resume, stop_at, progress, label)
    run_dir = _check_run_dir(Path(out))
    with locked(run_dir, "run directory", create=True):   # made already locked: never open to another writer
        return _train(model_config, task, cfg, run_dir, resume, stop_at, progress, label)


def _check_run_dir(run_dir: Path) -> Path:
    """run_dir, unless it exists and is not a directory (ValueError)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"out {str(run_dir)!r} exists and is not a directory")
    return run_dir


def _train(model_config: ModelConfig, task: Task, cfg: TrainConfig, run_dir: Path | None, resume: bool,
           stop_at: int | None, progress: bool, label: str) -> TrainResult:
    """The training loop of `train` (arguments checked; run_dir created and locked by the caller)."""
    end = min(cfg.steps, stop_at or cfg.steps)
    torch.manual_seed(cfg.seed)
    model = SequenceModel(model_config).to(cfg.device)
    optimizer = make_optimizer(model, cfg)
    state = {"length": cfg.curriculum_start if cfg.curriculum else cfg.train_length, "streak": 0,
             "sums": [0.0, 0.0, 0]}
    step, records, log = 0, [], None
    data = final = None
    if cfg.dataset_size is not None:
        data = FiniteData.build(task, cfg.lengths or [cfg.train_length], cfg.dataset_size, cfg.val_size, cfg.data_seed)
        final = min(cfg.steps, math.ceil(cfg.max_epochs * data.n_train / cfg.batch_size) if cfg.max_epochs else cfg.steps)
        end = min(end, final)
    if run_dir is not None:
        config = ckpt.make_config(model_config.to_dict(), task_record(task), cfg.to_dict(), cfg.seed)
        step, records, state, log = _open_run_dir(run_dir, config, model, optimizer, resume, state)

    def record(entry: dict[str, Any]) -> None:
        records.append(entry)
        if log is not None:
            log.append(entry)
    state["length"] = min(state["length"], cfg.train_length)
    converged = next((r["step"] for r in records if r["kind"] == "val" and r["converged"]), None)
    if converged is not None:
        end = step
    last_saved = start_step = step

    started = time.perf_counter()
    bar = _progress_bar(cfg.steps, step, progress, label)
    model.train()
    try:
        while step < end:
            batch = (data.batch(step, cfg.batch_size, cfg.seed) if data is not None else
                     task.sample(cfg.batch_size, state["length"], stream_seed(cfg.seed, TRAIN_STREAM, step)))
            batch = batch.to(cfg.device)
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, cfg)
            loss, accuracy = masked_loss(model(batch.tokens), batch)
            if not torch.isfinite(loss):
                raise TrainingDiverged(_diverged_message("loss", loss, step, run_dir, last_saved))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            if not torch.isfinite(norm):
                raise TrainingDiverged(_diverged_message("gradient norm", norm, step, run_dir, last_saved))
            optimizer.step()
            step += 1
            sums = state["sums"]  # [loss sum, accuracy sum, count] since the last log record
            sums[0] += loss.item()
            sums[1] += accuracy.item()
            sums[2] += 1
            if step % cfg.log_every == 0 or step == cfg.steps:
                record({"kind": "train", "step": step, "loss": sums[0] / sums[2],
                                "accuracy": sums[1] / sums[2], "lr": learning_rate(step - 1, cfg),
                                "length": state["length"], "time": time.perf_counter() - started})
                state["sums"] = [0.0, 0.0, 0]
                bar.set_postfix(loss=f"{records[-1]['loss']:.4f}", acc=f"{records[-1]['accuracy']:.3f}",
                                len=state["length"], refresh=False)
            if data is not None and (step % cfg.eval_every == 0 or step == final):
                converged = _validate(model, data, cfg, step, record)
                end = step if converged is not None else end
            elif data is None and (step % cfg.eval_every == 0 or step == cfg.steps):
                _evaluate_and_advance(model, task, cfg, step, state, record)
                model.train()
            bar.update(1)
            if run_dir is not None and (step % cfg.checkpoint_every == 0 or step == end):
                ckpt.save_checkpoint(run_dir, model, optimizer, step, extra=_extra(state), metrics=log)
                last_saved = step
    finally:
        bar.close()
        if log is not None:
            log.close()
    extra = {"converged_step": converged, "n_train": data.n_train, "data": data.summary()} if data is not None else {}
    return TrainResult(model, step, records, run_dir, time.perf_counter() - started, state["length"], extra,
                       start_step)


def _validate(model, data: FiniteData, cfg: TrainConfig, step: int, record) -> int | None:
    """Record (record(entry)) the validation loss and accuracy; `step` if the loss is below
    cfg.val_threshold."""
    model.eval()
    loss, accuracy = validation_loss(model, data.val.to(cfg.device))
    model.train()
    converged = loss < cfg.val_threshold
    record({"kind": "val", "step": step, "loss": loss, "accuracy": accuracy, "converged": converged})
    return step if converged else None


def _evaluate_and_advance(model, task, cfg: TrainConfig, step: int, state: dict, record) -> None:
    """Evaluate final-state accuracy at the current length (record(entry) keeps it); advance the
    curriculum."""
    model.eval()
    accuracy = final_state_accuracy(model, task, state["length"], cfg.eval_size, cfg.seed, cfg.device)
    record({"kind": "eval", "step": step, "length": state["length"], "accuracy": accuracy})
    if not cfg.curriculum or state["length"] >= cfg.train_length:
        return
    state["streak"] = state["streak"] + 1 if accuracy >= cfg.curriculum_threshold else 0
    if state["streak"] >= cfg.curriculum_patience:
        state["length"] = min(2 * state["length"], cfg.train_length)
        state["streak"] = 0


def _extra(state: dict) -> dict:
    return {"curriculum_length": state["length"], "curriculum_streak": state["streak"],
            "log_sums": list(state["sums"])}


def _open_run_dir(run_dir: Path, config: dict, model, optimizer, resume: bool, state: dict):
    """Create the run directory, or reopen an existing one for resuming (configs must match, but
    for a larger train.steps: an extension). Returns (step, records, state, metrics log)."""
    if not (run_dir / ckpt.CONFIG).exists():
        leftovers = writer.leftovers(run_dir, ckpt.CONFIG)  # a crash while config.json was written
        if set(run_dir.iterdir()) - set(leftovers) - {run_dir / LOCK}:
            raise FileExistsError(f"out {str(run_dir)!r} is a non-empty directory without a run; "
                                  "refusing to write into it")
        writer.remove_leftovers(run_dir, ckpt.CONFIG)
        ckpt.write_json(run_dir / ckpt.CONFIG, config)
        log, _ = ckpt.open_metrics(run_dir)
        return 0, [], state, log
    old = ckpt.read_config(run_dir)
    old_steps, new_steps = old["train"].get("steps"), config["train"]["steps"]
    differences = [line for line in ckpt.config_differences(old, config, field_defaults())
                   if not line.startswith("train.steps:")]
    if differences:
        raise ckpt.CheckpointError(
            f"{run_dir} holds a run with a different config; refusing to overwrite it. "
            f"Differences (old != new): {'; '.join(differences)}. Use another output directory."
        )
    if not resume:
        raise FileExistsError(
            f"{run_dir} already holds a run with this config; pass resume=True (--resume) to "
            "continue it (with more steps to extend it), or choose another output directory"
        )
    if new_steps < old_steps:
        raise ckpt.CheckpointError(
            f"{run_dir} holds a run of {old_steps} steps; a run can be extended but not shortened "
            f"(steps {new_steps} < {old_steps}). Use another output directory."
        )
    saved = None
    if ckpt.read_pointer(run_dir) is not None or (run_dir / ckpt.STATE).exists():
        saved = ckpt.load_checkpoint(run_dir, model, optimizer)
    ckpt.remove_stale(run_dir)
    if new_steps > old_steps:  # an extension: record it, atomically, before training on
        extensions = old.get("extensions", []) + [
            {"at_step": saved["step"] if saved else 0, "from_steps": old_steps, "to_steps": new_steps}]
        ckpt.write_json(run_dir / ckpt.CONFIG, {**old, "train": config["train"], "extensions": extensions})
    if saved is None:  # config written, no checkpoint yet: start from scratch
        log, _ = ckpt.open_metrics(run_dir)
        return 0, [], state, log
    extra = saved.get("extra", {})
    state = {"length": extra.get("curriculum_length", state["length"]),
             "streak": extra.get("curriculum_streak", 0),
             "sums": list(extra.get("log_sums", [0.0, 0.0, 0]))}
    log, records = ckpt.open_metrics(run_dir, keep=saved["metrics"])
    return saved["step"], records, state, log


def field_defaults() -> dict[str, dict[str, Any]]:
    """{"model": ModelConfig's defaults, "train": TrainConfig's} as JSON values (config.json's form)."""
    out = {}
    for section, cls in (("model", ModelConfig), ("train", TrainConfig)):
        out[section] = {f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())
                        for f in dataclasses.fields(cls)
                        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
    return out


def _diverged_message(what: str, value: torch.Tensor, step: int, run_dir: Path | None, last_saved: int) -> str:
    where = (f"the last good checkpoint (step {last_saved}) is intact in {run_dir}"
             if run_dir is not None and last_saved > 0 else "no checkpoint was written yet")
    return (f"training stopped: the {what} is {value.item()} at step {step + 1}; {where}. "
            "Try a lower lr or a stronger grad_clip.")


def _progress_bar(total: int, initial: int, enabled: bool, label: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, disable=not enabled, desc=label, file=sys.stderr,
                dynamic_ncols=True, leave=False, mininterval=0.5)
