"""examples/pretrained_state_patching.py on a tiny random transformers Mamba saved with
save_pretrained: causal vs read-out-only state patches, and the page renders with every axis titled."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from tests.browser import assert_renders
from tests.interop_parity import jitter
from tests.test_report_legibility import untitled_axes

tf = pytest.importorskip("transformers")
RECIPE = Path(__file__).resolve().parents[1] / "examples" / "pretrained_state_patching.py"


def load_recipe():
    spec = importlib.util.spec_from_file_location("pretrained_state_patching", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    config = tf.MambaConfig(vocab_size=32, hidden_size=16, state_size=4, num_hidden_layers=2, conv_kernel=3,
                            pad_token_id=0, bos_token_id=0, eos_token_id=0)
    path = tmp_path_factory.mktemp("ckpt") / "tiny-mamba"
    jitter(tf.MambaForCausalLM(config), scale=0.2).save_pretrained(path)
    return path


def test_last_layer_read_out_only_patch_changes_position_t_only(checkpoint, tmp_path):
    """Patching the last layer: the read-out-only patch changes the prediction at t and nothing
    after (no later layer reads t); the causal one changes t the same way and every later step."""
    t = 6
    result = load_recipe().main([str(checkpoint), "--layer", "1", "--position", str(t), "--length", "20",
                                 "--out", str(tmp_path)])
    causal, readout = result["causal"], result["read-out only"]
    for r in (causal, readout):
        assert torch.equal(r["kl"][:t], torch.zeros(t)) and r["l2"][t] > 1e-3
    torch.testing.assert_close(causal["kl"][t], readout["kl"][t], atol=1e-6, rtol=1e-5)
    assert torch.equal(readout["l2"][t + 1:], torch.zeros(20 - t - 1))
    assert (causal["l2"][t + 1:] > 1e-4).all()


def test_recipe_writes_a_page_that_renders(checkpoint, tmp_path):
    result = load_recipe().main([str(checkpoint), "--out", str(tmp_path)])
    assert result["path"] == tmp_path / "report.html"
    assert_renders(result["path"])
    recipe = load_recipe()
    fig = recipe.figure({kind: {"kl": torch.zeros(4), "l2": torch.zeros(4)} for kind in ("causal", "read-out only")},
                        t=1, layer=0, source="tiny")
    assert [axis for axis in untitled_axes(fig) if axis.startswith("y")] == []   # (x is shared: titled below)
    with pytest.raises(SystemExit, match="recurrent states"):
        load_recipe().main([str(checkpoint), "--layer", "5", "--out", str(tmp_path)])
