"""What from_pretrained guarantees on a checkpoint directory (docs/trust-imports.md): it never runs
the checkpoint's code (auto_map refused, stdin never read); every weight of the built model comes
from the files and every stored tensor is used (one tensor missing or one extra, for every family
the registry converts); a lying safetensors header or an oversized config is refused in one line
before anything is allocated. The checkpoints are tiny transformers / fla models with random
weights (the interop tests' sources), saved by save_pretrained and edited with safetensors."""

import importlib
import json
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import models
from models.interop import gates
from models.interop.registry import CONVERTERS

tf = pytest.importorskip("transformers")
st = pytest.importorskip("safetensors.torch")
ROOT = Path(__file__).resolve().parents[1]

# model_type -> "test module:source function" (imported when used: the fla sources need fla)
SOURCES = {
    "gpt2": "test_interop:gpt2_source", "llama": "test_interop:llama_source", "mamba": "test_interop:mamba_source",
    "falcon_mamba": "test_interop:falcon_mamba_source", "jamba": "test_interop:jamba_source",
    "mamba2": "test_interop_mamba2:mamba2_source", "bamba": "test_interop_hybrid:bamba_source",
    "granitemoehybrid": "test_interop_hybrid:granite_moe_source", "nemotron_h": "test_interop_hybrid:nemotron_h_source",
    "falcon_h1": "test_interop_hybrid:falcon_h1_source", "zamba2": "test_interop_hybrid:zamba2_source",
    "lfm2": "test_interop_lfm2:lfm2_source", "kimi_linear": "test_interop_kimi:kimi_source",
    "qwen3": "test_interop_qwen3:qwen3_source", "qwen3_moe": "test_interop_qwen3:qwen3_moe_source",
    "qwen3_next": "test_interop_qwen:next_source", "qwen3_5_text": "test_interop_qwen:qwen35_source",
    "qwen3_5_moe_text": "test_interop_qwen:qwen35_moe_source",
    "qwen3_5": "test_interop_qwen:multimodal_source:dense", "qwen3_5_moe": "test_interop_qwen:multimodal_source:moe",
    "delta_net": "test_interop_fla:deltanet_source", "gated_deltanet": "test_interop_fla:gated_source",
    "rwkv7": "test_rwkv7:rwkv7_source",
}
NEW = ("nemotron_h", "qwen3_next", "falcon_h1", "zamba2", "lfm2", "kimi_linear", "rwkv7")


def saved(model_type: str, directory: Path) -> Path:
    """The family's tiny source saved by save_pretrained into directory."""
    module, function, *variant = SOURCES[model_type].split(":")
    make = getattr(importlib.import_module(f"tests.{module}"), function)
    source = make(moe=variant[0] == "moe") if variant else make()
    source.save_pretrained(directory)
    return directory


def edited(directory: Path, edit) -> dict[str, torch.Tensor]:
    """Rewrite the directory's model.safetensors with edit(tensors) applied; the tensors before."""
    tensors = st.load_file(directory / "model.safetensors")
    before = dict(tensors)
    edit(tensors)
    st.save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    return before


def refused(directory: Path, match: str) -> str:
    with pytest.raises(ValueError) as raised:
        models.from_pretrained(directory)
    message = str(raised.value)
    assert "\n" not in message and str(directory) in message
    assert re.search(match, message), message
    return message


def test_every_family_of_the_registry_is_checked():
    assert set(SOURCES) == set(CONVERTERS)
    assert set(NEW) <= set(SOURCES)


def _a_norm_weight(tensors: dict) -> str:
    """A stored norm weight of a middle layer (every family has them; none is merged by transformers)."""
    norms = sorted(n for n in tensors if re.search(r"\.\d+\..*(norm|ln_)", n) and n.endswith("weight"))
    return norms[len(norms) // 2]


@pytest.mark.parametrize("model_type", sorted(SOURCES))
def test_a_missing_tensor_is_refused_naming_it(model_type, tmp_path):
    directory = saved(model_type, tmp_path / "ckpt")
    name = None

    def drop(tensors):
        nonlocal name
        name = _a_norm_weight(tensors)
        del tensors[name]

    edited(directory, drop)
    # transformers may rename the stored prefix (backbone. -> model., model.language_model. -> model.)
    message = refused(directory, "does not fill 1 weight")
    assert re.search(r"(layers|h)\.\d+\..*", name).group() + "'" in message, (name, message)


@pytest.mark.parametrize("model_type", sorted(SOURCES))
def test_an_unexpected_tensor_is_refused_naming_it(model_type, tmp_path):
    directory = saved(model_type, tmp_path / "ckpt")
    edited(directory, lambda tensors: tensors.update({"model.layers.0.extra_unused.weight": torch.ones(3)}))
    refused(directory, r"holds 1 tensor\(s\) .*KNOWN_DROPS.*'model\.layers\.0\.extra_unused\.weight'")


def test_a_missing_expert_is_refused_naming_the_merged_weight(tmp_path):
    """Qwen3-Next stores experts one by one; transformers stacks them: one gone is a wrong shape."""
    directory = saved("qwen3_next", tmp_path / "ckpt")
    edited(directory, lambda tensors: tensors.pop("model.layers.2.mlp.experts.1.down_proj.weight"))
    refused(directory, r"model\.layers\.2\.mlp\.experts\.down_proj \(stored \(3, .*the model's \(4, ")


def test_a_known_drop_loads_and_the_weights_are_the_sources(tmp_path):
    """GPT-2's legacy causal-mask buffers (KNOWN_DROPS) are dropped; everything else is the source's."""
    directory = saved("gpt2", tmp_path / "ckpt")
    before = edited(directory, lambda tensors: tensors.update({"transformer.h.0.attn.bias": torch.ones(1, 1, 4, 4)}))
    model = models.from_pretrained(directory)
    torch.testing.assert_close(model.embed.weight, before["transformer.wte.weight"], atol=0, rtol=0)
    torch.testing.assert_close(model.blocks[1].mlp.down.weight, before["transformer.h.1.mlp.c_proj.weight"].T,
                               atol=0, rtol=0)


@pytest.mark.parametrize("model_type", ["gpt2", "mamba", "falcon_h1", "lfm2", "rwkv7"])
def test_a_tensor_stored_at_another_shape_is_refused_naming_it(model_type, tmp_path):
    """A consistent header (same bytes) whose 2-d shape is transposed is not the model's weight."""
    directory = saved(model_type, tmp_path / "ckpt")
    name = None

    def transpose(tensors):
        nonlocal name
        name = sorted(n for n, t in tensors.items() if t.ndim == 2 and t.shape[0] != t.shape[1])[0]
        tensors[name] = tensors[name].T.contiguous()

    before = edited(directory, transpose)
    rows, columns = before[name].shape
    refused(directory, rf"does not fill 1 weight.*{re.escape(name)} \(stored \({columns}, {rows}\), "
                       rf"the model's \({rows}, {columns}\)\)")


# ----------------------------------------------------------------------------- safetensors headers


def rewritten_header(file: Path, name: str, **fields) -> None:
    """file with header entry `name`'s fields replaced (the data left as it is)."""
    raw = file.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    header[name] |= fields
    text = json.dumps(header).encode()
    file.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + length :])


LIES = {
    "huge shape": (lambda e: {"shape": [2**18, 2**18]}, r"shape \[262144, 262144\] of F32 needs 274877906944 bytes"),
    "negative shape": (lambda e: {"shape": [-4, 8]}, r"shape \[-4, 8\] is not a list of non-negative integers"),
    "float shape": (lambda e: {"shape": [2.0] + e["shape"][1:]}, "is not a list of non-negative integers"),
    "offsets past the file": (lambda e: {"data_offsets": [e["data_offsets"][0], 2**40]}, "do not lie within"),
    "offsets reversed": (lambda e: {"data_offsets": e["data_offsets"][::-1]}, "do not lie within"),
    "unknown dtype": (lambda e: {"dtype": "F128"}, "'F128' is not a safetensors dtype"),
}


@pytest.mark.parametrize("model_type", ["falcon_h1", "zamba2", "lfm2", "rwkv7", "mamba"])
@pytest.mark.parametrize("lie", sorted(LIES))
def test_a_lying_header_is_refused_naming_the_tensor_and_the_file(model_type, lie, tmp_path, monkeypatch):
    directory = saved(model_type, tmp_path / "ckpt")
    file = directory / "model.safetensors"
    header = json.loads(file.read_bytes()[8 : 8 + struct.unpack("<Q", file.read_bytes()[:8])[0]])
    name = max((n for n in header if n != "__metadata__" and len(header[n]["shape"]) == 2),
               key=lambda n: header[n]["data_offsets"][0])
    change, match = LIES[lie]
    if lie == "offsets reversed" and header[name]["data_offsets"][0] == header[name]["data_offsets"][1]:
        pytest.skip("an empty tensor")
    rewritten_header(file, name, **change(header[name]))
    monkeypatch.setattr(tf.AutoModelForCausalLM, "from_config", _never)  # refused before anything is built
    message = refused(directory, match)
    assert f"checkpoint tensor {name!r} in {file}" in message


def _never(*args, **kwargs):
    raise AssertionError("a model was built before the header was checked")


# ----------------------------------------------------------------------------- config size gates


def with_config(directory: Path, **fields) -> Path:
    path = directory / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | fields))
    return directory


@pytest.mark.parametrize("model_type", ["falcon_h1", "zamba2", "lfm2", "rwkv7"])
@pytest.mark.parametrize(("field", "value", "bound"), [
    ("vocab_size", 10**12, gates.VOCAB), ("vocab_size", 1e12, gates.VOCAB), ("hidden_size", -16, gates.WIDTH),
    ("num_hidden_layers", 10**9, gates.LAYERS), ("intermediate_size", True, gates.MLP_WIDTH),
])
def test_a_config_outside_the_size_bounds_is_refused_before_building(model_type, field, value, bound, tmp_path,
                                                                     monkeypatch):
    directory = with_config(saved(model_type, tmp_path / "ckpt"), **{field: value})
    monkeypatch.setattr(tf.AutoModelForCausalLM, "from_config", _never)
    start = time.perf_counter()
    refused(directory, rf"{field}={value!r} is outside .* an integer in \[0, {bound}\]")
    assert time.perf_counter() - start < 5


def test_nested_configs_and_per_layer_lists_are_bounded(tmp_path):
    directory = saved("qwen3_5", tmp_path / "ckpt")
    config = json.loads((directory / "config.json").read_text())
    refused(with_config(directory, text_config=config["text_config"] | {"num_attention_heads": 10**7}),
            rf"text_config\.num_attention_heads=10000000 .* \[0, {gates.HEADS}\]")
    refused(with_config(directory, text_config=config["text_config"] | {"layer_types": ["full_attention"] * 5000}),
            f"layer_types has 5000 entries; at most {gates.LAYERS}")


def test_the_memory_estimate_counts_the_model_and_is_refused_over_the_available(tmp_path, monkeypatch):
    """The estimate is the meta-built source's weights x bytes each (its float32): refused when the
    available memory is one byte less, loaded when it is exactly that."""
    directory = saved("falcon_h1", tmp_path / "ckpt")
    config = tf.AutoConfig.from_pretrained(directory)
    with torch.device("meta"):
        source = tf.AutoModelForCausalLM.from_config(config)
    weights = sum(t.numel() for t in {id(t): t for t in source.state_dict(keep_vars=True).values()}.values())
    needed = weights * 4
    monkeypatch.setattr(gates, "available_memory", lambda: needed - 1)
    refused(directory, rf"needs an estimated .*\({weights} weights x 4 bytes x 1 copy at the peak\)")
    monkeypatch.setattr(gates, "available_memory", lambda: needed)
    assert models.from_pretrained(directory).cfg.d_model == config.hidden_size


def test_available_memory_is_positive_and_at_most_the_machines():
    available = gates.available_memory()
    total = Path("/proc/meminfo").read_text().split()[1] if Path("/proc/meminfo").exists() else None
    assert available is None or (0 < available and (total is None or available <= int(total) * 1024))


# ----------------------------------------------------------------------------- checkpoint code


EVIL = """from pathlib import Path
Path({marker!r}).write_text("the checkpoint's code ran")
from transformers import GPT2Config as EvilConfig, GPT2LMHeadModel as EvilModel
"""
# run with stdin answering "y" to transformers' "Do you wish to run the custom code?"
PROGRAM = """import sys
from pathlib import Path
import transformers
import models
from models.interop import load
path = Path(sys.argv[1])
for attempt in (lambda: models.from_pretrained(path), lambda: load._meta_source(transformers, path),
                lambda: load._transformers_loaded(transformers, path, None, [], "gpt2")):
    try:
        attempt()
        print("LOADED")
    except Exception as error:
        print("ERROR", repr(str(error)))
"""


def test_checkpoint_code_never_runs_and_stdin_is_never_read(tmp_path):
    directory = saved("gpt2", tmp_path / "ckpt")
    marker = tmp_path / "marker"
    (directory / "evil.py").write_text(EVIL.format(marker=str(marker)))
    config = json.loads((directory / "config.json").read_text())
    del config["model_type"]
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    (directory / "config.json").write_text(json.dumps(config))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HF_HOME": str(tmp_path / "hf"),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    result = subprocess.run([sys.executable, "-c", PROGRAM, str(directory)], input="y\n" * 20, text=True,
                            capture_output=True, env=env, cwd=tmp_path, timeout=300)
    lines = [line for line in result.stdout.splitlines() if line.startswith(("ERROR", "LOADED"))]
    assert len(lines) == 3 and all(line.startswith("ERROR") for line in lines), result.stdout + result.stderr
    assert "auto_map=" in lines[0] and "never runs a checkpoint's code" in lines[0] and "\\n" not in lines[0]
    assert not marker.exists()
    assert not any((tmp_path / "hf").rglob("evil.py"))  # not copied into the module cache either
