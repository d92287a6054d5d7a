"""Issue 38 items 5-7: every size bounded, non-finite models named. Before: a run's config.json
with d_model 1e8 / vocab_size 1e10 was a raw DefaultCPUAllocator RuntimeError, max_len 1e10 was
accepted, n_layers 1e6 built layers past 120 s; `interp circuit --steps 1000000000` allocated an
8 GB arange and died with a traceback; generate on a recurrent model with 10**12 new tokens ran for
ever; NaN weights gave NaN scores (eval, circuit, patch) or a 23-line LinAlgError (drift)."""

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import models
from interp.cli import build_parser, main
from interp.cli.args import Deferred
from models import size
from models.backbone import SequenceModel
from models.config import FIELD_BOUNDS, ModelConfig
from models.decoding.generation import MAX_NEW_TOKENS, check_new_tokens, generate
from models.storage.saving import save_weights
from tests.test_fuzz_cli import TINY, one_line_status

REPO = Path(__file__).resolve().parents[1]
RUN_ARGS = {  # each command on a tiny run, quick
    "eval": ["--lengths", "4", "--n", "4"],
    "drift": ["--lengths", "4,6", "--n", "4", "--n-fit", "8", "--n-drift", "4", "--no-calibrate"],
    "circuit": ["--n", "4", "--length", "2", "--no-progress", "--rescore", "2"],
    "patch": ["--n", "4", "--length", "2", "--no-progress"],
    "heads": ["--n", "4"],
}
TASK_OF = {"eval": "c2", "drift": "c2", "circuit": "ar", "patch": "ar", "heads": "repl"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A C2 and an AR tanh RNN run and a REPL DeltaNet run, two steps each."""
    root = tmp_path_factory.mktemp("bounds")
    made = {}
    for name, model, task in (("c2", "tanh_rnn", "C2"), ("ar", "tanh_rnn", "AR"), ("repl", "deltanet", "REPL")):
        made[name] = root / name
        assert main(["train", "--model", model, "--task", task, "--steps", "2", "--out", str(made[name]),
                     "--no-progress", *TINY]) == 0
    return made


def edited_run(source: Path, target: Path, **model_fields) -> Path:
    """A copy of the run whose config.json's model entry has these fields."""
    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    config["model"].update(model_fields)
    (target / "config.json").write_text(json.dumps(config))
    return target


HOSTILE = [  # (model field, value, words of the refusal)
    ("d_model", 10 ** 8, "d_model 100000000 is past the sanity bound 65536"),
    ("vocab_size", 10 ** 10, "vocab_size 10000000000 is past the sanity bound 4194304"),
    ("max_len", 10 ** 10, "max_len 10000000000 is past the sanity bound 16777216"),
    ("n_layers", 10 ** 6, "n_layers 1000000 is past the sanity bound 4096"),
    ("d_model", 1e8, "d_model must be a positive int; got 100000000.0"),
    ("d_model", -3, "d_model must be a positive int; got -3"),
    ("n_layers", 0, "n_layers must be a positive int; got 0"),
    ("vocab_size", 2.5, "vocab_size must be a positive int; got 2.5"),
    ("max_len", "4096", "max_len must be a positive int; got '4096'"),
    ("d_mlp", 10 ** 9, "d_mlp 1000000000 is past the sanity bound 262144"),
]


@pytest.mark.parametrize("field, value, words", HOSTILE)
def test_a_hostile_run_config_is_one_line_at_once(runs, tmp_path, capsys, field, value, words):
    run = edited_run(runs["c2"], tmp_path / "run", **{field: value})
    started = time.perf_counter()
    status, line = one_line_status(["eval", str(run), *RUN_ARGS["eval"]], capsys)
    assert time.perf_counter() - started < 5
    assert status == 2 and line.startswith("interp eval: error: ") and words in line, line
    assert not (run / "eval.json").exists()


@pytest.mark.parametrize("command", sorted(RUN_ARGS))
def test_a_million_layers_are_refused_by_every_command_at_once(runs, tmp_path, capsys, command):
    run = edited_run(runs[TASK_OF[command]], tmp_path / "run", n_layers=10 ** 6)
    started = time.perf_counter()
    status, line = one_line_status([command, str(run), *RUN_ARGS[command]], capsys)
    assert time.perf_counter() - started < 5
    assert status == 2 and "n_layers 1000000 is past the sanity bound 4096" in line, line


def test_a_model_past_the_memory_is_refused_before_it_is_built(runs, tmp_path, capsys, monkeypatch):
    """Within the field bounds the memory decides: d_model 65536 (51.5 GB of float32 weights for
    a tanh RNN of vocabulary 2) is refused naming the parameters, the bytes and the memory."""
    monkeypatch.setattr(size, "available_bytes", lambda: 8 * 10 ** 9)
    run = edited_run(runs["c2"], tmp_path / "run", d_model=1 << 16)
    started = time.perf_counter()
    status, line = one_line_status(["eval", str(run), *RUN_ARGS["eval"]], capsys)
    assert time.perf_counter() - started < 5
    parameters = size.parameter_count(ModelConfig.from_dict(json.loads((run / "config.json").read_text())["model"]))
    assert status == 2 and f"has {parameters:,} parameters" in line and "more than the 8 GB of memory" in line, line


def llama_7b() -> ModelConfig:
    return ModelConfig(mixer="attention", vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, d_mlp=11008,
                       mlp=True, mlp_activation="swiglu", mlp_bias=False, attention_bias=False, norm="rmsnorm",
                       positional="rope", max_len=4096)


def test_a_7b_llama_passes_the_bounds_and_the_memory_decides(monkeypatch):
    config = llama_7b()
    assert size.parameter_count(config) == 6_738_415_616   # Llama-2-7B's published count
    monkeypatch.setattr(size, "available_bytes", lambda: 16 * 10 ** 9)
    with pytest.raises(size.ModelTooLarge, match=r"has 6,738,415,616 parameters: building it needs about 27 GB"):
        models.build(config)
    monkeypatch.setattr(size, "available_bytes", lambda: 64 * 10 ** 9)
    size.check_fits(config)


def test_on_a_gpu_the_weights_are_counted_in_their_own_dtype(monkeypatch):
    """A 7B Llama in bfloat16 (13.5 GB) fits a 24 GB GPU though its float32 build (27 GB) would not;
    a 12 GB GPU refuses it, naming the bytes and the device (torch.cuda stubbed: no GPU needed)."""
    monkeypatch.setattr(size, "available_bytes", lambda: 64 * 10 ** 9)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (24 * 10 ** 9, 80 * 10 ** 9))
    bf16 = 2 * 6_738_415_616
    size.check_fits(llama_7b(), "cuda:0", bf16)
    with pytest.raises(size.ModelTooLarge, match="27 GB of weights, more than the 24 GB free on cuda:0"):
        size.check_fits(llama_7b(), "cuda:0")   # no weights file: built in float32
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (12 * 10 ** 9, 80 * 10 ** 9))
    with pytest.raises(size.ModelTooLarge, match="13.5 GB of weights, more than the 12 GB free on cuda:0"):
        size.check_fits(llama_7b(), "cuda:0", bf16)


@pytest.mark.parametrize("field", sorted(FIELD_BOUNDS))
def test_every_field_bound_admits_its_bound_and_refuses_one_more(field):
    bound = FIELD_BOUNDS[field]
    base = {"n_heads": 1} if field == "d_model" else {"d_head": 8} if field in ("n_heads", "n_kv_heads") else {}
    extra = {"n_heads": bound} if field == "n_kv_heads" else {}
    ModelConfig(**{**base, **extra, field: bound})
    with pytest.raises(ValueError, match=rf"^{field} {bound + 1} is past the sanity bound {bound} "):
        ModelConfig(**{**base, **extra, field: bound + 1})


def test_moe_sizes_are_bounded():
    with pytest.raises(ValueError, match=r"moe\['experts'\] 1000000 is past the sanity bound 16384"):
        ModelConfig(mlp=True, moe={"experts": 10 ** 6, "top_k": 1, "d_expert": 4})


ZOO = {
    "hybrid": dict(mixer=["attention", "mamba2", "attention"], n_layers=3, mlp=[True, False, True]),
    "zamba2": dict(mixer="mamba2", n_layers=3, shared_block=[0, None, 0], shared_adapter_rank=2, mlp=True,
                   n_heads=4, mlp_activation="geglu", norm="rmsnorm", mixer_options={"mamba2": {"n_heads": 2}}),
    "moe": dict(mixer="gated_deltanet", n_layers=3, n_heads=2, mlp=True, mlp_activation="swiglu", mlp_bias=False,
                moe={"experts": 5, "top_k": 2, "d_expert": 6, "d_shared": 7, "layers": [1]}),
    "rwkv7": dict(mixer=["rwkv7", "rwkv7_ffn", "rwkv7"], n_layers=3, n_heads=4),
    "learned_tied": dict(mixer="attention", positional="learned", max_len=64, tie_embeddings=True, n_layers=2),
}


@pytest.mark.parametrize("name", sorted(ZOO))
def test_the_count_agrees_with_the_built_model(name):
    """Counted per kind of layer (and a shared block's tied weights once), equal to the model's own
    parameters (shared tensors counted once) and buffers."""
    config = ModelConfig(vocab_size=11, d_model=16, **ZOO[name])
    model = SequenceModel(config)
    parameters, buffers = size.element_counts(config)
    assert parameters == sum(p.numel() for p in model.parameters())
    assert buffers == sum(b.numel() * b.element_size() for b in model.buffers())


def test_generate_refuses_a_trillion_tokens_on_every_model_kind():
    tokens = torch.zeros(1, 3, dtype=torch.long)
    for name in ("tanh_rnn", "mamba", "transformer"):
        model = models.build(name, vocab_size=8, d_model=8, n_layers=2)
        started = time.perf_counter()
        with pytest.raises(ValueError) as error:
            generate(model, tokens, 10 ** 12, progress=False)
        assert time.perf_counter() - started < 5
        line = str(error.value)
        assert "\n" not in line and f"max_new_tokens 1000000000000 is past the bound {MAX_NEW_TOKENS}" in line
        assert "it would run for at least 31.7 years" in line, line   # 10^12 x 0.5 ms x 2 layers
    check_new_tokens(model, MAX_NEW_TOKENS)   # the bound itself is allowed
    assert generate(model, tokens, 2, progress=False).shape == (1, 5)


def test_circuit_steps_past_the_bound_is_one_line(runs, capsys):
    status, line = one_line_status(["circuit", str(runs["ar"]), "--steps", "1000000000"], capsys)
    assert status == 2 and line.startswith("interp circuit: error: argument --steps: 1000000000 is past the sanity "
                                           "bound 4096"), line
    assert not (runs["ar"] / "circuit.html").exists()


def numeric_flags():
    """(command, flag, action) of every flag of every subcommand."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))   # noqa: SLF001
    for command, subparser in sub.choices.items():
        for action in subparser._actions:   # noqa: SLF001
            if action.option_strings and action.type is not None:
                yield command, action.option_strings[-1], action


def reads_a_number(parse) -> bool:
    """Whether the flag type turns "1" into a number (or a list of them): a numeric flag."""
    try:
        value = parse("1")
        value = value.check(value.text) if isinstance(value, Deferred) else value
    except argparse.ArgumentTypeError:
        return False
    return any(isinstance(v, (int, float)) for v in (value if isinstance(value, (list, tuple)) else [value]))


@pytest.mark.parametrize("huge", ["1" * 30, "1e300", "inf", "nan"])
def test_every_numeric_flag_is_bounded(huge):
    """Every flag whose type reads a number has an upper bound (shown by --help: its `limit`) and
    refuses a number past any bound while parsing."""
    numeric = [(command, flag, action) for command, flag, action in numeric_flags() if reads_a_number(action.type)]
    assert len(numeric) > 40
    for command, flag, action in numeric:
        assert getattr(action.type, "limit", None), (command, flag)
        with pytest.raises(argparse.ArgumentTypeError):
            value = action.type(huge)
            value.check(value.text) if isinstance(value, Deferred) else value


def test_help_shows_every_bound(capsys):
    for command, flag, action in numeric_flags():
        limit = getattr(action.type, "limit", None)
        if limit:
            with pytest.raises(SystemExit):
                main([command, "--help"])
            shown = " ".join(capsys.readouterr().out.split())
            assert " ".join(f"[{limit}]".split()) in shown, (command, flag)


def test_max_memory_past_the_machine_is_one_line(runs, capsys):
    status, line = one_line_status(["patch", str(runs["ar"]), "--max-memory", "1e99TB"], capsys)
    assert status == 2 and "argument --max-memory: 1e99TB is more than the" in line, line


def diverged(source: Path, target: Path, parameter: str) -> Path:
    """A copy of the run whose checkpoint's `parameter` is NaN, recorded as written (its sha256 in
    trainer_state.json): what a run that diverged leaves."""
    shutil.copytree(source, target)
    model = models.load(target)
    with torch.no_grad():
        model.get_parameter(parameter).fill_(float("nan"))
    step = target / json.loads((target / "checkpoint.json").read_text())["path"]
    save_weights(model, step / "model.safetensors")
    state = json.loads((step / "trainer_state.json").read_text())
    state["sha256"]["model.safetensors"] = hashlib.sha256((step / "model.safetensors").read_bytes()).hexdigest()
    state["files"]["model.safetensors"] = (step / "model.safetensors").stat().st_size
    (step / "trainer_state.json").write_text(json.dumps(state))
    return target


def test_nan_weights_are_one_line_naming_the_parameter_in_every_analysis(runs, tmp_path):
    """The CLI in subprocesses (run side by side): stderr is one line naming the first non-finite
    parameter, no traceback, exit status 2."""
    probe = "import sys; from interp.cli import main; sys.exit(main(sys.argv[1:]))"
    bad = {name: diverged(runs[name], tmp_path / name, "unembed.weight") for name in ("c2", "ar")}
    started = {command: subprocess.Popen([sys.executable, "-c", probe, command, str(bad[TASK_OF[command]]),
                                          *RUN_ARGS[command]], cwd=REPO, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True,
                                         env={"PYTHONPATH": str(REPO), "INTERP_PROGRESS": "0", "PATH": "/usr/bin:/bin"})
               for command in ("eval", "drift", "circuit", "patch")}
    for command, process in started.items():
        _, err = process.communicate(timeout=600)
        lines = err.strip().splitlines()
        assert process.returncode == 2 and len(lines) == 1 and "Traceback" not in err, (command, err[-2000:])
        assert lines[0].startswith(f"interp {command}: error: ") and "parameter unembed.weight holds " in lines[0]
        assert "NaN / Inf values" in lines[0], lines[0]


def test_non_finite_states_are_named_before_the_svd():
    """Drift's U: finite weights whose states overflow (here a hook makes them Inf from position 2)
    name the hook and the position, not a LinAlgError from the SVD."""
    from interp.analysis.error_control import fit_subspace
    from interp.tasks import make_task
    from probes.subspace import Centroids, state_subspace

    model = models.build("tanh_rnn", vocab_size=2, d_model=8)
    site = "blocks.0.mixer.hook_state"

    def overflow(x, hook):
        x = x.clone()
        x[:, 2:] = float("inf")
        return x

    with model.hooks([(site, overflow)], allow_nonfinite=True), pytest.raises(ValueError) as error:
        fit_subspace(model, make_task("C2"), 6, site, n=8, data_seed=0)
    assert f"hook {site} holds NaN / Inf states from position 2" in str(error.value)
    means = torch.randn(3, 4, dtype=torch.float64).numpy()
    means[1, 0] = float("nan")
    cents = Centroids(classes=torch.arange(3).numpy(), means=means, counts=torch.ones(3).long().numpy(),
                      state_shape=(4,))
    with pytest.raises(ValueError, match=r"the centroids of classes \[1\] hold NaN / Inf"):
        state_subspace(cents)
