"""Fuzzed public entry points: every input works or raises ValueError / TypeError naming its argument.

Entry points: `models.build` overrides (and huge sizes: issue 38), `ModelConfig.from_dict`, `model(tokens)` /
`run_with_cache` / `run_with_hooks`, `make_task` specs and options (and `task.sample`), `Site`
and `interchange` arguments, `interp` argument vectors (exit 0, or exit 2 with one stderr line
naming the flag). Each input perturbs one argument of a valid call (or several, for overrides), so
the error must name that argument.

Budget: the profile "fuzz" (default, CI) runs 200 examples per entry point (7 tests, 1400 inputs,
about 30 s on 2 loaded cores); INTERP_FUZZ=long selects "fuzz-long" (3000 per entry point, 21000
inputs, about 10 minutes at load 25). Found and fixed, besides issue 13's items 3, 5, 7 and 9:
interchange took a tensor for skip_noops / resume (a torch "ambiguous boolean" RuntimeError), a
non-iterable `sites` and an int `answer` out of range without naming them; `interp train
--d-model 1` named d_model but not the flag; a --warmup >= --steps error named no flag. After the
fixes the long profile passes for every entry point (3000 examples each, 22:45 UTC).
"""

import contextlib
import io
import math
import os
import re

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import models
from interp.analysis.interventions import Site, interchange
from interp.analysis.interventions.corruption import corrupt_ar
from interp.tasks import make_task
from models.config import ModelConfig

settings.register_profile("fuzz", max_examples=200, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("fuzz-long", max_examples=3000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FUZZ = settings.get_profile("fuzz-long" if os.environ.get("INTERP_FUZZ") == "long" else "fuzz")
pytestmark = pytest.mark.fuzz

junk = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 70), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6), st.binary(max_size=3),
    st.lists(st.integers(-2, 5), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.just(object()), st.just(torch.zeros(2)),
)
small = st.one_of(st.none(), st.booleans(), st.integers(-2, 9), st.floats(-3, 3), st.text(max_size=4),
                  st.lists(st.floats(0, 2), max_size=5))


def assert_names(error: BaseException, *names: str) -> None:
    """A user error: ValueError / TypeError whose message names one of `names`."""
    assert isinstance(error, (ValueError, TypeError)), f"{type(error).__name__}: {error}"
    assert any(name in str(error) for name in names), f"{error!s} does not name any of {names}"


TINY = dict(d_model=8, n_layers=1, n_heads=2, d_state=2, d_hidden=8)


@FUZZ
@given(name=st.sampled_from(models.list_models()), field=st.sampled_from(ModelConfig.field_names()),
       value=junk, extra=st.booleans())
def test_model_config_from_dict(name, field, value, extra):
    data = models.preset_config(name, vocab_size=5, **TINY).to_dict()
    data[field] = value
    if extra:
        data["no_such_field"] = 1
    try:
        ModelConfig.from_dict(data)
    except Exception as error:  # noqa: BLE001
        assert_names(error, "no_such_field" if extra else field)
    else:
        assert not extra


@FUZZ
@given(name=st.one_of(st.sampled_from(models.list_models()), junk),
       overrides=st.dictionaries(st.sampled_from(ModelConfig.field_names()), small, max_size=2))
def test_build_overrides(name, overrides):
    overrides = {**TINY, "vocab_size": 5, **overrides}
    for key, value in overrides.items():
        if isinstance(value, int) and not isinstance(value, bool) and key != "vocab_size":
            overrides[key] = min(value, 9)
    try:
        model = models.build(name, **overrides)
    except Exception as error:  # noqa: BLE001
        assert_names(error, "name", "model", *overrides)
        return
    logits = model(torch.zeros(1, 3, dtype=torch.long))
    assert logits.shape == (1, 3, model.cfg.vocab_size)


HOSTILE_SIZES = [2 ** 66, 10 ** 12, 10 ** 10, 2 ** 40, 10 ** 6]   # shrinking moves toward the first


@settings(FUZZ, max_examples=60)
@given(name=st.sampled_from(models.list_models()), field=st.sampled_from(["d_model", "vocab_size", "max_len",
                                                                          "n_layers"]),
       value=st.sampled_from(HOSTILE_SIZES))
def test_hostile_sizes_are_refused_before_anything_is_built(name, field, value):
    """Issue 38 item 5: a run config whose d_model / vocab_size / max_len / n_layers is huge is refused
    naming the field, at once (no allocator error, no 10**6 layers built); a size the machine can hold
    may build."""
    from tests.test_fuzz_cli import MEMORY_CAP, SIZE_DEADLINE_S, deadline, memory_cap

    with deadline(SIZE_DEADLINE_S), memory_cap(MEMORY_CAP):
        try:
            models.build(name, **{**TINY, "vocab_size": 5, field: value})
        except Exception as error:  # noqa: BLE001
            assert_names(error, field)


MODEL = models.build("tanh_rnn", vocab_size=5, d_model=8)
NAMES = MODEL.hook_names()
dtypes = st.sampled_from([torch.int64, torch.int32, torch.int16, torch.uint8, torch.bool, torch.float32,
                          torch.complex64])
tokens = st.builds(
    lambda shape, dtype, high: torch.randint(0, high, shape).to(dtype),
    st.lists(st.integers(0, 4), min_size=0, max_size=3), dtypes, st.integers(1, 8),
) | junk


def hook_fn(kind):
    return {"id": lambda x, hook: x, "none": lambda x, hook: None, "nan": lambda x, hook: x * math.nan,
            "shape": lambda x, hook: x[:1], "int": lambda x, hook: 3, "zero": lambda x, hook: x * 0}[kind]


hook_specs = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(NAMES) | st.text(max_size=8) | st.just(lambda n: n.endswith("zz")),
                  st.sampled_from(["id", "none", "nan", "shape", "int", "zero"]).map(hook_fn) | junk),
        junk,
    ), max_size=2,
) | junk


@FUZZ
@given(tokens=tokens, names=st.one_of(st.sampled_from(NAMES), st.lists(st.sampled_from(NAMES) | junk, max_size=2),
                                      junk), fwd_hooks=hook_specs, entry=st.sampled_from(["call", "cache", "hooks"]))
def test_model_inputs(tokens, names, fwd_hooks, entry):
    try:
        if entry == "call":
            MODEL(tokens)
        elif entry == "cache":
            MODEL.run_with_cache(tokens, names=names, fwd_hooks=fwd_hooks)
        else:
            MODEL.run_with_hooks(tokens, fwd_hooks=fwd_hooks)
    except Exception as error:  # noqa: BLE001
        assert_names(error, "tokens", "names", "hook", "fwd_hooks")
    assert not any(point._forward_hooks for point in MODEL.hook_dict.values())


spec_text = st.text(alphabet="CZSAxRMQTPLEFcs0123456789 ", max_size=8)
OPTION_NAMES = ["format", "n_keys", "n_values", "n_queries", "n_items", "p", "reveal_every", "reveal", "init",
                "loss", "n_vars", "ops", "reveal_fraction", "random_init", "n_nonterminals", "n_terminals",
                "max_rule_length", "rules_per_nonterminal", "bogus"]


@FUZZ
@given(spec=st.sampled_from(["C2", "S3", "A4xZ5", "AR", "MQAR", "ATR", "REPL", "PFSA"]) | spec_text | junk,
       options=st.dictionaries(st.sampled_from(OPTION_NAMES), small, max_size=1),
       argument=st.sampled_from(["n", "length", "seed"]), value=st.integers(-1, 3) | junk)
def test_make_task_and_sample(spec, options, argument, value):
    try:
        task = make_task(spec, **options)
    except Exception as error:  # noqa: BLE001
        assert_names(error, repr(spec) if isinstance(spec, str) else "spec", *options)
        return
    arguments = {"n": 2, "length": 6, "seed": 0, argument: value}
    try:
        batch = task.sample(**arguments)
    except Exception as error:  # noqa: BLE001
        assert_word(error, argument)
        return
    assert batch.tokens.shape[0] == arguments["n"] and int(batch.tokens.max()) < task.vocab_size


def assert_word(error: BaseException, name: str) -> None:
    assert isinstance(error, (ValueError, TypeError)), f"{type(error).__name__}: {error}"
    assert re.search(rf"\b{name}\b", str(error)), f"{error!s} does not name {name}"


AR = make_task("AR")
AR_MODEL = models.build("mamba", vocab_size=AR.vocab_size, d_model=8, n_layers=1, d_state=2)
CLEAN = AR.sample(4, length=3, seed=0)
CORRUPT = corrupt_ar(CLEAN, AR, seed=1)


@FUZZ
@given(hook=st.sampled_from(["blocks.0.hook_resid_pre", "blocks.0.mixer.hook_state"]) | junk,
       position=st.sampled_from(["key", "value", "query"]) | st.integers(-4, 12) | junk,
       head=st.none() | junk, subspace=st.none() | junk)
def test_site_arguments(hook, position, head, subspace):
    try:
        Site(hook, position, head, subspace)
    except Exception as error:  # noqa: BLE001
        assert_names(error, "Site.hook", "Site.position", "Site.head", "subspace")


@FUZZ
@given(argument=st.sampled_from(["sites", "metric", "batch_size", "min_effect", "answer", "skip_noops",
                                 "resume", "clean", "corrupt", "position"]), value=junk | st.integers(-2, 12),
       role=st.sampled_from(["key", "value", "query"]))
def test_interchange_arguments(argument, value, role):
    kwargs = dict(sites=[Site("blocks.0.mixer.hook_state", role)], metric="restoration", batch_size=None,
                  min_effect=0.01, answer=None, skip_noops=True, resume=True)
    clean, corrupt = CLEAN, CORRUPT
    if argument == "clean":
        clean = value
    elif argument == "corrupt":
        corrupt = value
    elif argument == "position":
        assume(isinstance(value, (str, int)) and not isinstance(value, bool))
        kwargs["sites"] = [Site("blocks.0.mixer.hook_state", value)]
    else:
        kwargs[argument] = value
    try:
        result = interchange(AR_MODEL, clean, corrupt, **kwargs)
    except Exception as error:  # noqa: BLE001
        assert_names(error, argument, "site", "Site", "role", "batch")
        return
    assert result.restoration.shape == (1, len(CLEAN))


TRAIN = ["train", "--model", "tanh_rnn", "--task", "C2", "--steps", "2", "--out", "/nonexistent/fuzz/run"]
FLAGS = {"train": ["--model", "--task", "--format", "--train-length", "--steps", "--batch-size", "--lr",
                   "--weight-decay", "--warmup", "--grad-clip", "--seed", "--eval-every", "--checkpoint-every",
                   "--device", "--d-model", "--n-layers", "--d-hidden", "--d-state", "--n-heads", "--expand",
                   "--d-conv"],
         "eval": ["--lengths", "--n", "--seed", "--device"], "drift": ["--lengths", "--n", "--device"],
         "heads": ["--n", "--device", "--impl"]}
flag_values = st.one_of(st.text(max_size=6), st.integers(-3, 12).map(str), st.sampled_from(
    ["nan", "inf", "-1", "0", "1e9", "cuda", "cuda:3", "gpu", "S99", "s3", "mamba", "acot", "60,x", ""]))


class Reached(Exception):
    """The command got past validation (its real work is stubbed out)."""


@FUZZ
@given(command=st.sampled_from(sorted(FLAGS)), data=st.data())
def test_cli_argument_vectors(command, data, monkeypatch_module):
    flag = data.draw(st.sampled_from(FLAGS[command] + ["--no-such-flag"]))
    value = data.draw(flag_values)
    argv = TRAIN if command == "train" else [command, str(monkeypatch_module[command == "heads"])]
    argv = [*argv, flag, value] if flag != "--no-such-flag" else [*argv, flag]
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            status = main(argv)
        except SystemExit as exit:
            status = exit.code
        except Reached:
            return
    lines = stderr.getvalue().strip().splitlines()
    assert status == 2 and len(lines) == 1, (argv, status, lines)
    assert flag in lines[0] or "unrecognized" in lines[0], (argv, lines)


@pytest.fixture(scope="module")
def monkeypatch_module(tmp_path_factory):
    """Stub the work: a valid command stops where it would start training or load a model (of a run
    directory of a 1-step run: a C2 run, and a REPL run for `interp heads`, which are yielded)."""
    from interp.training import train as train_module

    from interp.training.train import TrainConfig

    runs = tmp_path_factory.mktemp("fuzz") / "run", tmp_path_factory.mktemp("fuzz") / "repl"
    cfg = TrainConfig(steps=1, batch_size=2, warmup=0, train_length=4, eval_size=2)
    for run_dir, task in zip(runs, (make_task("C2"), make_task("REPL"))):
        train_module.train(models.preset_config("tanh_rnn", vocab_size=task.vocab_size, d_model=4), task, cfg,
                           run_dir, progress=False)
    patch = pytest.MonkeyPatch()

    def reached(*args, **kwargs):
        raise Reached

    patch.setattr(train_module, "train", reached)
    patch.setattr(models, "load", reached)
    yield runs
    patch.undo()


from interp.cli import main  # noqa: E402
