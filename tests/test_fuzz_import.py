"""Hostile checkpoint directories for `models.from_pretrained`, per architecture (issue 38 items 2, 3, 5).

Each case saves a tiny random source of one architecture (the interop tests' builders) with
save_pretrained, makes one hostile change to the directory and calls `models.from_pretrained(dir)`:

    intact          nothing changed: must load (the harness's control)
    missing_tensor  one tensor removed from the safetensors file: must be refused (transformers' fallback
                    would initialise it at random)
    extra_tensor    one unexpected tensor added: must be refused
    lying_header    a tensor's header shape [2**18, 2**18] or [-4, 8], or offsets past the file's end or
                    reversed: must be refused before anything is allocated
    auto_map        config.json with `auto_map` and no `model_type`, beside an evil.py that writes a marker:
                    must be refused, stdin (answering "y") never read, the marker never written
    huge_config     a size field (vocab_size, layers, hidden size, heads, positions) 10**12, 10**9 or 2**40:
                    must be refused at once; -4 or 0: refused or loaded (a converter may ignore the field)

The pass rule is the CLI fuzz's (tests/test_fuzz_cli.py): the call returns a model (intact only) or
raises ValueError / TypeError / FileNotFoundError with a one-line message; no other exception, no
message over several lines, no run past SIZE_DEADLINE_S, nothing outside the case directory written
(the evil.py marker, transformers' module cache), and a directory that must be refused is never
loaded ("silent"). The suite runs FAST_CASES of seed 1; the long run:

    python tests/test_fuzz_import.py 400 [seed]     (prints the counts per kind and each failure)
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import io
import json
import random
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import pytest
import torch

if __name__ == "__main__":   # run as a script: the repository root, where tests/ is a package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.test_fuzz_cli import MEMORY_CAP, SIZE_DEADLINE_S, DeadlinePassed, deadline, memory_cap, snapshot

FAST_CASES = 14
ALLOWED = (ValueError, TypeError, FileNotFoundError)
# architecture -> (test module, source builder); the 7 architectures of issue 38 and the older ones
BUILDERS = {
    "gpt2": ("tests.test_interop", "gpt2_source"), "llama": ("tests.test_interop", "llama_source"),
    "mamba": ("tests.test_interop", "mamba_source"), "falcon_mamba": ("tests.test_interop", "falcon_mamba_source"),
    "jamba": ("tests.test_interop", "jamba_source"), "mamba2": ("tests.test_interop_mamba2", "mamba2_source"),
    "nemotron_h": ("tests.test_interop_hybrid", "nemotron_h_source"),
    "bamba": ("tests.test_interop_hybrid", "bamba_source"),
    "falcon_h1": ("tests.test_interop_hybrid", "falcon_h1_source"),
    "zamba2": ("tests.test_interop_hybrid", "zamba2_source"),
    "granitemoehybrid": ("tests.test_interop_hybrid", "granite_source"),
    "lfm2": ("tests.test_interop_lfm2", "lfm2_source"), "qwen3": ("tests.test_interop_qwen3", "qwen3_source"),
    "qwen3_next": ("tests.test_interop_qwen", "next_source"), "qwen3_5": ("tests.test_interop_qwen", "qwen35_source"),
    "kimi_linear": ("tests.test_interop_kimi", "kimi_source"), "rwkv7": ("tests.test_rwkv7", "rwkv7_source"),
    "delta_net": ("tests.test_interop_fla", "deltanet_source"),
    "gated_deltanet": ("tests.test_interop_fla", "gated_source"),
}
KINDS = ("intact", "missing_tensor", "extra_tensor", "lying_header", "auto_map", "huge_config")
SIZE_KEYS = ("vocab_size", "num_hidden_layers", "n_layer", "hidden_size", "n_embd", "intermediate_size",
             "num_attention_heads", "n_head", "num_key_value_heads", "state_size", "max_position_embeddings",
             "n_positions", "head_dim", "num_experts")
HUGE = [10 ** 12, 10 ** 9, 2 ** 40, -4, 0]
UNEXPECTED = "model.layers.0.unexpected.weight"
EVIL = '''import pathlib
pathlib.Path({marker!r}).write_text("checkpoint code ran")
from transformers import PretrainedConfig, PreTrainedModel
class EvilConfig(PretrainedConfig):
    model_type = "evil"
class EvilModel(PreTrainedModel):
    config_class = EvilConfig
'''


class Sources:
    """One saved checkpoint directory per architecture, made when first asked for (None: the
    architecture's library, such as fla, is not installed)."""

    def __init__(self, root: Path) -> None:
        self.root, self.saved = root, {}

    def get(self, name: str) -> Path | None:
        if name not in self.saved:
            module, builder = BUILDERS[name]
            try:
                source = getattr(importlib.import_module(module), builder)()
            except (ImportError, pytest.skip.Exception):
                self.saved[name] = None
                return None
            source.save_pretrained(self.root / name)
            self.saved[name] = self.root / name
        return self.saved[name]


def weight_file(directory: Path) -> Path:
    return sorted(directory.glob("*.safetensors"))[0]


def rewrite_tensors(path: Path, change) -> str:
    """The safetensors file at path rewritten with change(tensors) applied; returns what change returns."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(path)
    changed = change(tensors)
    save_file(tensors, path, metadata={"format": "pt"})
    return changed


def rewrite_header(path: Path, change) -> str:
    """The safetensors file at path with its JSON header changed by change(header) (data untouched);
    returns what change returns."""
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    changed = change(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + size:])
    return changed


def drop_one(tensors: dict, rng: random.Random) -> str:
    name = rng.choice(sorted(tensors))
    del tensors[name]
    return name


def lie(header: dict, rng: random.Random) -> str:
    """One entry of a safetensors header made to lie; returns what was changed."""
    name = rng.choice(sorted(k for k in header if k != "__metadata__"))
    entry, how = header[name], rng.choice(["huge_shape", "negative_shape", "past_end", "reversed"])
    if how == "huge_shape":
        entry["shape"] = [2 ** 18, 2 ** 18]
    elif how == "negative_shape":
        entry["shape"] = [-4, 8]
    elif how == "past_end":
        entry["data_offsets"] = [entry["data_offsets"][0], entry["data_offsets"][1] + 2 ** 40]
    else:
        entry["data_offsets"] = entry["data_offsets"][::-1]
    return f"{name}: {how}"


def auto_map(directory: Path, outside: Path) -> Path:
    """config.json made to ask for remote code; returns the marker evil.py would write."""
    marker = outside / "evil-ran"
    (directory / "evil.py").write_text(EVIL.format(marker=str(marker)))
    config = json.loads((directory / "config.json").read_text())
    config.pop("model_type", None)
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    (directory / "config.json").write_text(json.dumps(config))
    return marker


def huge_config(directory: Path, rng: random.Random) -> str:
    config = json.loads((directory / "config.json").read_text())
    key, value = rng.choice([k for k in SIZE_KEYS if isinstance(config.get(k), int)]), rng.choice(HUGE)
    config[key] = value
    (directory / "config.json").write_text(json.dumps(config))
    return f"{key} {value}"


def make_case(rng: random.Random, case: Path, sources: Sources, name: str, kind: str) -> tuple[Path | None, str]:
    """(the hostile directory case/ckpt, what was changed); None when the architecture is not installed."""
    saved = sources.get(name)
    if saved is None:
        return None, ""
    directory = Path(shutil.copytree(saved, case / "ckpt"))
    (case / "outside").mkdir()
    changed = ""
    if kind == "missing_tensor":
        changed = rewrite_tensors(weight_file(directory), lambda tensors: drop_one(tensors, rng))
    elif kind == "extra_tensor":
        changed = UNEXPECTED
        rewrite_tensors(weight_file(directory), lambda t: t.update({UNEXPECTED: torch.ones(3)}))
    elif kind == "lying_header":
        changed = rewrite_header(weight_file(directory), lambda header: lie(header, rng))
    elif kind == "auto_map":
        changed = str(auto_map(directory, case / "outside").name)
    elif kind == "huge_config":
        changed = huge_config(directory, rng)
    return directory, changed


@contextlib.contextmanager
def hostile_environment(case: Path):
    """stdin that answers "y" to any question, transformers' module cache inside the case."""
    import transformers.dynamic_module_utils as dynamic

    patch = pytest.MonkeyPatch()
    patch.setattr(sys, "stdin", io.StringIO("y\n" * 8))
    patch.setattr(dynamic, "HF_MODULES_CACHE", str(case / "outside" / "hf_modules"))
    try:
        yield
    finally:
        patch.undo()


def expected(kind: str, changed: str) -> str:
    """"load" (intact), "refuse", or "either" (a size field 0 or -4, which a converter may ignore, as Llama
    ignores max_position_embeddings: loading is no failure, an allocator error is)."""
    if kind == "intact":
        return "load"
    return "either" if kind == "huge_config" and changed.split()[-1] in ("0", "-4") else "refuse"


def run_case(directory: Path, case: Path, expect: str) -> tuple[str, str]:
    """(outcome, detail): "ok", "traceback", "lines", "hang", "escape", "code_ran", "silent" (loaded where
    it must be refused) or "refused_intact"."""
    import models

    before = snapshot(case / "outside")
    loaded, error = None, None
    try:
        with deadline(SIZE_DEADLINE_S), hostile_environment(case), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            loaded = models.from_pretrained(directory)
    except DeadlinePassed as timeout:
        return "hang", str(timeout)
    except Exception as raised:  # noqa: BLE001 - what the fuzz counts
        error = raised
    if (case / "outside" / "evil-ran").exists():
        return "code_ran", "evil.py was imported"
    if snapshot(case / "outside") != before:
        return "escape", "a file outside the checkpoint changed (transformers' module cache?)"
    if error is not None:
        text = str(error)
        where = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(traceback.extract_tb(error.__traceback__))
                      if "/models/" in f.filename), "?")
        if not isinstance(error, ALLOWED):
            return "traceback", f"{type(error).__name__} at {where}: {text[:200]}"
        if len(text.strip().splitlines()) > 1:
            return "lines", " | ".join(text.splitlines()[:3])[:300]
        return ("refused_intact", text[:200]) if expect == "load" else ("ok", text[:200])
    return ("silent", f"loaded {type(loaded).__name__} without a word") if expect == "refuse" else ("ok", "")


def fuzz(n: int, seed: int = 0, root: Path | None = None, log=None) -> collections.Counter:
    """n cases of random (architecture, kind); returns the count of each (kind, outcome)."""
    root = Path(tempfile.mkdtemp(prefix="interp-fuzz-import-")) if root is None else root
    root.mkdir(parents=True, exist_ok=True)
    counts: collections.Counter = collections.Counter()
    rng = random.Random(seed)
    sources = Sources(root / "sources")
    try:
        with memory_cap(MEMORY_CAP):
            for index in range(n):
                name, kind = rng.choice(sorted(BUILDERS)), rng.choice(KINDS)
                case = root / f"case-{index}"
                case.mkdir()
                directory, changed = make_case(rng, case, sources, name, kind)
                outcome, detail = ("skipped", f"{name} not installed") if directory is None else \
                    run_case(directory, case, expected(kind, changed))
                counts[kind, outcome] += 1
                if outcome not in ("ok", "skipped") and log is not None:
                    log(index, name, f"{kind} ({changed})" if changed else kind, outcome, detail)
                shutil.rmtree(case, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return counts


@pytest.mark.fuzz
def test_hostile_checkpoint_directories_are_loaded_whole_or_refused_in_one_line(tmp_path):
    failures = []
    counts = fuzz(FAST_CASES, seed=1, root=tmp_path / "fuzz", log=lambda *case: failures.append(case))
    failed = {key: count for key, count in counts.items() if key[1] not in ("ok", "skipped")}
    assert not failed, (dict(counts), failures[:5])


if __name__ == "__main__":
    cases, seed = int(sys.argv[1]) if len(sys.argv) > 1 else 400, int(sys.argv[2]) if len(sys.argv) > 2 else 0
    started = time.perf_counter()
    found = fuzz(cases, seed, log=lambda index, name, kind, outcome, detail: print(
        f"case {index} {name} {kind}: {outcome}: {detail[:300]}", flush=True))
    print(f"{cases} cases in {time.perf_counter() - started:.0f} s")
    for kind in KINDS:
        print(f"  {kind}: {dict((o, c) for (k, o), c in sorted(found.items()) if k == kind)}")
