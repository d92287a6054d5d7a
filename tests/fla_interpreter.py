"""Running fla's Triton layers on the CPU under TRITON_INTERPRET=1 (tests/conftest.py sets it).

fla autotunes most kernels; the autotuner benchmarks each config on a GPU driver, which the
interpreter has none of. `single_config_autotune(monkeypatch)` makes every autotuner keep its
first config (after fla's own pruning), so nothing is benchmarked and each kernel runs once.
fla's chunked kernels do not run in the interpreter (a Python int meets `.to`), so the parity tests
pick fla's fused recurrent mode (config attn_mode="fused_recurrent").
"""

from __future__ import annotations

import pytest


def fla_models():
    """fla.models (the flash-linear-attention package), or skip the test."""
    try:
        import fla.models
        from triton.runtime import autotuner  # noqa: F401
    except ImportError as error:
        pytest.skip(f"fla models (pip package flash-linear-attention) not importable: {error}")
    return fla.models


def single_config_autotune(monkeypatch) -> None:
    from triton.runtime import autotuner

    prune = autotuner.Autotuner.prune_configs
    monkeypatch.setattr(autotuner.Autotuner, "prune_configs", lambda self, kwargs: prune(self, kwargs)[:1])
