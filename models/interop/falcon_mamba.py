"""transformers FalconMambaForCausalLM -> our "mamba" stack: Mamba's math plus RMS norms without
weights on dt_low, B and C after x_proj (eps config.mixer_rms_eps).

Our Mamba represents those norms with the mixer option dt_bc_norm_eps, whose norms have weights:
they are set to one here (FalconMamba's own are fixed, non-persistent ones), so the imported model
computes FalconMamba's function and its norm weights start where FalconMamba's stay. Every other
weight maps as in models.interop.mamba (state [B, E, N] in both, no transposes).
"""

from __future__ import annotations

import torch
from torch import nn

from models.config import ModelConfig
from models.interop import mamba


def convert(source: nn.Module) -> tuple[ModelConfig, dict]:
    config = source.config
    mamba.check_config(config)
    cfg = mamba.model_config(config, dt_bc_norm_eps=float(config.mixer_rms_eps))
    dtype = source.get_input_embeddings().weight.dtype
    sizes = {"dt_norm": int(config.time_step_rank), "B_norm": config.state_size, "C_norm": config.state_size}
    unit_norms = lambda mixer: {f"{mixer}.{name}.weight": torch.ones(d, dtype=dtype) for name, d in sizes.items()}  # noqa: E731
    return mamba.convert_stack(source, cfg, unit_norms)


def source_blocks(source: nn.Module) -> list[nn.Module]:
    return list(source.backbone.layers)
