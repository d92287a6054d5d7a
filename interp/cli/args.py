"""Argument types shared by the subcommands (each parses one flag's text or names what is allowed),
the parser class (a user error is one line on stderr, exit status 2) and the help formatter (every
flag shows its default; "{models}" / "{tasks}" / "{reproductions}" in a help text or description
list the choices, looked up only when help is printed).

Parsing stays free of heavy imports (torch, the model registry), so that a mistyped command fails
in a fraction of a second: a flag whose check needs them (`model_name`, `device_name`) is a
`Deferred` type, kept as text until every flag has parsed and checked then (`Parser.parse_args`).
What can be told without them is told at once: an unknown task (`task_spec`), a GPU device on a
Linux machine without one (`device_name`).
A flag the command does not have is named with the closest ones (`--stpes`: did you mean
--steps?) before anything else is checked, so a typo is not reported as a missing flag.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path


class Bounded:
    """An argparse type: a number parsed from the text (int or float) in [low, high] (low excluded
    with low_open), else one line naming what is allowed; `limit` (the upper bound and why it is
    there) is appended to the flag's --help by HelpFormatter. name: the setting named in the
    refusal ("train_length 100000000 is past ..."; default the value alone). sanity=False: the
    bound is the domain's own (a share in [0, 1]), refused as any value outside it."""

    def __init__(self, parse, low: float, high: float, why: str, low_open: bool = False, name: str = "",
                 sanity: bool = True) -> None:
        self.parse, self.low, self.high, self.why, self.low_open, self.name = parse, low, high, why, low_open, name
        self.sanity = sanity
        self.__name__ = parse.__name__   # argparse names a type by it

    @property
    def limit(self) -> str:
        return f"at most {_shown(self.high)}: {self.why}"

    def __call__(self, text: str):
        try:
            value = self.parse(text)
        except (ValueError, OverflowError):
            value = None
        if value is not None and value > self.high and self.sanity:
            raise argparse.ArgumentTypeError(f"{self.name + ' ' if self.name else ''}{value} is past the sanity "
                                             f"bound {_shown(self.high)} ({self.why})")
        if value is None or not (value > self.low if self.low_open else value >= self.low) or not value <= self.high:
            raise argparse.ArgumentTypeError(f"must be {self.allowed}; got {text!r}")   # nan compares False
        return value

    @property
    def allowed(self) -> str:
        if not self.sanity:   # the domain's bounds
            return f"a number in {'(' if self.low_open else '['}{_shown(self.low)}, {_shown(self.high)}]"
        sign = "positive" if self.low_open or self.low >= 1 else "non-negative"   # the lows in use: 0 and 1
        return f"a {sign} integer" if self.parse is int else f"a {sign} finite number"


def _shown(number: float) -> str:
    """4096, 16777216, 0.5: whole numbers without an exponent."""
    return str(int(number)) if float(number).is_integer() else f"{number:g}"


MAX_SEQUENCES = MAX_LENGTH = 1 << 24   # interp.training.preflight.BOUNDS' train_length: past it, a typo
MAX_STEPS = 10 ** 8
MAX_SEED = 2 ** 32 - 1
MAX_WORKERS = 4096
WHY_SEQUENCES = "past it a typo: 16.8M sequences of 60 tokens already hold 32 GB of token arrays"
WHY_LENGTH = "past it a typo: 16.8M positions, the longest training or evaluation length a run allows"
WHY_STEPS = "at 1 ms or more a step, 10^8 steps are more than a day of compute"
WHY_SEED = "32-bit seeds, more than any study runs and within every generator's range (torch's, numpy's)"
WHY_WORKERS = "4096 processes or actors, more than the CPUs of a large Ray cluster"


def count(high: int, why: str, low: int = 1, name: str = "") -> Bounded:
    """An int flag in [low, high]."""
    return Bounded(int, low, high, why, name=name)


def real(low: float, high: float, why: str, low_open: bool = False, sanity: bool = True) -> Bounded:
    """A float flag in [low, high] ((low, high] with low_open)."""
    return Bounded(float, low, high, why, low_open=low_open, sanity=sanity)


class ModelSize:
    """A ModelConfig size flag (--d-model, --n-layers): an int in [1, models.config.FIELD_BOUNDS[field]],
    a Deferred type (checked once every flag has parsed: `models` imports torch) whose bound is read
    only when --help is printed or the value is checked."""

    __name__ = "int"

    def __init__(self, field: str) -> None:
        self.field = field

    def bounded(self) -> Bounded:
        from models.config import FIELD_BOUNDS

        return count(FIELD_BOUNDS[self.field], "models.config.FIELD_BOUNDS, past any real model's", name=self.field)

    @property
    def limit(self) -> str:
        return self.bounded().limit

    def check(self, text: str) -> int:
        return self.bounded()(text)

    def __call__(self, text: str) -> Deferred:
        return Deferred(self.check, text)


BATCH = count(1 << 20, "interp.training.preflight.BOUNDS: past it a typo", name="batch_size")
LEARNING_RATE = real(0, 10, "AdamW moves each weight by about lr a step: past 10 every step is a jump", low_open=True)
sequence_count = count(MAX_SEQUENCES, WHY_SEQUENCES)
length_count = count(MAX_LENGTH, WHY_LENGTH)
step_count = count(MAX_STEPS, WHY_STEPS)
seed_value = count(MAX_SEED, WHY_SEED, low=0)
worker_count = count(MAX_WORKERS, WHY_WORKERS)
fraction = real(0, 1, "a share", sanity=False)
gpu_share = real(0, 64, "the GPUs of one node, where Ray places a worker")


def output_path(text: str):
    """--out: a non-empty path (pathlib.Path); argparse's Path would turn '' into '.'."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must name a file or directory; got {text!r}")
    if "\0" in text:
        raise argparse.ArgumentTypeError(f"must not contain a NUL character; got {text!r}")
    return Path(text)


def run_directory(text: str):
    """RUN_DIR: a non-empty path without NUL (pathlib.Path; whether it is a run is checked by the command)."""
    if not text.strip() or "\0" in text:
        raise argparse.ArgumentTypeError(f"must name a run directory (non-empty, no NUL character); got {text!r}")
    return Path(text)


def check_out(command: str, out, file: bool = False, flag: str = "--out") -> int | None:
    """Preflight of an --out directory (or, file=True, a report file; interp.training.preflight):
    None when it can be written, else the exit status of the one-line error `argument FLAG: ...`
    (flag: what set the path, e.g. "run_dir" for a report written there by default). A report file is
    never written into a committed run (`committed_run`)."""
    from interp.training.preflight import Refused, check_output_dir, check_output_file

    if file and committed_run(Path(out).parent):
        return fail(command, f"argument {flag}: {str(out)!r} would be written into {COMMITTED}; give "
                             "--out FILE outside it")
    try:
        (check_output_file if file else check_output_dir)(out)
    except Refused as error:
        return fail(command, f"argument {flag}: {error}")
    return None


COMMITTED_MANIFEST = "manifest.json"   # interp.reproduce.manifest.MANIFEST (importing it loads the engine)
COMMITTED = ("a run committed by `interp reproduce` (its manifest.json lists every file, and a file added there "
             "makes the reproduction refuse the run)")


def committed_run(directory) -> bool:
    """`directory` is a committed run of `interp reproduce` (results/reproduce/...: it carries a manifest);
    an analysis reads it but writes nothing there."""
    try:
        return (Path(directory) / COMMITTED_MANIFEST).is_file()
    except OSError:   # a name too long, a link loop: the command's own checks name it
        return False


def check_run_free(command: str, run_dir) -> int | None:
    """None when no other process holds the run directory's lock (models.storage.paths.locked; checked up
    front so that an analysis does not run only to be refused its write) and the run is not a committed
    one (`committed_run`: the command writes into the run directory), else the exit status of the
    one-line error naming the holder or the committed run."""
    from models.storage.paths import DirectoryLocked, locked

    if committed_run(run_dir):
        return fail(command, f"argument run_dir: {str(run_dir)!r} is {COMMITTED}; `interp {command}` writes its "
                             f"results into the run directory: analyse a copy (cp -r {run_dir} /tmp/run)")
    try:
        if not Path(run_dir).is_dir():
            return None   # the command's own reading names what is missing
        with locked(run_dir, "run directory"):
            return None
    except DirectoryLocked as error:
        return fail(command, error)
    except OSError as error:   # a name too long, a link loop, a run on a read-only file system
        return fail(command, f"argument run_dir: {str(run_dir)[:80]!r}: {error.strerror or error}")


BYTES_PER_TOKEN = 32                     # a Batch's tokens, targets, states (int64) and loss mask, per token


def check_workload(task, n: int, length: int, n_flag: str, length_flag: str | None) -> None:
    """ValueError naming the flags when `n` sequences of `length` (task units: group elements,
    pairs, statements) are past the sanity bound, or when their token arrays alone (a lower bound
    of what an analysis holds) exceed the memory available, instead of numpy's MemoryError or a
    run that never ends. length_flag: the flag that set the length (None: the run's own)."""
    from models.memory import available_bytes, format_bytes

    for flag, value, bound in ((n_flag, n, MAX_SEQUENCES), (length_flag, length, MAX_LENGTH)):
        if value > bound:
            raise ValueError(f"argument {flag or n_flag}: {'length ' if flag is None else ''}{value} is past the "
                             f"sanity bound {bound} (a typo?)")
    try:   # tokens per unit of length, at the margin (REPL: a statement is several tokens)
        per_unit = max(1.0, (task.sample(2, 8, 0).tokens.shape[1] - task.sample(2, 4, 0).tokens.shape[1]) / 4)
    except ValueError:   # a task whose lengths start past 8
        per_unit = 1.0
    needed, available = n * length * per_unit * BYTES_PER_TOKEN, available_bytes()
    if needed > available:
        flags = f"{n_flag}/{length_flag}" if length_flag else n_flag
        raise ValueError(f"argument {flags}: {n} sequences of length {length} need at least {format_bytes(needed)} "
                         f"for their tokens alone, more than the {format_bytes(available)} of memory available; "
                         f"lower {' or '.join(flags.split('/'))}")


def length_list(text: str) -> list[int]:
    """'60,100,200' -> [60, 100, 200] (positive, comma-separated)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be comma-separated positive integers like 60,100,200; got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"must be comma-separated positive integers like 60,100,200; got {text!r}")
    if max(values) > MAX_LENGTH:
        raise argparse.ArgumentTypeError(f"{max(values)} is past the sanity bound {MAX_LENGTH} ({WHY_LENGTH})")
    return sorted(set(values))


length_list.limit = f"each at most {MAX_LENGTH}: {WHY_LENGTH}"


class Deferred:
    """A flag's text kept as given while parsing; `Parser.parse_args` replaces it by check(text)."""

    def __init__(self, check, text: str) -> None:
        self.check, self.text = check, text

    def __repr__(self) -> str:
        return repr(self.text)


def deferred(check):
    """An argparse type that defers `check` (which may import torch) until parsing is done."""

    def keep(text: str) -> Deferred:
        return Deferred(check, text)

    keep.__name__ = check.__name__
    return keep


def _model_name(text: str) -> str:
    import models

    names = models.list_models()
    if text not in names:
        close = difflib.get_close_matches(text, names, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise argparse.ArgumentTypeError(f"unknown model {text!r}{hint}; choose from {', '.join(names)}")
    return text


model_name = deferred(_model_name)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: `interp train: error: ... (see --help)`; unknown
    flags named first, with suggestions; Deferred flags checked after parsing (module docstring)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        self._refuse_unknown_flags(args)
        return super().parse_known_args(args, namespace)

    def parse_args(self, args=None, namespace=None):
        parsed = super().parse_args(args, namespace)
        for parser in self._chosen(parsed):
            for action in parser._actions:   # noqa: SLF001 - argparse keeps its actions there
                value = getattr(parsed, action.dest, None)
                if isinstance(value, Deferred):
                    try:
                        setattr(parsed, action.dest, value.check(value.text))
                    except argparse.ArgumentTypeError as error:
                        parser.error(f"argument {'/'.join(action.option_strings) or action.dest}: {error}")
        return parsed

    def _chosen(self, parsed) -> list[argparse.ArgumentParser]:
        """This parser and the subcommand's parser that `parsed` came from."""
        chosen = [self]
        for action in self._actions:   # noqa: SLF001
            if isinstance(action, argparse._SubParsersAction):   # noqa: SLF001
                chosen.append(action.choices[getattr(parsed, action.dest)])
        return chosen

    def _refuse_unknown_flags(self, args: list[str]) -> None:
        """error() naming the first `--flag` this parser lacks, with the closest it has (for the
        top-level parser: only the flags before the subcommand)."""
        known = [flag for flag in self._option_string_actions if flag.startswith("--")]   # noqa: SLF001
        commands = any(isinstance(a, argparse._SubParsersAction) for a in self._actions)   # noqa: SLF001
        for token in args:
            if token == "--" or (commands and not token.startswith("-")):
                return
            flag = token.split("=", 1)[0]
            if not flag.startswith("--") or flag in known or (
                    self.allow_abbrev and any(k.startswith(flag) for k in known)):
                continue
            close = difflib.get_close_matches(flag, known, n=2, cutoff=0.7)
            hint = f"; did you mean {' or '.join(close)}?" if close else f"; {self.prog}'s flags: {', '.join(known)}"
            self.error(f"unrecognized arguments: {flag}{hint}")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown for every flag (unless its help already says what the default is), the
    description kept as written, and the choice placeholders filled in."""

    def _get_help_string(self, action):
        text = _fill(action.help or "")
        limit = getattr(action.type, "limit", None)
        if limit:   # every numeric flag: its upper bound and why
            text = f"{text} [{limit}]"
        if ("default" in text or action.default is None or action.default is False
                or action.default == argparse.SUPPRESS or not action.option_strings or action.nargs == 0):
            return text
        return f"{text} (default: %(default)s)"

    def _format_text(self, text: str) -> str:
        return super()._format_text(_fill(text))


def _fill(text: str) -> str:
    """The placeholders {models}, {tasks}, {reproductions} of a help text replaced by the choices."""
    for placeholder, choices in (("{models}", lambda: ", ".join(_models())), ("{tasks}", _tasks),
                                 ("{reproductions}", _reproductions)):
        if placeholder in text:
            text = text.replace(placeholder, choices())
    return text


def _reproductions() -> str:
    from interp.reproduce import names

    return ", ".join(names())


def _models() -> list[str]:
    import models

    return models.list_models()


def _tasks() -> str:
    from interp.tasks import task_names

    return (f"{', '.join(task_names())}, or a group word problem: C<n>, Z<n>, S<k>, A<k> (k <= 6) and "
            "direct products such as A4xZ5")


def _device_name(text: str) -> str:
    """A torch device that exists here (cpu, cuda:0, ...); else the available ones are named."""
    from models.devices import check_device

    try:
        check_device(text)
    except (ValueError, TypeError) as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("device ")) from None
    return text


GPU_DEVICE_FILES = ("nvidiactl", "nvidia0", "kfd", "dxg")  # NVIDIA, ROCm, WSL's GPU: /dev/<name>


def device_name(text: str):
    """--device: a GPU device on a Linux machine with no GPU device file (/dev/nvidia*, /dev/kfd,
    /dev/dxg) is refused at once, without importing torch (only the CPU is there); any other
    value is checked after parsing (Deferred: torch's own check)."""
    gpu = re.fullmatch(r"cuda(:[0-9]+)?|mps", text.strip())
    if gpu and sys.platform.startswith("linux") and not any(Path("/dev", n).exists() for n in GPU_DEVICE_FILES):
        why = ("Apple GPUs only, on macOS" if text.strip() == "mps" else
               "this machine has no GPU: no /dev/nvidia*, /dev/kfd or /dev/dxg")
        raise argparse.ArgumentTypeError(f"{text!r} is not available ({why}); available: cpu")
    return Deferred(_device_name, text)


# interp.tasks.task_names() (tests/test_cli_parsing.py keeps them equal), known here without
# importing interp.tasks (which imports torch) so that an unknown task is refused at once
NAMED_TASKS = ("AR", "MQAR", "ATR", "REPL", "PFSA", "SelectiveCopy")
GROUP_SHAPE = re.compile(r"[CZSA][1-9][0-9]*(x[CZSA][1-9][0-9]*)*")


def task_spec(text: str) -> str:
    """--task: refused at once, without importing torch, when it is neither a named task nor shaped
    like a group name (naming the fix when case or spaces make it one); make_task checks the rest
    (a group's size, the options) when the run starts."""
    if text in NAMED_TASKS or GROUP_SHAPE.fullmatch(text):
        return text
    for fixed in (text.strip(), text.strip().upper(), text.strip().upper().replace("X", "x")):
        if fixed in NAMED_TASKS or GROUP_SHAPE.fullmatch(fixed):
            raise argparse.ArgumentTypeError(f"unknown task {text!r}: did you mean {fixed!r}? (task and group names "
                                             "are case-sensitive, without spaces)")
    close = difflib.get_close_matches(text, NAMED_TASKS, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise argparse.ArgumentTypeError(f"unknown task {text!r}: allowed {', '.join(NAMED_TASKS)} or a group name "
                                     f"(C<n>, Z<n>, S<k>, A<k>, products like A4xZ5){hint}")


def fail(command: str, error: Exception | str) -> int:
    """Print `interp COMMAND: error: ...` to stderr (one line); the exit status of a user error (2)."""
    if isinstance(error, KeyError):   # a run file without an entry the command reads
        error = f"an entry {error.args[0]!r} is missing (a file of the run corrupt or edited by hand?)"
    print(f"interp {command}: error: {' '.join(str(error).split())}", file=sys.stderr)
    return 2


def add_scale_out_arguments(parser: argparse.ArgumentParser, unit: str = "unit") -> None:
    """--executor, --workers, --address, --gpus-per-worker: where an analysis' independent units
    run (interp.sweep.grid; docs/scaling.md). Without --executor everything runs in this process."""
    parser.add_argument("--executor", choices=("local", "ray"), default=None,
                        help=f"run each {unit} on workers: local (spawned processes on this machine) or ray "
                             "(a Ray cluster); default: in this process")
    parser.add_argument("--workers", type=worker_count, default=None,
                        help="worker processes (local) or actors (ray) (default 2 with --executor)")
    parser.add_argument("--address", default=None,
                        help="ray: join the cluster at this address ('auto', 'HOST:6379') instead of starting a "
                             "local one on 127.0.0.1; only trusted machines may be members (docs/scaling.md)")
    parser.add_argument("--gpus-per-worker", type=gpu_share, default=0.0,
                        help="ray: num_gpus of each worker (1 with --device cuda: one worker per GPU)")


def executor_from_args(args: argparse.Namespace, command: str):
    """The executor --executor names (None: in this process); ValueError naming a flag that needs
    --executor (--workers, --address) when it is missing."""
    if args.executor is None:
        for flag, value in (("--workers", args.workers), ("--address", args.address)):
            if value is not None:
                raise ValueError(f"argument {flag}: needs --executor local or ray; got {flag} {value} alone")
        return None
    if args.address is not None and args.executor != "ray":
        raise ValueError(f"argument --address: only --executor ray joins a cluster; got --executor {args.executor}")
    from interp.sweep.executors import make_executor

    gpus = args.gpus_per_worker or (1.0 if str(getattr(args, "device", "cpu")).startswith("cuda") else 0.0)
    return make_executor(args.executor, args.workers or 2, address=args.address, num_gpus=gpus)


def check_runs(command: str, run_dirs, out=None, locks: bool = True) -> int | None:
    """Preflight of the run directories of an analysis over several runs (interp.sweep.runs), before
    anything heavy is imported: None when each is a run directory (a directory with config.json),
    named once, and `out` (its --out) is not given; else the exit status of the one-line error
    naming the first that is not. Then, as for one run, none may be held by another writer
    (check_run_free; locks=False for a command that takes no lock)."""
    seen = {}
    if out is not None:
        return fail(command, f"argument --out: names one report, but {len(run_dirs)} run directories were given; "
                             f"without --out each run's report is written into its run directory")
    for run_dir in run_dirs:
        path = Path(run_dir)
        try:
            key, is_run = path.resolve(), path.is_dir() and (path / "config.json").is_file()
        except OSError as error:   # a name too long, a link loop
            return fail(command, f"argument run_dir: {str(run_dir)[:80]!r}: {error.strerror or error}")
        if key in seen:
            return fail(command, f"argument run_dir: {str(run_dir)!r} names the run directory {str(seen[key])!r} "
                                 "again; give each run once")
        seen[key] = run_dir
        if not is_run:
            what = "does not exist" if not path.exists() else "is not a directory" if not path.is_dir() else \
                "has no config.json"
            return fail(command, f"argument run_dir: {str(run_dir)!r} {what}; each RUN_DIR must be a run directory "
                                 "written by `interp train`")
    for run_dir in run_dirs if locks else ():
        refused = check_run_free(command, run_dir)
        if refused is not None:
            return refused
    return None


def over_runs(command: str, work, run_dirs, executor, params: dict, show) -> int:
    """An analysis over several runs (or one, on an executor): work(params, run_dir) on each
    (interp.sweep.runs.run_each; executor None: one after another in this process), then show(row,
    run_dir) prints each finished run's lines, headed by `== RUN_DIR` when there are several, and each
    failed run is one error line `interp COMMAND: error: RUN_DIR: ...`; the executor is closed. The
    exit status: 0, or 2 when any run failed (the others' results are written all the same)."""
    from interp.sweep.runs import run_each

    try:
        results = run_each(work, run_dirs, executor, progress=len(run_dirs) > 1 and sys.stderr.isatty(), **params)
    except (ValueError, RuntimeError) as error:   # no Ray installed, a cluster on another address
        return fail(command, f"argument --executor: {error}")
    finally:
        if executor is not None:
            executor.close()
    several = len(results) > 1
    for result in results:
        if result.ok:
            if several:
                print(f"== {result.run_dir}")
            show(result.row, Path(result.run_dir))
    failed = [result for result in results if not result.ok]
    for result in failed:
        fail(command, f"{result.run_dir}: {result.error}" if several else result.error)
    return 2 if failed else 0
