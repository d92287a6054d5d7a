"""The float32 error of our imported model and of the transformers source, each against a float64
reference of the same weights: whose error is the gap between the two float32 runs?

    python benchmarks/float32_gap.py [--models mamba2 mamba gpt2] [--lengths 64 256]

The reference is the transformers model in float64 with its float32 casts made float64 too
(`.float()`, `.to(torch.float32)` inside its modeling module, residual_in_fp32 off): transformers'
Mamba and Mamba-2 compute norms, the scan and the residual in float32 whatever the model's dtype,
so a plain `.double()` source is float32-limited. Our model in float64 is checked against that
reference (same math: ~1e-13). Errors are max |logits - reference| / max |reference|, B = 1, one
thread, random weights of the real-size configs (benchmarks/real_configs.py).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import types

import torch

import models
from real_configs import build_source, tokens  # benchmarks/real_configs.py


@contextlib.contextmanager
def float64_casts(source: torch.nn.Module):
    """Within the block the source's modeling module casts to float64 where it casts to float32."""
    module = importlib.import_module(type(source).__module__)
    proxy = types.SimpleNamespace(**{k: getattr(torch, k) for k in dir(torch) if not k.startswith("__")})
    proxy.float32 = torch.float64
    original_torch, original_float = module.torch, torch.Tensor.float
    module.torch, torch.Tensor.float = proxy, torch.Tensor.double
    try:
        yield
    finally:
        module.torch, torch.Tensor.float = original_torch, original_float


def float64_copy(source: torch.nn.Module, build) -> torch.nn.Module:
    """build(dtype) -> a fresh source; the float64 one with `source`'s weights, residual_in_fp32 off."""
    copy = build(torch.float64)
    copy.load_state_dict({k: v.double() for k, v in source.state_dict().items()})
    for m in copy.modules():
        if hasattr(m, "residual_in_fp32"):
            m.residual_in_fp32 = False
    return copy.eval()


def relative(a: torch.Tensor, reference: torch.Tensor) -> float:
    return ((a.double() - reference).abs().max() / reference.abs().max()).item()


@torch.no_grad()
def errors(source: torch.nn.Module, build, ids: torch.Tensor) -> dict[str, float]:
    """{"ours": our float32 error, "transformers": the source's, "between": ours vs the source in
    float32, "reference_agreement": our float64 model vs the float64 reference}."""
    ours = models.from_pretrained(source)
    source64 = float64_copy(source, build)
    with float64_casts(source64):
        reference = source64(ids).logits
    ours64 = models.from_pretrained(source64)
    theirs, mine = source(ids).logits, ours(ids)
    return {"ours": relative(mine, reference), "transformers": relative(theirs, reference),
            "between": relative(mine, theirs.double()), "reference_agreement": relative(ours64(ids), reference),
            "scale": reference.abs().max().item(), "between_abs": (mine - theirs).abs().max().item()}


def main(argv=None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mamba2", "mamba", "gpt2"])
    parser.add_argument("--lengths", nargs="+", type=int, default=[64, 256])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = ["| model | T | ours vs float64 | transformers vs float64 | ours vs transformers (abs) | "
            "float64 models agree |", "|---|---|---|---|---|---|"]
    for name in args.models:
        source = build_source(name)
        for length in args.lengths:
            e = errors(source, lambda dtype: build_source(name, dtype=dtype), tokens(name, 1, length))
            rows.append(f"| {name} | {length} | {e['ours']:.2e} | {e['transformers']:.2e} | {e['between']:.2e} "
                        f"({e['between_abs']:.1e}) | {e['reference_agreement']:.0e} |")
            print(rows[-1], flush=True)
    return rows


if __name__ == "__main__":
    main()
